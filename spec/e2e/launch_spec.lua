-- A recipe that says how many local ranks it wants (launch = { nproc = N }):
-- `ztrain RECIPE` starts them itself, --nproc and launch.nproc=N override
-- it, a launcher's world must match it, bad values are refused by name, and
-- the recipe file runs once before launching (a broken one is said once).
-- Every run writes under a temporary directory, never the checkout's runs/.
local util = require "helpers.util"
local cjson = require "cjson"

local sh, read, write = util.sh, util.read, util.write

local MPIRUN = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " ..
               "timeout 120 mpirun --oversubscribe --bind-to none -np 2 "

-- Small settings, written into the recipe so that nothing on the command
-- line but what a test is about differs between runs.
local BODY = [[
  strategy = "dp",
  model = { size = "gpt2-tiny" },
  data  = { seq_len = 32 },
  batch = { micro = 2 },
  lr    = { warmup = 1 },
  train = { steps = 3, log_every = 1, eval_every = 0, eval_batches = 2 },
]]

local dir
local function recipe(name, extra)
  local path = ("%s/%s.lua"):format(dir, name)
  write(path, "return {\n" .. BODY .. (extra or "") .. "}\n")
  return path
end

-- a fresh out= path that no run should make
local function never() return dir .. "/never" .. tostring(math.random(1e9)) end

local function count(s, needle)
  local n, at = 0, 1
  while true do
    local i = s:find(needle, at, true)
    if not i then return n end
    n, at = n + 1, i + #needle
  end
end

-- train(args) -> summary, per-step loss bits (as text)
local function train(args)
  local out = dir .. "/out" .. tostring(math.random(1e9))
  local o, rc = sh(("timeout 120 build/ztrain %s -q out=%s"):format(args, out))
  assert(rc == 0, ("ztrain %s failed (rc %s):\n%s"):format(args, tostring(rc), o))
  local s = cjson.decode(read(out .. "/summary.json"))
  local losses = {}
  for line in io.lines(out .. "/metrics.jsonl") do
    local m = cjson.decode(line)
    losses[#losses + 1] = m.step .. ":" .. m.loss_hex
  end
  return s, table.concat(losses, " ")
end

describe("launch.nproc", function()
  local two, plain, want, want_losses
  setup(function()
    dir = util.tmpdir()
    two = recipe("two", "  launch = { nproc = 2 },\n")
    plain = recipe("plain")
    local s
    s, want_losses = train("--nproc 2 " .. plain)
    assert.are.equal(2, s.world_size)
    want = s.param_digest
  end)
  teardown(function() util.rm(dir) end)

  it("ztrain RECIPE starts the ranks the recipe asks for, with --nproc's bits", function()
    local s, losses = train(two)
    assert.are.equal(2, s.world_size)
    assert.matches('launch={hostfile="",nproc=2}', s.recipe_resolved, 1, true)
    assert.are.equal(want, s.param_digest)
    assert.are.equal(want_losses, losses)
  end)

  it("takes launch.nproc=2 as a key=value override", function()
    local s, losses = train(plain .. " launch.nproc=2")
    assert.are.equal(2, s.world_size)
    assert.are.equal(want, s.param_digest)
    assert.are.equal(want_losses, losses)
  end)

  it("lets --nproc win over the recipe and over launch.nproc=", function()
    -- one rank in this process is the reference for one rank under mpirun
    local one = train(plain)
    assert.are.equal(1, one.world_size)
    local s = train("--nproc 1 " .. two)
    assert.are.equal(1, s.world_size)
    assert.matches('launch={hostfile="",nproc=1}', s.recipe_resolved, 1, true)  -- what ran
    assert.are.equal(one.param_digest, s.param_digest)
    s = train("--nproc 2 " .. plain .. " launch.nproc=1")
    assert.are.equal(2, s.world_size)
    assert.are.equal(want, s.param_digest)
    -- launch.nproc=1 runs one rank here: no mpirun (the backend says so)
    s = train(two .. " launch.nproc=1")
    assert.are.equal(1, s.world_size)
    assert.are.equal("local", s.comm)
    assert.are.equal(one.param_digest, s.param_digest)
  end)

  it("under mpirun, refuses a recipe asking for another count, said once, no hang", function()
    local nv = never()
    local out, rc = sh(MPIRUN .. ("build/ztrain %s launch.nproc=4 -q out=%s"):format(plain, nv))
    assert.are_not.equal(0, rc, out)
    assert.are_not.equal(124, rc, "timed out:\n" .. out)
    local msg = "the recipe asks for launch.nproc = 4 rank(s), but the launcher started 2"
    assert.are.equal(1, count(out, msg), out)
    assert.matches("mpirun -np 4", out, 1, true)
    assert.is_nil(io.open(nv .. "/summary.json"))
  end)

  it("under mpirun, trains when the count matches or is 0", function()
    for _, args in ipairs({ two, plain .. " launch.nproc=0" }) do
      local out = dir .. "/mpi" .. tostring(math.random(1e9))
      local o, rc = sh(MPIRUN .. ("build/ztrain %s -q out=%s"):format(args, out))
      assert.are.equal(0, rc, o)
      local s = cjson.decode(read(out .. "/summary.json"))
      assert.are.equal(2, s.world_size)
      assert.are.equal(want, s.param_digest)
    end
  end)

  it("refuses bad values naming the key", function()
    for _, v in ipairs({ "-1", "1.5", "two", "5000" }) do
      local out, rc = sh(("timeout 60 build/ztrain %s launch.nproc=%s out=%s"):format(plain, v, never()))
      assert.are.equal(1, rc, out)
      assert.matches("launch.nproc must be", out, 1, true)
      assert.are.equal(1, count(out, "ztrain:"), out)
    end
    local bad = recipe("bad_type", '  launch = { nproc = "two" },\n')
    local nv = never()
    local out, rc = sh(("timeout 60 build/ztrain %s out=%s"):format(bad, nv))
    assert.are.equal(1, rc, out)
    assert.matches('recipe key "launch.nproc" must be a number', out, 1, true)
    assert.is_nil(io.open(nv .. "/summary.json"))
  end)

  it("says a broken recipe's own error once, before any rank starts", function()
    local broken = dir .. "/broken.lua"
    write(broken, "return { launch = { nproc = 2 }, train = { steps = 1 },\n")
    for _, args in ipairs({ broken, "--nproc 2 " .. broken }) do
      local out, rc = sh(("timeout 60 build/ztrain %s out=%s"):format(args, never()))
      assert.are.equal(1, rc, out)
      assert.are.equal(1, count(out, "cannot load recipe " .. broken), out)
      assert.is_nil(out:find("mpirun", 1, true), out)     -- no job was started
    end
    -- under a launcher every rank fails alike: rank 0 alone says it
    local out, rc = sh(MPIRUN .. ("build/ztrain %s out=%s"):format(broken, never()))
    assert.are_not.equal(0, rc, out)
    assert.are.equal(1, count(out, "cannot load recipe " .. broken), out)
  end)

  it("runs the recipe file once to find the count, then once per rank", function()
    -- a recipe with a side effect: each run of the file appends a line
    local log = dir .. "/loads.txt"
    local counted = dir .. "/counted.lua"
    write(counted, ("local f = io.open(%q, 'a'); f:write('x\\n'); f:close()\nreturn {\n%s}\n")
                   :format(log, BODY))
    local function loads()
      local f = io.open(log); if not f then return 0 end
      local n = count(f:read("*a"), "x"); f:close(); os.remove(log); return n
    end
    train(counted)
    assert.are.equal(1, loads())                       -- one rank: read once in all
    train(counted .. " launch.nproc=2")
    assert.are.equal(3, loads())                       -- the starter, then 2 ranks
  end)

  it("leaves --script and -e alone", function()
    local script = dir .. "/size.lua"
    write(script, 'print("size=" .. zt.comm.world().size .. " arg=" .. tostring(arg[1]))\n')
    local out, rc = sh(("timeout 60 build/ztrain --script %s %s"):format(script, two))
    assert.are.equal(0, rc, out)
    assert.matches("size=1 arg=" .. two, out, 1, true)
    out, rc = sh([[timeout 60 build/ztrain -e 'print("size=" .. zt.comm.world().size)']])
    assert.are.equal(0, rc, out)
    assert.matches("size=1", out, 1, true)
  end)

  it("zt.train runs on the current world and refuses a recipe asking for more ranks", function()
    -- needs zt.train (lua/ztrain/init.lua) to call launch.check_world(..., "session")
    local out, rc = sh(("timeout 60 build/ztrain -e 'zt.train(%q, { \"out=%s\" })'"):format(two, never()))
    assert.are.equal(1, rc, out)
    assert.matches("asks for launch.nproc = 2 rank(s), but this session's world has 1", out, 1, true)
    assert.is_nil(out:find("mpirun", 1, true), out)
    out, rc = sh(("timeout 60 build/ztrain -e 'zt.train(%q, { \"launch.nproc=0\", \"out=%s/ok\" }, { quiet = true })'")
                 :format(two, dir))
    assert.are.equal(0, rc, out)
    assert.are.equal(1, cjson.decode(read(dir .. "/ok/summary.json")).world_size)
  end)
end)

-- Launching across hosts (--hostfile, job/hosts.lua), at the unit level:
-- no namespaces, no mpirun. spec/e2e/multihost_spec.lua runs it for real.
describe("launch across hosts: the hostfile and mpirun's arguments", function()
  local hosts = require "ztrain.job.hosts"
  local launch = require "ztrain.job.launch"
  local tmp
  setup(function() tmp = util.tmpdir() end)
  teardown(function() util.rm(tmp) end)

  it("reads an Open MPI hostfile: slots (1 when not given), comments, a host named twice", function()
    local h = assert(hosts.parse("# cluster\nnodeA slots=2\n\n  nodeB   # one slot\nnodeA slots=3 max_slots=8\n", "F"))
    assert.are.same({ { host = "nodeA", slots = 5 }, { host = "nodeB", slots = 1 } }, h)
  end)

  it("refuses a hostfile that is missing, empty, malformed or has too few slots, naming the file", function()
    local _, err = hosts.check(tmp .. "/none", 2)
    assert.matches("hostfile .*/none does not exist; give an Open MPI hostfile: one line per host, `HOST slots=N`", err)
    assert.matches("`HOST slots=N` (tools/netcluster.sh hostfile prints one for the test cluster on this machine)",
                   err, 1, true)
    _, err = hosts.check(tmp, 2)
    assert.matches("hostfile " .. tmp .. " is a directory, not a file; give an Open MPI hostfile: one line per host",
                   err, 1, true)
    write(tmp .. "/empty", "# nothing\n\n")
    _, err = hosts.check(tmp .. "/empty", 2)
    assert.matches("hostfile .*/empty names no host: write one line per host", err)
    write(tmp .. "/bad", "a slots=two\n")
    _, err = hosts.check(tmp .. "/bad", 1)
    assert.matches("hostfile .*/bad line 1: slots=two is not a whole number >= 1; write one line per host", err)
    write(tmp .. "/two", "a slots=1\nb slots=1\n")
    _, err = hosts.check(tmp .. "/two", 3)
    assert.matches("hostfile .*/two has 2 slot%(s%) on 2 host%(s%), fewer than the 3 rank%(s%) asked for: " ..
                   "add slots %(HOST slots=N%), or ask for 2 rank%(s%) at most", err)
    local h, slots = hosts.check(tmp .. "/two", 0)
    assert.are.equal(2, #h); assert.are.equal(2, slots)
  end)

  it("refuses lines Open MPI would not take, naming the file, the line and the fix", function()
    local function refused(text, want)
      local h, err = hosts.parse(text, "F")
      assert.is_nil(h, text)
      assert.matches(want, err)
      assert.matches("write one line per host, `HOST slots=N`", err)
    end
    refused("slots=2\n", "hostfile F line 1: a line starts with the host's name, not slots=2;")
    refused("nodeA slots=1\n=x\n", "hostfile F line 2: a line starts with the host's name, not =x;")
    refused("nodeA slot=4\n", "hostfile F line 1: slot=4 is not a setting Open MPI takes %(slots=N, max_slots=N%);")
    refused("nodeA 4\n", "hostfile F line 1: 4 is not a setting Open MPI takes")
    refused("nodeA slots = 2\n", "hostfile F line 1: slots is not a setting Open MPI takes")
    refused("nodeA max_slots=x\n", "hostfile F line 1: max_slots=x is not a whole number >= 1")
    -- a Lua file (a recipe given by mistake) never reaches mpirun
    refused("-- a recipe\nreturn { model = { size = 'gpt2-tiny' } }\n",
            "hostfile F line 1: a line starts with the host's name, not %-%-;")
    refused("return { model = { size = 'gpt2-tiny' } }\n", "hostfile F line 1: { is not a setting Open MPI takes")
    refused("local x = 1\n", "hostfile F line 1: x is not a setting")
    local h = assert(hosts.parse("n-1.example.org slots=2 max-slots=4\n10.0.0.2 max_slots=3\n", "F"))
    assert.are.same({ { host = "n-1.example.org", slots = 2 }, { host = "10.0.0.2", slots = 1 } }, h)
  end)

  it("the command line: --hostfile and extra words before the program; ssh hosts get no thread count", function()
    write(tmp .. "/real", "node-a-not-a-namespace slots=4\n")
    local cmd = assert(launch.command(2, "ztrain", { "r.lua" }, { hostfile = tmp .. "/real",
                                                                 mpirun_args = { "--mca", "btl_tcp_if_include", "eth0" } }))
    local line = table.concat(cmd, " ")
    assert.matches("^mpirun %-np 2 .*%-%-hostfile " .. tmp:gsub("%p", "%%%0") .. "/real %-%-mca btl_tcp_if_include eth0 ztrain r%.lua$", line)
    assert.is_nil(line:find("ZTRAIN_DEFAULT_THREADS", 1, true))    -- a remote host shares its own cores
    assert.is_nil(line:find("netns_agent", 1, true))               -- ssh, as mpirun does
    local here = table.concat(assert(launch.command(2, "ztrain", {})), " ")
    assert.matches("ZTRAIN_DEFAULT_THREADS=%d+", here)             -- local ranks: cores / N
    local _, err = launch.command(3, "ztrain", {}, { hostfile = tmp .. "/two" })
    assert.matches("fewer than the 3 rank", err)
  end)

  it("refuses a hostfile that mixes the test cluster's namespace hosts with other hosts", function()
    -- namespaces stood in for: no root needed
    local is_netns, netns_subnet = hosts.is_netns, hosts.netns_subnet
    hosts.is_netns = function(h) return h:match("^ztq%d$") ~= nil end
    hosts.netns_subnet = function() return "10.213.9.0/24" end
    local errs = {}
    for _, text in ipairs({ "ztq0\nnodeB\n", "nodeB\nztq0\n" }) do
      write(tmp .. "/mixed", text)
      local w, err = hosts.args({ hostfile = tmp .. "/mixed", nproc = 2 })
      errs[#errs + 1] = w and "(accepted)" or err
    end
    write(tmp .. "/ns", "ztq0\nztq1\n")
    local w = hosts.args({ hostfile = tmp .. "/ns", nproc = 2 })
    hosts.is_netns, hosts.netns_subnet = is_netns, netns_subnet
    for _, err in ipairs(errs) do
      assert.matches("hostfile .*/mixed mixes hosts of the test cluster on this machine %(ztq0%) with other " ..
                     "hosts %(nodeB%): a launch reaches either namespaces %(tools/netcluster%.sh hostfile%) or " ..
                     "real hosts, not both", err)
    end
    assert.matches("netns_agent", table.concat(assert(w), " "))
  end)

  it("--hostfile without a recipe to run is refused, not ignored; --help says what --nproc means with it", function()
    for _, rest in ipairs({ "-e 'print(1)'", "--script /dev/null", "recipes/dp.lua --script /dev/null" }) do
      local o, rc = sh("build/ztrain --hostfile /nonexistent " .. rest)
      assert.are.equal(1, rc, o)
      assert.matches("ztrain: %-%-hostfile launches a recipe across hosts %(ztrain %-%-hostfile FILE RECIPE%.lua%); " ..
                     "%-e and %-%-script run on this machine %(ztrain %-%-nproc N for ranks here%)", o)
    end
    local o, rc = sh("build/ztrain --hostfile /nonexistent </dev/null")          -- the REPL
    assert.are.equal(1, rc, o)
    assert.matches("ztrain: %-%-hostfile runs a recipe across hosts; the multi%-rank REPL runs on this machine", o)
    local help = sh("build/ztrain --help")
    assert.matches("%-%-nproc N      run N ranks %(on this machine; across the hosts of %-%-hostfile", help)
  end)

  it("$ZTRAIN_MPIRUN_ARGS: words split at blanks, quotes keep blanks; an open quote is refused", function()
    assert.are.same({ "--mca", "x", "a b", "c d" }, hosts.split([[--mca x 'a b' "c d"]]))
    assert.are.same({}, hosts.split(nil))
    local w, err = hosts.split("--mca 'x")
    assert.is_nil(w); assert.matches("ZTRAIN_MPIRUN_ARGS has an unclosed ' quote", err)
  end)

  it("a host's network from its interface address", function()
    assert.are.equal("10.213.0.0/24", hosts.network("10.213.0.7/24"))
    assert.are.equal("10.213.128.0/17", hosts.network("10.213.200.7/17"))
    assert.is_nil(hosts.network("fe80::1/64"))
  end)

  it("a launch across hosts has started when every rank noted itself; else says which hosts have none", function()
    local ranks = { [10] = { rank = 0, host = "h0" }, [11] = { host = "h0" }, [12] = { host = "h1" } }
    local ok, missing = hosts.started(ranks, 2)
    assert.is_false(ok)
    assert.are.equal(1, missing.count)
    assert.matches("none on host h1: Open MPI starts ranks once every host's daemon has called back", missing.hosts)
    ranks[13] = { rank = 1, host = "h1" }
    assert.is_true(hosts.started(ranks, 2))
  end)

  it("reads how a job failed from mpirun's stderr, one exit status per failure", function()
    local dead = launch.dead_rank
    assert.are.equal(5, hosts.failure("ztrain: rank 0: comm.timeout: all_reduce #3 on the world (2 ranks), " ..
                                      "4096 bytes, has waited 3.0 s for its peers (comm.timeout = 3 s):", dead).status)
    assert.are.equal(5, hosts.failure("ztrain: rank 1: zt_comm_watch timeout: barrier has waited 2.0 s; " ..
                                      "ending the job", dead).status)
    assert.are.equal(1, hosts.failure("Remote daemon: [[7769,0],2] on node ztx1\n", dead).status)
    assert.are.equal("ztx1", hosts.lost_host("  HNP daemon   : [[7769,0],0] on node vm\n  Remote daemon: [[7769,0],2] on node ztx1\n"))
    assert.are.equal(3, hosts.failure("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 3.", dead).status)
    assert.are.equal(137, hosts.failure("mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).", dead).status)
    assert.is_nil(hosts.failure("step 3 loss 5.1", dead))
  end)
end)
