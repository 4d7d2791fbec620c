-- ztrain.parallel.strategy.shard: the pieces sharded strategies share.
--
-- A unit's flat buffer of u.padded elements (a multiple of world_size x the
-- norm block) is cut into world_size equal shards; rank r owns elements
-- [r*S, (r+1)*S). Because shard edges fall on norm-block edges, the global
-- gradient norm can be summed from the same blocks, in the same order, as on
-- one rank.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local ops = require "ztrain.core.ops"
local norm = require "ztrain.parallel.strategy.norm"
local T = require "ztrain.core.tensor"
local stream = require "ztrain.core.stream"

local M = {}

-- Elements per norm block (fixed partition of the fp64 sums).
M.BLOCK = tonumber(zffi.C.zt_sum_block())

-- The model padding a world of n ranks needs.
function M.pad(n) return n * M.BLOCK end

-- Global gradient norm from shards: shard_of(u) -> this rank's grad shard.
-- Every rank's block partials are gathered and put in (unit, rank, block)
-- order, which is the (unit, block) order of the unsharded buffer; with a
-- pipeline group the stages' lists follow in stage order (norm.total).
function M.global_norm(units, world, shard_of, pp)
  local xs = {}
  for i, u in ipairs(units) do xs[i] = shard_of(u) end
  local p, counts = ops.sumsq_blocks_many(xs)       -- one host wait, not one a unit
  local mine, total = {}, 0
  for _, n in ipairs(counts) do total = total + n end
  for b = 0, total - 1 do mine[b + 1] = p[b] end
  local all = world:gather_doubles(mine)
  local per_unit, off = {}, 0
  for i, u in ipairs(units) do
    local list = {}
    for r = 1, world.size do
      local row = all[r]
      for b = 1, counts[i] do list[#list + 1] = row[off + b] end
    end
    per_unit[i] = { index = u.index, p = list }
    off = off + counts[i]
  end
  return norm.total(per_unit, pp)
end

-- A pool of working buffers (category "comm") by element count. Gradient
-- buckets and gathered units are needed every micro-batch in the same sizes;
-- reusing them saves zero-filling and first-touch page faults of hundreds of
-- megabytes per step. Pooled buffers stay allocated (and accounted) until
-- pool:free(). A reused buffer holds old values: callers must only use it
-- where every element is written (gathers) or where the only elements not
-- written are padding that was zero from the start (gradient buckets).
--
-- A buffer released on one stream is not reused on another before the
-- release point has completed (PyTorch's record_stream idea): put() records
-- an event on the caller's current stream, and a get() on another stream
-- makes that stream wait for it, so work still queued on the old stream
-- cannot read or write the buffer after its new user has started. (A copy
-- or a collective that hands the buffer to another stream orders itself:
-- zt_copy_async, comm_stage.c.)
function M.pool(tier, dtype)
  local free = {}
  local P = {}
  function P.get(n)
    local list = free[n]
    if list and #list > 0 then
      local e, cur = list[#list], stream.current()
      if e.on.c ~= cur.c then cur:wait(e.ev) end   -- (a failure leaves it pooled)
      list[#list] = nil
      e.ev:free()
      return e.t
    end
    return T.new({ n }, { tier = tier, category = "comm", dtype = dtype })
  end
  function P.put(t)
    local n = t:numel()
    local on = stream.current()
    free[n] = free[n] or {}
    table.insert(free[n], { t = t, on = on, ev = on:record() })
  end
  function P.free()
    for _, list in pairs(free) do for _, e in ipairs(list) do e.ev:free(); e.t:free() end end
    free = {}
  end
  return P
end

-- Sum of one number over ranks, in rank order.
function M.sum_over_ranks(world, x)
  if world.size == 1 then return x end
  local all = world:gather_doubles({ x })
  local s = all[1][1]
  for r = 2, world.size do s = s + all[r][1] end
  return s
end

return M
