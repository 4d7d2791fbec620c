-- spec/e2e/slurm_spec.lua -- ztrain under a real Slurm: a single-node cluster on
-- this machine (Debian's slurm-wlm: slurmctld + slurmd, started here with a
-- generated slurm.conf in a temp dir, no munge, private ports) runs
-- `srun --mpi=pmix -n 2 build/ztrain recipes/dp.lua ...` and then the sbatch
-- example (examples/slurm/train.sbatch), which must each give the parameter
-- digest of `ztrain --nproc 2` with the same overrides. The daemons
-- are stopped in a finally, pass or fail. Where Slurm cannot start here (not
-- installed, not root, no PMIx plugin, daemons not up) the spec says why and
-- is pending.
local util = require "helpers.util"
local cjson = require "cjson"

local ROOT = os.getenv("PWD")
local ARGS = "recipes/dp.lua model.size=gpt2-tiny train.steps=3 data.seq_len=32 batch.micro=2 " ..
             "train.eval_every=0 sample.tokens=0 -q"

local function have(prog) return (util.sh("command -v " .. prog)):match("/") ~= nil end

-- slurm.conf for one node called localhost with CPUS cpus, everything in DIR.
-- auth/none + cred/none: no munge daemon (both sides read this file).
local function conf(dir, cpus, port)
  return table.concat({
    "ClusterName=ztspec",
    "SlurmctldHost=localhost",
    "SlurmctldPort=" .. port, "SlurmdPort=" .. (port + 1),
    "AuthType=auth/none", "CredType=cred/none",
    "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
    "MpiDefault=none", "SlurmUser=root", "SlurmdUser=root",
    "StateSaveLocation=" .. dir .. "/state", "SlurmdSpoolDir=" .. dir .. "/spool",
    "SlurmctldPidFile=" .. dir .. "/slurmctld.pid", "SlurmdPidFile=" .. dir .. "/slurmd.pid",
    "SlurmctldLogFile=" .. dir .. "/slurmctld.log", "SlurmdLogFile=" .. dir .. "/slurmd.log",
    "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
    "ReturnToService=2", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
    ("NodeName=localhost CPUs=%d RealMemory=1000 State=UNKNOWN"):format(cpus),
    "PartitionName=ztspec Nodes=localhost Default=YES MaxTime=10 State=UP",
  }, "\n") .. "\n"
end

-- Poll fn() every 0.2 s until it returns true or `secs` pass.
local function wait_for(secs, fn)
  local deadline = os.time() + secs
  repeat
    if fn() then return true end
    util.sh("sleep 0.2")
  until os.time() > deadline
  return false
end

-- pids_of(cmd) -> the pids a pgrep prints, one per line (never 0 or 1:
-- `kill 0` would end this spec's own process group)
local function pids_of(cmd)
  local pids = {}
  for line in (util.sh(cmd)):gmatch("[^\n]+") do
    local pid = tonumber(line:match("^(%d+)$"))
    if pid and pid > 1 then pids[#pids + 1] = pid end
  end
  return pids
end

local Slurm = {}
Slurm.__index = Slurm

-- start() -> a running cluster, or nil, why (one line).
local function start()
  for _, p in ipairs({ "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scancel" }) do
    if not have(p) then return nil, p .. " is not installed (apt-get install slurm-wlm; make deps)" end
  end
  if (util.sh("id -u")):match("^(%d+)") ~= "0" then
    return nil, "not root: slurmd must run as root to start tasks"
  end
  local dir = util.tmpdir()
  util.sh(("mkdir -p %s/state %s/spool"):format(dir, dir))
  local cpus = tonumber((util.sh("slurmd -C")):match("CPUs=(%d+)")) or 2
  -- private ports: a spec run elsewhere on the machine picks others
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
  local port = 20000 + 2 * math.random(0, 4000)
  util.write(dir .. "/slurm.conf", conf(dir, math.max(cpus, 2), port))
  local self = setmetatable({ dir = dir, env = "env SLURM_CONF=" .. dir .. "/slurm.conf " }, Slurm)
  local function bg(cmd, log)
    local out = util.sh(("%s sh -c '%s >%s/%s 2>&1 & echo pid=$!'"):format(self.env, cmd, dir, log))
    return tonumber(out:match("pid=(%d+)"))
  end
  self.ctld = bg("exec slurmctld -D -i", "slurmctld.out")
  self.slurmd = bg("exec slurmd -D -N localhost", "slurmd.out")
  local idle = wait_for(30, function()
    return (util.sh(self.env .. "sinfo -h -n localhost -o %T")):match("^idle") ~= nil
  end)
  if not idle then
    local why = (util.sh("tail -n 1 " .. dir .. "/slurmctld.out " .. dir .. "/slurmd.out")):gsub("%s+", " ")
    self:stop()
    return nil, "slurmctld/slurmd did not show an idle node within 30 s: " .. why
  end
  if not (util.sh(self.env .. "srun --mpi=list")):find("pmix", 1, true) then
    self:stop()
    return nil, "this Slurm has no PMIx plugin (srun --mpi=list), which Open MPI needs"
  end
  return self
end

-- Stop the daemons we started (by pid), then remove the temp dir.
function Slurm:stop()
  util.sh(self.env .. "scancel --full -p ztspec")
  -- slurmd's step daemons (slurmstepd), if a failed step left one
  local steps = {}
  if self.slurmd then
    steps = pids_of("pgrep -P " .. self.slurmd)
  end
  for _, pid in ipairs({ self.slurmd, self.ctld }) do
    if pid then
      util.sh("kill -TERM " .. pid)
      if not wait_for(10, function() return select(2, util.sh("kill -0 " .. pid)) ~= 0 end) then
        util.sh("kill -KILL " .. pid)
      end
    end
  end
  for _, pid in ipairs(steps) do   -- still a slurmstepd: a recycled pid is left alone
    local f = io.open(("/proc/%d/comm"):format(pid))
    if f and f:read("*l") == "slurmstepd" then util.sh("kill -KILL " .. pid) end
    if f then f:close() end
  end
  util.rm(self.dir)
end

local function summary(out)
  return cjson.decode(util.read(out .. "/summary.json"))
end

describe("Slurm", function()
  local slurm, why
  setup(function()
    local ok, s, w = pcall(start)
    if ok then slurm, why = s, w else why = "starting it failed: " .. tostring(s) end
  end)
  -- always, whatever the tests did: the daemons go
  teardown(function() if slurm then slurm:stop() end end)

  it("srun -n 2 trains as ztrain --nproc 2 does (same digest)", function()
    if not slurm then pending("Slurm cannot start here: " .. why) end
    local out_srun, out_mpi = util.outdir(), util.outdir()
    finally(function() util.rm(out_srun); util.rm(out_mpi) end)
    local t0 = os.time()
    local log, rc = util.sh(("cd %s && %s timeout 120 srun --mpi=pmix -n 2 -t 2 build/ztrain %s out=%s")
                            :format(ROOT, slurm.env, ARGS, out_srun))
    assert.are.equal(0, rc, log)
    assert.is_true(os.time() - t0 < 120)
    local s = summary(out_srun)
    assert.are.equal(2, s.world_size, log)
    -- srun sets no local-size variable: the ranks count themselves from
    -- SLURM_STEP_TASKS_PER_NODE and share the cores (2 ranks, 2 cores: 1 each)
    local cores = tonumber((util.sh("nproc")):match("%d+"))
    assert.are.equal(math.max(1, math.floor(cores / 2)), s.threads)

    local mlog, mrc = util.sh(("cd %s && timeout 120 build/ztrain --nproc 2 %s out=%s"):format(ROOT, ARGS, out_mpi))
    assert.are.equal(0, mrc, mlog)
    local m = summary(out_mpi)
    assert.are.equal(64, #s.param_digest)
    assert.are.equal(m.param_digest, s.param_digest)

    -- the sbatch example as a user submits it (its #SBATCH sizes overridden
    -- for this one node): same digest again
    util.rm(out_srun)
    local jlog = slurm.dir .. "/job.log"
    local blog, brc = util.sh(("cd %s && %s ZTRAIN=%s OUT=%s timeout 120 sbatch --wait -N 1 " ..
                               "--ntasks-per-node=2 --cpus-per-task=1 -t 2 -o %s " ..
                               "examples/slurm/train.sbatch recipes/dp.lua %s")
                              :format(ROOT, slurm.env, ROOT, out_srun, jlog, ARGS:gsub("^recipes/dp.lua ", "")))
    assert.are.equal(0, brc, blog .. (io.open(jlog) and util.read(jlog) or ""))
    local b = summary(out_srun)
    assert.are.equal(2, b.world_size)
    assert.are.equal(1, b.threads)                 -- --cpus-per-task=1
    assert.are.equal(m.param_digest, b.param_digest)
  end)

  it("a task killed with SIGKILL ends the step within 10 s, srun names it, nothing is left", function()
    if not slurm then pending("Slurm cannot start here: " .. why) end
    local out = util.outdir() .. "-slurmkill"
    local logf, rcf = out .. ".log", out .. ".rc"
    local function job_pids()       -- every process whose command line holds the unique out=
      -- "[/]tmp/...": the regex does not match the shell that runs pgrep
      return pids_of("pgrep -f -- '[" .. out:sub(1, 1) .. "]" .. out:sub(2) .. "'")
    end
    finally(function()
      for _, pid in ipairs(job_pids()) do util.sh("kill -KILL " .. pid) end
      util.rm(out); util.rm(logf); util.rm(rcf)
    end)
    os.execute(("cd %s && (%s srun --mpi=pmix --kill-on-bad-exit=1 -n 2 -t 2 build/ztrain recipes/dp.lua " ..
                "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.eval_every=0 sample.tokens=0 " ..
                "train.log_every=1 train.steps=100000 out=%s >%s 2>&1; echo $? >%s) &")
               :format(ROOT, slurm.env, out, logf, rcf))
    local function rc() local f = io.open(rcf); local v = f and tonumber(f:read("*a"):match("%d+")); if f then f:close() end; return v end
    assert.is_truthy(wait_for(120, function() return io.open(out .. "/metrics.jsonl") or rc() end), "no step within 120 s")
    assert.is_nil(rc())
    math.randomseed(os.time())
    local victim = math.random(0, 1)
    local pid
    for _, p in ipairs(job_pids()) do
      local f = io.open(("/proc/%d/environ"):format(p), "rb")
      local env = "\0" .. (f and f:read("*a") or "")
      if f then f:close() end
      if env:find("\0PMIX_RANK=" .. victim .. "\0", 1, true) then pid = p end
    end
    assert.is_number(pid, "no task " .. victim)
    local t0 = os.time()
    util.sh("kill -KILL " .. pid)
    assert.is_truthy(wait_for(30, rc), "srun still running 30 s after the kill")
    local secs = os.time() - t0
    assert.is_true(secs <= 10, secs .. " s")
    assert.are_not.equal(0, rc())
    assert.matches(("srun: error: localhost: task %d: Killed"):format(victim), util.read(logf), 1, true)
    assert.is_truthy(wait_for(10, function() return #job_pids() == 0 end), "tasks left after srun ended")
  end)
end)

describe("launch under Slurm (no cluster needed)", function()
  local launch = require "ztrain.job.launch"
  it("reads srun's tasks-per-node list for this node", function()
    assert.are.equal(2, launch.slurm_tasks_on_node("2", 0))
    assert.are.equal(4, launch.slurm_tasks_on_node("4(x3),1", 2))
    assert.are.equal(1, launch.slurm_tasks_on_node("4(x3),1", 3))
    assert.are.equal(3, launch.slurm_tasks_on_node("2,3", 1))
    assert.is_nil(launch.slurm_tasks_on_node("4(x3),1", 4))
    assert.is_nil(launch.slurm_tasks_on_node("bad", 0))
  end)
end)
