-- ztrain.train.checkpoint.format: what a checkpoint is on disk, shared by the
-- writer (checkpoint/write.lua) and the reader (checkpoint/read.lua).
--
-- A checkpoint is a directory ROOT/step-NNNNNNNN/ holding
--   manifest.json      what was saved: the model's units and their element
--                      counts, the strategy, world size, step, optimizer
--                      step count, data position, extra state (loss scaler,
--                      RNG), and every rank file with its size and SHA-256
--   rank-RRRRR.bin     one rank's ranges of its state (strategy/state.lua's
--                      export: kind, unit, [lo, hi) of the unit's unpadded
--                      flat buffer), raw little-endian fp32, back to back
--   rank-RRRRR.json    that file's index: each range's kind, unit, lo, hi,
--                      dtype and byte offset, and a SHA-256 per 1 MiB block
-- and ROOT/latest names the newest complete one.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"
local zffi = require "ztrain.core.ffi"
local C = zffi.C

local M = {}

M.FORMAT, M.VERSION = "ztrain-checkpoint", 1
M.BLOCK = 1048576                    -- bytes per checksummed block
M.CHUNK = 1048576                    -- elements staged per copy (4 MiB)

-- errno_text() -> the C library's text for errno, errno
function M.errno_text()
  local e = ffi.errno()
  return ffi.string(libc.strerror(e)), e
end

-- sha_hex(p, n) -> hex SHA-256 of n bytes at p
function M.sha_hex(p, n)
  local st = ffi.new("zt_sha256")
  C.zt_sha256_init(st)
  C.zt_sha256_update(st, p, n)
  local hex = ffi.new("char[65]")
  C.zt_sha256_hex(st, hex)
  return ffi.string(hex, 64)
end

-- blocks_sha(blocks) -> the manifest's checksum of an index's block checksums
function M.blocks_sha(blocks)
  local all = table.concat(blocks)
  return M.sha_hex(all, #all)
end

return M
