-- examples/topk_dp.lua -- data parallelism sending 1% of each gradient,
-- the rest fed back into the next step (examples/topk_compression.lua).
-- About 50 times fewer bytes than dp (8 bytes per pair sent, against 4 per
-- element); the loss follows dp's at a distance.
--
--   build/ztrain --nproc 2 examples/topk_dp.lua
--   build/ztrain --nproc 2 examples/topk_dp.lua train.steps=100
local zt = require "ztrain"
local topk = dofile((zt.home or ".") .. "/examples/topk_compression.lua")

return {
  model    = { size = "gpt2-tiny" },
  data     = { seq_len = 64 },
  strategy = topk.new { keep = 0.01 },
  optim    = { lr = 3e-3 },
  batch    = { micro = 4 },
  train    = { steps = 40, log_every = 10, eval_every = 20 },
}
