-- ztrain.parallel.strategy.zero_footprint: ZeRO's memory model (zero.lua's
-- S.footprint; strategy/footprint.lua says what a footprint is): the bytes
-- zero.lua's setup and step allocate at stage 1, 2 or 3, with the optimizer
-- state and the parameters on the tiers its offload options name.
local fp = require "ztrain.parallel.strategy.footprint"
local offload = require "ztrain.parallel.strategy.offload"

local M = {}
local add = fp.add

-- Model state: each rank's shard of the optimizer state (on otier), of the
-- fp32 gradients (stage >= 2, or accumulating / widening), of the
-- parameters at stage 3 (on ptier); full parameters below stage 3, and
-- stage 1's full gradients.
local function state(t, place, units, N, lowp, accumulate)
  local pb = lowp and 2 or 4
  local otier, ptier = place.otier or "device", place.ptier or "device"
  for _, u in ipairs(units) do
    local n = u.padded / N
    add(t, otier, "optim", 8 * n + (lowp and 4 * n or 0))
    if place.stage == 3 then
      add(t, ptier, "params", pb * n)
    else
      add(t, "device", "params", pb * u.padded)
      if place.stage == 1 then add(t, "device", "grads", pb * u.padded) end
    end
    if place.stage >= 2 or accumulate > 1 or lowp then add(t, "device", "grads", 4 * n) end
  end
end

-- Working buffers: MPI scratch, widened gradients, the accumulation
-- buffers, stage 2's buckets, stage 3's gathered units, prefetched
-- parameter shards, the offload staging pool and aio's bounce buffers.
local function working(t, place, f)
  local units, N, lowp, r = f.units, f.N, f.lowp, f.recipe
  local s = fp.shapes(units)
  local lb = lowp and 2 or 4                -- gathered units and buckets: the stored dtype
  -- what is in flight at once of each unit size: the unit in backward and
  -- two reductions (zero.lua's MAX_INFLIGHT); gradients completed early
  -- (f.held: driver/grad_order.lua) are handed over in bursts, a unit's
  -- micro-batches one after another: three of one size at once (a bound;
  -- measured for stage 2 under looped BFS: 74% of it)
  local sizes = s.embed + s.head + math.min(s.blocks, 3) * s.block
  if f.held and place.stage == 2 then
    sizes = 3 * (s.embed + s.head + (s.blocks > 0 and s.block or 0))
  end
  add(t, "device", "comm", fp.mpi_scratch(s.largest, N))
  if lowp then add(t, "device", "comm", f.held and place.stage == 2 and 4 * sizes or fp.widened(s)) end
  -- accumulation: micro-batches > 0 reduce into a shard-sized buffer, then
  -- add; how many are alive at once depends on when reductions complete
  -- (measured: the head's and two blocks', sometimes the embedding's too):
  -- the upper bound
  if f.accumulate > 1 then
    add(t, "device", "comm", 4 * sizes / N)
  end
  if place.stage == 2 then            -- buckets: the unit in backward and two reductions in flight
    add(t, "device", "comm", lb * sizes)
    -- a tied head writes its part of wte's gradient into the embedding's
    -- bucket: accumulating, it takes the next micro-batch's while the
    -- embedding's last reduction is still in flight
    if f.tied and f.accumulate > 1 and s.embed > 0 and s.head > 0 then add(t, "device", "comm", lb * s.embed) end
  elseif place.stage == 3 then        -- a gathered unit and a bucket of each; blocks as zero.lua pools them
    add(t, "device", "comm", lb * (2 * s.embed + 2 * s.head + math.min(s.blocks + 1, 5) * s.block))
  end
  if place.ptier then                 -- shards fetched from the host, offload.prefetch ahead
    local ahead = math.min(s.blocks, r.offload.prefetch)
    add(t, "device", "comm", lb * (s.embed + s.head + ahead * s.block) / N)
    if place.ptier == "nvme" then add(t, "host", "comm", lb * (s.embed + s.head + s.block) / N) end
  end
  if place.otier then
    add(t, "host", "comm", offload.pool_bytes { tier = place.otier, staging = offload.staging_bytes(r),
                                                dtype = lowp and "bf16" or nil })
  end
  if place.otier == "nvme" or place.ptier == "nvme" then      -- aio bounce buffers (aio.c)
    add(t, "host", "other", offload.aio_bounce_bytes(r))
  end
end

-- footprint(t, place, f): place = zero.lua's S.placement; f as footprint.lua says
function M.footprint(t, place, f)
  state(t, place, f.units, f.N, f.lowp, f.accumulate)
  working(t, place, f)
end

return M
