-- ztrain.launch: `ztrain --nproc N ...` (or a recipe's launch.nproc) starts
-- N local ranks through Open MPI's mpirun, which runs this same program in
-- each. Works as root, oversubscribes when N exceeds the cores, and gives
-- each rank cores / N threads unless the recipe sets device.threads.
local ffi = require "ffi"
local libc = require "ztrain.libc"
local bit = require "bit"

local M = {}

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- CPUs this process may run on: the count of its affinity mask (taskset,
-- cpusets, mpirun --bind-to), else the online CPUs.
local function affinity_cores()
  local bytes = 128                          -- 1024 CPUs; grown while EINVAL
  while bytes <= 65536 do
    local mask = ffi.new("uint8_t[?]", bytes)
    if libc.sched_getaffinity(0, bytes, mask) == 0 then
      local n = 0
      for i = 0, bytes - 1 do
        local b = mask[i]
        while b ~= 0 do n = n + bit.band(b, 1); b = bit.rshift(b, 1) end
      end
      return n
    end
    if ffi.errno() ~= libc.EINVAL then break end
    bytes = bytes * 2
  end
  return tonumber(libc.sysconf(libc.SC_NPROCESSORS_ONLN))
end

-- quota_cores(quota, period) -> CPUs a CFS quota of `quota` us per `period` us
-- allows, rounded up (1.5 CPUs of time keep 2 threads busy part of the time);
-- nil when unlimited (quota "max" or < 0) or unreadable.
function M.quota_cores(quota, period)
  quota, period = tonumber(quota), tonumber(period)
  if not quota or not period or quota <= 0 or period <= 0 then return nil end
  return math.max(1, math.ceil(quota / period))
end

-- parse_cpu_max(text) -> CPUs from a cgroup v2 cpu.max ("max 100000" or
-- "200000 100000"), or nil when unlimited.
function M.parse_cpu_max(text)
  local q, p = (text or ""):match("^%s*(%S+)%s+(%d+)")
  if not q or q == "max" then return nil end
  return M.quota_cores(q, p)
end

local function min(a, b) if not a then return b end; if not b then return a end; return math.min(a, b) end

-- The cgroup directories of this process that may hold a CPU quota: for
-- cgroup v2 and the v1 "cpu" controller, the mount joined with the path in
-- /proc/self/cgroup, then each parent up to the mount (a parent's quota
-- limits its children too). The texts of /proc/self/cgroup and
-- /proc/self/mountinfo may be given (specs). -> list of { dir =, v2 = bool }
function M.cgroup_dirs(cgroup_text, mountinfo_text)
  cgroup_text = cgroup_text or read_file("/proc/self/cgroup") or ""
  mountinfo_text = mountinfo_text or read_file("/proc/self/mountinfo") or ""
  local paths = {}                                   -- "v2" | "cpu" -> path
  for line in cgroup_text:gmatch("[^\n]+") do
    local id, ctrls, path = line:match("^(%d+):([^:]*):(.*)$")
    if id == "0" and ctrls == "" then paths.v2 = path end
    for c in (ctrls or ""):gmatch("[^,]+") do if c == "cpu" then paths.cpu = path end end
  end
  local dirs = {}
  for line in mountinfo_text:gmatch("[^\n]+") do
    -- id parent dev root mountpoint opts ... - fstype source superopts
    local root, mnt, fstype, super = line:match("^%S+ %S+ %S+ (%S+) (%S+) .- %- (%S+) %S+ (%S+)")
    local kind
    if fstype == "cgroup2" then kind = "v2"
    elseif fstype == "cgroup" then
      for o in super:gmatch("[^,]+") do if o == "cpu" then kind = "cpu" end end
    end
    local path = kind and paths[kind]
    if path then
      -- inside a cgroup namespace the mount's root is a prefix of the path
      if root ~= "/" and path:sub(1, #root) == root then path = path:sub(#root + 1) end
      local rel = path
      while true do
        dirs[#dirs + 1] = { dir = mnt .. (rel == "/" and "" or rel), v2 = kind == "v2" }
        if rel == "/" or rel == "" then break end
        rel = rel:match("^(.*)/[^/]*$")
        if rel == "" then rel = "/" end
      end
    end
  end
  if #dirs == 0 then               -- no /proc: the usual mounts
    dirs = { { dir = "/sys/fs/cgroup", v2 = true }, { dir = "/sys/fs/cgroup/cpu", v2 = false },
             { dir = "/sys/fs/cgroup/cpu,cpuacct", v2 = false } }
  end
  return dirs
end

-- CPUs the cgroup quota allows (the smallest along the hierarchy), nil if none.
local function cgroup_cores()
  local n
  for _, d in ipairs(M.cgroup_dirs()) do
    if d.v2 then
      n = min(n, M.parse_cpu_max(read_file(d.dir .. "/cpu.max")))
    else
      n = min(n, M.quota_cores(read_file(d.dir .. "/cpu.cfs_quota_us"),
                               read_file(d.dir .. "/cpu.cfs_period_us")))
    end
  end
  return n
end

-- cores() -> CPUs this process can use: the smaller of its affinity mask's
-- count and its cgroup CPU quota, at least 1. Threads beyond it only
-- time-slice (a container limited to 2 CPUs on a 64-core host sees 64 online).
function M.cores()
  return math.max(1, min(affinity_cores(), cgroup_cores()) or 1)
end

-- Ranks of this job on this machine, from the launcher's environment
-- (Open MPI, MPICH/Hydra, PMIx, Slurm); 1 when none says.
function M.local_ranks()
  for _, v in ipairs({ "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE",
                       "SLURM_NTASKS_PER_NODE" }) do
    local n = tonumber((os.getenv(v) or ""):match("^%d+"))
    if n and n >= 1 then return n end
  end
  return 1
end

-- The mpirun command line for N ranks running `program args...`.
function M.command(n, program, args)
  local threads = math.max(1, math.floor(M.cores() / n))
  local cmd = { "mpirun", "-np", tostring(n), "--oversubscribe", "--bind-to", "none",
                "-x", "ZTRAIN_DEFAULT_THREADS=" .. threads, "-x", "ZTRAIN_HOME",
                "-x", "ZTRAIN_TTY=" .. (libc.isatty(1) == 1 and "1" or "0"),
                "-x", "ZTRAIN_COMM=mpi" }
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

-- Replace this process with mpirun. Returns only on failure (nil, err).
function M.exec(n, program, args)
  local cmd = M.command(n, program, args)
  -- Open MPI refuses root unless told; a container's root is the usual case.
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0)
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0)
  libc.setenv("ZTRAIN_HOME", rawget(_G, "ZTRAIN_HOME") or require("ztrain.ffi").home, 0)
  local argv = ffi.new("char *[?]", #cmd + 1)
  local keep = {}
  for i, a in ipairs(cmd) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    argv[i - 1] = keep[i]
  end
  argv[#cmd] = nil
  io.stdout:flush(); io.stderr:flush()
  libc.execvp("mpirun", argv)
  return nil, "cannot run mpirun (" .. ffi.string(libc.strerror(ffi.errno())) ..
              "): install Open MPI (make deps) or start the ranks with your own launcher"
end

return M
