-- ztrain.strategy.dp: data parallelism. Every rank holds the whole model and
-- optimizer; each unit's gradient is all-reduced (summed in rank order) as
-- soon as backward produces it, overlapping with the rest of backward.
--
-- Canonical order (DESIGN.md): each micro-batch's gradient is reduced across
-- ranks, then added to the accumulator, so N ranks equal one rank
-- accumulating N micro-batches, bit for bit. defer_reduction = true instead
-- accumulates locally and reduces once per step: less communication when
-- accumulating, but the sums are ordered differently (no bit-equality).
local comm = require "ztrain.comm"
local shard = require "ztrain.strategy.shard"
local replicated = require "ztrain.strategy.replicated"

local M = {}

function M.new(opts)
  opts = opts or {}
  local S = { name = opts.defer_reduction and "dp_deferred" or "dp", opts = opts }
  local W, acc, pending

  function S.setup(ctx)
    W = comm.world()
    pending = {}
    acc = replicated.setup(ctx)
  end

  -- Wait for unit u's pending reduction and accumulate it (in canonical order).
  local function finish(u)
    local p = pending[u.index]
    if not p then return end
    pending[u.index] = nil
    p.req:wait()
    local a = acc[u.index]
    if a and not opts.defer_reduction then replicated.accumulate(a, u.grads, p.micro) end
  end

  function S.pre_forward(ctx, u) end
  function S.post_forward(ctx, u) end

  -- Backward of u writes the gradients of every unit it reads parameters of
  -- (the head writes embed's wte): their last reductions must be done.
  function S.pre_backward(ctx, u, micro)
    for _, pu in ipairs(ctx.model:param_units(u)) do finish(pu) end
  end

  function S.post_backward(ctx, u, micro)
    if opts.defer_reduction and ctx.accumulate > 1 then
      local a = acc[u.index]
      replicated.accumulate(a, u.grads, micro)
      if micro == ctx.accumulate - 1 then
        pending[u.index] = { req = W:all_reduce(a, true), micro = micro }
      end
      return
    end
    pending[u.index] = { req = W:all_reduce(u.grads, true), micro = micro }
  end

  local function grad_of(u) return acc[u.index] or u.grads end

  function S.step(ctx, lr)
    local units = ctx.model.units
    for i = #units, 1, -1 do finish(units[i]) end
    return replicated.step(ctx, lr, grad_of)
  end

  function S.reduce_loss(ctx, loss_sum) return shard.sum_over_ranks(W, loss_sum) end

  S.predicted = replicated.predicted

  function S.free(ctx)
    for _, u in ipairs(ctx.model.units) do finish(u) end
    replicated.free(acc)
    acc = {}
  end

  return S
end

return M
