-- ztrain.parallel.strategy.dp: data parallelism. Every rank of the data-parallel
-- group (ctx.dp) holds the whole model and optimizer; each unit's gradient
-- is all-reduced (summed in rank order) as soon as backward produces it,
-- overlapping with the rest of backward.
--
-- Canonical order (DESIGN.md): each micro-batch's gradient is reduced across
-- ranks, then added to the accumulator, so N ranks equal one rank
-- accumulating N micro-batches, bit for bit. defer_reduction = true instead
-- accumulates locally and reduces once per step: less communication when
-- accumulating, but the sums are ordered differently (no bit-equality).
local shard = require "ztrain.parallel.strategy.shard"
local ops = require "ztrain.core.ops"
local replicated = require "ztrain.parallel.strategy.replicated"
local options = require "ztrain.parallel.strategy.options"

local M = {}

function M.new(opts)
  opts = options.check("dp", opts, { "defer_reduction" })
  local defer = opts.defer_reduction and true or false
  local S = { name = defer and "dp_deferred" or "dp", opts = opts }
  S.placement, S.footprint = { stage = 0 }, replicated.footprint_pooled

  function S.setup(ctx)
    ctx.work = { pending = {} }      -- [unit index] = { req, micro }: reductions in flight
    if ctx.precision and defer then
      error("dp_deferred runs in fp32 only (it reduces the accumulator); use dp with precision " ..
            ctx.precision.name, 0)
    end
    replicated.setup(ctx, true)   -- mixed precision: reduced widened into the accumulator
    replicated.precision_hooks(S, ctx)
    -- mixed precision: gradients are reduced in fp32, widened into a
    -- buffer of their own per reduction in flight (category comm)
    if ctx.precision then ctx.work.pool = shard.pool(ctx.model.tier) end
  end

  -- Wait for unit u's pending reduction and accumulate it (in canonical order).
  local function finish(ctx, u)
    local pending = ctx.work.pending
    local p = pending[u.index]
    if not p then return end
    pending[u.index] = nil
    p.req:wait()
    local a = ctx.state.acc[u.index]
    if a and not defer then replicated.accumulate(a, p.buf or u.grads, p.micro) end
    if p.buf then ctx.work.pool.put(p.buf) end
  end

  -- The weight-gradient pass of u writes the gradients of every unit it
  -- reads parameters of (the head writes embed's wte): their last
  -- reductions must be done.
  function S.pre_weight_grad(ctx, u, micro)
    for _, pu in ipairs(ctx.model:param_units(u)) do finish(ctx, pu) end
  end

  function S.post_backward(ctx, u, micro)
    local pending = ctx.work.pending
    if defer and ctx.accumulate > 1 then
      local a = ctx.state.acc[u.index]
      replicated.accumulate(a, u.grads, micro)
      if micro == ctx.accumulate - 1 then
        pending[u.index] = { req = ctx.dp:all_reduce(a, true), micro = micro }
      end
      return
    end
    if ctx.precision then
      local buf = ctx.work.pool.get(u.padded)
      ops.cast(buf, u.grads)
      pending[u.index] = { req = ctx.dp:all_reduce(buf, true), micro = micro, buf = buf }
      return
    end
    pending[u.index] = { req = ctx.dp:all_reduce(u.grads, true), micro = micro }
  end

  -- Every reduction of the step done (the REDUCE_GRAD action).
  function S.finish_grads(ctx)
    local units = replicated.units(ctx)
    for i = #units, 1, -1 do finish(ctx, units[i]) end
  end

  function S.step(ctx, lr)
    S.finish_grads(ctx)
    return replicated.step(ctx, lr)
  end

  function S.reduce_loss(ctx, loss_sum) return shard.sum_over_ranks(ctx.dp, loss_sum) end

  S.predicted = function(ctx) return replicated.predicted(ctx, true) end

  -- Safe after a failed or partial setup (ctx.work or ctx.state missing).
  function S.free(ctx)
    if ctx and ctx.work and ctx.work.pending then
      for _, u in ipairs(replicated.units(ctx)) do pcall(finish, ctx, u) end
    end
    if ctx and ctx.work and ctx.work.pool then ctx.work.pool.free(); ctx.work.pool = nil end
    replicated.free(ctx)
  end

  return options.complete(S)
end

return M
