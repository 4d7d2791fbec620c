-- ztrain.parallel.strategy.zero: ZeRO stages 1, 2 and 3 (Rajbhandari et al.).
--
-- Every unit's flat buffer is cut into N equal shards, N the size of the
-- data-parallel group ctx.dp (shard.lua); rank r owns shard r of every
-- unit: its optimizer state (all stages), its reduced gradient (stage 2, 3)
-- and its parameters (stage 3). The shards and their placement are public
-- (ctx.state, strategy/state.lua).
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
-- Mixed precision (ctx.precision): parameters (full, or stage 3's shards)
-- and micro-batch gradients are stored low-precision; each rank's fp32
-- master shard is optimizer state (the public kind "params"); gradients
-- are widened to fp32 before the reduce-scatter and accumulated in fp32
-- shards; after the update the master shard is rounded into the stored
-- parameter shard and the all-gathers move 2-byte parameters.
--
-- Same math as dp: each micro-batch is reduced in rank order, then added to
-- the shard accumulator; norm blocks, clipping and AdamW are elementwise or
-- ordered per block. Working buffers (buckets, gathered units) are category
-- "comm", so the params/grads/optim categories measure model state only.
local ops = require "ztrain.core.ops"
local norm = require "ztrain.parallel.strategy.norm"
local shard = require "ztrain.parallel.strategy.shard"
local options = require "ztrain.parallel.strategy.options"
local offload = require "ztrain.parallel.strategy.offload"
local replicated = require "ztrain.parallel.strategy.replicated"
local zero_footprint = require "ztrain.parallel.strategy.zero_footprint"
local zero_setup = require "ztrain.parallel.strategy.zero_setup"
local params = require "ztrain.parallel.strategy.zero_params"
local precision = require "ztrain.model.precision"
local aio = require "ztrain.core.aio"

local M = {}

-- How many gradient reductions may be in flight before backward waits.
local MAX_INFLIGHT = 2

M.valid_options = { "stage", "offload_optimizer", "offload_params" }
local PLACES = { none = true, host = true, nvme = true }

-- Validated options -> stage, where the optimizer state lives ("none",
-- "host", "nvme"), where stage 3's parameter shards live.
local function check(opts)
  local stage = opts.stage
  if stage ~= 1 and stage ~= 2 and stage ~= 3 then
    error(("zero: stage must be 1, 2 or 3, got %s"):format(tostring(stage)), 0)
  end
  local oopt, oparams = opts.offload_optimizer or "none", opts.offload_params or "none"
  for key, v in pairs({ offload_optimizer = oopt, offload_params = oparams }) do
    if not PLACES[v] then
      error(('zero: %s must be "none", "host" or "nvme", got %s'):format(key, tostring(v)), 0)
    end
  end
  if oparams ~= "none" and stage ~= 3 then
    error(("zero: offload_params needs stage 3 (stages 1 and 2 keep full parameters on the device), " ..
           "got stage %d"):format(stage), 0)
  end
  if oparams ~= "none" and oopt == "none" then
    error('zero: offload_params needs offload_optimizer too (the update runs off the device, ' ..
          'where the parameter shards live)', 0)
  end
  return stage, oopt, oparams
end

-- The strategy's name: zero3_offload (optimizer and parameters off the
-- device, DeepSpeed's usual stage-3 offload), zero3_offload_optimizer (the
-- optimizer state only), zeroN_infinity (nvme), or both places spelt out.
local function name_of(stage, oopt, oparams)
  local name = "zero" .. stage
  if oopt ~= "none" then
    name = name .. ((stage == 3 and oparams == "none") and "_offload_optimizer" or "_offload")
  end
  if oopt == "nvme" and (stage < 3 or oparams == "nvme") then   -- ZeRO-Infinity
    name = name:gsub("_offload", "_infinity")
  elseif oopt ~= "none" and oopt ~= oparams and oparams ~= "none" then
    name = name .. "_" .. oopt .. "_" .. oparams                   -- e.g. optimizer on nvme, params on host
  end
  return name
end

-- The hooks below are the strategy's (options.lua names them); each takes
-- the placement first -- { stage, otier, ptier }, what M.new decided --
-- and M.new binds it.
local H = {}

---------------------------------------------------------------- parameters
-- stage 3 gathers and releases (zero_params.lua)
local ready, release, prefetch = params.ready, params.release, params.prefetch

function H.pre_forward(place, ctx, u)
  for _, pu in ipairs(ctx.model:param_units(u)) do ready(place, ctx, pu) end
  prefetch(place, ctx, u.index, 1)
end

-- In training the last unit's backward follows its forward at once: keep
-- its parameters (and embed's) gathered across the turn.
function H.post_forward(place, ctx, u)
  if ctx.training and u.index == #ctx.model.units then return end
  for _, pu in ipairs(ctx.model:param_units(u)) do release(place, ctx, pu) end
end

----------------------------------------------------------------- gradients
-- Complete the oldest reduction: accumulate micro-batches > 0 into the
-- shard, free the working bucket.
local function finish_one(ctx)
  local W = ctx.work
  local f = table.remove(W.inflight, 1)
  f.req:wait()
  if f.tmp then
    ops.add(ctx.state.gshard[f.u.index], f.tmp)
    W.pool.put(f.tmp)
  end
  if f.view then f.view:free() end
  if f.bucket then W.lpool.put(f.bucket) end
  if f.wide then W.pool.put(f.wide) end
end

local function finish_all(ctx) while #ctx.work.inflight > 0 do finish_one(ctx) end end

-- Before unit u's backward reads parameters: gather them (and prefetch).
function H.pre_backward(place, ctx, u, micro)
  for _, pu in ipairs(ctx.model:param_units(u)) do ready(place, ctx, pu) end
  prefetch(place, ctx, u.index, -1)
end

-- u's input gradient is done: its parameters (and embed's, for the head)
-- may go; the weight-gradient pass does not read them.
function H.post_input_grad(place, ctx, u, micro)
  for _, pu in ipairs(ctx.model:param_units(u)) do release(place, ctx, pu) end
end

-- Before unit u's weight gradients are written, every reduction still
-- reading those buffers must be done (stage 1 reuses them across
-- micro-batches), and stage 2/3 need a fresh zeroed bucket.
function H.pre_weight_grad(place, ctx, u, micro)
  local model, W = ctx.model, ctx.work
  for _, pu in ipairs(model:param_units(u)) do
    if place.stage == 1 then
      for _, f in ipairs(W.inflight) do if f.u == pu then finish_all(ctx) break end end
    elseif not pu.grads then
      -- a recycled bucket: backward writes every gradient element; the
      -- padding past u.numel is never written and stays zero
      model:set_grads(pu, W.lpool.get(pu.padded))
    end
  end
end

function H.post_backward(place, ctx, u, micro)
  local model, W, st = ctx.model, ctx.work, ctx.state
  local l = st.layout[u.index]
  local f = { u = u, micro = micro }
  local out
  if micro > 0 then
    f.tmp = W.pool.get(l.size)
    out = f.tmp
  elseif st.gshard[u.index] then
    out = st.gshard[u.index]
  else                                 -- stage 1, no accumulation: in place
    f.view = u.grads:view(l.lo, { l.size })
    out = f.view
  end
  local inp = u.grads
  if ctx.precision then            -- reductions sum in fp32: the gradient widened first
    f.wide = W.pool.get(u.padded)
    ops.cast(f.wide, u.grads)
    inp = f.wide
  end
  f.req = ctx.dp:reduce_scatter(out, inp, true)
  if place.stage >= 2 then f.bucket = model:set_grads(u, nil) end
  W.inflight[#W.inflight + 1] = f
  while #W.inflight > MAX_INFLIGHT do finish_one(ctx) end
end

-- Every reduction of the step done (the REDUCE_GRAD action).
function H.finish_grads(place, ctx) finish_all(ctx) end

-- This rank's reduced gradient shard of unit u, once all are finished.
local function grad_shard(ctx, u)
  local st, W = ctx.state, ctx.work
  if st.gshard[u.index] then return st.gshard[u.index] end
  local v = W.grad_views[u.index]
  if not v then
    local l = st.layout[u.index]
    v = u.grads:view(l.lo, { l.size })
    W.grad_views[u.index] = v
  end
  return v
end

---------------------------------------------------------------------- step
-- The next forward's first units (offload.prefetch of them, at least one):
-- their shards fetched from the host or nvme while the optimizer's last
-- writes drain (the disk's queue stays full across the step's turn). The
-- forward's gather takes them as its own prefetch would have.
local function fetch_next(place, ctx)
  local model = ctx.model
  for d = 1, math.max(1, ctx.work.fetch_depth or 0) do
    local u = model.units[d]
    if u then
      for _, pu in ipairs(model:param_units(u)) do
        if ctx.state.pshard[pu.index] then params.fetch(place, ctx, pu) end   -- units this rank holds
      end
    end
  end
end

-- Shards fetched ahead hold what the files held when they were read: a
-- load that rewrites the shards makes them stale.
local function drop_fetches(ctx)
  local W = ctx.work
  for i, f in pairs(W and W.fetches or {}) do
    local ok, err = pcall(f.ready.sync, f.ready)
    f.ready:free()
    W.lpool.put(f.staged)
    if f.bounce then W.hpool.put(f.bounce) end
    W.fetches[i] = nil
    if not ok then error(err, 0) end
  end
end

function H.step(place, ctx, lr)
  finish_all(ctx)
  local model, st, W = ctx.model, ctx.state, ctx.work
  local units = replicated.units(ctx)
  local gn = shard.global_norm(units, ctx.dp, function(u) return grad_shard(ctx, u) end, ctx.pp)
  -- fp16: gradients hold the loss scale; an overflow skips the step
  local skip, unscale
  skip, gn, unscale = precision.unscale(ctx.loss_scaler, gn)
  if skip then
    for _, v in pairs(W.grad_views) do v:free() end
    W.grad_views = {}
    return gn
  end
  local scale = norm.clip_scale(gn, ctx.clip) * unscale
  ctx.optim:begin_step()
  -- on the device: every unit's shard updated in one op (one launch on a
  -- GPU), where the optimizer batches (model/adamw.lua; a user's may not)
  local batch = not W.offload and ctx.optim.begin_batch ~= nil
  if batch then ctx.optim:begin_batch() end
  local reqs, work = {}, {}
  for _, u in ipairs(units) do
    local l = st.layout[u.index]
    local P = st.pshard[u.index]
    if place.stage < 3 then P = u.params:view(l.lo, { l.size }) end
    if W.offload then
      work[#work + 1] = { u = u, lo = l.lo, size = l.size, P = P, G = grad_shard(ctx, u), st = st.optim[u.index],
                          M = st.master[u.index] }
    elseif st.master[u.index] then
      -- mixed precision: the fp32 master shard, rounded into the stored shard
      ctx.optim:update_range(u, l.lo, l.hi, st.master[u.index], grad_shard(ctx, u), st.optim[u.index], lr,
                             scale, P)
    else
      ctx.optim:update_range(u, l.lo, l.hi, P, grad_shard(ctx, u), st.optim[u.index], lr, scale)
    end
    if place.stage < 3 then reqs[#reqs + 1] = { u = u, pv = P } end
  end
  if batch then ctx.optim:flush() end
  -- off the device: every shard streamed through the host and back; the
  -- next forward's first shards fetched beside the last writes
  if W.offload then W.offload:step(ctx.optim, work, lr, scale, place.ptier and function() fetch_next(place, ctx) end) end
  -- the updated shards go to every rank (in place: my slice is the input)
  for _, r in ipairs(reqs) do r.req = ctx.dp:all_gather(r.u.params, r.pv, true) end
  for _, r in ipairs(reqs) do r.req:wait(); r.pv:free() end
  for _, v in pairs(W.grad_views) do v:free() end
  W.grad_views = {}
  return gn
end

function H.reduce_loss(place, ctx, loss_sum) return shard.sum_over_ranks(ctx.dp, loss_sum) end

-- After a load filled the fp32 master shards (mixed precision): the
-- stored parameters rounded from them, and for stages 1 and 2 gathered
-- into the full parameters. A collective.
function H.after_load(place, ctx)
  drop_fetches(ctx)
  local st, W = ctx.state, ctx.work
  -- a shard on another tier goes through the device (casts run there)
  local function on_device(t, pool, fn)
    if t:tier() == ctx.model.tier then return fn(t) end
    local d = pool.get(t:numel())
    local ok, err = pcall(function() W.offload:copy(d, t); fn(d) end)
    pool.put(d)
    if not ok then error(err, 0) end
  end
  for _, u in ipairs(replicated.units(ctx)) do
    local m = st.master[u.index]
    if m then
      on_device(m, W.pool, function(md)
        if place.stage == 3 then
          local ps = st.pshard[u.index]
          if ps:tier() == ctx.model.tier then return ops.cast(ps, md) end
          local lp = W.lpool.get(ps:numel())
          ops.cast(lp, md)
          local ok, err = pcall(W.offload.copy, W.offload, ps, lp)
          W.lpool.put(lp)
          if not ok then error(err, 0) end
        else
          local l = st.layout[u.index]
          local pv = u.params:view(l.lo, { l.size })
          ops.cast(pv, md)
          ctx.dp:all_gather(u.params, pv)
          pv:free()
        end
      end)
    end
  end
end

-- Full parameters of unit u (for digests and checkpoints): fn(tensor).
-- Mixed precision: the fp32 master shards, gathered.
function H.with_full_params(place, ctx, u, fn)
  local m = ctx.state.master and ctx.state.master[u.index]
  if m then
    local W = ctx.work
    local full, local_m = W.pool.get(u.padded), nil
    local ok, err = pcall(function()
      if m:tier() ~= full:tier() then      -- offloaded master shards: to the device first
        local_m = W.pool.get(m:numel())
        W.offload:copy(local_m, m)
        m = local_m
      end
      ctx.dp:all_gather(full, m)
      return fn(full)
    end)
    W.pool.put(full)
    if local_m then W.pool.put(local_m) end
    if not ok then error(err, 0) end
    return
  end
  if u.params then return fn(u.params) end
  ready(place, ctx, u)
  local ok, err = pcall(fn, u.params)
  release(place, ctx, u)
  if not ok then error(err, 0) end
end

-- Model-state bytes per rank (DESIGN.md's table), and where they live:
-- tiers[tier] = { params, grads, optim } (offload moves the optimizer term,
-- and with offload_params the parameter shards, to the host).
function H.predicted(place, ctx)
  local stage, otier, ptier = place.stage, place.otier, place.ptier
  local psi, N = replicated.nparams(ctx), ctx.dp.size
  local p = { [1] = { 4 * psi, 4 * psi, 8 * psi / N },
              [2] = { 4 * psi, 4 * psi / N, 8 * psi / N },
              [3] = { 4 * psi / N, 4 * psi / N, 8 * psi / N } }
  local acc = (stage == 1 and ctx.accumulate > 1) and 4 * psi / N or 0
  if ctx.precision then
    -- 2-byte parameters (and stage 1's micro-batch gradients), fp32
    -- gradient shards, fp32 master weights beside the two moments
    p = { [1] = { 2 * psi, 2 * psi, 12 * psi / N },
          [2] = { 2 * psi, 4 * psi / N, 12 * psi / N },
          [3] = { 2 * psi / N, 4 * psi / N, 12 * psi / N } }
    acc = stage == 1 and 4 * psi / N or 0
  end
  local P, G, O = p[stage][1], p[stage][2], p[stage][3]
  local tiers = { device = { params = P, grads = G + acc, optim = O }, host = { params = 0, grads = 0, optim = 0 },
                  nvme = { params = 0, grads = 0, optim = 0 } }
  if otier then tiers.device.optim, tiers[otier].optim = 0, O end
  if ptier then tiers.device.params, tiers[ptier].params = 0, P end
  return { params = P, grads = G, optim = O, accumulator = acc, tiers = tiers,
           staging = otier and offload.pool_bytes { tier = otier, staging = offload.staging_bytes(ctx.recipe) } or 0 }
end

-- Where an offloaded step's time went (per step, rank 0's view): waiting
-- for parameter shards fetched from the host or nvme, waiting for the
-- optimizer's transfers, and the update itself.
function H.describe(place, ctx)
  local off = ctx.work and ctx.work.offload
  if not off or off.time.steps == 0 then return nil end
  local n = off.time.steps
  local nv = ctx.work.nvme                         -- the aio engine, where a tier is on nvme
  return { offload = { tier = place.otier, params_tier = place.ptier or "device", chunk_elems = off.chunk,
                       aio_engine = nv and nv.engine or nil, aio_engine_note = nv and nv.engine_note or nil,
                       aio_queue_depth = nv and nv.queue_depth or nil, aio_block_bytes = nv and nv.block_bytes or nil,
                       aio_stripes = nv and nv.stripes or nil,
                       aio_probe = nv and nv.probe or nil,
                       fetch_wait_ms = 1000 * off.time.fetch_wait / n, io_wait_ms = 1000 * off.time.io_wait / n,
                       update_ms = 1000 * off.time.update / n, optimizer_ms = 1000 * off.time.opt / n,
                       -- the optimizer's nvme traffic per step (0 with the state on the host)
                       nvme_read_bytes = off.nvme_bytes.read / n, nvme_written_bytes = off.nvme_bytes.written / n,
                       -- the disk's share of that: time with blocks in flight, their mean number
                       disk_busy_ms = 1000 * off.disk.busy / n,
                       disk_depth = off.disk.busy > 0 and off.disk.depth / off.disk.busy or 0 } }
end

-- Safe after a setup that failed part-way, and twice.
function H.free(place, ctx)
  local W, st = ctx and ctx.work, ctx and ctx.state
  if W then
    while #W.inflight > 0 do pcall(finish_one, ctx) end
    for i, g in pairs(W.gathers) do
      pcall(g.req.wait, g.req); g.full:free()
      if g.staged then g.staged:free() end
      W.gathers[i] = nil
    end
    for i, f in pairs(W.fetches) do
      pcall(f.ready.sync, f.ready); f.ready:free(); f.staged:free()
      if f.bounce then f.bounce:free() end
      W.fetches[i] = nil
    end
    if W.offload then W.offload:free(); W.offload = nil end
    if W.hpool then W.hpool.free() end
    for _, v in pairs(W.grad_views) do v:free() end
    W.grad_views = {}
    W.pool.free()
    if W.lpool ~= W.pool then W.lpool.free() end
  end
  if st then
    for _, t in pairs(st.master or {}) do t:free() end
    st.master = {}
    for _, t in pairs(st.gshard or {}) do t:free() end
    for _, t in pairs(st.pshard or {}) do t:free() end
    for _, os in pairs(st.optim or {}) do for _, t in pairs(os) do t:free() end end
    st.gshard, st.pshard, st.optim = {}, {}, {}
  end
  -- the nvme tier's swap files go with the last nvme tensor
  if W and W.nvme then pcall(aio.shutdown); W.nvme = nil end
end

function M.new(opts)
  opts = options.check("zero", opts, M.valid_options)
  local stage, oopt, oparams = check(opts)
  local S = { name = name_of(stage, oopt, oparams), stage = stage, opts = opts }
  -- where things live: the optimizer state (otier) and stage 3's parameter
  -- shards (ptier), nil for the device; for the planner
  -- (strategy/footprint.lua), and the bytes setup and step allocate (the
  -- memory model: zero_footprint.lua)
  local place = { stage = stage, otier = oopt ~= "none" and oopt or nil, ptier = oparams ~= "none" and oparams or nil }
  S.placement = place
  function S.footprint(t, f) return zero_footprint.footprint(t, place, f) end
  function S.pad(n) return shard.pad(n) end
  -- ctx.state: each unit's shards; ctx.work: reductions and gathers in
  -- flight, the working-buffer pools (zero_setup.lua)
  function S.setup(ctx) return zero_setup.setup(place, ctx) end
  for name, hook in pairs(H) do S[name] = function(...) return hook(place, ...) end end
  return options.complete(S)
end

return M
