-- ztrain.strategy.single: one rank, no communication. The reference every
-- other strategy is compared with, and the simplest complete example of the
-- strategy hooks (see docs/strategies.md).
--
-- Gradients: each micro-batch's unit gradients are written into the unit's
-- grad buffer; with accumulation they are then added to an accumulator in
-- micro-batch order (the canonical order of DESIGN.md: never beta=1 GEMMs).
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"
local norm = require "ztrain.strategy.norm"

local M = {}

function M.new(opts)
  opts = opts or {}
  local S = { name = "single", opts = opts }

  -- ctx: { model, optim, accumulate, world_size, rank }
  function S.setup(ctx)
    if ctx.world_size ~= 1 then
      error(("strategy single runs on one rank, but the job has %d; use dp or zero")
            :format(ctx.world_size), 0)
    end
    S.acc = {}
    ctx.model:materialize(ctx.seed)
    for _, u in ipairs(ctx.model.units) do
      ctx.optim:add_unit(u, { tier = ctx.model.tier })
      if ctx.accumulate > 1 then
        S.acc[u.index] = T.new({ u.padded }, { tier = ctx.model.tier, category = "grads" })
      end
    end
  end

  function S.pre_forward(ctx, u) end
  function S.post_forward(ctx, u) end
  function S.pre_backward(ctx, u, micro) end

  -- micro: 0-based index of the micro-batch within the step.
  function S.post_backward(ctx, u, micro)
    local acc = S.acc[u.index]
    if not acc then return end
    if micro == 0 then ops.copy(acc, u.grads) else ops.add(acc, u.grads) end
  end

  -- The step's gradient of unit u (the accumulator, or the last micro-batch's).
  local function grad_of(u) return S.acc[u.index] or u.grads end

  -- Clip by the global norm and update. Returns the pre-clip gradient norm.
  function S.step(ctx, lr)
    local units = ctx.model.units
    local gn = norm.global({ units = units, grad_of = grad_of })
    local scale = norm.clip_scale(gn, ctx.clip)
    ctx.optim:begin_step()
    for _, u in ipairs(units) do
      ctx.optim:update_unit(u, u.params, grad_of(u), lr, scale)
    end
    return gn
  end

  -- Bytes of model state this strategy predicts per rank (fp32: 16 psi),
  -- plus the gradient accumulator when accumulating.
  function S.predicted(ctx)
    local psi = ctx.model.nparams
    return { params = 4 * psi, grads = 4 * psi, optim = 8 * psi,
             accumulator = ctx.accumulate > 1 and 4 * psi or 0 }
  end

  function S.free(ctx)
    for _, a in pairs(S.acc or {}) do a:free() end
    S.acc = {}
  end

  return S
end

return M
