-- ztrain.model.data.utf8: strict UTF-8 validation of byte buffers (RFC 3629).
--
--   local utf8 = require "ztrain.model.data.utf8"
--   local ok, offset, reason = utf8.check(s)            -- s: Lua string
--   local ok, offset, reason = utf8.check(ptr, n, opts)  -- ptr: uint8_t* / char*
--
-- Returns true, or false plus the 0-based byte offset of the first bad byte and a
-- short reason. Rejected: stray continuation bytes, bytes C0/C1/F5..FF, truncated
-- sequences, overlong forms, UTF-16 surrogates (U+D800..DFFF), code points above
-- U+10FFFF. With opts.nul == false a NUL byte is rejected too (reason "NUL byte"):
-- NUL is valid UTF-8 but in practice means "binary file".
local ffi = require "ffi"

local M = {}

local function hex(b) return ("0x%02X"):format(b) end

function M.check(s, n, opts)
  local p
  if type(s) == "string" then
    n = n or #s
    if n > #s then error("utf8.check: n (" .. n .. ") exceeds string length " .. #s, 2) end
    p = ffi.cast("const uint8_t *", s)
  elseif type(s) == "cdata" then
    if type(n) ~= "number" then error("utf8.check: n (byte count) required with a cdata buffer", 2) end
    p = ffi.cast("const uint8_t *", s)
  else
    error("utf8.check: expected a string or a cdata byte buffer, got " .. type(s), 2)
  end
  local reject_nul = opts ~= nil and opts.nul == false
  local i = 0
  while i < n do
    local c = p[i]
    if c < 0x80 then
      if c == 0 and reject_nul then return false, i, "NUL byte" end
      i = i + 1
    else
      local need, lo, hi -- continuation count; allowed range of the 2nd byte
      if c < 0xC2 then
        if c < 0xC0 then return false, i, "unexpected continuation byte " .. hex(c) end
        return false, i, "invalid byte " .. hex(c) .. " (overlong lead)"
      elseif c < 0xE0 then need, lo, hi = 1, 0x80, 0xBF
      elseif c < 0xF0 then
        need = 2
        if c == 0xE0 then lo, hi = 0xA0, 0xBF       -- no overlong 3-byte forms
        elseif c == 0xED then lo, hi = 0x80, 0x9F   -- no surrogates
        else lo, hi = 0x80, 0xBF end
      elseif c < 0xF5 then
        need = 3
        if c == 0xF0 then lo, hi = 0x90, 0xBF       -- no overlong 4-byte forms
        elseif c == 0xF4 then lo, hi = 0x80, 0x8F   -- <= U+10FFFF
        else lo, hi = 0x80, 0xBF end
      else
        return false, i, "invalid byte " .. hex(c)
      end
      if i + need >= n then -- the sequence needs bytes i .. i+need
        return false, i, "truncated " .. (need + 1) .. "-byte sequence at end of data"
      end
      local c2 = p[i + 1]
      if c2 < lo or c2 > hi then
        if c2 < 0x80 or c2 > 0xBF then
          return false, i, "truncated " .. (need + 1) .. "-byte sequence (lead " .. hex(c) .. ", then " .. hex(c2) .. ")"
        elseif c == 0xED then
          return false, i, "UTF-16 surrogate encoded as UTF-8"
        elseif c == 0xF4 then
          return false, i, "code point above U+10FFFF"
        else
          return false, i, "overlong encoding"
        end
      end
      for k = 2, need do
        local ck = p[i + k]
        if ck < 0x80 or ck > 0xBF then
          return false, i, "truncated " .. (need + 1) .. "-byte sequence (lead " .. hex(c) .. ", then " .. hex(ck) .. ")"
        end
      end
      i = i + need + 1
    end
  end
  return true
end

-- 1-based line number and 1-based column (in bytes) of a 0-based byte offset.
function M.line_col(s, offset)
  local line, last_nl = 1, 0
  local pos = 1
  while true do
    local nl = s:find("\n", pos, true)
    if not nl or nl > offset then break end
    line, last_nl, pos = line + 1, nl, nl + 1
  end
  return line, offset + 1 - last_nl
end

-- sanitize(s) -> s with every invalid byte replaced by U+FFFD (valid
-- UTF-8 for JSON and terminals: a sample from a byte tokenizer may cut a
-- character in two).
function M.sanitize(s)
  local out, i, n = {}, 0, #s
  while i < n do
    local ok, off = M.check(s:sub(i + 1))
    if ok then out[#out + 1] = s:sub(i + 1); break end
    out[#out + 1] = s:sub(i + 1, i + off)
    out[#out + 1] = "\239\191\189"
    i = i + off + 1
  end
  return table.concat(out)
end

return M
