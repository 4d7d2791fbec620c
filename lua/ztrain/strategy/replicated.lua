-- ztrain.strategy.replicated: what single and dp share. Every rank holds the
-- whole model and optimizer; with accumulation each unit has an accumulator
-- that micro-batch gradients are added to in micro-batch order.
--
-- Public state (strategy/state.lua): params, grads and the optimizer's
-- kinds, unsharded, on the model's tier; ctx.state.acc[u.index] are the
-- accumulators and ctx.state.optim[u.index] the per-unit optimizer state.
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"
local norm = require "ztrain.strategy.norm"
local state = require "ztrain.strategy.state"

local M = {}

-- The units this rank holds: its pipeline stages' (ctx.units), or all.
function M.units(ctx) return ctx.units or ctx.model.units end
-- Their parameter count.
function M.nparams(ctx) return ctx.nparams or ctx.model.nparams end

-- setup(ctx) -> st: full parameters and optimizer state for every unit,
-- and accumulators when ctx.accumulate > 1. Sets ctx.state.
function M.setup(ctx)
  local model, tier = ctx.model, ctx.model.tier
  local st = state.new(model, ctx.dp, false)
  st.acc, st.optim = {}, {}
  ctx.state = st
  local units = M.units(ctx)
  model:materialize(ctx.seed, { units = units })
  state.add_kind(st, "params", { tier = tier, category = "params" })
  state.add_kind(st, "grads", { tier = tier, category = "grads" })
  for _, k in ipairs(ctx.optim.state_kinds) do state.add_kind(st, k, { tier = tier, category = "optim" }) end
  for _, u in ipairs(units) do
    state.set(st, "params", u, 0, u.padded, u.params)
    local os = ctx.optim:new_state(u.numel, tier)
    st.optim[u.index] = os
    for _, k in ipairs(ctx.optim.state_kinds) do state.set(st, k, u, 0, u.numel, os[k]) end
    if ctx.accumulate > 1 then
      st.acc[u.index] = T.new({ u.padded }, { tier = tier, category = "grads" })
    end
    state.set(st, "grads", u, 0, u.padded, st.acc[u.index] or u.grads)
  end
  return st
end

-- Add micro-batch `micro`'s gradient g into a (the first one is copied:
-- 0 + x = x, so the bits are those of the sum in micro-batch order).
function M.accumulate(a, g, micro)
  if micro == 0 then ops.copy(a, g) else ops.add(a, g) end
end

-- The step's gradient of unit u: the accumulator, or the last micro-batch's.
function M.grad_of(ctx, u) return ctx.state.acc[u.index] or u.grads end

-- Clip by the global norm and update every unit. Returns the pre-clip norm.
function M.step(ctx, lr)
  local units, st = M.units(ctx), ctx.state
  local gn = norm.global({ units = units, grad_of = function(u) return M.grad_of(ctx, u) end, pp = ctx.pp })
  local scale = norm.clip_scale(gn, ctx.clip)
  ctx.optim:begin_step()
  for _, u in ipairs(units) do
    ctx.optim:update_range(u, 0, u.numel, u.params, M.grad_of(ctx, u), st.optim[u.index], lr, scale)
  end
  return gn
end

-- Model state per rank (fp32: 16 bytes a parameter), plus the accumulator.
function M.predicted(ctx)
  local psi = M.nparams(ctx)
  return { params = 4 * psi, grads = 4 * psi, optim = 8 * psi,
           accumulator = ctx.accumulate > 1 and 4 * psi or 0 }
end

-- Free what setup allocated (the model's own buffers are the trainer's).
-- Safe after a setup that failed part-way, and twice.
function M.free(ctx)
  local st = ctx and ctx.state
  if not st then return end
  for _, a in pairs(st.acc or {}) do a:free() end
  for _, os in pairs(st.optim or {}) do for _, t in pairs(os) do t:free() end end
  st.acc, st.optim = {}, {}
end

return M
