-- examples/timed_zero2.lua -- ZeRO stage 2, timed by a user-written wrapper
-- strategy (examples/timed_strategy.lua).
--
--   build/ztrain --nproc 2 examples/timed_zero2.lua
local zt = require "ztrain"
local timed = dofile((zt.home or ".") .. "/examples/timed_strategy.lua")

return {
  model    = { size = "gpt2-tiny" },
  data     = { seq_len = 128 },
  strategy = timed.wrap(zt.strategy.zero { stage = 2 }),
  batch    = { micro = 8 },
  train    = { steps = 50, log_every = 10, eval_every = 0 },
}
