-- ztrain.job.cleanup: what a job leaves behind, removed after it. Each rank
-- notes who it is in the job's directory (job/registry.lua); after mpirun
-- ends the launcher (job/launch.lua) kills any process of the job left
-- behind and removes the swap files of ranks killed without exit handlers,
-- and a launcher removes what the job of a launcher that died left.
local libc = require "ztrain.core.libc"
local fs = require "ztrain.util.fs"
local registry = require "ztrain.job.registry"

local M = {}
-- the paths matching pattern; none on no match or a read error
local function glob(pattern) return fs.glob(pattern) or {} end

-- gone(pid) -> true once pid has ended: no such process, or a zombie (a
-- rank mpirun left unreaped is adopted by the launcher, its subreaper, and
-- waits as a zombie until reap_adopted: it writes nothing any more)
local function gone(pid)
  if libc.kill(pid, 0) ~= 0 then return true end
  local stat = fs.read_file(("/proc/%d/stat"):format(pid)) or ""
  local state = stat:match("%) (%a)")
  return state == "Z" or state == "X"
end
M.gone = gone

-- Is pid alive and one of this job's processes (its environment names the
-- job directory: a recycled pid is never killed)?
local function ours(pid, dir)
  if gone(pid) then return false end
  local env = fs.read_file(("/proc/%d/environ"):format(pid)) or ""
  return env:find("\0ZTRAIN_JOB=" .. dir .. "\0", 1, true) ~= nil
      or env:sub(1, 12 + #dir) == "ZTRAIN_JOB=" .. dir .. "\0"
end

-- remove_swap(nvme_dir, pid[, wait_s]) -> files removed: the swap files a
-- dead rank (pid) left in its engine directory NVME/ztrain-aio.HOST.PID.N,
-- when no process holds the directory's owner lock (runtime/aio.c's rule).
-- wait_s: how long to wait for the lock of a rank that is still exiting (it
-- holds the lock until its last descriptor closes); default 0.
function M.remove_swap(nvme, pid, wait_s)
  local removed = 0
  for _, d in ipairs(glob(("%s/ztrain-aio.*.%d.*"):format(nvme, pid))) do
    local fd = libc.open(d .. "/owner", libc.O_RDONLY + libc.O_CLOEXEC)
    local locked = fd >= 0 and libc.flock(fd, libc.LOCK_EX + libc.LOCK_NB) == 0
    local t = os.time() + (wait_s or 0)
    while fd >= 0 and not locked and os.time() <= t do
      libc.poll(nil, 0, 20)
      locked = libc.flock(fd, libc.LOCK_EX + libc.LOCK_NB) == 0
    end
    if locked then
      for _, f in ipairs(glob(d .. "/swap.*")) do
        if f:match("/swap%.%d+$") and libc.unlink(f) == 0 then removed = removed + 1 end
      end
      libc.unlink(d .. "/.probe")
      libc.unlink(d .. "/owner")
      libc.rmdir(d)                  -- fails, harmlessly, if anything else is in it
    end
    if fd >= 0 then libc.close(fd) end
  end
  return removed
end

-- job_pids(dir) -> pids of live processes, other than this one, whose
-- environment names job directory `dir` (every process mpirun started,
-- through any launch agent, inherits ZTRAIN_JOB)
function M.job_pids(dir)
  local out, me = {}, libc.getpid()
  for _, path in ipairs(glob("/proc/[0-9]*")) do
    local p = tonumber(path:match("(%d+)$"))
    if p and p ~= me and ours(p, dir) then out[#out + 1] = p end
  end
  table.sort(out)
  return out
end

-- file_id(path) -> "device:inode" of the file, or nil
local function file_id(path)
  local st = libc.stat_t()
  if libc.stat(path, st) ~= 0 then return nil end
  return tostring(st.st_dev) .. ":" .. tostring(st.st_ino)
end

-- pid_host(pid) -> the network namespace a process runs in, by name (the
-- test cluster's hosts: /run/netns/NAME), or nil when it is this one's
function M.pid_host(pid)
  local them = file_id(("/proc/%d/ns/net"):format(pid))
  if not them or them == file_id("/proc/self/ns/net") then return nil end
  for _, path in ipairs(glob("/run/netns/*")) do
    if file_id(path) == them then return path:match("([^/]+)$") end
  end
  return nil
end

-- remove_ckpt_tmp(root): the temporary directories of checkpoints a job
-- ended at once left in root (.step-N.tmp/ with its files, .latest.tmp);
-- after the job no rank writes them (train/checkpoint/write.lua's layout)
function M.remove_ckpt_tmp(root)
  for _, d in ipairs(glob(root .. "/.step-[0-9]*.tmp")) do
    for _, f in ipairs(glob(d .. "/*")) do libc.unlink(f) end
    libc.rmdir(d)
  end
  libc.unlink(root .. "/.latest.tmp")
end

-- remove_mpirun_session(pid): the session directory of an mpirun killed
-- outright ($TMPDIR/ompi.HOST.UID/pid.PID, Open MPI 4.1's), which it
-- would have removed itself
function M.remove_mpirun_session(pid)
  local tmpdir = os.getenv("TMPDIR") or "/tmp"
  for _, d in ipairs(glob(("%s/ompi.*/pid.%d"):format(tmpdir, pid))) do
    if d:match("^/[%w_/%.%-]*/ompi%.[%w_%.%-]+/pid%.%d+$") then os.execute("rm -rf '" .. d .. "'") end
  end
end

-- cleanup_job(dir, ranks): after a job, kill its ranks still alive (said on
-- stderr), remove the swap files and temporary checkpoint directories its
-- dead ranks left, and the registry.
function M.cleanup_job(job, ranks)
  ranks = ranks or registry.read(job)
  for p, r in pairs(ranks) do
    if ours(p, job) then
      local what = r.rank and ("rank " .. r.rank) or
                   (fs.read_file(("/proc/%d/comm"):format(p)) or "process"):gsub("%s+$", "")
      io.stderr:write(("ztrain: %s (pid %d)%s outlived mpirun; killed it\n"):format(what, p,
                      r.host and (" on host " .. r.host) or ""))
      libc.kill(p, libc.SIGKILL)
      -- its swap directory's lock goes when it is gone: wait for that (2 s at most)
      local t = os.time() + 2
      while not gone(p) and os.time() <= t do libc.poll(nil, 0, 20) end
    end
  end
  -- then any other process of the job (its environment names the job):
  -- Open MPI's daemons on hosts mpirun lost touch with, and their children.
  -- A daemon may still be ending after a good run: 2 s for that first.
  local left, t = M.job_pids(job), os.time() + 2
  while #left > 0 and os.time() <= t do
    libc.poll(nil, 0, 100)
    left = M.job_pids(job)
  end
  for _, p in ipairs(left) do
    local comm = (fs.read_file(("/proc/%d/comm"):format(p)) or "?"):gsub("%s+$", "")
    local host = M.pid_host(p)
    io.stderr:write(("ztrain: %s (pid %d)%s outlived mpirun; killed it\n"):format(comm, p,
                    host and (" on host " .. host) or ""))
    libc.kill(p, libc.SIGKILL)
  end
  for p, r in pairs(ranks) do
    -- an Open MPI daemon killed above leaves its session directory
    -- (tools/netns_agent notes it); the pattern keeps rm to those
    if r.session and r.session:match("^/[%w_/%.%-]*/ompi%.[%w_%.%-]+%.%d+/jf%.%d+$")
       and gone(p) then
      os.execute("rm -rf '" .. r.session .. "'")
      libc.rmdir((r.session:match("^(.*)/jf%.%d+$")))   -- its host's directory, when empty
    end
    for _, d in ipairs(r.nvme) do M.remove_swap(d, p, 2) end
    if gone(p) then for _, d in ipairs(r.ckpt or {}) do M.remove_ckpt_tmp(d) end end
    os.remove(("%s/%d"):format(job, p))
  end
  os.remove(job .. "/lock")
  libc.rmdir(job)
end

-- Jobs whose launcher died (SIGKILL: no clean-up ran) are cleaned by the
-- next launcher: a job directory whose lock no process holds.
function M.clean_dead_jobs(tmpdir)
  for _, d in ipairs(glob(tmpdir .. "/ztrain-job.*")) do
    local fd = libc.open(d .. "/lock", libc.O_RDONLY + libc.O_CLOEXEC)
    if fd >= 0 then
      if libc.flock(fd, libc.LOCK_EX + libc.LOCK_NB) == 0 then M.cleanup_job(d) end
      libc.close(fd)
    end
  end
end

return M
