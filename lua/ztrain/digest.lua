-- ztrain.digest: SHA-256 of all parameters as fp32 little-endian, in
-- canonical unit/tensor order (padding excluded). Equal digests mean
-- bit-identical models: the cheap, strong test that strategies agree.
local ffi = require "ffi"
local zffi = require "ztrain.ffi"
local C = zffi.C

local M = {}

-- params(model, with_full) -> 64 hex digits. Reads each unit's parameter
-- buffer; with_full(u, fn) calls fn(full flat tensor) for strategies that
-- shard parameters (a collective: every rank must call it).
function M.params(model, with_full)
  assert(ffi.abi("le"), "param_digest assumes a little-endian host")
  local s = ffi.new("zt_sha256")
  C.zt_sha256_init(s)
  for _, u in ipairs(model.units) do
    local n = u.numel
    local buf = ffi.new("float[?]", u.padded)
    if with_full then with_full(u, function(t) t:read(buf) end) else u.params:read(buf) end
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
