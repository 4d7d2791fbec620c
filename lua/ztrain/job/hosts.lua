-- ztrain.job.hosts: the mpirun arguments of a launch across hosts
-- (`ztrain --hostfile FILE`, the recipe's launch.hostfile) and the escape
-- hatch for any other mpirun flag (--mpirun-arg, $ZTRAIN_MPIRUN_ARGS).
-- Open MPI does the launching; this only checks the hostfile and picks
-- the flags. When every host of the file is a network namespace on this
-- machine (tools/netcluster.sh, docs/cluster.md), the launch agent is
-- tools/netns_agent instead of ssh and Open MPI's TCP (ranks and its
-- out-of-band channel) keeps to the cluster's subnet, so bytes cross the
-- namespaces' links.
local libc = require "ztrain.core.libc"
local zffi = require "ztrain.core.ffi"

local M = {}

local HOW = "one line per host, `HOST slots=N` (tools/netcluster.sh hostfile prints one for the " ..
            "test cluster on this machine)"

-- the settings a hostfile line may carry (Open MPI's names); slots counts
local KEYS = { slots = true, max_slots = true, ["max-slots"] = true }
-- the most slots Open MPI 4.1 reads from a line (and counts in all): an int;
-- 2147483648 is "a bad parameter in the hostfile" from mpirun
M.MAX_SLOTS = 2147483647

-- parse(text, path) -> hosts | nil, err. hosts: list of { host =, slots = }
-- in file order; a host named twice gets the slots of both lines (as
-- Open MPI counts them); a line without slots= counts 1. Comments (#) and
-- blank lines are skipped. A line is `HOST [key=N ...]`: a line that does
-- not start with a host name, or carries any other word (a typo such as
-- slot=4, a Lua file given by mistake), is refused here, naming the line,
-- where Open MPI would miscount it or fail with an internal error.
function M.parse(text, path)
  local hosts, by_name, lineno = {}, {}, 0
  local function bad(what) return nil, ("hostfile %s line %d: %s; write %s"):format(path, lineno, what, HOW) end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    lineno = lineno + 1
    line = line:gsub("#.*$", ""):match("^%s*(.-)%s*$")
    if line ~= "" then
      local host, rest = line:match("^(%S+)%s*(.*)$")
      if not host:match("^[%w][%w%._%-]*$") then
        return bad(("a line starts with the host's name, not %s"):format(host))
      end
      local slots = 1
      for word in rest:gmatch("%S+") do
        local k, v = word:match("^([%w_%-]+)=(.*)$")
        if not k or not KEYS[k] then
          return bad(("%s is not a setting Open MPI takes (slots=N, max_slots=N)"):format(word))
        end
        local num = tonumber(v)
        if not num or num < 1 or num ~= math.floor(num) then
          return bad(("%s=%s is not a whole number >= 1"):format(k, v))
        end
        if num > M.MAX_SLOTS then
          return bad(("%s=%s is more than Open MPI takes (at most %d: it counts slots in a 32-bit int)")
                     :format(k, v, M.MAX_SLOTS))
        end
        if k == "slots" then slots = num end
      end
      if by_name[host] then by_name[host].slots = by_name[host].slots + slots
      else
        by_name[host] = { host = host, slots = slots }
        hosts[#hosts + 1] = by_name[host]
      end
    end
  end
  if #hosts == 0 then return nil, ("hostfile %s names no host: write %s"):format(path, HOW) end
  local total = 0
  for _, h in ipairs(hosts) do total = total + h.slots end
  if total > M.MAX_SLOTS then
    return nil, ("hostfile %s has %.0f slots in all, more than Open MPI takes (at most %d: it counts slots in " ..
                 "a 32-bit int); give each host the slots it has"):format(path, total, M.MAX_SLOTS)
  end
  return hosts
end

-- check(path, nproc) -> hosts, slots | nil, err: the hostfile read and its
-- slots checked against nproc ranks (0: as many as it has slots).
function M.check(path, nproc)
  local kind = libc.file_kind(path)
  if kind ~= "file" then
    return nil, ("hostfile %s %s; give an Open MPI hostfile: %s"):format(path,
      kind and ("is a " .. kind .. ", not a file") or "does not exist", HOW)
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, ("cannot read hostfile %s: %s"):format(path, tostring(err)) end
  local text = f:read("*a")
  f:close()
  local hosts, perr = M.parse(text, path)
  if not hosts then return nil, perr end
  local slots = 0
  for _, h in ipairs(hosts) do slots = slots + h.slots end
  if nproc > slots then
    return nil, ("hostfile %s has %d slot(s) on %d host(s), fewer than the %d rank(s) asked for: add " ..
                 "slots (HOST slots=N), or ask for %d rank(s) at most"):format(path, slots, #hosts, nproc, slots)
  end
  return hosts, slots
end

-- is_netns(host) -> true when `host` names a network namespace here
-- (ip netns keeps them as /run/netns/NAME)
function M.is_netns(host)
  return host:match("^[%w_.%-]+$") ~= nil and libc.file_kind("/run/netns/" .. host) ~= nil
end

-- network(cidr) -> "A.B.C.D/LEN", the network of an interface address
-- "a.b.c.d/LEN" (its host bits cleared), or nil.
function M.network(cidr)
  local a, b, c, d, len = (cidr or ""):match("^(%d+)%.(%d+)%.(%d+)%.(%d+)/(%d+)$")
  if not a then return nil end
  local octets, out = { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }, {}
  len = tonumber(len)
  for i = 1, 4 do
    local keep = math.max(0, math.min(8, len - 8 * (i - 1)))
    local block = 2 ^ (8 - keep)
    out[i] = octets[i] - octets[i] % block
  end
  return ("%d.%d.%d.%d/%d"):format(out[1], out[2], out[3], out[4], len)
end

-- netns_subnet(host) -> the network of the host's interface zteth (the
-- test cluster's), or nil
function M.netns_subnet(host)
  -- (through a shell: only a name of the characters a namespace may have)
  if type(host) ~= "string" or not host:match("^[%w_.%-]+$") then return nil end
  local p = io.popen(("ip -n %s -4 -o addr show dev zteth 2>/dev/null"):format(host))
  if not p then return nil end
  local text = p:read("*a")
  p:close()
  return M.network(text:match("inet (%S+)"))
end

-- split(s) -> the words of $ZTRAIN_MPIRUN_ARGS: split at blanks, '...'
-- and "..." keep blanks inside a word (no other shell syntax).
function M.split(s)
  local words, cur, i, q = {}, nil, 1, nil
  s = s or ""
  while i <= #s do
    local ch = s:sub(i, i)
    if q then
      if ch == q then q = nil else cur = cur .. ch end
    elseif ch == "'" or ch == '"' then q, cur = ch, cur or ""
    elseif ch:match("%s") then
      if cur then words[#words + 1] = cur; cur = nil end
    else cur = (cur or "") .. ch end
    i = i + 1
  end
  if q then return nil, ("ZTRAIN_MPIRUN_ARGS has an unclosed %s quote: %s"):format(q, s) end
  if cur then words[#words + 1] = cur end
  return words
end

-- home() -> the ztrain checkout (for tools/netns_agent)
local function home()
  return os.getenv("ZTRAIN_HOME") or rawget(_G, "ZTRAIN_HOME") or zffi.home
end

-- args(o) -> words | nil, err: mpirun's arguments for o = { hostfile = PATH
-- or nil, nproc = N, mpirun_args = { ... } (--mpirun-arg, in order),
-- env = $ZTRAIN_MPIRUN_ARGS }, and whether every rank runs on this machine
-- (then per-rank threads are this machine's cores / N). The hostfile is
-- checked first (a clear error, nothing started).
function M.args(o)
  local words, local_only = {}, true
  if o.hostfile then
    local hosts, err = M.check(o.hostfile, o.nproc)
    if not hosts then return nil, err end
    words = { "--hostfile", o.hostfile }
    local ns, other, subnet = {}, {}, nil
    for _, h in ipairs(hosts) do
      local list = M.is_netns(h.host) and ns or other
      list[#list + 1] = h.host
    end
    -- one way to reach them all: the agent reaches namespaces only, ssh
    -- no namespace (it would fail with "Could not resolve hostname")
    if #ns > 0 and #other > 0 then
      return nil, ("hostfile %s mixes hosts of the test cluster on this machine (%s) with other hosts (%s): " ..
                   "a launch reaches either namespaces (tools/netcluster.sh hostfile) or real hosts, not both")
                  :format(o.hostfile, table.concat(ns, ", "), table.concat(other, ", "))
    end
    local all_ns = #other == 0
    for _, host in ipairs(ns) do
      local net = M.netns_subnet(host)
      if not net or (subnet and net ~= subnet) then
        return nil, ("hostfile %s: host %s is a network namespace without the test cluster's zteth " ..
                     "interface on %s: make the cluster with tools/netcluster.sh up N"):format(o.hostfile,
                     host, subnet or "one subnet")
      end
      subnet = net
    end
    if all_ns then
      -- the test cluster: hosts are namespaces of this machine, reached by
      -- `ip netns exec` (no ssh); TCP only, on the cluster's links only
      for _, w in ipairs({ "--mca", "plm_rsh_agent", home() .. "/tools/netns_agent",
                           "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "btl", "tcp,self",
                           "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet }) do
        words[#words + 1] = w
      end
    else
      local_only = false
    end
  end
  local env, err = M.split(o.env)
  if not env then return nil, err end
  for _, w in ipairs(env) do words[#words + 1] = w end
  for _, w in ipairs(o.mpirun_args or {}) do words[#words + 1] = w end
  return words, local_only
end

-- ---- a failed job --------------------------------------------------------------------

-- abort_grace() -> seconds the launcher lets mpirun take to end a failed
-- job before it ends mpirun itself ($ZTRAIN_ABORT_GRACE, default 5)
function M.abort_grace()
  local g = tonumber(os.getenv("ZTRAIN_ABORT_GRACE") or "")
  return (g and g >= 0) and g or 5
end

-- start_timeout() -> seconds every rank of a launch across hosts has to
-- start ($ZTRAIN_START_TIMEOUT, default 60)
function M.start_timeout()
  local t = tonumber(os.getenv("ZTRAIN_START_TIMEOUT") or "")
  return (t and t > 0) and t or 60
end

-- started(ranks, n) -> true when n ranks have noted themselves in the
-- job registry (launch.read_job's table); else false, { count = ranks noted, hosts = text naming the
-- hosts whose daemon started but whose ranks did not, or "" }
function M.started(ranks, n)
  local count, daemons, with_ranks = 0, {}, {}
  for _, r in pairs(ranks) do
    if r.rank then count = count + 1; if r.host then with_ranks[r.host] = true end
    elseif r.host then daemons[#daemons + 1] = r.host end
  end
  if count >= n then return true end
  local silent = {}
  for _, h in ipairs(daemons) do if not with_ranks[h] then silent[#silent + 1] = h end end
  table.sort(silent)
  return false, { count = count, hosts = #silent > 0 and
    (" (none on host %s: Open MPI starts ranks once every host's daemon has called back, and one " ..
     "that cannot reach mpirun stalls them all)"):format(table.concat(silent, ", ")) or "" }
end

-- failure(tail) -> { status = } when mpirun's stderr says the job failed
-- (so mpirun should end it soon), else nil. status: what the job's exit
-- status is when the launcher has to end mpirun: the watchdog's 5, an
-- MPI_Abort's error code, 128 + the signal of a killed rank, 1 for a lost
-- host (its ranks' deaths follow from it). The launcher gives it as the
-- job's status whenever the job failed: mpirun's own status for a lost
-- host is an internal code (205 and the like).
function M.failure(tail, dead_rank)
  -- the watchdog's report (runtime/comm_watch.c), whatever it calls the
  -- timeout (a run: comm.timeout; zt_comm_watch's own name otherwise)
  if tail:find("ztrain: rank %d+: [^\n]- has waited [%d%.]+ s") then return { status = 5 } end
  if M.lost_host(tail) or tail:find("ORTE has lost communication") then return { status = 1 } end
  local code = tail:match("MPI_ABORT was invoked on rank %d+ in communicator %S+%s+with errorcode (%d+)")
  if code then return { status = tonumber(code) } end
  local _, sig = dead_rank(tail)
  if sig then return { status = 128 + sig } end
  return nil
end

-- lost_host(tail) -> the host whose Open MPI daemon mpirun lost, or nil
-- ("Remote daemon: [[...],2] on node ztn2")
function M.lost_host(tail)
  return tail:match("Remote daemon:%s*%S+ on node (%S+)")
end

return M
