-- ztrain.core.libc: every libc function ztrain calls through the FFI, declared once.
--
--   local libc = require "ztrain.core.libc"
--   libc.setenv("NAME", "value", 0)
--   local g = libc.glob_t()                 -- ctypes are fields too
--
-- Returns a table of the C functions under their plain names (not ffi.C
-- itself): each is declared under a private name bound to the libc symbol
-- with an asm label, so a recipe or script that declares `int getpid(void)`
-- or `int mkdir(...)` itself through ffi.cdef never clashes with ztrain
-- ("attempt to redefine"). The cdef runs once per Lua state, however many
-- times the module is loaded (package.loaded cleared, a second path).
--
-- Linux (glibc) only: glob_t's layout and the sysconf/dlopen constants are
-- glibc's.
local ffi = require "ffi"
local bit = require "bit"

-- name -> C declaration with "%s" where the private name goes
local decls = {
  -- environment, processes
  setenv = "int %s(const char *name, const char *value, int overwrite)",
  execvp = "int %s(const char *file, char *const argv[])",
  getpid = "int %s(void)",
  kill = "int %s(int pid, int sig)",
  strerror = "char *%s(int errnum)",
  isatty = "int %s(int fd)",
  -- wall-clock time (CLOCK_REALTIME) for records: metrics lines, summaries
  clock_gettime = "int %s(int clock, ztrain_libc_timespec_t *tp)",
  -- the --nproc launcher: mpirun as a child, its stderr relayed (launch.lua)
  fork = "int %s(void)",
  waitpid = "int %s(int pid, int *status, int options)",
  pipe = "int %s(int fds[2])",
  dup2 = "int %s(int oldfd, int newfd)",
  poll = "int %s(ztrain_libc_pollfd_t *fds, unsigned long nfds, int timeout)",
  read = "int64_t %s(int fd, void *buf, size_t n)",
  write = "int64_t %s(int fd, const void *buf, size_t n)",
  _exit = "void %s(int status)",
  prctl = "int %s(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5)",
  sigemptyset = "int %s(ztrain_libc_sigset_t *set)",
  sigaddset = "int %s(ztrain_libc_sigset_t *set, int sig)",
  sigprocmask = "int %s(int how, const ztrain_libc_sigset_t *set, ztrain_libc_sigset_t *old)",
  sigtimedwait = "int %s(const ztrain_libc_sigset_t *set, void *info, const ztrain_libc_timespec_t *timeout)",
  -- cores: sysconf(_SC_NPROCESSORS_ONLN), the affinity mask (cpu_set_t bytes)
  sysconf = "long %s(int name)",
  sched_getaffinity = "int %s(int pid, size_t cpusetsize, void *mask)",
  -- the runtime library
  dlopen = "void *%s(const char *file, int mode)",
  dlerror = "char *%s(void)",
  -- files
  mkdir = "int %s(const char *path, unsigned int mode)",
  mkdtemp = "char *%s(char *template)",
  symlink = "int %s(const char *target, const char *linkpath)",
  realpath = "char *%s(const char *path, char *resolved)",
  free = "void %s(void *p)",
  glob = "int %s(const char *pattern, int flags, void *errfunc, ztrain_libc_glob_t *pglob)",
  globfree = "void %s(ztrain_libc_glob_t *pglob)",
  -- files (checkpoints: positioned reads and writes, fsync for durability)
  open = "int %s(const char *path, int flags, ...)",
  close = "int %s(int fd)",
  pread = "int64_t %s(int fd, void *buf, size_t n, int64_t off)",
  pwrite = "int64_t %s(int fd, const void *buf, size_t n, int64_t off)",
  fsync = "int %s(int fd)",
  ftruncate = "int %s(int fd, int64_t length)",
  flock = "int %s(int fd, int operation)",
  setpgid = "int %s(int pid, int pgid)",
  stat = "int %s(const char *path, ztrain_libc_stat_t *st)",
  fstat = "int %s(int fd, ztrain_libc_stat_t *st)",
  unlink = "int %s(const char *path)",
  rmdir = "int %s(const char *path)",
  fnmatch = "int %s(const char *pattern, const char *string, int flags)",
  signal = "void *%s(int sig, void *handler)",
  -- the REPL: readline's strings are malloc'd (it frees them), input is
  -- polled (a signal interrupts the wait), the multi-rank front end talks
  -- to mpirun through pipes (poll, pipe, read, write, waitpid: above)
  malloc = "void *%s(size_t n)",
  posix_spawnp = "int %s(int *pid, const char *file, const ztrain_libc_spawn_actions *actions, " ..
                 "const ztrain_libc_spawnattr *attr, char *const argv[], char *const envp[])",
  posix_spawn_file_actions_init = "int %s(ztrain_libc_spawn_actions *a)",
  posix_spawn_file_actions_destroy = "int %s(ztrain_libc_spawn_actions *a)",
  posix_spawn_file_actions_adddup2 = "int %s(ztrain_libc_spawn_actions *a, int fd, int newfd)",
  posix_spawn_file_actions_addclose = "int %s(ztrain_libc_spawn_actions *a, int fd)",
  posix_spawnattr_init = "int %s(ztrain_libc_spawnattr *a)",
  posix_spawnattr_destroy = "int %s(ztrain_libc_spawnattr *a)",
  posix_spawnattr_setflags = "int %s(ztrain_libc_spawnattr *a, short flags)",
  posix_spawnattr_setpgroup = "int %s(ztrain_libc_spawnattr *a, int pgroup)",
  -- the REPL's terminal: keys typed while a call runs survive a Ctrl-C (NOFLSH)
  tcgetattr = "int %s(int fd, ztrain_libc_termios_t *t)",
  tcsetattr = "int %s(int fd, int when, const ztrain_libc_termios_t *t)",
}

local PREFIX = "ztrain_libc_"

-- glibc's glob_t
local types = [[
typedef struct ztrain_libc_glob_t {
  size_t gl_pathc;
  char **gl_pathv;
  size_t gl_offs;
  int gl_flags;
  void *gl_closedir, *gl_readdir, *gl_opendir, *gl_lstat, *gl_stat;
} ztrain_libc_glob_t;
typedef struct ztrain_libc_pollfd_t { int fd; short events, revents; } ztrain_libc_pollfd_t;
typedef struct ztrain_libc_sigset_t { unsigned long val[16]; } ztrain_libc_sigset_t;
typedef struct ztrain_libc_timespec_t { long tv_sec, tv_nsec; } ztrain_libc_timespec_t;
typedef struct ztrain_libc_stat_t {          /* x86_64 struct stat */
  uint64_t st_dev, st_ino, st_nlink;
  uint32_t st_mode, st_uid, st_gid, pad0;
  uint64_t st_rdev;
  int64_t st_size, st_blksize, st_blocks;
  int64_t st_atime, st_atime_ns, st_mtime, st_mtime_ns, st_ctime, st_ctime_ns;
  int64_t reserved[3];
} ztrain_libc_stat_t;
extern char **ztrain_libc_environ __asm__("environ");
/* opaque, glibc's sizes (80 and 336 bytes) rounded up */
typedef struct ztrain_libc_spawn_actions { uint64_t opaque[16]; } ztrain_libc_spawn_actions;
typedef struct ztrain_libc_spawnattr { uint64_t opaque[64]; } ztrain_libc_spawnattr;
typedef struct ztrain_libc_termios_t {       /* glibc's struct termios */
  uint32_t c_iflag, c_oflag, c_cflag, c_lflag;
  uint8_t c_line, c_cc[32];
  uint32_t c_ispeed, c_ospeed;
} ztrain_libc_termios_t;
]]

-- Declared already in this Lua state? (ffi.cdef of a second copy would fail
-- with "attempt to redefine".)
local declared = pcall(ffi.typeof, "ztrain_libc_glob_t")
if not declared then
  local text = { types }
  local names = {}
  for name in pairs(decls) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    text[#text + 1] = decls[name]:format(PREFIX .. name) .. (' __asm__("%s");'):format(name)
  end
  ffi.cdef(table.concat(text, "\n"))
end

local M = {}
for name in pairs(decls) do M[name] = ffi.C[PREFIX .. name] end
M.glob_t = ffi.typeof("ztrain_libc_glob_t")
M.stat_t = ffi.typeof("ztrain_libc_stat_t")
M.pollfd_t = ffi.typeof("ztrain_libc_pollfd_t[?]")
M.sigset_t = ffi.typeof("ztrain_libc_sigset_t")
M.timespec_t = ffi.typeof("ztrain_libc_timespec_t")
M.termios_t = ffi.typeof("ztrain_libc_termios_t")

-- file_kind(path) -> "file", "directory", "FIFO", "socket", "character device",
-- "block device", or nil, errno (stat follows symlinks)
local KINDS = { [0x8000] = "file", [0x4000] = "directory", [0x1000] = "FIFO", [0xC000] = "socket",
                [0x2000] = "character device", [0x6000] = "block device" }
function M.file_kind(path)
  local st = M.stat_t()
  if M.stat(path, st) ~= 0 then return nil, ffi.errno() end
  return KINDS[bit.band(st.st_mode, 0xF000)] or "unknown"
end
M.pollfd = M.pollfd_t
M.spawn_actions = ffi.typeof("ztrain_libc_spawn_actions[1]")
M.spawnattr = ffi.typeof("ztrain_libc_spawnattr[1]")

-- load_average() -> the machine's 1-minute load average (/proc/loadavg:
-- runnable and waiting threads, averaged), or nil where there is none
function M.load_average()
  local f = io.open("/proc/loadavg")
  if not f then return nil end
  local v = tonumber(((f:read("*l") or "")):match("^(%S+)"))
  f:close()
  return v
end

-- now() -> seconds since the epoch, wall clock, to the microsecond
local ts = M.timespec_t()
function M.now()
  M.clock_gettime(0, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- constants (glibc, Linux)
M.SC_NPROCESSORS_ONLN = 84
M.RTLD_NOW, M.RTLD_GLOBAL, M.RTLD_NODELETE = 0x2, 0x100, 0x1000
M.GLOB_MARK, M.GLOB_BRACE, M.GLOB_TILDE = 2, 1024, 4096
M.GLOB_NOSPACE, M.GLOB_ABORTED, M.GLOB_NOMATCH = 1, 2, 3
M.FNM_PATHNAME = 1
M.O_RDWR = 2
M.EINVAL, M.EINTR = 22, 4
M.POLLIN, M.POLLHUP = 0x1, 0x10
M.SIGPIPE, M.SIG_IGN = 13, ffi.cast("void *", 1)
function M.environ() return ffi.C.ztrain_libc_environ end
M.POSIX_SPAWN_SETPGROUP = 0x2
M.O_RDONLY, M.O_WRONLY, M.O_CREAT, M.O_TRUNC, M.O_EXCL = 0, 1, 0x40, 0x200, 0x80
M.O_DIRECTORY, M.O_CLOEXEC = 0x10000, 0x80000
M.LOCK_EX, M.LOCK_NB = 2, 4
M.POLLIN, M.POLLHUP = 1, 0x10
M.WNOHANG = 1
M.SIGINT, M.SIGKILL, M.SIGTERM, M.SIGHUP, M.SIGUSR1 = 2, 9, 15, 1, 10
M.SIG_BLOCK, M.SIG_SETMASK = 0, 2
M.SI_USER = 0                      -- siginfo si_code: sent by kill(), not by the tty
M.PR_SET_PDEATHSIG = 1
M.TCSANOW, M.NOFLSH = 0, 0x80

return M
