-- spec/e2e/faults_spec.lua -- kill -9 of one rank of a `ztrain --nproc 2` job.
--
-- Under dp, zero3, zero3_offload, infinity (swap files in a temp
-- offload.nvme_path) and a 1F1B pipeline, a random rank is killed at a random
-- step (random but seeded: the seed is printed, ZTRAIN_FAULT_SEED=N repeats
-- it). The job must exit non-zero within 10 s of the kill, the launcher must
-- name the dead rank and its pid, no process of the job may be left, and no
-- swap file may be left. Then a rank is killed while checkpoints are being
-- written (train.ckpt_every=1, the kill aimed at a .step-N.tmp directory
-- appearing), several times: `latest` must still name a complete checkpoint,
-- which a fresh run resumes from (every block's checksum is checked on read).
-- And the launcher itself killed: mpirun and the ranks must end, and the
-- next launch must remove the swap files nobody could clean.
local ffi = require "ffi"
local util = require "helpers.util"
local cjson = require "cjson"
local libc = require "ztrain.core.libc"

pcall(ffi.cdef, [[
typedef struct { long tv_sec, tv_nsec; } faults_timespec;
int clock_gettime(int clk, faults_timespec *ts);
int usleep(unsigned int us);
]])
local ts = ffi.new("faults_timespec")
local function now() ffi.C.clock_gettime(1, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end
local function sleep(s) ffi.C.usleep(s * 1e6) end

local ROOT = os.getenv("PWD")
local SEED = tonumber(os.getenv("ZTRAIN_FAULT_SEED") or "") or os.time()
print(("faults_spec: seed %d (ZTRAIN_FAULT_SEED=%d repeats this run)"):format(SEED, SEED))
math.randomseed(SEED)

local COMMON = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.eval_every=0 " ..
               "sample.tokens=0 train.log_every=1 train.steps=100000"

local function glob(pattern)
  local g = libc.glob_t()
  local out = {}
  if libc.glob(pattern, 0, nil, g) == 0 then
    for i = 0, tonumber(g.gl_pathc) - 1 do out[#out + 1] = ffi.string(g.gl_pathv[i]) end
  end
  libc.globfree(g)
  return out
end

-- pids whose command line holds `mark` (the job's unique out= path)
local function job_pids(mark)
  local pids = {}
  for _, d in ipairs(glob("/proc/[0-9]*/cmdline")) do
    local f = io.open(d, "rb")
    local cl = f and f:read("*a")
    if f then f:close() end
    if cl and cl:find(mark, 1, true) then pids[#pids + 1] = tonumber(d:match("/proc/(%d+)/")) end
  end
  return pids
end

-- the pid of rank `rank` of the job (a rank has OMPI_COMM_WORLD_RANK; the
-- launcher and mpirun do not)
local function rank_pid(mark, rank)
  for _, pid in ipairs(job_pids(mark)) do
    local f = io.open(("/proc/%d/environ"):format(pid), "rb")
    local env = f and f:read("*a") or ""
    if f then f:close() end
    if ("\0" .. env):find("\0OMPI_COMM_WORLD_RANK=" .. rank .. "\0", 1, true) then return pid end
  end
end

-- wait_for(secs, fn) -> fn's first true value, or nil after secs
local function wait_for(secs, fn, step)
  local deadline = now() + secs
  repeat
    local v = fn()
    if v then return v end
    sleep(step or 0.05)
  until now() > deadline
end

-- start(recipe, extra, out) -> job: the launcher in the background; job.rc()
-- is its exit status once it ended (nil before), job.log() its output
local function start(recipe, extra, out, env)
  local rcfile, logfile = out .. ".rc", out .. ".log"
  os.execute(("cd %s && (%s build/ztrain --nproc 2 %s %s %s out=%s >%s 2>&1; echo $? >%s) &")
             :format(ROOT, env or "", recipe, COMMON, extra or "", out, logfile, rcfile))
  return {
    out = out,
    rc = function()
      local f = io.open(rcfile)
      local s = f and f:read("*a")
      if f then f:close() end
      return s and tonumber(s:match("%d+"))
    end,
    log = function() local f = io.open(logfile); local s = f and f:read("*a") or ""; if f then f:close() end; return s end,
    clean = function() util.rm(out); util.rm(rcfile); util.rm(logfile) end,
  }
end

-- the last step in OUT/metrics.jsonl (0 before the first)
local function last_step(out)
  local f = io.open(out .. "/metrics.jsonl")
  if not f then return 0 end
  local s = f:read("*a"); f:close()
  local n = 0
  for step in s:gmatch('"step":(%d+)') do n = math.max(n, tonumber(step)) end
  return n
end

-- Kill rank `victim` with SIGKILL; -> seconds until the job ended, its status.
local function kill_and_wait(job, victim, pid)
  assert.is_true(libc.kill(pid, libc.SIGKILL) == 0, "kill " .. pid)
  local t0 = now()
  local rc = wait_for(30, job.rc, 0.02)
  return now() - t0, rc
end

local CASES = {
  { "dp", "recipes/dp.lua" },
  { "zero3", "recipes/zero3.lua" },
  { "zero3_offload", "recipes/zero3_offload.lua" },
  { "infinity", "recipes/infinity.lua", nvme = true },
  { "pipeline 1F1B", "recipes/pipeline_1f1b.lua" },
}

describe("kill -9 of a rank under --nproc 2", function()
  for _, case in ipairs(CASES) do
    local name, recipe = case[1], case[2]
    local victim, at_step = math.random(0, 1), math.random(1, 3)
    it(("%s: rank %d killed after step %d -> exits non-zero within 10 s, names it, leaves nothing")
       :format(name, victim, at_step), function()
      local out = util.outdir() .. "-faults"
      local nvme = case.nvme and util.tmpdir()
      local job = start(recipe, nvme and ("offload.nvme_path=" .. nvme) or "", out)
      finally(function()
        for _, p in ipairs(job_pids(out)) do libc.kill(p, libc.SIGKILL) end
        job.clean(); if nvme then util.rm(nvme) end
      end)
      assert.is_truthy(wait_for(120, function() return last_step(out) >= at_step or job.rc() end),
                       "no step " .. at_step .. " within 120 s: " .. job.log())
      assert.is_nil(job.rc(), job.log())
      local pid = rank_pid(out, victim)
      assert.is_number(pid, "no rank " .. victim .. " process")
      if nvme then assert.is_true(#glob(nvme .. "/ztrain-aio.*/swap.*") > 0, "no swap files to clean") end
      local secs, rc = kill_and_wait(job, victim, pid)
      print(("faults_spec: %s: rank %d (pid %d) killed at step >= %d; job ended in %.2f s, status %s")
            :format(name, victim, pid, at_step, secs, tostring(rc)))
      assert.is_number(rc, "still running 30 s after the kill")
      assert.is_true(secs < 10, ("ended %.1f s after the kill"):format(secs))
      assert.are.equal(137, rc, job.log())
      assert.matches(("ztrain: rank %d (pid %d) was killed by signal 9 (SIGKILL); the job was ended (exit status 137)")
                     :format(victim, pid), job.log(), 1, true)
      -- (the spec's own wrapper shell may take a moment to exit after writing the status)
      wait_for(2, function() return #job_pids(out) == 0 end)
      assert.are.same({}, job_pids(out))
      if nvme then
        assert.are.same({}, glob(nvme .. "/ztrain-aio.*/swap.*"))
        assert.are.same({}, glob(nvme .. "/ztrain-aio.*"))
      end
      assert.are.same({}, glob("/tmp/ztrain-job.*/" .. pid))   -- the launcher's registry went too
    end)
  end
end)

describe("the launcher's reading of mpirun's report", function()
  local launch = require "ztrain.job.launch"
  it("finds the rank and signal (Open MPI 4.1 says PID 0; 5.x's prterun the real one)", function()
    assert.are.same({ 1, 9 }, { launch.dead_rank("...\nmpirun noticed that process rank 1 with PID 0 on node vm " ..
                                                 "exited on signal 9 (Killed).\n---") })
    assert.are.same({ 12, 11 }, { launch.dead_rank("prterun noticed that process rank 12 with PID 4242 on node " ..
                                                   "n1 exited on signal 11 (Segmentation fault).") })
    assert.are.same({}, { launch.dead_rank("Primary job terminated normally, but 1 process returned a non-zero exit code.") })
    assert.are.equal("ztrain: rank 3 (pid 77) was killed by signal 6 (SIGABRT); the job was ended (exit status 134)",
                     launch.death_message(3, 77, 6, 134))
  end)
end)

describe("kill -9 of the launcher itself", function()
  it("ends mpirun and the ranks; the next launch removes their swap files", function()
    local out, nvme, tmp = util.outdir() .. "-faults", util.tmpdir(), util.tmpdir()
    local out2 = out .. "-next"
    -- a private TMPDIR: the job registry is the only ztrain-job.* in it
    local job = start("recipes/infinity.lua", "offload.nvme_path=" .. nvme, out, "TMPDIR=" .. tmp)
    finally(function()
      for _, p in ipairs(job_pids(out)) do libc.kill(p, libc.SIGKILL) end
      job.clean(); util.rm(out2); util.rm(nvme); util.rm(tmp)
    end)
    assert.is_truthy(wait_for(120, function() return last_step(out) >= 1 or job.rc() end), job.log())
    local launcher
    for _, pid in ipairs(job_pids(out)) do
      local f = io.open(("/proc/%d/cmdline"):format(pid), "rb")
      local cl = f and f:read("*a") or ""
      if f then f:close() end
      if cl:match("^build/ztrain%z") then
        local e = io.open(("/proc/%d/environ"):format(pid), "rb")
        local env = e and e:read("*a") or ""
        if e then e:close() end
        if not env:find("OMPI_COMM_WORLD_RANK=", 1, true) then launcher = pid end
      end
    end
    assert.is_number(launcher, "no launcher process")
    assert.are.equal(1, #glob(tmp .. "/ztrain-job.*"))
    assert.is_true(libc.kill(launcher, libc.SIGKILL) == 0)
    local t0 = now()
    assert.is_truthy(wait_for(10, function() return #job_pids(out) == 0 end), "ranks outlived the launcher")
    print(("faults_spec: launcher (pid %d) killed; mpirun and the ranks gone in %.2f s"):format(launcher, now() - t0))
    -- mpirun passes the launcher's end on as SIGTERM: the ranks may stop
    -- and remove their swap files themselves, or be killed first; either
    -- way, after the next launch nothing is left
    local log, rc = util.sh(("cd %s && TMPDIR=%s timeout 120 build/ztrain --nproc 2 recipes/dp.lua %s train.steps=1 out=%s")
                            :format(ROOT, tmp, COMMON, out2))
    assert.are.equal(0, rc, log)
    assert.are.same({}, glob(nvme .. "/ztrain-aio.*"))
    assert.are.same({}, glob(tmp .. "/ztrain-job.*"))
  end)
end)

describe("kill -9 during a checkpoint write", function()
  local ROUNDS = 3
  it(("leaves `latest` naming a complete checkpoint that resumes (%d rounds)"):format(ROUNDS), function()
    local mid_write = 0
    for round = 1, ROUNDS do
      local out = util.outdir() .. "-ckfault"
      local job = start("recipes/dp.lua", "train.ckpt_every=1", out)
      finally(function()
        for _, p in ipairs(job_pids(out)) do libc.kill(p, libc.SIGKILL) end
        job.clean()
      end)
      local ck = out .. "/checkpoints"
      -- a first complete checkpoint, then a random number of writes later,
      -- the moment a new one's temporary directory appears
      assert.is_truthy(wait_for(120, function() return io.open(ck .. "/latest") or job.rc() end), job.log())
      local skip = math.random(0, 2)
      local tmp
      for _ = 0, skip do
        local seen = {}
        for _, d in ipairs(glob(ck .. "/.step-*.tmp")) do seen[d] = true end
        tmp = wait_for(60, function()
          if job.rc() then return "ended" end
          for _, d in ipairs(glob(ck .. "/.step-*.tmp")) do if not seen[d] then return d end end
        end, 0.002)
      end
      assert.is_truthy(tmp, "no checkpoint write seen within 60 s")
      assert.are_not.equal("ended", tmp, job.log())
      local victim = math.random(0, 1)
      local pid = rank_pid(out, victim)
      assert.is_number(pid)
      local secs, rc = kill_and_wait(job, victim, pid)
      assert.is_true(secs < 10)
      assert.are.equal(137, rc, job.log())
      local left = #glob(ck .. "/.step-*.tmp") > 0          -- the kill cut a write short
      if left then mid_write = mid_write + 1 end
      local latest = util.read(ck .. "/latest"):match("^(step%-(%d+))%s*$")
      local step = tonumber(util.read(ck .. "/latest"):match("step%-(%d+)"))
      print(("faults_spec: checkpoint round %d: rank %d killed as %s appeared (%s); latest = %s")
            :format(round, victim, tmp:match("[^/]+$"), left and "write cut short" or "write had finished",
                    tostring(latest)))
      assert.is_string(latest)
      -- complete: the manifest and every rank file it lists, at its size
      local man = cjson.decode(util.read(ck .. "/" .. latest .. "/manifest.json"))
      assert.are.equal(step, man.step)
      for _, f in ipairs(man.files) do
        local fh = assert(io.open(ck .. "/" .. latest .. "/" .. f.bin, "rb"))
        assert.are.equal(f.bytes, fh:seek("end")); fh:close()
      end
      -- valid: a fresh run resumes from it (reading verifies every block's SHA-256)
      local log, rrc = util.sh(("cd %s && timeout 120 build/ztrain --nproc 2 recipes/dp.lua %s train.steps=%d " ..
                                "train.ckpt_every=0 resume=latest out=%s"):format(ROOT, COMMON, step + 1, out))
      assert.are.equal(0, rrc, log)
      local s = cjson.decode(util.read(out .. "/summary.json"))
      assert.are.equal(step + 1, s.steps)
      job.clean()
    end
    print(("faults_spec: %d of %d checkpoint kills cut a write short"):format(mid_write, ROUNDS))
  end)
end)
