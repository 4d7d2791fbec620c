-- ztrain.optim.adamw: AdamW with decoupled weight decay (PyTorch's formula).
--
-- State m and v mirror a set of flat parameter buffers (category "optim").
-- The update is elementwise (kernels.h: zk_adamw), so it gives the same bits
-- on a whole unit, a shard of it, on the device or on the host. Weight decay
-- applies to tensors marked decay (matrices and embeddings), not to biases
-- and LayerNorm parameters.
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"

local M = {}
local AdamW = {}
AdamW.__index = AdamW

M.defaults = { lr = 3e-4, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }

-- new(opts) -> optimizer; opts: lr, betas, eps, weight_decay.
function M.new(opts)
  opts = opts or {}
  local self = setmetatable({}, AdamW)
  for k, v in pairs(M.defaults) do self[k] = opts[k] == nil and v or opts[k] end
  local b = self.betas
  if type(b) ~= "table" or #b ~= 2 or type(b[1]) ~= "number" or type(b[2]) ~= "number"
     or b[1] < 0 or b[1] >= 1 or b[2] < 0 or b[2] >= 1 then
    error("optim.betas must be a pair of numbers in [0, 1) like { 0.9, 0.95 }", 2)
  end
  if not (self.lr >= 0 and self.lr < math.huge) then error("optim.lr must be a finite number >= 0", 2) end
  if not (self.eps > 0) then error("optim.eps must be > 0", 2) end
  if not (self.weight_decay >= 0) then error("optim.weight_decay must be >= 0", 2) end
  self.state, self.t = {}, 0
  return self
end

-- Allocate m and v for a unit's parameter range [lo, hi) of its flat buffer
-- (the whole unit by default; a shard under ZeRO). tier: where state lives.
function AdamW:add_unit(u, opts)
  opts = opts or {}
  local lo, hi = opts.lo or 0, opts.hi or u.numel
  local n = math.max(hi - lo, 1)
  local st = { unit = u, lo = lo, hi = hi,
               m = T.new({ n }, { tier = opts.tier or "device", category = "optim" }),
               v = T.new({ n }, { tier = opts.tier or "device", category = "optim" }) }
  -- Per-tensor segments inside [lo, hi): { offset in range, length, decay }.
  st.segments = {}
  for _, t in ipairs(u.tensors) do
    local a, b = math.max(lo, t.offset), math.min(hi, t.offset + t.numel)
    if b > a then st.segments[#st.segments + 1] = { a - lo, b - a, t.decay } end
  end
  self.state[u.index] = st
  return st
end

-- Update one unit: params and grads are flat tensors covering [lo, hi) of the
-- unit (the caller passes views for shards). grad_scale is the clip factor.
function AdamW:update_unit(u, params, grads, lr, grad_scale)
  local st = assert(self.state[u.index], "adamw: unit not added")
  local b1, b2 = self.betas[1], self.betas[2]
  for _, seg in ipairs(st.segments) do
    local off, len = seg[1], seg[2]
    local p, g = params:view(off, { len }), grads:view(off, { len })
    local m, v = st.m:view(off, { len }), st.v:view(off, { len })
    ops.adamw(p, g, m, v, lr, b1, b2, self.eps, seg[3] and self.weight_decay or 0,
              grad_scale, self.t)
    p:free(); g:free(); m:free(); v:free()
  end
end

-- Call once per optimizer step, before the unit updates.
function AdamW:begin_step() self.t = self.t + 1 end

function AdamW:free()
  for _, st in pairs(self.state) do st.m:free(); st.v:free() end
  self.state = {}
end

return M
