-- ztrain.strategy.norm: the global gradient norm, independent of sharding.
--
-- Each unit's flat gradient is cut into fixed blocks (zt_sum_block elements);
-- the fp64 sum of squares of every block is added in (unit, block) order. A
-- strategy that holds only shards computes its blocks' partials, gathers them
-- and adds them in the same order: the same bits as one rank.
local ops = require "ztrain.ops"

local M = {}

-- partials(units, grad_of) -> the fp64 block sums of squares of every unit's
-- gradient, in (unit, block) order (a Lua list).
function M.partials(units, grad_of)
  local out = {}
  for _, u in ipairs(units) do
    local p, n = ops.sumsq_blocks(grad_of(u))
    for i = 0, n - 1 do out[#out + 1] = p[i] end
  end
  return out
end

-- total(list, pp) -> sqrt of the partials added one by one, in order. With
-- a pipeline group, every stage's list is gathered and the lists are added
-- in stage order: the (unit, block) order of the whole model, so the same
-- bits as one rank holding every unit.
function M.total(list, pp)
  if pp and pp.size > 1 then
    local counts = pp:gather_doubles({ #list })
    local most = 0
    for _, c in ipairs(counts) do most = math.max(most, c[1]) end
    local padded = {}
    for i = 1, most do padded[i] = list[i] or 0 end
    local all = pp:gather_doubles(padded)
    list = {}
    for r = 1, pp.size do
      for i = 1, counts[r][1] do list[#list + 1] = all[r][i] end
    end
  end
  local total = 0.0
  for i = 1, #list do total = total + list[i] end
  return math.sqrt(total)
end

-- global{ units = list, grad_of = fn(u) -> flat grad tensor, pp = group } -> norm
function M.global(args)
  return M.total(M.partials(args.units, args.grad_of), args.pp)
end

-- PyTorch's clip_grad_norm_: scale = clip / (norm + 1e-6) when below 1.
function M.clip_scale(gnorm, clip)
  if not clip or clip <= 0 then return 1.0 end
  local s = clip / (gnorm + 1e-6)
  return s < 1 and s or 1.0
end

return M
