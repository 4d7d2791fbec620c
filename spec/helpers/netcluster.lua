-- spec/helpers/netcluster.lua -- a test cluster of network-namespace hosts
-- (tools/netcluster.sh) for the multi-host specs: made with a prefix of the
-- spec's own, removed in teardown even when a test failed, and checked to
-- be gone.
local util = require "helpers.util"
local cjson = require "cjson"
local luassert = require "luassert"

local M = {}
local sh, read = util.sh, util.read

M.ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"

-- unavailable() -> why the multi-host specs cannot run here, or nil
function M.unavailable()
  local id = sh("id -u"):match("^(%d+)")
  if id ~= "0" then return "not root: network namespaces need root (run the suite as root)" end
  -- a namespace made and removed: root in a container may lack the right
  local _, rc = sh("ip netns add ztprobe$$ && ip netns del ztprobe$$")     -- $$: the shell's pid, unique
  if rc ~= 0 then
    return "`ip netns add` does not work here (iproute2 missing, or no right to make network namespaces)"
  end
  _, rc = sh("command -v tc >/dev/null && command -v mpirun >/dev/null")
  if rc ~= 0 then return "tc (iproute2) or mpirun (Open MPI) not found" end
  return nil
end

local function script(prefix, args)
  return ("ZTRAIN_NETCLUSTER=%s tools/netcluster.sh %s"):format(prefix, args)
end

-- up(prefix, n, rate) -> a directory holding hostfile.N for every N <= n
-- (the first N hosts, one slot each)
function M.up(prefix, n, rate)
  M.down(prefix)
  local out, rc = sh(script(prefix, ("up %d%s"):format(n, rate and (" --rate " .. rate) or "")))
  assert(rc == 0, "netcluster up failed:\n" .. out)
  local dir = util.tmpdir()
  local hosts = {}
  for line in sh(script(prefix, "hostfile")):gmatch("[^\n]+") do
    if line:match("^" .. prefix .. "%d+ slots=") then hosts[#hosts + 1] = line end
  end
  assert(#hosts == n, "netcluster hostfile: expected " .. n .. " hosts")
  for k = 1, n do
    util.write(("%s/hostfile.%d"):format(dir, k), table.concat(hosts, "\n", 1, k) .. "\n")
  end
  return dir
end

function M.down(prefix) return sh(script(prefix, "down")) end

function M.sh(prefix, args) return sh(script(prefix, args)) end

-- remove(prefix): down, and checked to be gone (a failed assertion if not)
function M.remove(prefix)
  M.down(prefix)
  luassert.are.equal("", M.leftovers(prefix), "the cluster's namespaces and links are gone")
end

-- cluster(prefix, n, ready) -> c, an n-host cluster for a describe block:
-- setup(c.up) makes it (c.dir: its hostfiles; c.hostfile(k): the first k
-- hosts), then calls ready(c) if given (e.g. the oracle runs); a setup that
-- fails still removes it. teardown(c.down) removes it and checks it is gone.
function M.cluster(prefix, n, ready)
  local c = {}
  function c.hostfile(k) return ("%s/hostfile.%d"):format(c.dir, k) end
  function c.up()
    local ok, err = pcall(function()
      c.dir = M.up(prefix, n)
      if ready then ready(c) end
    end)
    if not ok then M.down(prefix); error(err, 0) end
  end
  function c.down()
    if c.dir then util.rm(c.dir) end
    M.remove(prefix)
  end
  return c
end

-- leftovers(prefix) -> what of the cluster is still there ("" when none)
function M.leftovers(prefix)
  local out = sh(("ip netns list | grep -E '^%s[0-9]+' ; ip -o link show | grep -E ': %s([0-9]+b|br)[:@]'")
                 :format(prefix, prefix))
  return (out:gsub("rc=%d+%s*$", ""))
end

-- sent(prefix, i) -> bytes host i sent over its link (the bridge side's
-- received count)
local function stat(prefix, i, what)
  return tonumber(read(("/sys/class/net/%s%db/statistics/%s"):format(prefix, i, what)):match("%d+"))
end
function M.sent(prefix, i) return stat(prefix, i, "rx_bytes") end

-- snapshot(prefix, n) -> before, the bytes hosts 0..n-1 have sent so far;
-- sent_since(prefix, before, i) -> what host i sent after it
function M.snapshot(prefix, n)
  local before = {}
  for i = 0, n - 1 do before[i] = M.sent(prefix, i) end
  return before
end
function M.sent_since(prefix, before, i) return M.sent(prefix, i) - before[i] end

-- run(args, env) -> summary (nil when the run failed), output, exit status.
-- args: what follows build/ztrain (out= is added).
function M.run(args, env)
  local out = util.outdir()
  local o, rc = sh(("%s %s timeout -k 10 150 build/ztrain %s out=%s"):format(M.ENV, env or "", args, out))
  local s
  local f = io.open(out .. "/summary.json", "rb")
  if f then s = cjson.decode(f:read("*a")); f:close() end
  util.rm(out)
  return s, o, rc
end

-- ranks(out) -> pids of processes whose command line holds out=OUT (a
-- run's ranks and launcher; pgrep -f, its pattern written so that it does
-- not match the shell that runs pgrep)
function M.ranks(out)
  local out = sh(("pgrep -f '[o]ut=%s'"):format(out)):gsub("rc=%d+%s*$", "")
  local t = {}
  for p in out:gmatch("%d+") do t[#t + 1] = tonumber(p) end
  return t
end

return M
