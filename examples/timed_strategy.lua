-- examples/timed_strategy.lua -- a strategy written by a user: it wraps any
-- other strategy and measures where each step's time goes, without changing
-- a single bit of the math (the spec checks the digest).
--
--   build/ztrain --nproc 2 examples/timed_zero2.lua
--
-- Time inside the inner strategy's hooks is what the strategy costs the
-- step: waiting for gradient reductions, gathering parameters, the update.
local zt = require "ztrain"

local M = {}

-- wrap(inner) -> a strategy that behaves exactly like inner, timed.
function M.wrap(inner)
  local now = function() return zt.ffi.C.zt_now() end
  local S = setmetatable({ name = inner.name, inner = inner }, { __index = inner })
  local spent = { forward_hooks = 0, backward_hooks = 0, step = 0 }
  local steps = 0

  local function timed(bucket, fn)
    return function(...)
      local t0 = now()
      local a, b = fn(...)
      spent[bucket] = spent[bucket] + (now() - t0)
      return a, b
    end
  end

  S.pre_forward = timed("forward_hooks", inner.pre_forward)
  S.post_forward = timed("forward_hooks", inner.post_forward)
  S.pre_backward = timed("backward_hooks", inner.pre_backward)
  S.post_backward = timed("backward_hooks", inner.post_backward)
  local step = timed("step", inner.step)
  function S.step(ctx, lr)
    steps = steps + 1
    return step(ctx, lr)
  end

  function S.free(ctx)
    if ctx.rank == 0 and steps > 0 then
      print(("%s on rank 0, per step: %.1f ms in forward hooks, %.1f ms in backward hooks, " ..
             "%.1f ms in step (norm, clip, update, gathers)"):format(inner.name,
             1000 * spent.forward_hooks / steps, 1000 * spent.backward_hooks / steps,
             1000 * spent.step / steps))
    end
    if inner.free then inner.free(ctx) end
  end
  return S
end

return M
