-- recipes/dp.lua -- data parallelism: every rank holds the whole model; gradients are
-- all-reduced unit by unit during backward (model state 16 bytes/param/rank).
--
--   build/ztrain --nproc 2 recipes/dp.lua
--   build/ztrain --nproc 4 recipes/dp.lua train.steps=50 model.size=gpt2-mini
--
-- With the same ranks, micro-batch and accumulation, dp, zero1, zero2 and zero3
-- end with the same param_digest (summary.json): the strategy moves bytes, not math.
return {
  model    = { size = "gpt2-tiny", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  strategy = "dp",
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 8, accumulate = 1 },      -- global batch = ranks x 8
  train    = { steps = 300, log_every = 50, eval_every = 100, eval_batches = 20 },
}
