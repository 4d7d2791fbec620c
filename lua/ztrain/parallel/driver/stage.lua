-- ztrain.parallel.driver.stage: a stage's units run with the strategy's hooks, and
-- the activation sets of its micro-batches in flight.
--
-- A stage is { index (0-based), units (consecutive), has_embed, has_head }.
-- Every driver runs units through these functions, so a strategy sees the
-- same hook calls whatever the driver:
--   pre_forward, post_forward      around a unit's forward
--   pre_backward                   before its backward reads parameters (B or I)
--   post_input_grad                its input gradient is done: parameters may go
--   pre_weight_grad                its weight gradients are about to be written (B or W)
--   post_backward                  its weight gradient is complete: reduce it
-- Fused: pre_backward, pre_weight_grad, B, post_input_grad, post_backward.
-- Split: I = pre_backward, I, post_input_grad; W = pre_weight_grad, W, post_backward.
local Acts = require "ztrain.model.activations"
local stream = require "ztrain.core.stream"

-- a copy between tiers, waited for (kept inputs to and from the host)
local function copy_wait(dst, src)
  stream.copy_async(dst, src)
  stream.current():sync()
end

local M = {}

-- stages(model, bounds) -> list of stages. bounds: unit counts per stage
-- (nil: one stage with every unit).
function M.stages(model, counts)
  counts = counts or { #model.units }
  local out, i = {}, 1
  for s, n in ipairs(counts) do
    local st = { index = s - 1, units = {} }
    for _ = 1, n do
      local u = model.units[i]
      st.units[#st.units + 1] = u
      if u.kind == "embed" then st.has_embed = true end
      if u.kind == "head" then st.has_head = true end
      i = i + 1
    end
    out[s] = st
  end
  assert(i == #model.units + 1, "stage unit counts must add up to the model's units")
  return out
end

---------------------------------------------------------------------------
-- Activation sets: a pool per stage, one set per micro-batch in flight.
local Pool = {}
Pool.__index = Pool

-- pool(model, stage, B, T, opts) -> pool: acquire(mb) / get(mb) /
-- release(mb) / free(). opts.checkpoint = { [unit index] = true }: those
-- blocks keep only their input per micro-batch and are recomputed in
-- backward; opts.host: that input kept on the host tier (model/activations.lua).
function M.pool(model, stage, B, Tlen, opts)
  local ckpt = {}
  for _, u in ipairs(stage.units) do
    if opts and opts.checkpoint and opts.checkpoint[u.index] then ckpt[u.index] = true end
  end
  local self = setmetatable({ model = model, stage = stage, B = B, T = Tlen, free_sets = {},
                              live = {}, wfree = {}, nsets = 0, peak_sets = 0, checkpoint = ckpt,
                              host = opts and opts.host and next(ckpt) ~= nil }, Pool)
  self.scratch = Acts.scratch(model.cfg, B, Tlen, model.tier, { recompute = next(ckpt) ~= nil,
                                                                host = self.host, gemm16 = model.gemm16 })
  return self
end

-- checkpoint_units(units, every) -> { [unit index] = true }: every k-th
-- block of the model, counted over all its units whatever the stages
-- (every = 1: all blocks; true means 1; false or 0: none). The one place the
-- rule is written: the trainer and the planner (plan/init.lua) both ask it.
function M.checkpoint_units(units, every)
  if every == true then every = 1 end
  local out = {}
  if not every or every == false or every == 0 then return out end
  local k = 0
  for _, u in ipairs(units) do
    if u.kind == "block" then
      if k % every == 0 then out[u.index] = true end
      k = k + 1
    end
  end
  return out
end

function Pool:acquire(mb)
  assert(not self.live[mb], "micro-batch " .. tostring(mb) .. " already has activations")
  local a = table.remove(self.free_sets)
  if not a then
    a = Acts.new(self.model.cfg, self.B, self.T, self.model.tier, self.stage.units, self.scratch,
                 { checkpoint = self.checkpoint, host = self.host, gemm16 = self.model.gemm16 })
    self.nsets = self.nsets + 1
    self.peak_sets = math.max(self.peak_sets, self.nsets)
  end
  a.mb = mb
  self.live[mb] = a
  return a
end

-- Release every set still live (a step that failed part-way leaves some):
-- each step starts from none, so no micro-batch reuses stale inputs.
function Pool:reset()
  for mb, a in pairs(self.live) do
    for _, u in ipairs(self.stage.units) do self:wput(u, a.w[u.index]); a.w[u.index] = nil end
    self:release(mb)
  end
end

function Pool:get(mb)
  local a = self.live[mb]
  if not a then error(("stage %d has no activations for micro-batch %s"):format(self.stage.index, tostring(mb)), 2) end
  return a
end

function Pool:release(mb)
  local a = self.live[mb]
  self.live[mb] = nil
  if a then self.free_sets[#self.free_sets + 1] = a end
end

-- A W-pass record for unit u (pooled by unit kind).
function Pool:wget(u)
  local list = self.wfree[u.kind]
  local w = list and table.remove(list)
  return w or self.model:wgrad(u, self.B, self.T)
end

function Pool:wput(u, w)
  if not w then return end
  self.wfree[u.kind] = self.wfree[u.kind] or {}
  table.insert(self.wfree[u.kind], w)
end

function Pool:free()
  for mb in pairs(self.live) do self:release(mb) end
  for _, a in ipairs(self.free_sets) do
    for _, u in ipairs(self.stage.units) do self:wput(u, a.w[u.index]) end
    a:free()
  end
  for _, list in pairs(self.wfree) do for _, w in ipairs(list) do w.free() end end
  self.free_sets, self.wfree = {}, {}
  if self.scratch then self.scratch.free(); self.scratch = nil end
end

---------------------------------------------------------------------------
-- Running a stage. ctx: the strategy context; S: the strategy.

-- forward(ctx, S, stage, a, mb) -> the stage's output (the head: losses).
function M.forward(ctx, S, stage, a, mb)
  a.mm = ctx.mm
  local model = ctx.model
  local x = stage.has_embed and a.tokens or a.input
  local P = ctx.precision
  for _, u in ipairs(stage.units) do
    S.pre_forward(ctx, u, mb)
    if P then P:enter(u, true, false) end
    local xin = x
    x = model:forward(u, a, x)
    if P then P:leave(u) end
    -- a checkpointed block's input kept on the host (train.checkpoint_host)
    if a.hx and a.hx[u.index] then copy_wait(a.hx[u.index], xin) end
    S.post_forward(ctx, u, mb)
  end
  return x
end

-- backward (fused I + W) over the stage's units in reverse; a.grad holds
-- the gradient of the stage's output (set by the head, or received), and
-- the gradient of its input at the end (nil for the first stage).
function M.backward(ctx, S, stage, a, mb)
  a.mm = ctx.mm
  local model, units, P = ctx.model, stage.units, ctx.precision
  for i = #units, 1, -1 do
    local u = units[i]
    S.pre_backward(ctx, u, mb)
    S.pre_weight_grad(ctx, u, mb)
    -- the parameters widened where the backward (or a recompute) reads them
    if P then P:enter(u, a.checkpointed[u.index] or model:backward_reads_params(u), true) end
    -- a checkpointed block: its forward again, from its kept input
    if a.checkpointed[u.index] then
      local x = a.x[u.index]
      if a.hx and a.hx[u.index] then x = a.scratch.xin; copy_wait(x, a.hx[u.index]) end
      model:forward(u, a, x)
    end
    if ctx.tied then ctx.tied:before_weight(u, mb) end
    model:backward(u, a)
    if ctx.tied then ctx.tied:after_weight(u, mb) end
    if P then P:leave(u) end
    S.post_input_grad(ctx, u, mb)
    S.post_backward(ctx, u, mb)
  end
end

-- The input-gradient half: what W needs is kept in a.w[u.index].
function M.backward_input(ctx, S, stage, a, mb, pool)
  a.mm = ctx.mm
  local model, units, P = ctx.model, stage.units, ctx.precision
  for i = #units, 1, -1 do
    local u = units[i]
    if a.checkpointed[u.index] then
      error("activation checkpointing needs the fused backward (B): a split W reads activations that the " ..
            "next block's recompute overwrites; use a schedule without I/W (1f1b, gpipe, interleaved_1f1b)", 0)
    end
    S.pre_backward(ctx, u, mb)
    a.w[u.index] = pool:wget(u)
    if P then P:enter(u, model:backward_reads_params(u), false) end
    model:backward_input(u, a, a.w[u.index])
    if P then P:leave(u) end
    S.post_input_grad(ctx, u, mb)
  end
end

-- The weight-gradient half, in the same unit order as the fused backward
-- (the head's wte gradient before the embedding's).
function M.backward_weight(ctx, S, stage, a, mb, pool)
  a.mm = ctx.mm
  local model, units, P = ctx.model, stage.units, ctx.precision
  for i = #units, 1, -1 do
    local u = units[i]
    S.pre_weight_grad(ctx, u, mb)
    if P then P:enter(u, false, true) end
    if ctx.tied then ctx.tied:before_weight(u, mb) end
    model:backward_weight(u, a, a.w[u.index])
    if ctx.tied then ctx.tied:after_weight(u, mb) end
    if P then P:leave(u) end
    pool:wput(u, a.w[u.index])
    a.w[u.index] = nil
    S.post_backward(ctx, u, mb)
  end
end

return M
