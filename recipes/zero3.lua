-- recipes/zero3.lua -- ZeRO stage 3: parameters sharded too; each unit is all-gathered
-- before its forward and backward and freed after, the next one prefetched (16P/N).
--
--   build/ztrain --nproc 2 recipes/zero3.lua
--   build/ztrain --nproc 4 recipes/zero3.lua train.steps=50 model.size=gpt2-mini
--
-- With the same ranks, micro-batch and accumulation, dp, zero1, zero2 and zero3
-- end with the same param_digest (summary.json): the strategy moves bytes, not math.
local zt = require "ztrain"
return {
  model    = { size = "gpt2-tiny", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  strategy = zt.strategy.zero { stage = 3 },
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 8, accumulate = 1 },      -- global batch = ranks x 8
  train    = { steps = 300, log_every = 50, eval_every = 100, eval_batches = 20 },
}
