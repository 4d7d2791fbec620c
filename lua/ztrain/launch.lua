-- ztrain.launch: `ztrain --nproc N ...` starts N local ranks through Open
-- MPI's mpirun, which runs this same program in each. Works as root,
-- oversubscribes when N exceeds the cores, and gives each rank cores / N
-- threads unless the recipe sets device.threads.
local ffi = require "ffi"

ffi.cdef [[
int execvp(const char *file, char *const argv[]);
long sysconf(int name);
int setenv(const char *name, const char *value, int overwrite);
int isatty(int fd);
char *strerror(int errnum);
]]
local SC_NPROCESSORS_ONLN = 84

local M = {}

function M.cores() return tonumber(ffi.C.sysconf(SC_NPROCESSORS_ONLN)) end

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
                "-x", "ZTRAIN_TTY=" .. (ffi.C.isatty(1) == 1 and "1" or "0"),
                "-x", "ZTRAIN_COMM=mpi" }
  cmd[#cmd + 1] = program
  for _, a in ipairs(args) do cmd[#cmd + 1] = a end
  return cmd
end

-- Replace this process with mpirun. Returns only on failure (nil, err).
function M.exec(n, program, args)
  local cmd = M.command(n, program, args)
  -- Open MPI refuses root unless told; a container's root is the usual case.
  ffi.C.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0)
  ffi.C.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0)
  ffi.C.setenv("ZTRAIN_HOME", rawget(_G, "ZTRAIN_HOME") or require("ztrain.ffi").home, 0)
  local argv = ffi.new("char *[?]", #cmd + 1)
  local keep = {}
  for i, a in ipairs(cmd) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    argv[i - 1] = keep[i]
  end
  argv[#cmd] = nil
  io.stdout:flush(); io.stderr:flush()
  ffi.C.execvp("mpirun", argv)
  return nil, "cannot run mpirun (" .. ffi.string(ffi.C.strerror(ffi.errno())) ..
              "): install Open MPI (make deps) or start the ranks with your own launcher"
end

return M
