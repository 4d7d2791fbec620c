-- ztrain.driver.losses: a step's losses, read once at its end.
--
-- Reading a micro-batch's mean loss as its forward ends (model:mean_loss,
-- an fp64 sum the host waits for) stalls a GPU's queue in the middle of the
-- step: the host sits idle until the forward has run, then the backward's
-- first kernels wait for the host. A ledger instead copies each head
-- forward's per-position losses (device to device, queued like a kernel)
-- into a row of its own -- the activation set is reused before the step
-- ends -- and sums the rows when the step is over: the same fp64 sums, the
-- same order (the order the forwards ran), so the same bits as before.
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"

local M = {}
local Ledger = {}
Ledger.__index = Ledger

function M.new() return setmetatable({ rows = {}, count = {}, n = 0 }, Ledger) end

-- keep(a): set a's per-position losses (its last forward), as the next row.
function Ledger:keep(a)
  local src = a:losses()
  local n = self.n + 1
  local row = self.rows[n]
  if row and (row:numel() ~= src:numel() or row:tier() ~= src:tier()) then row:free(); row = nil end
  if not row then
    row = T.new({ src:numel() }, { tier = src:tier(), category = "activations" })
    self.rows[n] = row
  end
  ops.copy(row, src)
  self.count[n] = a.B * a.T
  self.n = n
end

-- total() -> the sum over the kept rows of their mean loss, in keep order,
-- or nil when none was kept; empties the ledger (its rows stay for the next
-- step).
function Ledger:total()
  local loss
  for i = 1, self.n do loss = (loss or 0.0) + ops.sum(self.rows[i]) / self.count[i] end
  self.n = 0
  return loss
end

-- reset(): forget the kept rows (a step that failed part-way)
function Ledger:reset() self.n = 0 end

function Ledger:free()
  for _, r in ipairs(self.rows) do r:free() end
  self.rows, self.count, self.n = {}, {}, 0
end

return M
