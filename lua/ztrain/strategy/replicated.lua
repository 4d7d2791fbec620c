-- ztrain.strategy.replicated: what single and dp share. Every rank holds the
-- whole model and optimizer; with accumulation each unit has an accumulator
-- that micro-batch gradients are added to in micro-batch order.
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"
local norm = require "ztrain.strategy.norm"

local M = {}

-- setup(ctx) -> acc: full parameters and optimizer state for every unit,
-- and acc[u.index] accumulators when ctx.accumulate > 1.
function M.setup(ctx)
  local acc = {}
  ctx.model:materialize(ctx.seed)
  for _, u in ipairs(ctx.model.units) do
    ctx.optim:add_unit(u, { tier = ctx.model.tier })
    if ctx.accumulate > 1 then
      acc[u.index] = T.new({ u.padded }, { tier = ctx.model.tier, category = "grads" })
    end
  end
  return acc
end

-- Add micro-batch `micro`'s gradient g into a (the first one is copied:
-- 0 + x = x, so the bits are those of the sum in micro-batch order).
function M.accumulate(a, g, micro)
  if micro == 0 then ops.copy(a, g) else ops.add(a, g) end
end

-- Clip by the global norm and update every unit; grad_of(u) is the step's
-- gradient of u. Returns the pre-clip gradient norm.
function M.step(ctx, lr, grad_of)
  local units = ctx.model.units
  local gn = norm.global({ units = units, grad_of = grad_of })
  local scale = norm.clip_scale(gn, ctx.clip)
  ctx.optim:begin_step()
  for _, u in ipairs(units) do ctx.optim:update_unit(u, u.params, grad_of(u), lr, scale) end
  return gn
end

-- Model state per rank (fp32: 16 bytes a parameter), plus the accumulator.
function M.predicted(ctx)
  local psi = ctx.model.nparams
  return { params = 4 * psi, grads = 4 * psi, optim = 8 * psi,
           accumulator = ctx.accumulate > 1 and 4 * psi or 0 }
end

function M.free(acc)
  for _, a in pairs(acc or {}) do a:free() end
end

return M
