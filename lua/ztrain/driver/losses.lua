-- ztrain.driver.losses: a step's losses, read once at its end.
--
-- Reading a micro-batch's mean loss as its forward ends (model:mean_loss,
-- an fp64 sum the host waits for) stalls a GPU's queue in the middle of the
-- step: the host sits idle until the forward has run, then the backward's
-- first kernels wait for the host. A ledger instead copies each head
-- forward's per-position losses (device to device, queued like a kernel)
-- into a row of its own -- the activation set is reused before the step
-- ends -- and at the step's end reads every row with one host wait and sums
-- each on the host: the same fp64 sums (a device's zt_sum has the CPU's
-- bits), in the same order (the forwards'), so the same loss as before.
local ffi = require "ffi"
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"

local M = {}
local Ledger = {}
Ledger.__index = Ledger

-- new(rows): room for `rows` head forwards a step (the micro-batches).
function M.new(rows) return setmetatable({ cap = math.max(1, rows or 1), count = {}, n = 0 }, Ledger) end

local function alloc(self, src)
  local N, tier = src:numel(), src:tier()
  if self.kept and self.N == N and self.tier == tier then return end
  self:free()
  self.N, self.tier = N, tier
  self.kept = T.new({ self.cap, N }, { tier = tier, category = "activations" })
  self.host = T.new({ self.cap, N }, { tier = "host", category = "activations" })
  self.buf = ffi.new("float[?]", self.cap * N)
end

local function row(t, i, N) return t:view((i - 1) * N, { N }) end

-- keep(a): set a's per-position losses (its last forward), as the next row.
function Ledger:keep(a)
  local src = a:losses()
  alloc(self, src)
  local n = self.n + 1
  assert(n <= self.cap, "losses ledger: more head forwards in a step than micro-batches")
  local r = row(self.kept, n, self.N)
  ops.copy(r, src)
  r:free()
  self.count[n] = a.B * a.T
  self.n = n
end

-- total() -> the sum over the kept rows of their mean loss, in keep order,
-- or nil when none was kept; empties the ledger (its buffers stay for the
-- next step).
function Ledger:total()
  if self.n == 0 then return nil end
  self.kept:read(self.buf)              -- the step's one host wait for its losses
  self.host:write(self.buf)
  local loss
  for i = 1, self.n do
    local r = row(self.host, i, self.N)
    loss = (loss or 0.0) + ops.sum(r) / self.count[i]
    r:free()
  end
  self.n = 0
  return loss
end

-- reset(): forget the kept rows (a step that failed part-way)
function Ledger:reset() self.n = 0 end

function Ledger:free()
  if self.kept then self.kept:free(); self.host:free() end
  self.kept, self.host, self.buf, self.N, self.tier, self.n = nil, nil, nil, nil, nil, 0
end

return M
