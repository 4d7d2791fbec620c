-- ztrain.digest: SHA-256 of all parameters as fp32 little-endian, in
-- canonical unit/tensor order (padding excluded). Equal digests mean
-- bit-identical models: the cheap, strong test that strategies agree.
local ffi = require "ffi"
local zffi = require "ztrain.ffi"
local C = zffi.C

local M = {}

-- params(model) -> 64 hex digits. Reads each unit's live parameter buffer.
function M.params(model)
  assert(ffi.abi("le"), "param_digest assumes a little-endian host")
  local s = ffi.new("zt_sha256")
  C.zt_sha256_init(s)
  for _, u in ipairs(model.units) do
    local n = u.numel
    local buf = ffi.new("float[?]", u.padded)
    u.params:read(buf)
    C.zt_sha256_update(s, buf, n * 4)
  end
  local hex = ffi.new("char[65]")
  C.zt_sha256_hex(s, hex)
  return ffi.string(hex)
end

-- bytes(str) -> hex SHA-256 of a Lua string (for tests and recipe hashes).
function M.string(str)
  local s = ffi.new("zt_sha256")
  C.zt_sha256_init(s)
  C.zt_sha256_update(s, str, #str)
  local hex = ffi.new("char[65]")
  C.zt_sha256_hex(s, hex)
  return ffi.string(hex)
end

return M
