-- ztrain.parallel.strategy.single: one rank, no communication. The reference every
-- other strategy is compared with, and the simplest complete example of a
-- strategy (see docs/strategies.md).
--
-- Gradients: each micro-batch's unit gradients are written into the unit's
-- grad buffer; with accumulation they are then added to an accumulator in
-- micro-batch order (the canonical order of DESIGN.md: never beta=1 GEMMs).
local replicated = require "ztrain.parallel.strategy.replicated"
local options = require "ztrain.parallel.strategy.options"

local M = {}

-- check_ranks(n) -> true | nil, err: single runs on a data-parallel group of one
function M.check_ranks(n)
  if n ~= 1 then return nil, ("strategy single runs on one rank, but the job has %d; use dp or zero"):format(n) end
  return true
end

function M.new(opts)
  opts = options.check("single", opts, {})
  local S = { name = "single", opts = opts }

  -- ctx: { model, optim, dp, pp, accumulate, clip, seed, recipe, ... }
  function S.setup(ctx)
    local okn, nerr = M.check_ranks(ctx.dp and ctx.dp.size or 1)
    if not okn then error(nerr, 0) end
    replicated.setup(ctx)
    replicated.precision_hooks(S, ctx)
  end

  -- micro: 0-based index of the micro-batch within the step.
  function S.post_backward(ctx, u, micro)
    local a = ctx.state.acc[u.index]
    if a then replicated.accumulate(a, u.grads, micro) end
  end

  S.step = replicated.step
  S.predicted = replicated.predicted
  S.placement, S.footprint = { stage = 0 }, replicated.footprint
  S.free = replicated.free
  return options.complete(S)
end

return M
