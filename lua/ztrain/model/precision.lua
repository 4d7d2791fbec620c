-- ztrain.model.precision: mixed precision (recipe key `precision`).
--
--   fp32   everything in fp32 (the default)
--   bf16   parameters and gradients stored as bfloat16 on the device; fp32
--          master weights and optimizer state (optimizer state kinds
--          "master_params", "exp_avg", "exp_avg_sq"); fp32 gradient
--          accumulation and reduction
--   fp16   as bf16 with IEEE half, plus dynamic loss scaling (LossScaler)
--
-- Storage and compute are separate: a unit's parameters (u.params) and
-- gradients (u.grads) are low-precision tensors, and the kernels compute in
-- fp32. The stage runner (driver/stage.lua) calls enter/leave around each
-- unit's forward and backward: enter casts the parameters of the units it
-- reads (the unit, and the embedding for the tied head) into fp32 work
-- buffers and points the unit's views at them -- except with the bf16 GEMMs,
-- where every op reads the stored bf16 parameters itself, widened exactly
-- as read (Model:reads_stored), so nothing is cast; for a backward it points
-- the gradients at fp32 work buffers too (the embedding's is first filled
-- from its stored gradient: the embedding adds to the head's part); leave
-- casts those gradients back to low precision and restores the views. So every strategy sees
-- low-precision parameters and gradients, and the same kernel calls on the
-- same fp32 values in every strategy: the same-math rule holds within a
-- precision.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local ffi = require "ffi"
local core_ffi = require "ztrain.core.ffi"

local M = {}

M.NAMES = { fp32 = "f32", bf16 = "bf16", fp16 = "f16" }

local P = {}
P.__index = P

-- new(name, model) -> policy; name one of M.NAMES. The fp32 policy has
-- lp = false and does nothing.
function M.new(name, model)
  local dtype = M.NAMES[name]
  if not dtype then
    error(('precision must be "fp32", "bf16" or "fp16", got %s'):format(tostring(name)), 0)
  end
  local self = setmetatable({ name = name, dtype = dtype, lp = dtype ~= "f32", model = model,
                              pw = {}, gw = {}, saved_p = {}, saved_g = {}, slots = {} }, P)
  return self
end

-- An fp32 work buffer for slot k (a unit's largest request in slot 1:
-- slots below), at least n elements; category "activations":
-- transient, per unit, like the other per-unit scratch.
local function work(self, list, k, n)
  local w = list[k]
  if not w or w:numel() < n then
    if w then w:free() end
    w = T.new({ n }, { tier = self.model.tier, category = "activations" })
    list[k] = w
  end
  return w
end

-- The work-buffer slot of each of the units a unit reads: the largest
-- first. Slots are reused from one unit to the next (leave frees them all),
-- so the largest request always lands in slot 1: GPT-2's tied head writes
-- the embedding's wte gradient (V x C) beside its own small one, and the
-- embedding's backward then reuses that buffer instead of growing a second
-- one as large (154 MB at GPT-2's vocabulary).
local function slots(pus)
  local order = {}
  for k = 1, #pus do order[k] = k end
  table.sort(order, function(a, b)
    if pus[a].padded ~= pus[b].padded then return pus[a].padded > pus[b].padded end
    return a < b
  end)
  local slot = {}
  for i, k in ipairs(order) do slot[k] = i end
  return slot
end

-- work_bytes(model, units, gemm16) -> the bytes of the fp32 work buffers
-- enter() keeps for these units (the memory planner's, plan/activations.lua):
-- slot k grows to the largest k-th request of any of them, once for
-- parameters and once for gradients. None with the bf16 GEMMs: GPT-2's and
-- Llama's ops read and write the stored bf16 themselves (widens, writes).
function M.work_bytes(model, units, gemm16)
  if gemm16 then return 0 end
  local size = {}
  for _, u in ipairs(units) do
    local pus = model:param_units(u)
    local slot = slots(pus)
    for k, pu in ipairs(pus) do size[slot[k]] = math.max(size[slot[k]] or 0, pu.padded) end
  end
  local n = 0
  for _, e in pairs(size) do n = n + e end
  return 2 * 4 * n
end

-- enter(u, backward): fp32 views of the parameters of every unit u reads,
-- and for a backward of its gradients.
function P:enter(u, want_params, want_grads)
  if not self.lp then return end
  local model = self.model
  local pus = model:param_units(u)
  -- the units a unit reads are fixed: their slots are worked out once
  local slot = self.slots[u] or slots(pus)
  self.slots[u] = slot
  for k, pu in ipairs(pus) do
    if want_params and pu.params and self.lp_of and not self:widens(pu, u) then
      -- nothing reads pu's fp32 image (below): no work buffer, its views
      -- stay the stored ones, and the GEMMs' map points each at itself
      self:map_stored(pu, pu.params)
    elseif want_params and pu.params then
      local w = work(self, self.pw, slot[k], pu.padded)
      local v = w:view(0, { pu.padded })
      ops.cast(v, pu.params)
      self.saved_p[k] = { u = pu, lp = model:set_params(pu, v) }
      -- bf16 GEMMs read a weight as bf16: the stored view is the very bits
      -- a cast of its fp32 image gives back (bf16 -> fp32 -> bf16 is exact),
      -- a fused view (Llama's q|k|v, gate|up) likewise
      if self.lp_of then self:map_stored(pu, self.saved_p[k].lp) end
    end
    if want_grads and pu.grads and self:writes(pu) then
      self:zero_unwritten(pu, u)
    elseif want_grads and pu.grads then
      local w = work(self, self.gw, slot[k], pu.padded)
      local v = w:view(0, { pu.padded })
      -- the embedding's wte gradient is the head's part plus its own: it
      -- starts from what is stored; every other gradient is written (the
      -- embedding's when the head writes its wte part: zero, so its wpe
      -- and the padding cast back as zeros)
      if pu.kind == "embed" and pu == u then ops.cast(v, pu.grads)
      elseif pu ~= u then ops.fill(v, 0)
      elseif pu.padded > pu.numel then
        local tail = v:view(pu.numel, { pu.padded - pu.numel })
        ops.fill(tail, 0)
        tail:free()
      end
      self.saved_g[k] = { u = pu, lp = model:set_grads(pu, v) }
    end
  end
end

-- With the bf16 GEMMs, whether unit pu's backward ops write its stored
-- bf16 gradients themselves (Model:writes_stored: GPT-2's and Llama's
-- all do): each element the f32 op's rounded once, the embedding's table
-- accumulated onto what is stored and rounded once -- the bits of an fp32
-- work buffer and a cast after, without either (on the CPU devices; CUDA
-- writes a large dW as a bf16 D, its own algorithm's sum rounded once:
-- fixed for a shape on a card, so every strategy still gives one rank's
-- bits there). At GPT-2 124M that is a
-- V x C fp32 buffer (154 MB; Llama-3-8B's: 2.1 GB) and 16 casts a
-- backward, 1.2 GB of traffic a step.
function P:writes(pu)
  return self.lp_of ~= nil and self.model.writes_stored ~= nil and self.model:writes_stored(pu)
end

-- What the ops do not write, zeroed in the stored gradients (as the cast
-- of a work buffer's zeros would leave it): for the tied head, the
-- embedding's gradients but its table (the head writes the table's part,
-- the embedding's own backward adds to it); for a unit's own backward its
-- padding. The embedding's own backward writes (wpe) or adds (wte) into
-- what is stored: nothing to do.
function P:zero_unwritten(pu, u)
  if pu == u and pu.kind == "embed" then return end
  local from = pu.numel                       -- a unit's own: its padding
  if pu ~= u then
    local eg, tab = self.model:embedding_grad(), nil
    for _, t in ipairs(pu.tensors) do if pu.g[t.name] == eg then tab = t end end
    if not tab then error("precision: the tied head's unit " .. tostring(u.name) ..
                          " reads no embedding table of unit " .. tostring(pu.name), 2) end
    if tab.offset > 0 then self:zero(pu, 0, tab.offset) end
    from = tab.offset + tab.numel
  end
  if pu.padded > from then self:zero(pu, from, pu.padded) end
end

function P:zero(pu, from, to)
  local v = pu.grads:view(from, { to - from })
  ops.fill(v, 0)
  v:free()
end

-- lp_of[view] = the stored bf16 view of the same tensor, for each of pu's
-- current views (and its fused ones): what the bf16 GEMMs read
function P:map_stored(pu, lp)
  local at = {}
  for _, t in ipairs(pu.tensors) do
    self.lp_of[pu.p[t.name]] = lp:view(t.offset, t.shape)
    at[t.name] = t.offset
  end
  for _, f in ipairs(pu.fused or {}) do self.lp_of[pu.p[f[1]]] = lp:view(at[f[2]], f[3]) end
end

-- With the bf16 GEMMs, whether anything reads unit pu's parameters in fp32
-- when `reader` runs: not for another reader (the tied head reads the
-- embedding's wte only as its GEMMs' weight), nor for a unit whose ops
-- read the stored bf16 parameters themselves (Model:reads_stored: GPT-2's
-- and Llama's all do). Such a unit gets no fp32 work buffer and no cast:
-- at GPT-2 124M, B=16, T=1024 that was 61 casts in the forward and as many
-- again in the backward, each a launch on a GPU.
function P:widens(pu, reader)
  if reader ~= pu then return false end
  return not (self.model.reads_stored and self.model:reads_stored(pu))
end

-- leave(u): the fp32 gradients back into the stored low-precision ones,
-- and the stored buffers back in place.
function P:leave(u)
  if not self.lp then return end
  local model = self.model
  for k, s in pairs(self.saved_g) do
    local v = model:set_grads(s.u, s.lp)
    ops.cast(s.lp, v)
    v:free()
    self.saved_g[k] = nil
  end
  self:drop_lp_views()
  for k, s in pairs(self.saved_p) do
    local v = model:set_params(s.u, s.lp)
    v:free()
    self.saved_p[k] = nil
  end
end

function P:drop_lp_views()
  if not self.lp_of then return end
  for w, v in pairs(self.lp_of) do v:free(); self.lp_of[w] = nil end
end

-- After a failure inside a unit: restore the stored buffers (no cast).
function P:abort()
  if not self.lp then return end
  self:drop_lp_views()
  for k, s in pairs(self.saved_g) do
    local v = self.model:set_grads(s.u, s.lp); if v then v:free() end; self.saved_g[k] = nil
  end
  for k, s in pairs(self.saved_p) do
    local v = self.model:set_params(s.u, s.lp); if v then v:free() end; self.saved_p[k] = nil
  end
end

function P:free()
  self:abort()
  for _, list in ipairs({ self.pw, self.gw }) do
    for k, w in pairs(list) do w:free(); list[k] = nil end
  end
end

---------------------------------------------------------------------------
-- bf16 GEMMs (device.bf16_gemm): every matmul of a pass takes its operands
-- rounded to bf16 -- the weights exactly (they are stored as bf16), the
-- activations and their gradients by rounding -- and accumulates in fp32
-- (zt_matmul_bf16_*: AVX512_BF16 or AMX where the CPU has them, a portable
-- path with the same bits elsewhere). Other math than the fp32 kernels on
-- the same stored values, the same for every strategy. bf16 storage only
-- (fp16 values do not fit bf16 exactly).
local MMB = {}
MMB.__index = MMB

-- policy: the precision policy (optional); with it a weight the policy
-- entered is read from its stored bf16 view instead of cast again.
function M.bf16_gemm(tier, policy)
  if policy and policy.dtype == "bf16" then policy.lp_of = policy.lp_of or {} end
  return setmetatable({ tier = tier, free_bufs = {}, bases = {}, views = {}, policy = policy }, MMB)
end

-- a bf16 buffer shaped like t (reused across calls; given back by :done())
function MMB:buf(t, fill)
  local n = t:numel()
  local list = self.free_bufs[n]
  local b = list and table.remove(list)
  if not b then b = T.new({ n }, { tier = self.tier, category = "activations", dtype = "bf16" }) end
  self.bases[#self.bases + 1] = b
  local v = b:view(0, t:shape())
  self.views[#self.views + 1] = v
  if fill then ops.cast(v, t) end
  return v
end

function MMB:done()
  for i = #self.views, 1, -1 do self.views[i]:free(); self.views[i] = nil end
  for i = #self.bases, 1, -1 do
    local b = self.bases[i]
    local n = b:numel()
    self.free_bufs[n] = self.free_bufs[n] or {}
    table.insert(self.free_bufs[n], b)
    self.bases[i] = nil
  end
end

-- the bf16 image of weight w: the policy's stored view, w itself where it
-- is bf16 (a W-only pass's bf16 gradient standing in for the weight's
-- shape), or a cast
function MMB:weight(w, fill)
  local lp = self.policy and self.policy.lp_of and self.policy.lp_of[w]
  if lp then return lp end
  if w:dtype() == "bf16" then return w end
  return self:buf(w, fill)
end

-- an operand as bf16: as it is when its producer wrote bf16 (the
-- activations only GEMMs read: model/activations.lua), else a cast (when
-- fill: the values are read)
function MMB:in16(t, fill)
  if t:dtype() == "bf16" then return t end
  return self:buf(t, fill)
end

function MMB:forward_(out, inp, w, b)
  ops.matmul_bf16_forward(out, self:in16(inp, true), self:weight(w, true), b)
end

function MMB:backward_(dinp, dw, db, dout, inp, w)
  -- w is read only for dinp (without it, w only gives the shape)
  ops.matmul_bf16_backward(dinp, dw, db, self:in16(dout, true), self:in16(inp, dw ~= nil),
                           self:weight(w, dinp ~= nil))
end

-- the MLP's GEMMs with the GELU: with bf16 pre and out (activations.lua
-- stores them so) one op, which a GPU fuses (ops.matmul_bf16_forward_gelu);
-- on fp32 activations (specs' accounts) the GEMM and the GELU apart
local function b16(t) return t == nil or t:dtype() == "bf16" end
function MMB:forward_gelu_(out, inp, w, b, pre)
  if not (b16(out) and b16(pre)) then
    self:forward_(pre, inp, w, b)
    return ops.gelu_forward(out, pre)
  end
  ops.matmul_bf16_forward_gelu(out, self:in16(inp, true), self:weight(w, true), b, pre)
end

function MMB:backward_dgelu_(dinp16, dw, db, dout, inp, w, pre, dinp32)
  if not (b16(dinp16) and b16(pre)) then
    self:backward_(dinp32, dw, db, dout, inp, w)
    return ops.gelu_backward(dinp16, pre, dinp32)
  end
  ops.matmul_bf16_backward_dgelu(dinp16, dw, db, self:in16(dout, true), self:in16(inp, dw ~= nil),
                                 self:weight(w, dinp16 ~= nil), pre, dinp32)
end

-- gemm16(recipe) -> on, path: whether a run takes the bf16 GEMMs, and the
-- CPU's bf16 path (zt_matmul_bf16_info). device.bf16_gemm "on" takes them,
-- "off" not; "auto" where they outrun the fp32 ones: the CUDA device
-- (tensor cores) and CPUs whose path is AMX (AVX512_BF16 runs at half the
-- fp32 rate on the CPU kind it was measured on; the portable path is a
-- correctness fallback). Only with precision = "bf16" (the weights stored
-- as bf16). The trainer and the memory plan ask the same question here.
function M.gemm16(r)
  local path = ffi.string(core_ffi.C.zt_matmul_bf16_info())
  local bg = r.device.bf16_gemm
  local on = r.precision == "bf16" and
             (bg == "on" or (bg == "auto" and (r.device.backend == "cuda" or path:match("^AMX") ~= nil)))
  return on, path
end

-- attention_mode(recipe, cfg) -> "exact" | "bf16": device.attention with
-- "auto" resolved for the model cfg (C, NH; NKV and window where the family
-- has them). auto takes the tensor-core kernels (bf16 operands, fp32
-- accumulation; kernels/cuda/attention_tc_*.cu) where the run takes the bf16
-- GEMMs on the cuda device and the attention is what a GPU has checked:
-- every query head its own key/value head, no window, head size 64 or 128
-- (measured on an H200 at FlashAttention-2's speed at GPT-2's shape, the
-- whole step within its bf16 tolerances against the CPU: docs/gpu.md).
-- Grouped-query and windowed attention have tensor-core kernels too,
-- checked on the CPU only: "bf16" takes them. Everywhere else the fp32
-- kernels, which give the CPU's bits: fakegpu, the CPU and fp32 runs keep
-- their digests.
function M.attention_mode(r, cfg)
  local at = r.device.attention
  if at ~= "auto" then return at end
  if r.device.backend ~= "cuda" or not M.gemm16(r) then return "exact" end
  local hs = cfg.C / cfg.NH
  local mha = (cfg.NKV or cfg.NH) == cfg.NH and (cfg.window or 0) == 0
  return (mha and (hs == 64 or hs == 128)) and "bf16" or "exact"
end

-- the interface gpt2.lua calls: mm.forward(...), mm.backward(...)
function M.bf16_matmuls(tier, policy)
  local g = M.bf16_gemm(tier, policy)
  local mm = {}
  function mm.forward(...) local ok, err = pcall(g.forward_, g, ...); g:done(); if not ok then error(err, 0) end end
  function mm.backward(...) local ok, err = pcall(g.backward_, g, ...); g:done(); if not ok then error(err, 0) end end
  function mm.forward_gelu(...) local ok, err = pcall(g.forward_gelu_, g, ...); g:done(); if not ok then error(err, 0) end end
  function mm.backward_dgelu(...) local ok, err = pcall(g.backward_dgelu_, g, ...); g:done(); if not ok then error(err, 0) end end
  -- w's stored bf16 view while its unit is entered (nil: none), for an op
  -- that reads the stored parameters itself (the embedding's tables)
  function mm.stored(w) local p = g.policy; return p and p.lp_of and p.lp_of[w] end
  function mm.free()
    for _, list in pairs(g.free_bufs) do for _, b in ipairs(list) do b:free() end end
    g.free_bufs = {}
  end
  return mm
end

---------------------------------------------------------------------------
-- Dynamic loss scaling for fp16, DeepSpeed's conventions (its
-- DynamicLossScaler): start at 2^16; a step whose gradients hold an inf or
-- NaN is skipped; the first hysteresis - 1 overflows only use up the
-- hysteresis budget, every further one halves the scale (never below
-- min_scale); after `window` steps without overflow the scale doubles and
-- the budget is restored. An overflow that would halve a scale already at
-- min_scale sets `stuck` (DeepSpeed's raise_error_at_min_scale: its
-- update_scale raises "Current loss scale already at minimum"): the loop
-- (train/loop.lua) then stops the run on every rank.
local LossScaler = {}
LossScaler.__index = LossScaler

function M.loss_scaler(opts)
  opts = opts or {}
  return setmetatable({ scale = opts.initial or 2 ^ 16, window = opts.window or 1000,
                        hysteresis = opts.hysteresis or 2, min_scale = opts.min_scale or 1,
                        good = 0, skipped = 0, left = opts.hysteresis or 2 }, LossScaler)
end

-- unscale(LS, gn) -> skip, norm, factor: what a strategy's step does with
-- the global norm of the scaled gradients. skip: an inf or NaN -- the step
-- is skipped (the scaler adjusts); else the true norm and the factor the
-- update multiplies the gradients by (1 / the scale this step used).
-- Without a scaler: false, gn, 1.
function M.unscale(LS, gn)
  if not LS then return false, gn, 1.0 end
  local used = LS.scale
  if LS:update(gn ~= gn or gn == math.huge or gn == -math.huge) then return true, gn, 0 end
  return false, gn / used, 1.0 / used
end

-- update(overflow) -> true when the step must be skipped.
function LossScaler:update(overflow)
  if overflow then
    self.skipped = self.skipped + 1
    self.good = 0
    if self.left <= 1 then
      if self.scale <= self.min_scale then self.stuck = true end
      self.scale = math.max(self.scale / 2, self.min_scale)
    else
      self.left = self.left - 1
    end
    return true
  end
  self.good = self.good + 1
  if self.good % self.window == 0 then
    self.scale = self.scale * 2
    self.left = self.hysteresis
  end
  return false
end

return M
