-- examples/local_sgd.lua -- a strategy written by a user: periodic
-- parameter averaging (local SGD), and DiLoCo's outer optimizer on top.
--
-- Every rank trains its own replica on its own data (micro-batch j of step
-- s on rank r reads global batch (s-1)*accumulate*N + j*N + r, as under
-- dp), with its own inner optimizer (the recipe's AdamW, its moments never
-- shared), and talks to the others only once every `every` steps:
--
--   outer = "average"   the replicas' parameters are averaged (local SGD)
--   outer = "nesterov"  DiLoCo: each rank's outer gradient, the distance it
--                       moved since the last sync (start - params), is
--                       averaged and fed to Nesterov SGD (outer_lr,
--                       outer_momentum) on the parameters of the last sync
--
-- Communication falls by a factor `every` against dp; the price is that
-- this leaves the same-math rule on purpose: between syncs the ranks hold
-- different parameters, and no synchronous strategy computes what it does.
-- Its own identities, checked by spec/e2e/examples_spec.lua: at N=1 it is dp;
-- with every=1, plain averaging and SGD it is dp up to rounding; DiLoCo
-- with outer lr 1 and no momentum is averaging up to rounding; right after
-- a sync every rank holds the same bits (trace = true writes each rank's
-- parameter digest after every step).
--
--   build/ztrain --nproc 2 examples/diloco.lua
local zt = require "ztrain"
local ops = zt.ops
local replicated = require "ztrain.parallel.strategy.replicated"
local norm = require "ztrain.parallel.strategy.norm"
local shard = require "ztrain.parallel.strategy.shard"
local options = require "ztrain.parallel.strategy.options"

local M = {}

-- An SGD optimizer with the interface strategies hand ranges to
-- (model/adamw.lua): no state, p <- p - lr * scale * g. Linear in g, which
-- is what makes "average after one step" equal "step on the average".
function M.sgd()
  local O = { state_kinds = {}, t = 0 }
  function O:new_state() return {} end
  function O:begin_step() self.t = self.t + 1 end
  function O:update_range(u, lo, hi, params, grads, _, lr, scale)
    local n = math.min(hi, u.numel) - lo
    local p, g = params:view(0, { n }), grads:view(0, { n })
    ops.axpy(p, -lr * scale, g)
    p:free(); g:free()
  end
  return O
end

-- new{ every = H, outer = "average" | "nesterov", outer_lr, outer_momentum,
--      inner = "adamw" | "sgd", trace = false } -> strategy
function M.new(opts)
  opts = options.check("local_sgd", opts, { "every", "outer", "outer_lr", "outer_momentum", "inner", "trace" })
  local every = opts.every or 8
  local outer = opts.outer or "average"
  local outer_lr, mu = opts.outer_lr or 0.7, opts.outer_momentum or 0.9
  assert(every >= 1 and every % 1 == 0, "local_sgd: every must be a whole number of steps >= 1")
  assert(outer == "average" or outer == "nesterov", 'local_sgd: outer must be "average" or "nesterov"')
  local S = { name = outer == "nesterov" and "diloco" or "local_sgd", opts = opts }
  local trace   -- defined below

  function S.setup(ctx)
    if ctx.precision then error(S.name .. " runs in fp32 only", 0) end
    if ctx.pp then error(S.name .. " replicates the whole model: no pipeline stages", 0) end
    local ev = ctx.recipe.train.eval_every
    if ev > 0 and ev % every ~= 0 then
      -- evaluation splits its batches over the ranks: they must hold one model
      error(("%s: train.eval_every (%d) must be a multiple of every (%d), so that evaluation "
             .. "sees the averaged model"):format(S.name, ev, every), 0)
    end
    if ctx.recipe.train.ckpt_every > 0 or ctx.recipe.resume ~= "" then
      -- a checkpoint would hold rank 0's replica and not the outer state
      error(S.name .. " does not checkpoint yet: set train.ckpt_every = 0", 0)
    end
    if opts.inner == "sgd" then ctx.optim = M.sgd() end
    replicated.setup(ctx)   -- whole model, inner optimizer state, accumulators
    ctx.work = { since_sync = 0, step = 0, pool = shard.pool(ctx.model.tier), start = {}, momentum = {} }
    if outer == "nesterov" then
      -- the outer optimizer's state: the parameters of the last sync (the
      -- same on every rank) and Nesterov's momentum buffer
      for _, u in ipairs(replicated.units(ctx)) do
        local start = zt.tensor.new({ u.padded }, { tier = ctx.model.tier, category = "optim" })
        ops.copy(start, u.params)
        ctx.work.start[u.index] = start
        ctx.work.momentum[u.index] = zt.tensor.new({ u.padded }, { tier = ctx.model.tier, category = "optim" })
      end
    end
  end

  -- No reduction during backward: the gradient stays on this rank. With
  -- accumulation it is added to the accumulator in micro-batch order.
  function S.post_backward(ctx, u, mb)
    local acc = ctx.state.acc[u.index]
    if acc then replicated.accumulate(acc, u.grads, mb) end
  end

  -- Plain averaging: every replica's parameters summed in rank order, / N.
  local function average(ctx)
    local units, N = replicated.units(ctx), ctx.dp.size
    local reqs = {}
    for i, u in ipairs(units) do reqs[i] = ctx.dp:all_reduce(u.params, true) end  -- all in flight at once
    for i, u in ipairs(units) do reqs[i]:wait(); ops.scale(u.params, 1 / N) end
  end

  -- DiLoCo: delta = mean over ranks of (start - params); Nesterov SGD on
  -- start with delta as its gradient (PyTorch's formula: m = mu m + delta;
  -- start -= outer_lr (delta + mu m)); every replica restarts from start.
  local function outer_step(ctx)
    local N, work = ctx.dp.size, ctx.work
    for _, u in ipairs(replicated.units(ctx)) do
      local start, m = work.start[u.index], work.momentum[u.index]
      local delta = work.pool.get(u.padded)
      ops.copy(delta, start)
      ops.axpy(delta, -1, u.params)
      ctx.dp:all_reduce(delta)
      ops.scale(delta, 1 / N)
      ops.scale(m, mu)
      ops.add(m, delta)
      ops.axpy(delta, mu, m)
      ops.axpy(start, -outer_lr, delta)
      ops.copy(u.params, start)
      work.pool.put(delta)
    end
  end

  -- The inner step on this rank's own gradient, then (every H steps, and at
  -- the last step so that the run ends with one model) the outer step.
  function S.step(ctx, lr)
    local units, N, work = replicated.units(ctx), ctx.dp.size, ctx.work
    -- the trainer scales each rank's loss by 1/N (it expects a sum over
    -- ranks): this rank's own mean gradient is N x grads (exact for N a
    -- power of two), and so is its norm
    local grad_of = function(u) return replicated.grad_of(ctx, u) end
    local gn = N * norm.global({ units = units, grad_of = grad_of })
    local scale = norm.clip_scale(gn, ctx.clip) * N
    ctx.optim:begin_step()
    for _, u in ipairs(units) do
      ctx.optim:update_range(u, 0, u.numel, u.params, grad_of(u), ctx.state.optim[u.index], lr, scale)
    end
    work.step, work.since_sync = work.step + 1, work.since_sync + 1
    local synced = work.since_sync == every or work.step == ctx.recipe.train.steps
    if synced then
      if outer == "nesterov" then outer_step(ctx) else average(ctx) end
      work.since_sync = 0
    end
    if opts.trace then trace(ctx, synced) end
    return gn    -- this rank's own gradient norm (rank 0's is logged)
  end

  -- trace: one line per step in OUT/local_sgd.rank<r>.jsonl with this
  -- rank's parameter digest (no collective: its own replica).
  function trace(ctx, synced)
    local path = ("%s/local_sgd.rank%d.jsonl"):format(ctx.out_dir, ctx.dp.rank)
    if not ctx.work.trace then
      assert(require("ztrain.record.report").mkdirs(ctx.out_dir))
      ctx.work.trace = assert(io.open(path, "w"))
    end
    ctx.work.trace:write(('{"step":%d,"synced":%s,"digest":"%s"}\n')
      :format(ctx.work.step, tostring(synced), zt.digest.params(ctx.model)))
    ctx.work.trace:flush()
  end

  function S.reduce_loss(ctx, sum) return shard.sum_over_ranks(ctx.dp, sum) end

  function S.predicted(ctx)
    local p = replicated.predicted(ctx)
    if outer == "nesterov" then p.optim = p.optim + 8 * replicated.nparams(ctx) end
    return p
  end

  function S.free(ctx)
    local work = ctx and ctx.work
    if work then
      if work.trace then work.trace:close(); work.trace = nil end
      for _, t in pairs(work.start) do t:free() end
      for _, t in pairs(work.momentum) do t:free() end
      work.start, work.momentum = {}, {}
      if work.pool then work.pool.free(); work.pool = nil end
    end
    replicated.free(ctx)
  end

  return options.complete(S)
end

return M
