-- ztrain.strategy.zero: ZeRO stages 1, 2 and 3 (Rajbhandari et al.).
--
-- Every unit's flat buffer is cut into world_size equal shards (shard.lua);
-- rank r owns shard r of every unit: its optimizer state (all stages), its
-- reduced gradient (stage 2, 3) and its parameters (stage 3).
--
--   stage 1  full params and micro-batch grads; each unit's gradient is
--            reduce-scattered as backward produces it, into this rank's slice
--            of the grad buffer; after the step the updated shards are
--            all-gathered into the full params.       model state 8P + 8P/N
--   stage 2  as 1, but a unit's full gradient lives only in a working bucket
--            during its backward; only the shard is kept. 4P + 12P/N
--   stage 3  parameters sharded too: a unit is all-gathered into a working
--            buffer before its forward (and its backward), freed after, with
--            the next unit prefetched.                 16P/N
--
-- Same math as dp: each micro-batch is reduced in rank order, then added to
-- the shard accumulator; norm blocks, clipping and AdamW are elementwise or
-- ordered per block. Working buffers (buckets, gathered units) are category
-- "comm", so the params/grads/optim categories measure model state only.
local T = require "ztrain.tensor"
local ops = require "ztrain.ops"
local comm = require "ztrain.comm"
local norm = require "ztrain.strategy.norm"
local shard = require "ztrain.strategy.shard"

local M = {}

-- How many gradient reductions may be in flight before backward waits.
local MAX_INFLIGHT = 2

function M.new(opts)
  opts = opts or {}
  local stage = opts.stage
  if stage ~= 1 and stage ~= 2 and stage ~= 3 then
    error(("zero: stage must be 1, 2 or 3, got %s"):format(tostring(stage)), 2)
  end
  local S = { name = "zero" .. stage, stage = stage, opts = opts }
  local W, model, tier
  local range = {}       -- [unit index] = { lo, hi, size }
  local gshard = {}      -- [unit index] = this rank's reduced gradient (stage 2, 3; stage 1 with accumulation)
  local pshard = {}      -- [unit index] = this rank's parameters (stage 3)
  local inflight = {}    -- FIFO of gradient reductions { u, req, bucket, tmp, micro }
  local gathers = {}     -- [unit index] = { req, full } (stage 3 all-gathers in flight)

  local pool             -- working buffers reused across micro-batches
  local function new(n, category) return T.new({ n }, { tier = tier, category = category }) end

  function S.pad(world_size) return shard.pad(world_size) end

  function S.setup(ctx)
    W, model, tier = comm.world(), ctx.model, ctx.model.tier
    pool = shard.pool(tier)
    for _, u in ipairs(model.units) do
      local lo, hi, n = shard.range(u, W)
      range[u.index] = { lo, hi, n }
      ctx.optim:add_unit(u, { lo = lo, hi = hi, tier = tier })
      if stage == 3 then
        -- initialise one unit at a time in a working buffer, keep the shard
        local full = new(u.padded, "comm")
        model:set_params(u, full)
        model:init_unit(u, ctx.seed)
        model:set_params(u, nil)
        pshard[u.index] = new(n, "params")
        local v = full:view(lo, { n })
        ops.copy(pshard[u.index], v)
        v:free(); full:free()
      end
      if stage >= 2 or ctx.accumulate > 1 then gshard[u.index] = new(n, "grads") end
    end
    if stage <= 2 then model:materialize(ctx.seed, { grads = stage == 1 }) end
  end

  ---------------------------------------------------------------- parameters
  local function gather(u)
    if stage < 3 or u.params or gathers[u.index] then return end
    local full = pool.get(u.padded)     -- every element is overwritten by the gather
    gathers[u.index] = { req = W:all_gather(full, pshard[u.index], true), full = full }
  end

  local function ready(u)
    gather(u)
    local g = gathers[u.index]
    if not g then return end
    gathers[u.index] = nil
    g.req:wait()
    model:set_params(u, g.full)
  end

  local function release(u)
    if stage < 3 then return end
    local full = model:set_params(u, nil)
    if full then pool.put(full) end
  end

  -- Unit i's neighbour in the pass direction (with the units it reads, e.g.
  -- embed's tied wte for the head), prefetched while i computes.
  local function prefetch(i, dir)
    local nu = model.units[i + dir]
    if nu then for _, pu in ipairs(model:param_units(nu)) do gather(pu) end end
  end

  function S.pre_forward(ctx, u)
    for _, pu in ipairs(model:param_units(u)) do ready(pu) end
    prefetch(u.index, 1)
  end

  -- In training the last unit's backward follows its forward at once: keep
  -- its parameters (and embed's) gathered across the turn.
  function S.post_forward(ctx, u)
    if ctx.training and u.index == #model.units then return end
    for _, pu in ipairs(model:param_units(u)) do release(pu) end
  end

  ----------------------------------------------------------------- gradients
  -- Complete the oldest reduction: accumulate micro-batches > 0 into the
  -- shard, free the working bucket.
  local function finish_one()
    local f = table.remove(inflight, 1)
    f.req:wait()
    if f.tmp then
      ops.add(gshard[f.u.index], f.tmp)
      pool.put(f.tmp)
    end
    if f.view then f.view:free() end
    if f.bucket then pool.put(f.bucket) end
  end

  local function finish_all() while #inflight > 0 do finish_one() end end

  -- Before unit u's backward writes gradients, every reduction still reading
  -- those buffers must be done (stage 1 reuses them across micro-batches),
  -- and stage 2/3 need a fresh zeroed bucket.
  function S.pre_backward(ctx, u, micro)
    for _, pu in ipairs(model:param_units(u)) do
      ready(pu)
      if stage == 1 then
        for _, f in ipairs(inflight) do if f.u == pu then finish_all() break end end
      elseif not pu.grads then
        -- a recycled bucket: backward writes every gradient element; the
        -- padding past u.numel is never written and stays zero
        model:set_grads(pu, pool.get(pu.padded))
      end
    end
    prefetch(u.index, -1)
  end

  function S.post_backward(ctx, u, micro)
    local lo, _, n = unpack(range[u.index])
    local f = { u = u, micro = micro }
    local out
    if micro > 0 then
      f.tmp = pool.get(n)
      out = f.tmp
    elseif gshard[u.index] then
      out = gshard[u.index]
    else                                 -- stage 1, no accumulation: in place
      f.view = u.grads:view(lo, { n })
      out = f.view
    end
    f.req = W:reduce_scatter(out, u.grads, true)
    if stage >= 2 then f.bucket = model:set_grads(u, nil) end
    inflight[#inflight + 1] = f
    while #inflight > MAX_INFLIGHT do finish_one() end
    for _, pu in ipairs(model:param_units(u)) do release(pu) end
  end

  -- This rank's reduced gradient shard of unit u, once all are finished.
  local grad_views = {}
  local function grad_shard(u)
    if gshard[u.index] then return gshard[u.index] end
    local v = grad_views[u.index]
    if not v then
      local lo, _, n = unpack(range[u.index])
      v = u.grads:view(lo, { n })
      grad_views[u.index] = v
    end
    return v
  end

  ---------------------------------------------------------------------- step
  function S.step(ctx, lr)
    finish_all()
    local units = model.units
    local gn = shard.global_norm(units, W, grad_shard)
    local scale = norm.clip_scale(gn, ctx.clip)
    ctx.optim:begin_step()
    local reqs = {}
    for _, u in ipairs(units) do
      local lo, _, n = unpack(range[u.index])
      if stage == 3 then
        ctx.optim:update_unit(u, pshard[u.index], grad_shard(u), lr, scale)
      else
        local pv = u.params:view(lo, { n })
        ctx.optim:update_unit(u, pv, grad_shard(u), lr, scale)
        -- the updated shard goes to every rank (in place: my slice is the input)
        reqs[#reqs + 1] = { W:all_gather(u.params, pv, true), pv }
      end
    end
    for _, r in ipairs(reqs) do r[1]:wait(); r[2]:free() end
    for _, v in pairs(grad_views) do v:free() end
    grad_views = {}
    return gn
  end

  function S.reduce_loss(ctx, loss_sum) return shard.sum_over_ranks(W, loss_sum) end

  -- Full parameters of unit u (for digests and checkpoints): fn(tensor).
  function S.with_full_params(ctx, u, fn)
    if u.params then return fn(u.params) end
    ready(u)
    local ok, err = pcall(fn, u.params)
    release(u)
    if not ok then error(err, 0) end
  end

  function S.predicted(ctx)
    local psi, N = ctx.model.nparams, ctx.world_size
    local p = { [1] = { 4 * psi, 4 * psi, 8 * psi / N },
                [2] = { 4 * psi, 4 * psi / N, 8 * psi / N },
                [3] = { 4 * psi / N, 4 * psi / N, 8 * psi / N } }
    local acc = (stage == 1 and ctx.accumulate > 1) and 4 * psi / N or 0
    return { params = p[stage][1], grads = p[stage][2], optim = p[stage][3], accumulator = acc }
  end

  function S.free(ctx)
    finish_all()
    for i, g in pairs(gathers) do g.req:wait(); g.full:free(); gathers[i] = nil end
    for _, v in pairs(grad_views) do v:free() end
    grad_views = {}
    if pool then pool.free() end
    for _, t in pairs(gshard) do t:free() end
    for _, t in pairs(pshard) do t:free() end
    gshard, pshard = {}, {}
  end

  return S
end

return M
