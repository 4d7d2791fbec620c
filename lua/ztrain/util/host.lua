-- ztrain.util.host: facts about this machine that several layers ask for:
-- its usable cores (affinity mask and cgroup quota), the ranks a launcher
-- put on it, the threads a rank should use, and MemAvailable.
local ffi = require "ffi"
local bit = require "bit"
local libc = require "ztrain.core.libc"
local fs = require "ztrain.util.fs"

local M = {}

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
  cgroup_text = cgroup_text or fs.read_file("/proc/self/cgroup") or ""
  mountinfo_text = mountinfo_text or fs.read_file("/proc/self/mountinfo") or ""
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
      n = min(n, M.parse_cpu_max(fs.read_file(d.dir .. "/cpu.max")))
    else
      n = min(n, M.quota_cores(fs.read_file(d.dir .. "/cpu.cfs_quota_us"),
                               fs.read_file(d.dir .. "/cpu.cfs_period_us")))
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

-- load_average() -> the machine's 1-minute load average, or nil
M.load_average = libc.load_average

-- Ranks of this job on this machine, from the launcher's environment
-- (Open MPI, MPICH/Hydra, PMIx, Slurm's srun); 1 when none says.
function M.local_ranks()
  for _, v in ipairs({ "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE",
                       "SLURM_NTASKS_PER_NODE" }) do
    local n = tonumber((os.getenv(v) or ""):match("^%d+"))
    if n and n >= 1 then return n end
  end
  -- srun sets no local size; its step's tasks per node are a list
  local n = M.slurm_tasks_on_node(os.getenv("SLURM_STEP_TASKS_PER_NODE") or os.getenv("SLURM_TASKS_PER_NODE"),
                                  tonumber(os.getenv("SLURM_NODEID") or "0"))
  return n or 1
end

-- rank_threads() -> threads for a rank that a plain mpirun/srun started:
-- srun's --cpus-per-task when given (the CPUs Slurm gave this task, bound
-- to them or not), else this machine's usable cores shared between its ranks.
function M.rank_threads()
  local cores = M.cores()
  local per_task = tonumber(os.getenv("SLURM_CPUS_PER_TASK") or "")
  if per_task and per_task >= 1 then return math.min(per_task, cores) end
  return math.max(1, math.floor(cores / M.local_ranks()))
end

-- slurm_tasks_on_node("2(x3),1", nodeid) -> tasks on node `nodeid` (0-based)
-- of a Slurm tasks-per-node list, or nil.
function M.slurm_tasks_on_node(list, nodeid)
  if not list or not nodeid then return nil end
  local i = 0
  for item in list:gmatch("[^,]+") do
    local n, rep = item:match("^(%d+)%(x(%d+)%)$")
    n, rep = tonumber(n or item:match("^(%d+)$")), tonumber(rep) or 1
    if not n then return nil end
    if nodeid < i + rep then return n >= 1 and n or nil end
    i = i + rep
  end
  return nil
end


-- mem_available() -> bytes of MemAvailable (/proc/meminfo), or nil where
-- the kernel gives none.
function M.mem_available()
  local f = io.open("/proc/meminfo")
  if not f then return nil end
  local avail
  for line in f:lines() do
    local kb = line:match("^MemAvailable:%s+(%d+) kB")
    if kb then avail = tonumber(kb) * 1024 end
  end
  f:close()
  return avail
end

-- hostname() -> this machine's name (/proc/sys/kernel/hostname), or "?"
function M.hostname()
  return ((fs.read_file("/proc/sys/kernel/hostname") or "?"):gsub("%s+$", ""))
end

-- cpu_name() -> the CPU's model name (/proc/cpuinfo), or nil
function M.cpu_name()
  local text = fs.read_file("/proc/cpuinfo") or ""
  local name = text:match("model name%s*:%s*([^\n]+)")
  return name and (name:gsub("%s+$", "")) or nil
end

-- git_commit(dir) -> the commit checked out at dir (a git work tree: its
-- .git/HEAD, a branch's ref file or packed-refs), or nil: read from the
-- files, so a machine without git, or a copy without .git, gives nil
function M.git_commit(dir)
  local git = dir .. "/.git"
  local head = fs.read_file(git .. "/HEAD")
  if not head then
    -- a worktree or submodule: .git is a file naming the real directory
    local link = (fs.read_file(git) or ""):match("^gitdir:%s*(%S+)")
    if not link then return nil end
    git = link:sub(1, 1) == "/" and link or (dir .. "/" .. link)
    head = fs.read_file(git .. "/HEAD")
    if not head then return nil end
  end
  local sha = head:match("^(%x+)%s*$")
  if sha and #sha >= 40 then return sha end
  local ref = head:match("^ref:%s*(%S+)")
  if not ref then return nil end
  -- a worktree's branch refs live in the main repository (its commondir)
  local common = (fs.read_file(git .. "/commondir") or ""):match("^(%S+)")
  common = common and (common:sub(1, 1) == "/" and common or (git .. "/" .. common)) or git
  for _, base in ipairs({ git, common }) do
    local direct = (fs.read_file(base .. "/" .. ref) or ""):match("^(%x+)")
    if direct and #direct >= 40 then return direct end
  end
  local packed = fs.read_file(common .. "/packed-refs") or ""
  for line in packed:gmatch("[^\n]+") do
    local h, name = line:match("^(%x+) (%S+)$")
    if name == ref then return h end
  end
  return nil
end

return M
