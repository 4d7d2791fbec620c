-- spec/helpers/toy_steps.lua -- what the pipeline driver scripts under
-- spec/helpers (two_stage.lua, late_receiver.lua) share: a strategy that
-- only sums each unit's gradient over a step's micro-batches, and the
-- tokens of micro-batch mb (fixed, byte vocabulary).
local ffi = require "ffi"
local zt = require "ztrain"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"

local M = {}

-- accumulator() -> strategy, acc: acc[unit index] holds the sum of the
-- unit's gradient over the micro-batches (copied at micro-batch 0)
function M.accumulator()
  local acc = {}
  local S = zt.strategy.options.validate({ name = "accumulate", setup = function() end,
    step = function() return 0 end,
    post_backward = function(_, u, mb)
      acc[u.index] = acc[u.index] or T.new({ u.padded })
      if mb == 0 then ops.copy(acc[u.index], u.grads) else ops.add(acc[u.index], u.grads) end
    end })
  return S, acc
end

-- loader(B, Tl) -> load(set, mb): writes micro-batch mb's tokens and targets
function M.loader(B, Tl)
  return function(a, mb)
    local n = B * Tl
    local x, y = ffi.new("int32_t[?]", n), ffi.new("int32_t[?]", n)
    for i = 0, n - 1 do x[i] = (i * 7 + mb * 13) % 256; y[i] = (i * 11 + mb * 5 + 3) % 256 end
    if a.tokens then a.tokens:write(x) end
    if a.targets then a.targets:write(y) end
  end
end

return M
