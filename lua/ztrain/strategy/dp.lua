-- ztrain.strategy.dp: data parallelism. Every rank holds the whole model and
-- optimizer; each unit's gradient is all-reduced (summed in rank order) as
-- soon as backward produces it, overlapping with the rest of backward.
--
-- Canonical order (DESIGN.md): each micro-batch's gradient is reduced across
-- ranks, then added to the accumulator, so N ranks equal one rank
-- accumulating N micro-batches, bit for bit. defer_reduction = true instead
-- accumulates locally and reduces once per step: less communication when
-- accumulating, but the sums are ordered differently (no bit-equality).
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"
local comm = require "ztrain.comm"
local norm = require "ztrain.strategy.norm"
local shard = require "ztrain.strategy.shard"

local M = {}

function M.new(opts)
  opts = opts or {}
  local S = { name = opts.defer_reduction and "dp_deferred" or "dp", opts = opts }
  local W, acc, pending

  function S.setup(ctx)
    W = comm.world()
    acc, pending = {}, {}
    ctx.model:materialize(ctx.seed)
    for _, u in ipairs(ctx.model.units) do
      ctx.optim:add_unit(u, { tier = ctx.model.tier })
      if ctx.accumulate > 1 then
        acc[u.index] = T.new({ u.padded }, { tier = ctx.model.tier, category = "grads" })
      end
    end
  end

  -- Wait for unit u's reduction of micro-batch `micro` and accumulate it.
  local function finish(u)
    local p = pending[u.index]
    if not p then return end
    pending[u.index] = nil
    p.req:wait()
    local a = acc[u.index]
    if a and not opts.defer_reduction then
      if p.micro == 0 then ops.copy(a, u.grads) else ops.add(a, u.grads) end
    end
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
      if micro == 0 then ops.copy(a, u.grads) else ops.add(a, u.grads) end
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
    local gn = norm.global({ units = units, grad_of = grad_of })
    local scale = norm.clip_scale(gn, ctx.clip)
    ctx.optim:begin_step()
    for _, u in ipairs(units) do ctx.optim:update_unit(u, u.params, grad_of(u), lr, scale) end
    return gn
  end

  function S.reduce_loss(ctx, loss_sum) return shard.sum_over_ranks(W, loss_sum) end

  function S.predicted(ctx)
    local psi = ctx.model.nparams
    return { params = 4 * psi, grads = 4 * psi, optim = 8 * psi,
             accumulator = ctx.accumulate > 1 and 4 * psi or 0 }
  end

  function S.free(ctx)
    for _, u in ipairs(ctx.model.units) do finish(u) end
    for _, a in pairs(acc or {}) do a:free() end
    acc = {}
  end

  return S
end

return M
