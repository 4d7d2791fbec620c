-- ztrain.model.data.unorm: Unicode normalization (NFC) of UTF-8 byte strings, through
-- GNU libunistring's u8_normalize (Debian's libunistring2: the runtime library only, no
-- headers), for Hugging Face tokenizers that declare an NFC normalizer (Qwen 2.5).
--
--   local unorm = require "ztrain.model.data.unorm"
--   unorm.nfc("Cafe\204\129")   -- "Caf\195\169" (e + U+0301 composed to U+00E9)
--
-- The library is loaded on first use, so that requiring this module costs nothing where
-- no tokenizer asks for it. Bytes that are not valid UTF-8 are left as they are: each
-- maximal valid run between them is normalized alone (Hugging Face's `tokenizers` takes
-- text only, which is always valid). ASCII text is returned as is (NFC leaves it alone).
-- unorm.unicode_version: not exposed by the library; libunistring 1.0 (Debian 12) knows
-- Unicode 14.0, as Debian 12's PCRE2 does.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"
local utf8 = require "ztrain.model.data.utf8"

local M = {}

if not pcall(ffi.typeof, "ztrain_uninorm_t") then ffi.cdef [[
typedef const void *ztrain_uninorm_t;
uint8_t *u8_normalize(ztrain_uninorm_t nf, const uint8_t *s, size_t n, uint8_t *resultbuf, size_t *lengthp);
extern const uint8_t uninorm_nfc[1];
]] end

local lib, forms
local function load_lib()
  if lib then return lib end
  local errs = {}
  for _, name in ipairs { "libunistring.so.2", "libunistring.so.5", "unistring" } do
    libc.dlopen(name, libc.RTLD_NOW + libc.RTLD_NODELETE)
    local ok, l = pcall(ffi.load, name)
    if ok then lib = l; break end
    errs[#errs + 1] = tostring(l)
  end
  if not lib then
    return nil, "unorm: cannot load GNU libunistring (" .. table.concat(errs, "; ") ..
                "); install Debian's libunistring2 (apt-get install libunistring2; make deps)"
  end
  forms = { NFC = ffi.cast("ztrain_uninorm_t", lib.uninorm_nfc) }
  return lib
end

-- available() -> true, or nil and a message saying what to install
function M.available()
  local l, err = load_lib()
  if not l then return nil, err end
  return true
end

local u8ptr = ffi.typeof("const uint8_t *")
local lenbox = ffi.new("size_t[1]")

local function normalize_valid(form, s)
  if not s:find("[\128-\255]") then return s end
  local out = lib.u8_normalize(form, ffi.cast(u8ptr, s), #s, nil, lenbox)
  if out == nil then error("unorm: u8_normalize failed on valid UTF-8 (out of memory?)", 0) end
  local r = ffi.string(out, lenbox[0])
  libc.free(out)
  return r
end

-- nfc(s) -> the NFC form of the byte string s (invalid bytes kept in place). Raises
-- when the library is missing (check available() first).
function M.nfc(s)
  local l, err = load_lib()
  if not l then error(err, 0) end
  local form = forms.NFC
  if not s:find("[\128-\255]") then return s end
  local p, n = ffi.cast(u8ptr, s), #s -- `s` stays alive; checks from each offset (no copies)
  local parts, i = {}, 0
  while i < n do
    local ok, off = utf8.check(p + i, n - i)
    if ok then parts[#parts + 1] = normalize_valid(form, s:sub(i + 1)); break end
    parts[#parts + 1] = normalize_valid(form, s:sub(i + 1, i + off))
    -- the invalid byte and the continuation bytes after it stay as they are
    local j = i + off + 1
    while j < n and p[j] >= 0x80 and p[j] < 0xC2 do j = j + 1 end
    parts[#parts + 1] = s:sub(i + off + 1, j)
    i = j
  end
  return table.concat(parts)
end

return M
