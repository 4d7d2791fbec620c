-- ztrain.model.data.bytes: the byte-level tokenizer. Token id = byte value (0..255).
--
--   local tok = require("ztrain.model.data").tokenizer("bytes")
--   local ids, n = tok.encode("héllo")   -- int32_t[n] (0-based), n = 6 (UTF-8 bytes)
--   local s = tok.decode(ids, n)          -- "héllo"
--
-- Any byte string round-trips exactly, including invalid UTF-8. There is no
-- end-of-text token (eot = nil): all 256 ids are bytes. encode/decode may also be
-- called with a colon (tok:encode(s)).
local ffi = require "ffi"

local M = { name = "bytes", vocab_size = 256, eot = nil }

local i32arr = ffi.typeof("int32_t[?]")
local u8arr = ffi.typeof("uint8_t[?]")
local u8ptr = ffi.typeof("const uint8_t *")

-- encode(str) -> int32_t[n] array, n
function M.encode(s, ...)
  if s == M then s = ... end
  if type(s) ~= "string" then
    error("bytes.encode: expected a string, got " .. type(s), 2)
  end
  local n = #s
  local out = i32arr(n)
  local p = ffi.cast(u8ptr, s) -- no copy; `s` stays alive for the loop
  for i = 0, n - 1 do out[i] = p[i] end
  return out, n
end

-- decode(ids, n) -> string. ids: a 0-based cdata array/pointer of integers (n
-- required), or a 1-based Lua table (n defaults to #ids).
function M.decode(a, n, ...)
  if a == M then a, n = n, ... end
  local buf
  if type(a) == "table" then
    n = n or #a
    buf = u8arr(n)
    for i = 1, n do
      local v = a[i]
      if type(v) ~= "number" or v < 0 or v > 255 or v % 1 ~= 0 then
        error(("bytes.decode: id %s at position %d is not a byte (0..255)"):format(tostring(v), i), 2)
      end
      buf[i - 1] = v
    end
  elseif type(a) == "cdata" then
    if type(n) ~= "number" or n < 0 then
      error("bytes.decode: n (token count) required with a cdata array", 2)
    end
    buf = u8arr(n)
    for i = 0, n - 1 do
      local v = a[i]
      if v < 0 or v > 255 then
        error(("bytes.decode: id %s at index %d is not a byte (0..255)"):format(tostring(v), i), 2)
      end
      buf[i] = v
    end
  else
    error("bytes.decode: expected a cdata array or a table of ids, got " .. type(a), 2)
  end
  return ffi.string(buf, n)
end

return M
