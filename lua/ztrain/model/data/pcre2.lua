-- ztrain.model.data.pcre2: a small LuaJIT FFI binding of PCRE2 (8-bit code units), enough for
-- the GPT-2 pre-tokenizer: compile a pattern once, then find matches in a byte buffer.
--
--   local pcre2 = require "ztrain.model.data.pcre2"
--   local re = pcre2.compile([[ ?\p{L}+]], { utf = true, ucp = true })
--   local s, e = re:find(ptr, len, start)   -- 0-based [s, e) of the first match at or
--                                           -- after byte `start`, or nil when none
--   for s, e in re:gmatch(str) do ... end   -- every match of a Lua string, left to right
--   re:free()                               -- optional; the GC frees it too
--
-- Options (all default true except where said): utf (PCRE2_UTF: the pattern and subject
-- are UTF-8), ucp (PCRE2_UCP: \s \d \w and POSIX classes use Unicode properties),
-- invalid_utf (PCRE2_MATCH_INVALID_UTF: a subject that is not valid UTF-8 is matched
-- anyway, its invalid sequences matching nothing; without it such a subject is an
-- error), jit (JIT-compile when the library supports it; re.jit says whether it did).
--
-- The library is Debian's libpcre2-8-0 (the runtime package: only libpcre2-8.so.0 is
-- needed, no headers). Declarations follow pcre2.h of PCRE2 10.34+ (MATCH_INVALID_UTF
-- appeared in 10.34); pcre2.version() names the loaded one.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"

-- Declared once per Lua state, however many times this module is loaded.
if not pcall(ffi.typeof, "pcre2_code_8") then ffi.cdef [[
typedef struct pcre2_real_code_8 pcre2_code_8;
typedef struct pcre2_real_match_data_8 pcre2_match_data_8;
typedef struct pcre2_real_match_context_8 pcre2_match_context_8;
typedef struct pcre2_real_compile_context_8 pcre2_compile_context_8;
typedef struct pcre2_real_general_context_8 pcre2_general_context_8;
typedef struct pcre2_real_jit_stack_8 pcre2_jit_stack_8;
typedef pcre2_jit_stack_8 *(*pcre2_jit_callback_8)(void *);

int pcre2_config_8(uint32_t what, void *where);
int pcre2_get_error_message_8(int errorcode, uint8_t *buffer, size_t size);
pcre2_code_8 *pcre2_compile_8(const uint8_t *pattern, size_t length, uint32_t options,
                              int *errorcode, size_t *erroroffset, pcre2_compile_context_8 *ccontext);
void pcre2_code_free_8(pcre2_code_8 *code);
int pcre2_jit_compile_8(pcre2_code_8 *code, uint32_t options);
pcre2_match_context_8 *pcre2_match_context_create_8(pcre2_general_context_8 *gcontext);
void pcre2_match_context_free_8(pcre2_match_context_8 *mcontext);
pcre2_jit_stack_8 *pcre2_jit_stack_create_8(size_t startsize, size_t maxsize, pcre2_general_context_8 *gcontext);
void pcre2_jit_stack_assign_8(pcre2_match_context_8 *mcontext, pcre2_jit_callback_8 callback, void *data);
void pcre2_jit_stack_free_8(pcre2_jit_stack_8 *jit_stack);
pcre2_match_data_8 *pcre2_match_data_create_from_pattern_8(const pcre2_code_8 *code, pcre2_general_context_8 *gcontext);
void pcre2_match_data_free_8(pcre2_match_data_8 *match_data);
int pcre2_match_8(const pcre2_code_8 *code, const uint8_t *subject, size_t length, size_t startoffset,
                  uint32_t options, pcre2_match_data_8 *match_data, pcre2_match_context_8 *mcontext);
size_t *pcre2_get_ovector_pointer_8(pcre2_match_data_8 *match_data);
]] end

-- pcre2.h constants (stable across 10.x)
local PCRE2_UCP               = 0x00020000
local PCRE2_UTF               = 0x00080000
local PCRE2_MATCH_INVALID_UTF = 0x04000000
local PCRE2_JIT_COMPLETE      = 0x00000001
local PCRE2_ERROR_NOMATCH     = -1
local PCRE2_CONFIG_JIT        = 1
local PCRE2_CONFIG_UNICODE    = 9
local PCRE2_CONFIG_UNICODE_VERSION = 10
local PCRE2_CONFIG_VERSION    = 11

-- The library is pinned (RTLD_NODELETE) before ffi.load: compiled
-- patterns are freed by ffi.gc finalizers, which may run as the Lua state
-- closes, after LuaJIT has dropped its handle -- without the pin, a call
-- into an unmapped library (a segfault at exit).
local function load_lib()
  local errs = {}
  for _, name in ipairs { "libpcre2-8.so.0", "pcre2-8" } do
    libc.dlopen(name, libc.RTLD_NOW + libc.RTLD_NODELETE)
    local ok, lib = pcall(ffi.load, name)
    if ok then return lib end
    errs[#errs + 1] = tostring(lib)
  end
  error("ztrain.model.data.pcre2: cannot load libpcre2-8 (" .. table.concat(errs, "; ") ..
        "); install Debian's libpcre2-8-0 (apt-get install libpcre2-8-0)", 0)
end
local C = load_lib()

local M = {}

local errbuf = ffi.new("uint8_t[256]")
local function message(code)
  local n = C.pcre2_get_error_message_8(code, errbuf, 256)
  if n < 0 then return "PCRE2 error " .. code end
  return ffi.string(errbuf, n)
end
M.message = message

local function config_string(what)
  local n = C.pcre2_config_8(what, nil) -- length in code units, terminating zero included
  if n <= 0 then return nil end
  local buf = ffi.new("uint8_t[?]", n)
  C.pcre2_config_8(what, buf)
  return ffi.string(buf, n - 1)
end

local u32 = ffi.new("uint32_t[1]")
local function config_int(what)
  if C.pcre2_config_8(what, u32) < 0 then return nil end
  return tonumber(u32[0])
end

-- version() -> "10.42 2022-12-11"; unicode_version() -> "14.0.0"
function M.version() return config_string(PCRE2_CONFIG_VERSION) end
function M.unicode_version() return config_string(PCRE2_CONFIG_UNICODE_VERSION) end
M.has_jit = config_int(PCRE2_CONFIG_JIT) == 1
M.has_unicode = config_int(PCRE2_CONFIG_UNICODE) == 1

local Regex = {}
Regex.__index = Regex

local u8ptr = ffi.typeof("const uint8_t *")

-- compile(pattern, opts) -> regex. Raises (level 0) naming the pattern offset on a
-- syntax error.
function M.compile(pattern, opts)
  if type(pattern) ~= "string" then
    error("pcre2.compile: expected a pattern string, got " .. type(pattern), 2)
  end
  opts = opts or {}
  local flags = 0
  if opts.utf ~= false or opts.ucp ~= false or opts.invalid_utf ~= false then
    if not M.has_unicode then
      error("pcre2.compile: this libpcre2-8 was built without Unicode support", 0)
    end
  end
  if opts.utf ~= false then flags = bit.bor(flags, PCRE2_UTF) end
  if opts.ucp ~= false then flags = bit.bor(flags, PCRE2_UCP) end
  if opts.invalid_utf ~= false then flags = bit.bor(flags, PCRE2_MATCH_INVALID_UTF) end
  local errcode, erroff = ffi.new("int[1]"), ffi.new("size_t[1]")
  local code = C.pcre2_compile_8(ffi.cast(u8ptr, pattern), #pattern, flags, errcode, erroff, nil)
  if code == nil then
    error(("pcre2.compile: %s at offset %d of pattern %q"):format(
      message(errcode[0]), tonumber(erroff[0]), pattern), 0)
  end
  code = ffi.gc(code, C.pcre2_code_free_8)
  local self = setmetatable({ pattern = pattern, code = code, jit = false }, Regex)
  if opts.jit ~= false and M.has_jit then
    self.jit = C.pcre2_jit_compile_8(code, PCRE2_JIT_COMPLETE) == 0
  end
  local md = C.pcre2_match_data_create_from_pattern_8(code, nil)
  if md == nil then error("pcre2.compile: out of memory (match data)", 0) end
  self.md = ffi.gc(md, C.pcre2_match_data_free_8)
  self.ov = C.pcre2_get_ovector_pointer_8(self.md)
  if self.jit then
    -- The default JIT stack (32 KiB, on the machine stack) is too small for long runs
    -- of whitespace under \s+(?!\S): give it one that may grow to 16 MiB.
    local mc = C.pcre2_match_context_create_8(nil)
    local js = C.pcre2_jit_stack_create_8(32 * 1024, 16 * 1024 * 1024, nil)
    if mc == nil or js == nil then error("pcre2.compile: out of memory (JIT stack)", 0) end
    self.mc = ffi.gc(mc, C.pcre2_match_context_free_8)
    self.js = ffi.gc(js, C.pcre2_jit_stack_free_8)
    C.pcre2_jit_stack_assign_8(self.mc, nil, self.js)
  end
  return self
end

-- re:find(ptr, len, start) -> s, e (0-based, e exclusive) or nil. ptr: a Lua string or
-- a byte pointer (which the caller keeps alive); start defaults to 0. Raises on a match
-- error (e.g. a resource limit), naming it.
function Regex:find(ptr, len, start)
  if type(ptr) == "string" then len = len or #ptr end
  local rc = C.pcre2_match_8(self.code, ffi.cast(u8ptr, ptr), len, start or 0, 0, self.md, self.mc)
  if rc < 0 then
    if rc == PCRE2_ERROR_NOMATCH then return nil end
    error(("pcre2: matching %q failed at offset %d: %s"):format(self.pattern, start or 0, message(rc)), 0)
  end
  local ov = self.ov
  return tonumber(ov[0]), tonumber(ov[1])
end

-- re:gmatch(str) -> iterator of s, e (0-based, e exclusive) over the non-overlapping
-- matches of a Lua string. An empty match advances by one byte.
function Regex:gmatch(str)
  local pos, n = 0, #str
  return function()
    if pos > n then return nil end
    local s, e = self:find(str, n, pos)
    if not s then pos = n + 1; return nil end
    pos = (e > s) and e or e + 1
    return s, e
  end
end

function Regex:free()
  if self.mc then ffi.gc(self.mc, nil); C.pcre2_match_context_free_8(self.mc); self.mc = nil end
  if self.js then ffi.gc(self.js, nil); C.pcre2_jit_stack_free_8(self.js); self.js = nil end
  if self.md then ffi.gc(self.md, nil); C.pcre2_match_data_free_8(self.md); self.md = nil end
  if self.code then ffi.gc(self.code, nil); C.pcre2_code_free_8(self.code); self.code = nil end
end

return M
