-- ztrain.core.digest: SHA-256 of all parameters as fp32 little-endian, in
-- canonical unit/tensor order (padding excluded). Equal digests mean
-- bit-identical models: the cheap, strong test that strategies agree.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local C = zffi.C

local M = {}

-- update(st, units, with_full): hash units' parameters (canonical tensor
-- order, padding excluded) into a running zt_sha256 state. with_full(u, fn)
-- calls fn(full flat tensor) for strategies that shard parameters (a
-- collective: every rank must call it).
function M.update(st, units, with_full)
  assert(ffi.abi("le"), "param_digest assumes a little-endian host")
  -- one host buffer for every unit (a buffer per unit left gigabytes of
  -- garbage for the Lua GC on a 1.5B model), read through in slices
  local SLICE = 4 * 1024 * 1024
  local buf = ffi.new("float[?]", SLICE)
  for _, u in ipairs(units) do
    local function hash(t)
      for off = 0, u.numel - 1, SLICE do
        local n = math.min(SLICE, u.numel - off)
        local v = t:view(off, { n })
        local ok, err = pcall(v.read, v, buf)
        v:free()
        if not ok then error(err, 0) end
        C.zt_sha256_update(st, buf, n * 4)
      end
    end
    if with_full then with_full(u, hash) else hash(u.params) end
  end
end

-- params(model, with_full) -> 64 hex digits over every unit.
function M.params(model, with_full)
  local s = ffi.new("zt_sha256")
  C.zt_sha256_init(s)
  M.update(s, model.units, with_full)
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
