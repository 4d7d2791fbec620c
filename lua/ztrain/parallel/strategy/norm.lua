-- ztrain.parallel.strategy.norm: the global gradient norm, independent of sharding.
--
-- Each unit's flat gradient is cut into fixed blocks (zt_sum_block elements);
-- the fp64 sum of squares of every block is added in (unit, block) order. A
-- strategy that holds only shards computes its blocks' partials, gathers them
-- and adds them in the same order: the same bits as one rank.
local ops = require "ztrain.core.ops"

local M = {}

-- partials(units, grad_of) -> { { index = u.index, p = { block sums } } }:
-- the fp64 block sums of squares of every unit's gradient.
-- One call for all units (ops.sumsq_blocks_many: on a GPU one host wait,
-- not one a unit); the same partials.
function M.partials(units, grad_of)
  local xs = {}
  for i, u in ipairs(units) do xs[i] = grad_of(u) end
  local p, counts = ops.sumsq_blocks_many(xs)
  local out, off = {}, 0
  for i, u in ipairs(units) do
    local list = {}
    for b = 0, counts[i] - 1 do list[b + 1] = p[off + b] end
    off = off + counts[i]
    out[#out + 1] = { index = u.index, p = list }
  end
  return out
end

-- total(per_unit, pp) -> sqrt of every block partial added one by one in
-- (unit, block) order. With a pipeline group the units of every stage are
-- gathered first (any placement: interleaved ranks hold non-adjacent
-- units), so the bits are those of one rank holding every unit.
function M.total(per_unit, pp)
  if pp and pp.size > 1 then
    local flat = {}
    for _, e in ipairs(per_unit) do
      flat[#flat + 1] = e.index; flat[#flat + 1] = #e.p
      for _, v in ipairs(e.p) do flat[#flat + 1] = v end
    end
    local counts = pp:gather_doubles({ #flat })
    local most = 0
    for _, c in ipairs(counts) do most = math.max(most, c[1]) end
    for i = #flat + 1, most do flat[i] = 0 end
    local all = pp:gather_doubles(flat)
    per_unit = {}
    for r = 1, pp.size do
      local row, i = all[r], 1
      while i <= counts[r][1] do
        local n = row[i + 1]
        local e = { index = row[i], p = {} }
        for k = 1, n do e.p[k] = row[i + 1 + k] end
        per_unit[#per_unit + 1] = e
        i = i + 2 + n
      end
    end
    table.sort(per_unit, function(a, b) return a.index < b.index end)
  end
  local total = 0.0
  for _, e in ipairs(per_unit) do
    for _, v in ipairs(e.p) do total = total + v end
  end
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
