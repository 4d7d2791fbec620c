-- ztrain.parallel.strategy.replicated: what single and dp share. Every rank holds the
-- whole model and optimizer; with accumulation each unit has an accumulator
-- that micro-batch gradients are added to in micro-batch order.
--
-- Public state (strategy/state.lua): params, grads and the optimizer's
-- kinds, unsharded, on the model's tier; ctx.state.acc[u.index] are the
-- accumulators and ctx.state.optim[u.index] the per-unit optimizer state.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local norm = require "ztrain.parallel.strategy.norm"
local state = require "ztrain.parallel.strategy.state"
local fp = require "ztrain.parallel.strategy.footprint"
local precision = require "ztrain.model.precision"

local M = {}

-- The units this rank holds: its pipeline stages' (ctx.units), or all.
function M.units(ctx) return ctx.units or ctx.model.units end
-- Their parameter count.
function M.nparams(ctx) return ctx.nparams or ctx.model.nparams end

-- setup(ctx, widened) -> st: full parameters and optimizer state for every
-- unit, and accumulators when ctx.accumulate > 1. Sets ctx.state.
--
-- Mixed precision (ctx.precision, precision.lua): u.params and u.grads are
-- low-precision; the fp32 master weights are optimizer state
-- (st.master[u.index]; the public kind "params", so checkpoints hold fp32
-- whatever the precision), the stored parameters their rounding (the
-- derived kind "lp_params"); gradients are accumulated (and reduced) in
-- fp32. Without accumulation the gradient norm and AdamW read the stored
-- gradient itself, widened as they read it (the bits of an fp32 copy), so
-- there is no accumulator -- unless `widened`: a strategy that reduces an
-- fp32 widening of each gradient into it (dp).
function M.setup(ctx, widened)
  local model, tier, P = ctx.model, ctx.model.tier, ctx.precision
  local st = state.new(model, ctx.dp, false)
  st.acc, st.optim, st.master = {}, {}, {}
  ctx.state = st
  local units = M.units(ctx)
  if P then
    for _, u in ipairs(units) do
      local master = T.new({ u.padded }, { tier = tier, category = "optim" })
      st.master[u.index] = master
      model:set_params(u, master)
      model:init_unit(u, ctx.seed)
      model:set_params(u, nil)
      local lp = T.new({ u.padded }, { dtype = P.dtype, tier = tier, category = "params" })
      model:set_params(u, lp)
      ops.cast(lp, master)
      model:set_grads(u, T.new({ u.padded }, { dtype = P.dtype, tier = tier, category = "grads" }))
    end
    state.add_kind(st, "params", { tier = tier, category = "optim" })
    state.add_kind(st, "lp_params", { dtype = P.dtype, tier = tier, category = "params", derived = true })
  else
    model:materialize(ctx.seed, { units = units })
    state.add_kind(st, "params", { tier = tier, category = "params" })
  end
  -- the step's gradient: the fp32 accumulator, or (none kept) the stored one
  local keep_acc = ctx.accumulate > 1 or (P and widened)
  state.add_kind(st, "grads", { dtype = (P and not keep_acc) and P.dtype or nil, tier = tier,
                                category = "grads" })
  for _, k in ipairs(ctx.optim.state_kinds) do state.add_kind(st, k, { tier = tier, category = "optim" }) end
  for _, u in ipairs(units) do
    if P then
      state.set(st, "params", u, 0, u.padded, st.master[u.index])
      state.set(st, "lp_params", u, 0, u.padded, u.params)
    else
      state.set(st, "params", u, 0, u.padded, u.params)
    end
    local os = ctx.optim:new_state(u.numel, tier)
    st.optim[u.index] = os
    for _, k in ipairs(ctx.optim.state_kinds) do state.set(st, k, u, 0, u.numel, os[k]) end
    if keep_acc then
      st.acc[u.index] = T.new({ u.padded }, { tier = tier, category = "grads" })
    end
    state.set(st, "grads", u, 0, u.padded, st.acc[u.index] or u.grads)
  end
  return st
end

-- Add micro-batch `micro`'s gradient g into a (the first one is copied:
-- 0 + x = x, so the bits are those of the sum in micro-batch order). A
-- low-precision g is widened to fp32 as it is read (the cast's bits; no
-- fp32 copy of it: zt_add takes a 2-byte x).
function M.accumulate(a, g, micro)
  if micro > 0 then return ops.add(a, g) end
  if g:dtype() ~= "f32" then return ops.cast(a, g) end
  ops.copy(a, g)
end

-- The step's gradient of unit u: the accumulator, or the last micro-batch's.
function M.grad_of(ctx, u) return ctx.state.acc[u.index] or u.grads end

-- Clip by the global norm and update every unit. Returns the pre-clip norm.
-- With a loss scaler (fp16) the gradients hold scale x the true ones: a
-- non-finite norm skips the step (the scaler adjusts), else the update
-- divides by the scale. With mixed precision the fp32 master weights are
-- updated and the stored parameters re-rounded from them.
function M.step(ctx, lr)
  local units, st, LS = M.units(ctx), ctx.state, ctx.loss_scaler
  local gn = norm.global({ units = units, grad_of = function(u) return M.grad_of(ctx, u) end, pp = ctx.pp })
  local skip, unscale
  skip, gn, unscale = precision.unscale(LS, gn)
  if skip then return gn end
  local scale = norm.clip_scale(gn, ctx.clip) * unscale
  ctx.optim:begin_step()
  -- every unit's update in one op (one launch on a GPU), where the
  -- optimizer batches (model/adamw.lua; a user's may not)
  local batch = ctx.optim.begin_batch ~= nil
  if batch then ctx.optim:begin_batch() end
  for _, u in ipairs(units) do
    local master = st.master[u.index]
    -- mixed precision: the stored parameters rounded from the master in the update's pass
    ctx.optim:update_range(u, 0, u.numel, master or u.params, M.grad_of(ctx, u), st.optim[u.index], lr,
                           scale, master and u.params or nil)
  end
  if batch then ctx.optim:flush() end
  return gn
end

-- After a load (state.import filled the fp32 master weights): the stored
-- low-precision parameters re-rounded from them.
function M.after_load(ctx)
  local st = ctx.state
  for _, u in ipairs(M.units(ctx)) do
    if st.master[u.index] then ops.cast(u.params, st.master[u.index]) end
  end
end

-- Mixed precision: every unit's full fp32 master weights are here (digest,
-- export, samples read them).
function M.with_full_params(ctx, u, fn)
  local m = ctx.state.master[u.index]
  return fn(m or u.params)
end

-- What single and dp share under mixed precision, set at setup (the fp32
-- strategy object stays as it was): with_full_params (the master weights)
-- and a load that re-rounds the stored parameters.
function M.precision_hooks(S, ctx)
  if not ctx.precision then return end
  S.with_full_params = M.with_full_params
  S.after_load = M.after_load
end

-- Model state per rank: fp32, 16 bytes a parameter (4 params + 4 grads +
-- 8 optimizer), plus the accumulator; mixed precision, 2 + 2 + 12 (fp32
-- master weights with the optimizer's two moments), plus the fp32
-- accumulator where gradients are accumulated or (dp) widened.
function M.predicted(ctx, widened)
  local psi = M.nparams(ctx)
  if ctx.precision then
    return { params = 2 * psi, grads = 2 * psi, optim = 12 * psi,
             accumulator = (ctx.accumulate > 1 or widened) and 4 * psi or 0 }
  end
  return { params = 4 * psi, grads = 4 * psi, optim = 8 * psi,
           accumulator = ctx.accumulate > 1 and 4 * psi or 0 }
end

-- The memory model of a replicated strategy (single, dp; footprint.lua):
-- the full model state, and as working buffers the MPI scratch of the
-- largest unit's all-reduce and, in a 2-byte precision, the widened
-- gradients being reduced (dp, on any number of ranks: its pool). single
-- accumulates a 2-byte gradient into fp32 as it reads it: no buffer.
M.placement = { stage = 0 }      -- a strategy object takes its own copy (single.lua, dp.lua)
function M.footprint(t, f, pooled)
  fp.replicated_state(t, f.units, f.lowp, f.accumulate, pooled)
  local s = fp.shapes(f.units)
  fp.add(t, "device", "comm", fp.mpi_scratch(s.largest, f.N))
  if f.lowp and (f.N > 1 or pooled) then fp.add(t, "device", "comm", fp.widened(s)) end
end
-- dp's: widened through its pool, one rank or many
function M.footprint_pooled(t, f) return M.footprint(t, f, true) end

-- Free what setup allocated (the model's own buffers are the trainer's).
-- Safe after a setup that failed part-way, and twice.
function M.free(ctx)
  local st = ctx and ctx.state
  if not st then return end
  for _, a in pairs(st.acc or {}) do a:free() end
  for _, m in pairs(st.master or {}) do m:free() end
  st.master = {}
  for _, os in pairs(st.optim or {}) do for _, t in pairs(os) do t:free() end end
  st.acc, st.optim = {}, {}
end

return M
