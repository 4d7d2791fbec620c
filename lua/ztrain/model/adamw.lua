-- ztrain.model.adamw: AdamW with decoupled weight decay (PyTorch's formula).
--
-- The optimizer holds hyperparameters and the step count, not the state: a
-- strategy owns the moments (named state kinds "exp_avg" and "exp_avg_sq",
-- placed on whatever tier it chooses) and hands the optimizer any range
-- [lo, hi) of a unit's flat buffer with the matching parameter, gradient and
-- moment tensors. The update is elementwise (kernels.h: zk_adamw), so a whole
-- unit, a shard of it, or a shard streamed through in chunks all give the
-- same bits. Weight decay applies to tensors marked decay (matrices and
-- embeddings), not to biases and LayerNorm parameters.
local ffi = require "ffi"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"

local M = {}
local AdamW = {}
AdamW.__index = AdamW

M.defaults = { lr = 3e-4, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }

-- The optimizer's state kinds, in canonical order (checkpoints, reports).
M.state_kinds = { "exp_avg", "exp_avg_sq" }

local function user_error(msg) error(msg, 0) end

-- in_range(x, lo, hi, open_hi): a number with lo <= x <= hi (x < hi when
-- open_hi). Written as the test that must pass, not the one that fails: every
-- comparison with NaN is false, so `x < lo or x >= hi` would let NaN through.
local function in_range(x, lo, hi, open_hi)
  return type(x) == "number" and x >= lo and (x < hi or not open_hi and x == hi)
end

local function show(v)
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  for i, x in ipairs(v) do parts[i] = tostring(x) end
  return "{ " .. table.concat(parts, ", ") .. " }"
end

-- check(opts) -> true | nil, message: the hyperparameters new() takes (lr,
-- betas, eps, weight_decay; nil = the default), each named as its recipe
-- key. NaN and the infinities are refused: the kernel would refuse them
-- only mid-run, or spread them through the weights.
function M.check(opts)
  local o = {}
  for k, v in pairs(M.defaults) do o[k] = opts[k] == nil and v or opts[k] end
  local b = o.betas
  if type(b) ~= "table" or #b ~= 2 or not (in_range(b[1], 0, 1, true) and in_range(b[2], 0, 1, true)) then
    return nil, ("optim.betas must be a pair of numbers in [0, 1) like { 0.9, 0.95 }, got %s"):format(show(b))
  end
  if not in_range(o.lr, 0, math.huge, true) then
    return nil, ("optim.lr must be a finite number >= 0, got %s"):format(show(o.lr))
  end
  if not (in_range(o.eps, 0, math.huge, true) and o.eps > 0) then
    return nil, ("optim.eps must be > 0 and finite, got %s"):format(show(o.eps))
  end
  if not in_range(o.weight_decay, 0, math.huge, true) then
    return nil, ("optim.weight_decay must be >= 0 and finite, got %s"):format(show(o.weight_decay))
  end
  return true
end

-- new(opts) -> optimizer; opts: lr, betas, eps, weight_decay.
function M.new(opts)
  opts = opts or {}
  local ok, err = M.check(opts)
  if not ok then user_error(err) end
  local self = setmetatable({ state_kinds = M.state_kinds }, AdamW)
  for k, v in pairs(M.defaults) do self[k] = opts[k] == nil and v or opts[k] end
  self.t = 0
  self.segments_cache = {}
  return self
end

-- new_state(n, tier) -> { exp_avg = tensor(n), exp_avg_sq = tensor(n) }, zeroed,
-- category "optim": the state for a range of n elements.
function AdamW:new_state(n, tier)
  local st = {}
  for _, k in ipairs(M.state_kinds) do
    local ok, t = pcall(T.new, { math.max(n, 1) }, { tier = tier or "device", category = "optim" })
    if not ok then                       -- nothing half-made stays allocated
      for _, made in pairs(st) do made:free() end
      error(t, 0)
    end
    st[k] = t
  end
  return st
end

-- Per-tensor segments of unit u inside [lo, hi): { offset in range, length, decay }.
function AdamW:segments(u, lo, hi)
  local key = u.index .. ":" .. lo .. ":" .. hi
  local segs = self.segments_cache[key]
  if segs then return segs end
  segs = {}
  for _, t in ipairs(u.tensors) do
    local a, b = math.max(lo, t.offset), math.min(hi, t.offset + t.numel)
    if b > a then segs[#segs + 1] = { a - lo, b - a, t.decay } end
  end
  self.segments_cache[key] = segs
  return segs
end

-- Update elements [lo, hi) of unit u's flat buffer. params, grads and the
-- moments in st (exp_avg, exp_avg_sq) are tensors whose element 0 is element
-- lo (views of a shard, a chunk streamed in, ...); padding past the unit's
-- tensors is left alone. grad_scale is the clip factor. lp (mixed
-- precision: the stored bf16 or fp16 parameters of the range, params being
-- the fp32 master): the updated elements rounded into it in the same pass,
-- the bits of a cast after (the range's padding, never updated, keeps what
-- it holds). grads f32, or a mixed-precision step's stored bf16 / fp16
-- gradient (no accumulation): widened as read, the same bits.
--
-- Each tensor's segment is a part of one zt_adamw_multi op: between
-- begin_batch() and flush() the parts of every range wait, and flush
-- issues them together -- a whole step's update in one op (one launch on a
-- GPU, where it was one a unit; ~150 a step before that, one a tensor).
-- Outside a batch the range's parts go at once. The update is elementwise:
-- the same bits either way. The tensors must stay alive until the flush.
function AdamW:update_range(u, lo, hi, params, grads, st, lr, grad_scale, lp)
  local b = self.pending or {}      -- outside a batch: this range's own parts
  if b.lr ~= nil and (b.lr ~= lr or b.scale ~= grad_scale) then
    error("adamw: one batch takes one lr and grad_scale (flush between steps)", 2)
  end
  b.lr, b.scale = lr, grad_scale
  for _, seg in ipairs(self:segments(u, lo, hi)) do
    b[#b + 1] = { params, grads, st.exp_avg, st.exp_avg_sq, lp, seg[1], seg[2],
                  seg[3] and self.weight_decay or 0 }
  end
  if b ~= self.pending then self:issue(b) end
end

-- begin_batch(): update_range's parts wait for flush(). A batch a failed
-- step left (an error between begin_batch and flush) is dropped by the
-- next begin_step or begin_batch: its tensors are not updated, and no
-- later update_range joins it.
function AdamW:begin_batch()
  self.pending = {}
end

-- flush(): the waiting parts as zt_adamw_multi ops, MAX_PARTS at a time
-- (one op for GPT-2 124M's 148 tensors); ends the batch.
local MAX_PARTS = 4096    -- zt_ops.h's ZT_ADAMW_PARTS
function AdamW:flush()
  local b = self.pending
  self.pending = nil
  if b then self:issue(b) end
end

function AdamW:issue(b)
  if #b == 0 then return end
  local cap = math.min(#b, MAX_PARTS)
  if not self.parts or self.parts_n < cap then
    self.parts, self.parts_n = ffi.new("zt_adamw_part[?]", cap), cap
  end
  local parts, b1, b2 = self.parts, self.betas[1], self.betas[2]
  for first = 1, #b, MAX_PARTS do
    local n = math.min(MAX_PARTS, #b - first + 1)
    for k = 0, n - 1 do
      local q, d = b[first + k], parts[k]
      d.param, d.grad, d.m, d.v = q[1].c, q[2].c, q[3].c, q[4].c
      d.lp = q[5] and q[5].c or nil
      d.offset, d.length, d.weight_decay = q[6], q[7], q[8]
    end
    ops.adamw_multi(parts, n, b.lr, b1, b2, self.eps, b.scale, self.t)
  end
end

-- Convenience for the REPL and tests: the optimizer keeps the state of a
-- unit's range itself. add_unit(u, {lo=, hi=, tier=}) (default the whole
-- unit), update_unit(u, params, grads, lr, scale), free(). Strategies own
-- their state instead (new_state / update_range).
function AdamW:add_unit(u, opts)
  opts = opts or {}
  local lo, hi = opts.lo or 0, opts.hi or u.numel
  self.owned = self.owned or {}
  local st = self:new_state(hi - lo, opts.tier)
  st.lo, st.hi = lo, hi
  self.owned[u.index] = st
  return st
end

function AdamW:update_unit(u, params, grads, lr, grad_scale)
  local st = self.owned and self.owned[u.index]
  if not st then error("adamw: update_unit before add_unit for unit " .. tostring(u.name), 2) end
  self:update_range(u, st.lo, st.hi, params, grads, st, lr, grad_scale)
end

function AdamW:free()
  for _, st in pairs(self.owned or {}) do
    for _, k in ipairs(M.state_kinds) do st[k]:free() end
  end
  self.owned = nil
end

-- Call once per optimizer step, before the updates.
function AdamW:begin_step()
  self.pending = nil
  self.t = self.t + 1
end

return M
