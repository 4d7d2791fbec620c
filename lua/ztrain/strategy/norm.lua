-- ztrain.strategy.norm: the global gradient norm, independent of sharding.
--
-- Each unit's flat gradient is cut into fixed blocks (zt_sum_block elements);
-- the fp64 sum of squares of every block is added in (unit, block) order. A
-- strategy that holds only shards computes its blocks' partials, gathers them
-- and adds them in the same order: the same bits as one rank.
local ops = require "ztrain.ops"

local M = {}

-- global{ units = list, grad_of = fn(u) -> flat grad tensor } -> norm
function M.global(args)
  local total = 0.0
  for _, u in ipairs(args.units) do
    local p, n = ops.sumsq_blocks(args.grad_of(u))
    for i = 0, n - 1 do total = total + p[i] end
  end
  return math.sqrt(total)
end

-- PyTorch's clip_grad_norm_: scale = clip / (norm + 1e-6) when below 1.
function M.clip_scale(gnorm, clip)
  if not clip or clip <= 0 then return 1.0 end
  local s = clip / (gnorm + 1e-6)
  return s < 1 and s or 1.0
end

return M
