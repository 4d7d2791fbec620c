-- ztrain.parallel.strategy.zero_setup: ZeRO's setup (zero.lua's S.setup), for the
-- placement S.placement = { stage, otier, ptier }: the public state's kinds,
-- each unit's shards (optimizer state; fp32 master and stored parameter
-- shards; gradient shards), initialised one unit at a time in a working
-- buffer so no rank ever holds the whole model at stage 3.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local shard = require "ztrain.parallel.strategy.shard"
local state = require "ztrain.parallel.strategy.state"
local offload = require "ztrain.parallel.strategy.offload"
local replicated = require "ztrain.parallel.strategy.replicated"

local M = {}

-- Initialise unit u in a working buffer (the same values on every rank
-- and whatever the sharding) and keep what this rank holds of it: the fp32
-- master shard (mixed precision, with the optimizer state), stage 3's
-- stored parameter shard, or below stage 3 the full parameters rounded.
local function init_unit(place, ctx, u, lo, n)
  local model, tier, PR = ctx.model, ctx.model.tier, ctx.precision
  local st, pool, pdtype = ctx.state, ctx.work.pool, PR and PR.dtype or nil
  local full = pool.get(u.padded)
  local ok, err = pcall(function()
    ops.fill(full, 0)
    model:set_params(u, full)
    model:init_unit(u, ctx.seed)
    model:set_params(u, nil)
    local v = full:view(lo, { n })
    if PR then
      -- the fp32 master shard lives with the optimizer state
      st.master[u.index] = T.new({ n }, { tier = place.otier or tier, category = "optim" })
      if place.otier then ctx.work.offload:copy(st.master[u.index], v) else ops.copy(st.master[u.index], v) end
    end
    if place.stage == 3 then
      st.pshard[u.index] = T.new({ n }, { tier = place.ptier or tier, category = "params", dtype = pdtype })
      if PR and place.ptier then            -- rounded on the device, then moved
        local lp = ctx.work.lpool.get(n)
        ops.cast(lp, v)
        local okc, cerr = pcall(ctx.work.offload.copy, ctx.work.offload, st.pshard[u.index], lp)
        ctx.work.lpool.put(lp)
        if not okc then error(cerr, 0) end
      elseif place.ptier then ctx.work.offload:copy(st.pshard[u.index], v)
      elseif PR then ops.cast(st.pshard[u.index], v)
      else ops.copy(st.pshard[u.index], v) end
    else
      local lp = T.new({ u.padded }, { tier = tier, category = "params", dtype = pdtype })
      ops.cast(lp, full)
      model:set_params(u, lp)
      if place.stage == 1 then
        model:set_grads(u, T.new({ u.padded }, { tier = tier, category = "grads", dtype = pdtype }))
      end
    end
    v:free()
  end)
  if u.params == full then model:set_params(u, nil) end
  pool.put(full)                   -- back to the pool even on failure (S.free frees it)
  if not ok then error(err, 0) end
end

-- ctx.state: layout (this rank's [lo, hi) of every unit), kinds params,
-- grads, exp_avg, exp_avg_sq; plus pshard (stage 3), gshard, optim per unit.
-- ctx.work: reductions and gathers in flight, the working-buffer pool.
local function setup(place, ctx)
  local model, tier, PR = ctx.model, ctx.model.tier, ctx.precision
  local st = state.new(model, ctx.dp, true)
  st.gshard, st.pshard, st.optim, st.master = {}, {}, {}, {}
  ctx.state = st
  ctx.work = { inflight = {}, gathers = {}, fetches = {}, grad_views = {}, pool = shard.pool(tier),
               fetch_depth = place.ptier and ctx.recipe and ctx.recipe.offload and ctx.recipe.offload.prefetch or 2 }
  -- low precision: gathered units and gradient buckets in 2 bytes
  ctx.work.lpool = PR and shard.pool(tier, PR.dtype) or ctx.work.pool
  if place.otier == "nvme" or place.ptier == "nvme" then
    ctx.work.nvme = offload.configure_nvme(ctx.recipe, ctx.out_dir)
    if ctx.rank == 0 and not ctx.quiet then io.stderr:write(ctx.work.nvme.summary, "\n") end
  end
  local pdtype = PR and PR.dtype or nil
  if place.otier then
    ctx.work.offload = offload.new { tier = place.otier, staging = offload.staging_bytes(ctx.recipe), dtype = pdtype }
  end
  ctx.work.hpool = place.ptier == "nvme" and shard.pool("host", pdtype) or nil
  if PR then
    state.add_kind(st, "params", { tier = tier, sharded = true, category = "optim" })       -- fp32 master shards
    state.add_kind(st, "lp_params", { dtype = pdtype, tier = tier, sharded = place.stage == 3, category = "params",
                                      derived = true })
  else
    state.add_kind(st, "params", { tier = place.ptier or tier, sharded = place.stage == 3, category = "params" })
  end
  state.add_kind(st, "grads", { tier = tier, sharded = place.stage >= 2, category = "grads" })
  for _, k in ipairs(ctx.optim.state_kinds) do
    state.add_kind(st, k, { tier = place.otier or tier, sharded = true, category = "optim" })
  end
  local units = replicated.units(ctx)
  for _, u in ipairs(units) do
    local l = st.layout[u.index]
    local lo, hi, n = l.lo, l.hi, l.size
    local os = ctx.optim:new_state(n, place.otier or tier)
    st.optim[u.index] = os
    for _, k in ipairs(ctx.optim.state_kinds) do state.set(st, k, u, lo, hi, os[k]) end
    if place.stage == 3 or PR then
      -- initialise one unit at a time in a working buffer, keep the shard
      -- (and with mixed precision the fp32 master shard, and for stages
      -- 1 and 2 the full parameters rounded)
      init_unit(place, ctx, u, lo, n)
      if place.stage == 3 then state.set(st, PR and "lp_params" or "params", u, lo, hi, st.pshard[u.index]) end
      if PR then
        state.set(st, "params", u, lo, hi, st.master[u.index])
        if place.stage < 3 then state.set(st, "lp_params", u, 0, u.padded, u.params) end
      end
    end
    if place.stage >= 2 or ctx.accumulate > 1 or PR then
      st.gshard[u.index] = T.new({ n }, { tier = tier, category = "grads" })
      state.set(st, "grads", u, lo, hi, st.gshard[u.index])
    end
  end
  if place.stage <= 2 and not PR then
    model:materialize(ctx.seed, { grads = place.stage == 1, units = units })
    for _, u in ipairs(units) do
      state.set(st, "params", u, 0, u.padded, u.params)
      if place.stage == 1 and not st.gshard[u.index] then state.set(st, "grads", u, 0, u.padded, u.grads) end
    end
  end
end

function M.setup(place, ctx)
  local ok, err = pcall(setup, place, ctx)
  -- a swap file the disk cannot hold, named with the key that placed it
  if not ok then error(offload.with_key(err), 0) end
end

return M
