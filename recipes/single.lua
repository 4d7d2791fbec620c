-- recipes/single.lua -- GPT-2 (tiny) on one rank, on the fortunes corpus.
--
--   build/ztrain recipes/single.lua                      # 600 steps, ~25 s on 2 cores
--   build/ztrain recipes/single.lua model.size=gpt2-mini # 4 layers, 128 channels, ~80 s
--
-- Byte-level tokens (vocabulary 256), so a loss of ln(256) = 5.55 is chance.
-- Measured: gpt2-tiny 2.72 at step 100, 2.47 at step 600 (validation 2.55);
-- gpt2-mini 2.17 at step 600 (validation 2.28).
return {
  model    = { size = "gpt2-tiny", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  strategy = "single",
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 16, accumulate = 1 },
  train    = { steps = 600, log_every = 50, eval_every = 200, eval_batches = 20 },
}
