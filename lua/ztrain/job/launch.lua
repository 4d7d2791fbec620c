-- ztrain.job.launch: `ztrain --nproc N ...` (or a recipe's launch.nproc) starts
-- N local ranks through Open MPI's mpirun, which runs this same program in
-- each. Works as root, oversubscribes when N exceeds the cores, and gives
-- each rank cores / N threads unless the recipe sets device.threads.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"
local bit = require "bit"
local fs = require "ztrain.util.fs"
local host = require "ztrain.util.host"
local registry = require "ztrain.job.registry"
local hosts = require "ztrain.job.hosts"
local cleanup = require "ztrain.job.cleanup"
local mpi_text = require "ztrain.job.mpi_text"
local zffi = require "ztrain.core.ffi"

local M = {}

-- Cores, cgroup quotas and ranks per machine: util/host.lua (the trainer
-- asks it too); the names stay here for the launcher's callers and specs.
M.quota_cores, M.parse_cpu_max, M.cgroup_dirs = host.quota_cores, host.parse_cpu_max, host.cgroup_dirs
M.cores, M.local_ranks, M.rank_threads = host.cores, host.local_ranks, host.rank_threads
M.slurm_tasks_on_node = host.slurm_tasks_on_node

-- The most ranks one machine starts: its usable cores x RANKS_PER_CORE
-- (the test suite runs 4 ranks on 2 cores; 999 ranks on 2 cores took
-- minutes to start and 14 s to end), unless --oversubscribe lifts it.
M.RANKS_PER_CORE = 8

-- check_nproc(n) -> true | nil, err: n local ranks within the bound
function M.check_nproc(n)
  local cores = M.cores()
  local most = cores * M.RANKS_PER_CORE
  if n <= most then return true end
  return nil, ("%d ranks are more than this machine runs (%d: %d usable core(s) x %d); ask for %d at most, " ..
               "or pass --oversubscribe to start them anyway"):format(n, most, cores, M.RANKS_PER_CORE, most)
end

-- command(n, program, args, o) -> the mpirun command line for N ranks
-- running `program args...` | nil, err. o (optional) = { hostfile =,
-- mpirun_args = { ... } }: a launch across hosts and extra mpirun words
-- (job/hosts.lua; $ZTRAIN_MPIRUN_ARGS too). Ranks on this machine (local,
-- or the test cluster's namespace hosts) get cores / N threads each; on
-- other hosts each rank takes its host's share (rank_threads).
function M.command(n, program, args, o)
  o = o or {}
  local extra, local_only = hosts.args({
    hostfile = o.hostfile, nproc = n, mpirun_args = o.mpirun_args, env = os.getenv("ZTRAIN_MPIRUN_ARGS") })
  if not extra then return nil, local_only end
  local threads = math.max(1, math.floor(M.cores() / n))
  -- odls_base_sigkill_timeout 0: ending a job (the launcher killed, a rank
  -- dead, MPI_Abort, a rank's non-zero exit) Open MPI 4.1 sends each rank
  -- SIGCONT, sleeps this many seconds, SIGTERM, sleeps again, SIGKILL: 2 s
  -- by default, a rank's first SIGTERM being only a stop request (cli.lua).
  -- Not when the user's words set it (Open MPI refuses a parameter twice)
  local cmd = { "mpirun", "-np", tostring(n), "--oversubscribe", "--bind-to", "none",
                "-x", "ZTRAIN_HOME",
                "-x", "ZTRAIN_TTY=" .. (libc.isatty(1) == 1 and "1" or "0"),
                "-x", "ZTRAIN_COMM=mpi" }
  if not table.concat(extra, " "):find("odls_base_sigkill_timeout", 1, true) then
    for _, w in ipairs({ "--mca", "odls_base_sigkill_timeout", "0" }) do cmd[#cmd + 1] = w end
  end
  if local_only then
    cmd[#cmd + 1] = "-x"; cmd[#cmd + 1] = "ZTRAIN_DEFAULT_THREADS=" .. threads
  end
  for _, w in ipairs(extra) do cmd[#cmd + 1] = w end
  cmd[#cmd + 1] = program
  for _, a in ipairs(args) do cmd[#cmd + 1] = a end
  return cmd
end

-- check_world(nproc, size, where) -> true | nil, message. A recipe's
-- launch.nproc (0: any) against the `size` ranks it is about to run on.
-- `where` says who made that world: "launcher" (mpirun/srun started this
-- process) or "session" (zt.train in a running program, which never starts
-- ranks). The message names both numbers and what to do.
function M.check_world(nproc, size, where)
  if nproc == 0 or nproc == size then return true end
  if where == "session" then
    return nil, ("the recipe asks for launch.nproc = %d rank(s), but this session's world has %d; " ..
                 "zt.train runs on the current world and starts no ranks: run `ztrain RECIPE.lua` " ..
                 "from a shell (it starts them), or pass the override launch.nproc=0 to train on " ..
                 "this world"):format(nproc, size)
  end
  return nil, ("the recipe asks for launch.nproc = %d rank(s), but the launcher started %d; start " ..
               "%d (mpirun -np %d), or override launch.nproc=%d (launch.nproc=0: whatever the " ..
               "launcher gives)"):format(nproc, size, nproc, nproc, size)
end

-- ---- the job registry ---------------------------------------------------------------
-- Each rank notes who it is in the job's directory (job/registry.lua);
-- after mpirun ends the launcher reads the notes to name a rank that died,
-- kill any rank left behind and remove the swap files of ranks killed
-- without exit handlers. The names stay here for the launcher's callers.
M.note, M.read_job = registry.note, registry.read
-- (the killing and removing: job/cleanup.lua)
M.remove_swap, M.job_pids, M.pid_host = cleanup.remove_swap, cleanup.job_pids, cleanup.pid_host
M.cleanup_job = cleanup.cleanup_job

-- launched_rank() -> this process's rank from the launcher's environment, or nil.
function M.launched_rank()
  for _, v in ipairs({ "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID" }) do
    local n = tonumber(os.getenv(v) or "")
    if n then return n end
  end
end

local SIGNAMES = { [1] = "SIGHUP", [2] = "SIGINT", [3] = "SIGQUIT", [4] = "SIGILL", [6] = "SIGABRT",
                   [7] = "SIGBUS", [8] = "SIGFPE", [9] = "SIGKILL", [11] = "SIGSEGV", [13] = "SIGPIPE",
                   [15] = "SIGTERM" }

-- dead_rank(tail) -> rank, signal from Open MPI's report in mpirun's stderr
-- ("mpirun noticed that process rank 1 with PID 0 on node vm exited on
-- signal 9 (Killed)."; its PID is 0 in Open MPI 4.1, hence the registry).
function M.dead_rank(tail)
  local rank, sig = tail:match("process rank (%d+) with PID %d+ on node %S+ exited on signal (%d+)")
  return tonumber(rank), tonumber(sig)
end

-- death_message(rank, pid, sig, status) -> the launcher's line naming a dead rank.
function M.death_message(rank, pid, sig, status)
  return ("ztrain: rank %d (pid %s) was killed by signal %d (%s); the job was ended (exit status %d)")
    :format(rank, pid and tostring(pid) or "?", sig, SIGNAMES[sig] or "signal " .. sig, status)
end

local PR_SET_CHILD_SUBREAPER = 36

-- this machine's name (a test cluster's hosts have their own)
local hostname = host.hostname
local now = os.time                            -- whole seconds serve a grace period

local function cstrings(list)
  local argv = ffi.new("char *[?]", #list + 1)
  local keep = {}
  for i, a in ipairs(list) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    argv[i - 1] = keep[i]
  end
  argv[#list] = nil
  return argv, keep
end

local function in_path(name)
  for d in (os.getenv("PATH") or ""):gmatch("[^:]+") do
    if libc.file_kind(d .. "/" .. name) == "file" then return true end
  end
  return false
end

-- M.run's steps follow, in its order. The environment mpirun and the ranks inherit:
-- Open MPI refuses root unless told (a container's root is the usual case).
local function set_launch_env()
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0)
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0)
  libc.setenv("ZTRAIN_HOME", rawget(_G, "ZTRAIN_HOME") or zffi.home, 0)
end

-- open_job() -> a new job directory under $TMPDIR, its lock's fd | nil, err. The lock
-- is held for the launcher's life (not by mpirun: close-on-exec), so a later
-- launcher can tell this job's launcher died (cleanup.clean_dead_jobs).
local function open_job()
  local tmpdir = os.getenv("TMPDIR") or "/tmp"
  cleanup.clean_dead_jobs(tmpdir)
  local tmpl = ffi.new("char[?]", #tmpdir + 32, tmpdir .. "/ztrain-job.XXXXXX")
  if libc.mkdtemp(tmpl) == nil then
    return nil, "cannot make the job directory: " .. ffi.string(libc.strerror(ffi.errno()))
  end
  local job = ffi.string(tmpl)
  -- held for the launcher's life (not by mpirun: close-on-exec), so a later
  -- launcher can tell this job's launcher died. Locked under another name,
  -- then renamed: a launcher starting meanwhile (clean_dead_jobs) finds
  -- "lock" only once it is held -- created and locked in two steps, an
  -- unlocked "lock" would look dead to it, and its flock would make ours fail.
  local lockfd = libc.open(job .. "/lock.new", libc.O_RDONLY + libc.O_CREAT + libc.O_CLOEXEC, 420)
  if lockfd < 0 or libc.flock(lockfd, libc.LOCK_EX + libc.LOCK_NB) ~= 0
     or not os.rename(job .. "/lock.new", job .. "/lock") then
    return nil, "cannot lock the job directory " .. job .. ": " .. ffi.string(libc.strerror(ffi.errno()))
  end
  return job, lockfd
end

-- name_job(cmd, job): every process of the job inherits ZTRAIN_JOB (job_pids)
local function name_job(cmd, job)
  libc.setenv("ZTRAIN_JOB", job, 1)
  table.insert(cmd, 4, "-x"); table.insert(cmd, 5, "ZTRAIN_JOB")
  -- mpirun runs in a process group of its own (start_mpirun): reading the
  -- terminal from there would stop it (SIGTTIN), so it forwards no terminal input
  if libc.isatty(0) == 1 then table.insert(cmd, 4, "--stdin"); table.insert(cmd, 5, "none") end
end

-- block_stops() -> set, old (the mask before). Signals to the launcher are taken
-- with sigtimedwait (forward_stops). mpirun and the ranks run in a process group of
-- their own, so a Ctrl-C from the terminal reaches the launcher alone (mpirun would
-- end the job on it): the first SIGINT/SIGTERM/SIGHUP becomes SIGUSR1, which mpirun
-- forwards to every rank -- a graceful stop after the step in flight, with a
-- checkpoint and summary.json (cli.lua, run.lua) -- the second SIGTERM.
local function block_stops()
  local set, old = libc.sigset_t(), libc.sigset_t()
  libc.sigemptyset(set)
  for _, s in ipairs({ libc.SIGINT, libc.SIGTERM, libc.SIGHUP }) do libc.sigaddset(set, s) end
  libc.sigprocmask(libc.SIG_BLOCK, set, old)
  return set, old
end

-- exec_mpirun(argv, fds, old): the forked child, stderr into the pipe; never returns
local function exec_mpirun(argv, fds, old)
  libc.dup2(fds[1], 2)
  libc.close(fds[0]); libc.close(fds[1])
  libc.sigprocmask(libc.SIG_SETMASK, old, nil)
  libc.prctl(libc.PR_SET_PDEATHSIG, libc.SIGTERM, 0, 0, 0)  -- launcher gone: end the job
  libc.setpgid(0, 0)                                        -- no terminal signals
  libc.execvp("mpirun", argv)
  local msg = "ztrain: cannot run mpirun (" .. ffi.string(libc.strerror(ffi.errno())) ..
              "): install Open MPI (make deps) or start the ranks with your own launcher\n"
  libc.write(2, msg, #msg)
  libc._exit(127)
end

-- start_mpirun(cmd) -> { pid, fd (its stderr), set, old (block_stops) } | nil, err
local function start_mpirun(cmd)
  local argv, keep = cstrings(cmd)
  local fds = ffi.new("int[2]")
  if libc.pipe(fds) ~= 0 then return nil, "pipe: " .. ffi.string(libc.strerror(ffi.errno())) end
  local set, old = block_stops()
  io.stdout:flush(); io.stderr:flush()
  -- the launcher adopts what mpirun leaves when it dies (Open MPI's
  -- daemons), so it can end and reap them: no orphans, no zombies.
  -- Only the CLI calls launch.run (its process does nothing else): being
  -- a subreaper, and reap_adopted's waitpid(-1), would take other children
  -- of an embedding program too
  libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
  local pid = libc.fork()
  if pid == 0 then exec_mpirun(argv, fds, old) end
  libc.close(fds[1])
  if pid < 0 then
    libc.close(fds[0]); libc.sigprocmask(libc.SIG_SETMASK, old, nil)
    return nil, "fork: " .. ffi.string(libc.strerror(ffi.errno()))
  end
  local _ = keep                               -- argv's strings live until the fork
  return { pid = pid, fd = fds[0], set = set, old = old }
end

-- new_watch(mp, n, job, o) -> the state of the watch over mpirun (mp: start_mpirun)
-- running n ranks of job. Unset: drain_until (output is read until then once mpirun
-- is reaped), failed (the job failed), kill_at (when to end mpirun), killed (it was).
local function new_watch(mp, n, job, o)
  local w = { pid = mp.pid, fd = mp.fd, set = mp.set, old = mp.old, n = n, job = job,
              pfd = libc.pollfd_t(1), buf = ffi.new("char[?]", 65536),
              info = ffi.new("int32_t[32]"),   -- siginfo_t: signo, errno, code, ...
              zero = libc.timespec_t(), status = ffi.new("int[1]"),
              tail = "", open_fd = true, reaped = false, stops = 0, grace = hosts.abort_grace(),
              partial = "", mpi = "",
              across = o and o.hostfile ~= nil, next_look = 0, start_failed = false }
  w.pfd[0].fd, w.pfd[0].events = w.fd, libc.POLLIN
  -- every rank must start (note itself) within the start timeout: across
  -- hosts mpirun waits for ever for a daemon on a host it cannot reach, and
  -- here a machine asked for too many ranks takes minutes to start them
  w.start_by = now() + hosts.start_timeout()
  return w
end

-- relay_output(w): mpirun's output (0.1 s wait at most) to stderr, its last 8 KiB in w.tail
local function relay_output(w)
  if not w.open_fd then
    libc.poll(nil, 0, 100)
  elseif libc.poll(w.pfd, 1, 100) > 0 then
    local got = libc.read(w.fd, w.buf, 65536)
    if got > 0 then
      local text = ffi.string(w.buf, got)
      mpi_text.relay(w, text)
      w.tail = (w.tail .. text):sub(-8192)
    else
      w.open_fd = false                        -- EOF: mpirun and every writer are gone
    end
  end
end

-- stop_now(w, sig): the second stop signal ends the job at once. mpirun is
-- not sent it (Open MPI 4.1 crashes in PMIx_Finalize on a signal while its
-- abort is in progress): each rank gets SIGTERM, its second stop request,
-- which kills it (cli.lua: hard_after(2)); mpirun then ends the job. What
-- is left after 1 s is killed. The launcher exits with 128 + sig.
local function stop_now(w, sig)
  if w.hard then return end
  w.hard, w.hard_by = sig, libc.now() + 1
  io.stderr:write("ztrain: stopping now (a second stop signal): ending every rank\n")
  for p, r in pairs(M.read_job(w.job)) do
    if r.rank then libc.kill(p, libc.SIGTERM) end
  end
end

-- forward_stops(w): the first stop signal becomes mpirun's SIGUSR1 (block_stops);
-- a second ends the job at once (stop_now)
local function forward_stops(w)
  while true do
    local sig = libc.sigtimedwait(w.set, w.info, w.zero)
    if sig <= 0 then break end
    w.stops = w.stops + 1
    if w.stops == 1 then
      io.stderr:write("ztrain: stopping after the step in flight (a checkpoint and summary.json follow); " ..
                      "Ctrl-C again to stop at once\n")
      libc.kill(w.pid, libc.SIGUSR1)
    else
      stop_now(w, sig)
    end
  end
  if w.hard_by and not w.reaped and libc.now() >= w.hard_by then
    -- the ranks or mpirun did not end within 1 s: mpirun's group, then the ranks (cleanup_job)
    w.hard_by, w.hard_killed = nil, true
    libc.kill(-w.pid, libc.SIGKILL)
    libc.kill(w.pid, libc.SIGKILL)
  end
end

-- check_started(w): once a second until every rank has noted itself
local function check_started(w)
  if not (w.start_by and not w.reaped and not w.killed and now() >= w.next_look) then return end
  w.next_look = now() + 1
  local started, missing = hosts.started(M.read_job(w.job), w.n)
  if started then w.start_by = nil
  elseif now() >= w.start_by then
    io.stderr:write(("ztrain: only %d of %d rank(s) started within %g s%s; ending the job " ..
                     "(ZTRAIN_START_TIMEOUT sets the wait)\n"):format(missing.count, w.n,
                     hosts.start_timeout(), missing.hosts))
    w.failed, w.kill_at, w.start_failed = { status = 1 }, now(), true
  end
end

-- end_failed_job(w): a failed job that mpirun does not end (a host it
-- cannot reach): after the grace period, end mpirun and its process group
-- (across hosts only: on this machine mpirun ends its jobs itself)
local function end_failed_job(w)
  if w.across and not w.reaped and not w.failed then
    w.failed = hosts.failure(w.tail, M.dead_rank)
    if w.failed then w.kill_at = now() + w.grace end
  end
  if not w.reaped and w.kill_at and now() >= w.kill_at then
    -- SIGKILL: mpirun already aborting ignores SIGTERM, or crashes on it;
    -- what it leaves behind is the launcher's to clean (cleanup_job)
    if not w.start_failed then
      io.stderr:write(("ztrain: mpirun did not end within %g s of the job's failure (a host it cannot " ..
                       "reach?); ending it\n"):format(w.grace))
    end
    libc.kill(-w.pid, libc.SIGKILL)
    libc.kill(w.pid, libc.SIGKILL)
    w.killed, w.kill_at = true, nil
  end
end

-- reaped(w) -> true once mpirun is reaped and its output read to the end
local function reaped(w)
  if not w.reaped and libc.waitpid(w.pid, w.status, libc.WNOHANG) == w.pid then
    w.reaped = true
    w.drain_until = os.time() + 2
  end
  return w.reaped and (not w.open_fd or os.time() > w.drain_until)
end

-- watch(w): until mpirun is reaped; then its pipe closed, the signal mask restored
local function watch(w)
  repeat
    relay_output(w)
    forward_stops(w)
    check_started(w)
    end_failed_job(w)
  until reaped(w)
  libc.close(w.fd)
  libc.sigprocmask(libc.SIG_SETMASK, w.old, nil)
end

-- exit_code(w) -> mpirun's exit status (128 + signal when it was killed); mpirun
-- ended by the launcher: the status the failure asked for (and whenever its stderr
-- says how it failed: one status per failure). The first failure seen decides: a
-- host removed is its ranks' watchdog firing too (1, not 5), if mpirun is slow.
local function exit_code(w)
  local st = w.status[0]
  local code = bit.band(st, 0x7f) == 0 and bit.band(bit.rshift(st, 8), 0xff) or 128 + bit.band(st, 0x7f)
  if w.hard then code = 128 + w.hard                 -- stopped at once (stop_now)
  elseif w.killed then code = w.failed.status
  elseif w.across and code ~= 0 then
    local f = w.failed or hosts.failure(w.tail, M.dead_rank)
    if f then code = f.status end
  end
  return code
end

-- tell_failures(w, code) -> the job's registry, after saying what mpirun's output
-- tells: a lost host, a rank killed by a signal, ranks the watchdog found unreachable
local function tell_failures(w, code)
  local tail = w.tail
  local lost = hosts.lost_host(tail)
  if lost then
    io.stderr:write(("ztrain: lost host %s (its daemon stopped answering mpirun: the host died, " ..
                     "or its link is down); the job was ended (exit status %d)\n"):format(lost, code))
  end
  local ranks = M.read_job(w.job)
  local rank, sig = M.dead_rank(tail)
  if rank and sig and not w.hard then              -- not the ranks stop_now ended
    local rpid
    for p, r in pairs(ranks) do if r.rank == rank then rpid = p end end
    io.stderr:write(M.death_message(rank, rpid, sig, code), "\n")
  end
  -- ranks the watchdog found unreachable: say on which host each ran
  local gone = {}
  for r in tail:gmatch("rank (%d+): no answer") do gone[tonumber(r)] = true end
  for p, r in pairs(ranks) do
    if r.rank and gone[r.rank] and r.host and r.host ~= hostname() then
      io.stderr:write(("ztrain: rank %d (pid %d) ran on host %s, which did not answer: the host is down, " ..
                       "its link is, or the rank is stuck\n"):format(r.rank, p, r.host))
    end
  end
  return ranks
end

-- reap_adopted(status): what was adopted and has ended (cleanup_job killed the job's
-- rest), 2 s at most; any child: fine in the CLI's process, the only caller
local function reap_adopted(status)
  local deadline = now() + 2
  while true do
    local r = libc.waitpid(-1, status, libc.WNOHANG)
    if r < 0 then break end                         -- no children left
    if r == 0 then
      if now() > deadline then break end
      libc.poll(nil, 0, 20)
    end
  end
end

-- Start mpirun for N ranks as a child, relay its stderr, and wait for it.
-- Returns mpirun's exit status (128 + signal when it was killed), after
-- naming a rank that died by a signal, killing ranks left behind and
-- removing their swap files; or nil, err when mpirun cannot be started.
function M.run(n, program, args, o)
  local cmd, cerr = M.command(n, program, args, o)
  if not cmd then return nil, cerr end
  if not in_path("mpirun") then
    return nil, "cannot run mpirun (not found in PATH): install Open MPI (make deps) or start " ..
                "the ranks with your own launcher"
  end
  set_launch_env()
  local job, lockfd = open_job()
  if not job then return nil, lockfd end
  name_job(cmd, job)
  local mp, err = start_mpirun(cmd)
  if not mp then return nil, err end
  local w = new_watch(mp, n, job, o)
  watch(w)
  local code = exit_code(w)
  mpi_text.keep(w, M.read_job(job))   -- first: what the launcher says after it is the last word
  M.cleanup_job(job, tell_failures(w, code))
  if w.hard_killed then cleanup.remove_mpirun_session(w.pid) end
  reap_adopted(w.status)
  libc.close(lockfd)
  return code
end

return M
