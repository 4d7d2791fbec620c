-- ztrain.strategy.single: one rank, no communication. The reference every
-- other strategy is compared with, and the simplest complete example of the
-- strategy hooks (see docs/strategies.md).
--
-- Gradients: each micro-batch's unit gradients are written into the unit's
-- grad buffer; with accumulation they are then added to an accumulator in
-- micro-batch order (the canonical order of DESIGN.md: never beta=1 GEMMs).
local replicated = require "ztrain.strategy.replicated"

local M = {}

function M.new(opts)
  opts = opts or {}
  local S = { name = "single", opts = opts }
  local acc = {}

  -- ctx: { model, optim, accumulate, clip, world_size, rank, seed }
  function S.setup(ctx)
    if ctx.world_size ~= 1 then
      error(("strategy single runs on one rank, but the job has %d; use dp or zero")
            :format(ctx.world_size), 0)
    end
    acc = replicated.setup(ctx)
  end

  function S.pre_forward(ctx, u) end
  function S.post_forward(ctx, u) end
  function S.pre_backward(ctx, u, micro) end

  -- micro: 0-based index of the micro-batch within the step.
  function S.post_backward(ctx, u, micro)
    if acc[u.index] then replicated.accumulate(acc[u.index], u.grads, micro) end
  end

  -- The step's gradient of unit u (the accumulator, or the last micro-batch's).
  local function grad_of(u) return acc[u.index] or u.grads end

  function S.step(ctx, lr) return replicated.step(ctx, lr, grad_of) end

  S.predicted = replicated.predicted

  function S.free(ctx)
    replicated.free(acc)
    acc = {}
  end

  return S
end

return M
