-- ztrain.parallel.driver.losses: a step's losses, read once at its end.
--
-- Reading a micro-batch's mean loss as its forward ends (model:mean_loss,
-- an fp64 sum the host waits for) stalls a GPU's queue in the middle of the
-- step: the host sits idle until the forward has run, then the backward's
-- first kernels wait for the host. A ledger instead copies each head
-- forward's per-position losses (device to device, queued like a kernel)
-- into a row of its own -- the activation set is reused before the step
-- ends -- and at the step's end reads the rows with one host wait and sums
-- each in host memory (zt_host_sum: zt_sum's fixed-block fp64 sum, no
-- device involved), in the order the forwards ran: the same loss, bit for
-- bit, as summing each mean as it came. Nothing here syncs the device
-- beyond that one read, so a deferred device error (a bad token id)
-- surfaces where it did before: at the trainer's device sync.
local ffi = require "ffi"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local C = require("ztrain.core.ffi").C

local M = {}
local Ledger = {}
Ledger.__index = Ledger

-- bytes(rows, B, T) -> the device bytes a ledger of `rows` micro-batches of
-- B x T positions holds (the memory planner's figure, plan.lua)
function M.bytes(rows, B, Tlen) return math.max(1, rows) * B * Tlen * 4 end

-- new(rows): room for `rows` head forwards a step (the micro-batches).
function M.new(rows) return setmetatable({ cap = math.max(1, rows or 1), n = 0 }, Ledger) end

-- the rows for losses of N positions on `tier` (made once; again if those change)
local function alloc(self, src)
  local N, tier = src:numel(), src:tier()
  if self.kept and self.N == N and self.tier == tier then return end
  self:free()
  local kept = T.new({ self.cap, N }, { tier = tier, category = "activations" })
  self.kept, self.buf, self.N, self.tier = kept, ffi.new("float[?]", self.cap * N), N, tier
end

-- keep(a): set a's per-position losses (its last forward), as the next row.
function Ledger:keep(a)
  local src = a:losses()
  alloc(self, src)
  local n = self.n + 1
  assert(n <= self.cap, "losses ledger: more head forwards in a step than micro-batches")
  local r = self.kept:view((n - 1) * self.N, { self.N })
  local ok, err = pcall(ops.copy, r, src)
  r:free()
  if not ok then error(err, 0) end
  self.n = n
end

-- total() -> the sum over the kept rows of their mean loss, in keep order,
-- or nil when none was kept; empties the ledger (its buffers stay for the
-- next step).
function Ledger:total()
  local n = self.n
  if n == 0 then return nil end
  self.n = 0
  local rows = self.kept:view(0, { n * self.N })
  local ok, err = pcall(rows.read, rows, self.buf)    -- the step's one host wait for its losses
  rows:free()
  if not ok then error(err, 0) end
  local loss
  for i = 1, n do
    -- a row's mean: its B x T positions (every set of a stage has one shape)
    loss = (loss or 0.0) + C.zt_host_sum(self.buf + (i - 1) * self.N, self.N) / self.N
  end
  return loss
end

-- reset(): forget the kept rows (a step that failed part-way)
function Ledger:reset() self.n = 0 end

function Ledger:free()
  if self.kept then self.kept:free() end
  self.kept, self.buf, self.N, self.tier, self.n = nil, nil, nil, nil, 0
end

return M
