-- ztrain.core.ffi: the C runtime through LuaJIT's FFI.
--
-- The cdefs are read from runtime/ztrain.h and the parts it includes
-- (zt_core.h, zt_device.h, ...) at load time (preprocessor lines and
-- comments dropped), so the headers are the only declaration of the API.
-- Returns { C = <libztrain>, home = <tree root>, check = fn }.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"

local M = {}

local function tree_root()
  if rawget(_G, "ZTRAIN_HOME") then return ZTRAIN_HOME end
  local env = os.getenv("ZTRAIN_HOME")
  if env and env ~= "" then return env end
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/lua/ztrain/core/ffi%.lua$")
  if dir then return dir == "" and "/" or dir end
  if src == "lua/ztrain/core/ffi.lua" then return "." end
  error("ztrain: cannot locate the ztrain tree from " .. src .. "; set ZTRAIN_HOME", 0)
end

-- read_header(dir, name, seen, out): the declarations of dir/name with
-- comments and preprocessor lines dropped, each #include "part.h" of the
-- runtime read in its place, once (ztrain.h includes the parts in order)
local function read_header(dir, name, seen, out)
  if seen[name] then return out end
  seen[name] = true
  local f, err = io.open(dir .. "/" .. name, "rb")
  if not f then error("ztrain: cannot read the runtime header: " .. err .. "; set ZTRAIN_HOME to the tree", 0) end
  local text = f:read("*a")
  f:close()
  text = text:gsub("/%*.-%*/", ""):gsub("//[^\n]*", "")
  for line in text:gmatch("[^\n]*") do
    local part = line:match('^%s*#%s*include%s*"([^"]+)"')
    if part then read_header(dir, part, seen, out)
    elseif not line:match("^%s*#") then out[#out + 1] = line end
  end
  return out
end

M.home = tree_root()
ffi.cdef(table.concat(read_header(M.home .. "/runtime", "ztrain.h", {}, {}), "\n"))

local libpath = os.getenv("ZTRAIN_LIB") or (M.home .. "/build/libztrain.so")

-- OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE or its own
-- CPU detection. Debian's OpenBLAS 0.3.21 does not know recent Xeons and falls
-- back to its generic SSE3 (Prescott) kernels, 5-9x slower. When the variable
-- is unset, name the best core the CPU supports; a user's setting wins.
local function pick_blas_core()
  if os.getenv("OPENBLAS_CORETYPE") then return end
  local f = io.open("/proc/cpuinfo")
  if not f then return end
  local flags = {}
  for line in f:lines() do
    local fl = line:match("^flags%s*:%s*(.*)$")
    if fl then for w in fl:gmatch("%S+") do flags[w] = true end break end
  end
  f:close()
  local core
  if flags.avx512f and flags.avx512bw and flags.avx512vl and flags.avx512dq and flags.avx512cd then
    core = "SkylakeX"
  elseif flags.avx2 and flags.fma then
    core = "Haswell"
  end
  if core then libc.setenv("OPENBLAS_CORETYPE", core, 0) end
  M.blas_core_auto = core
end
pick_blas_core()

-- OpenMP's idle threads spin (libgomp: ~300k iterations) before they sleep.
-- On a machine busier than its cores the spinning threads take the time
-- the working ones need: a gpt2-mini step here took 43.8 ms with the
-- default and 32.3 with OMP_WAIT_POLICY=passive under a load of 3.5 on 2
-- cores (issue 29 saw 249.9 against 29.5 ms), but on the quiet machine
-- 21-25 ms active against 33-39 passive. So: passive where the 1-minute
-- load average is above the online CPUs when the library loads, the
-- default elsewhere; a user's OMP_WAIT_POLICY wins. M.omp_wait_auto says
-- what was set (the run's banner names it).
local function online_cpus()
  local f = io.open("/sys/devices/system/cpu/online")
  local text = f and f:read("*l") or ""
  if f then f:close() end
  local n = 0
  for a, b in text:gmatch("(%d+)%-?(%d*)") do n = n + (b ~= "" and tonumber(b) - tonumber(a) + 1 or 1) end
  return n
end
-- omp_wait_choice(load, cpus, given) -> "passive" | nil: what to set
function M.omp_wait_choice(load, cpus, given)
  if given or not load or not cpus or cpus < 1 then return nil end
  return load > cpus and "passive" or nil
end
local function pick_omp_wait()
  -- a launcher (also ztrain) that chose it marks it so: its ranks inherit
  -- the variable and would take it for the user's
  if os.getenv("ZTRAIN_OMP_WAIT_AUTO") == "1" and os.getenv("OMP_WAIT_POLICY") then
    M.omp_wait_auto = os.getenv("OMP_WAIT_POLICY")
    return
  end
  local choice = M.omp_wait_choice(libc.load_average(), online_cpus(), os.getenv("OMP_WAIT_POLICY"))
  if choice then
    libc.setenv("OMP_WAIT_POLICY", choice, 0)
    libc.setenv("ZTRAIN_OMP_WAIT_AUTO", "1", 1)
    M.omp_wait_auto = choice
  end
end
pick_omp_wait()

-- Pin the library in memory first (RTLD_NODELETE): OpenMP's worker threads
-- outlive the Lua state, and unloading their code at lua_close would crash
-- the process on exit.
if libc.dlopen(libpath, libc.RTLD_NOW + libc.RTLD_GLOBAL + libc.RTLD_NODELETE) == nil then
  error("ztrain: cannot load " .. libpath .. " (" .. ffi.string(libc.dlerror()) ..
        "); run `make` first", 0)
end
local ok, lib = pcall(ffi.load, libpath)
if not ok then
  error("ztrain: cannot load " .. libpath .. " (" .. tostring(lib) .. "); run `make` first", 0)
end
M.C = lib

local C = lib
-- Turn a runtime error code into a Lua error carrying the runtime's message.
-- `what` names the Lua-level operation for context.
-- What to change when a tier's limit is exceeded (ZT_ELIMIT, -3): every
-- such error ends with it (docs/errors.md).
M.ELIMIT_REMEDY = "raise device.memory_limit, lower batch.micro, data.seq_len or model.size, or move model " ..
  "state off the device (strategy=zero3_offload: optimizer state and parameter shards on the host; " ..
  "zero2_offload: optimizer state)"

function M.check(rc, what)
  if rc ~= 0 then
    local msg = ffi.string(C.zt_last_error())
    msg = (what and (what .. ": ") or "") .. msg .. " [" .. ffi.string(C.zt_strerror(rc)) .. "]"
    if rc == -3 then msg = msg .. "; " .. M.ELIMIT_REMEDY end
    error(msg, 0)
  end
  return rc
end

-- check_key(rc, key): check for a call that was handed a setting's value
-- (a recipe key: "device.backend=cuda"). The runtime's messages name C
-- things and open with the call, "zt_device_init(\"cuda\"): ..." or
-- "zt_comm_use_nccl: ..."; the error raised names the key instead, as the
-- user wrote it: "device.backend=cuda: ... [EINVAL]" (no Lua location).
function M.check_key(rc, key)
  if rc ~= 0 then
    local msg = ffi.string(C.zt_last_error())
    msg = msg:gsub("^zt_[%w_]+%b(): ", "", 1):gsub("^zt_[%w_]+: ", "", 1)
    error(key .. ": " .. msg .. " [" .. ffi.string(C.zt_strerror(rc)) .. "]", 0)
  end
  return rc
end

return M
