-- ztrain.parallel.strategy.zero_params: stage 3's parameters (zero.lua's hooks call
-- these with S.placement = { stage, otier, ptier }): a unit's shards
-- all-gathered into a working buffer before it computes and given back
-- after, the next unit gathered meanwhile, shards on the host or nvme
-- fetched to the device ahead of their gather.
local now = require("ztrain.core.ffi").C.zt_now

local M = {}

-- Parameter shards on the host are fetched to a device working buffer
-- (the all-gather's input must live on the device, like its output) on
-- the offload copy stream, up to offload.prefetch units ahead.
function M.fetch(place, ctx, u)
  local W = ctx.work
  if not place.ptier or u.params or W.gathers[u.index] or W.fetches[u.index] then return end
  local src = ctx.state.pshard[u.index]
  local staged = W.lpool.get(src:numel())
  local cs, bounce = W.offload.copies, nil
  if place.ptier == "nvme" then                -- a file reaches the device through the host
    bounce = W.hpool.get(src:numel())
    cs:copy_async(bounce, src)
    src = bounce
  end
  cs:copy_async(staged, src)
  W.fetches[u.index] = { staged = staged, bounce = bounce, ready = cs:record() }
end

-- Start gathering unit u's parameters (after its fetch, from the host).
function M.gather(place, ctx, u)
  local W = ctx.work
  if place.stage < 3 or u.params or W.gathers[u.index] then return end
  local shard_t, staged = ctx.state.pshard[u.index], nil
  if place.ptier then
    M.fetch(place, ctx, u)
    local f = W.fetches[u.index]
    W.fetches[u.index] = nil
    local t0 = now()
    f.ready:sync(); f.ready:free()
    W.offload.time.fetch_wait = W.offload.time.fetch_wait + (now() - t0)
    if f.bounce then W.hpool.put(f.bounce) end
    staged, shard_t = f.staged, f.staged
  end
  local full = W.lpool.get(u.padded)    -- every element is overwritten by the gather
  W.gathers[u.index] = { req = ctx.dp:all_gather(full, shard_t, true), full = full, staged = staged }
end

function M.ready(place, ctx, u)
  M.gather(place, ctx, u)
  local g = ctx.work.gathers[u.index]
  if not g then return end
  ctx.work.gathers[u.index] = nil
  g.req:wait()
  if g.staged then ctx.work.lpool.put(g.staged) end
  ctx.model:set_params(u, g.full)
end

function M.release(place, ctx, u)
  if place.stage < 3 then return end
  local full = ctx.model:set_params(u, nil)
  if full then ctx.work.lpool.put(full) end
end

-- Unit i's neighbour in the pass direction (with the units it reads, e.g.
-- embed's tied wte for the head), prefetched while i computes.
-- Further units' shards are fetched from the host meanwhile (prefetch depth).
function M.prefetch(place, ctx, i, dir)
  local model = ctx.model
  local nu = model.units[i + dir]
  if nu then for _, pu in ipairs(model:param_units(nu)) do M.gather(place, ctx, pu) end end
  for d = 2, ctx.work.fetch_depth or 0 do
    local fu = model.units[i + dir * d]
    if fu then for _, pu in ipairs(model:param_units(fu)) do M.fetch(place, ctx, pu) end end
  end
end

return M
