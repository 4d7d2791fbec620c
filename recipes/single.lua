-- recipes/single.lua -- GPT-2 (tiny) on one rank, on the fortunes corpus.
--
--   build/ztrain recipes/single.lua                      # 600 steps, ~1-2 min on 2 cores
--   build/ztrain recipes/single.lua train.steps=50 model.size=gpt2-mini
--
-- Byte-level tokens (vocabulary 256), so a loss of ln(256) = 5.55 is chance;
-- gpt2-tiny reaches about 2.0 after a few hundred steps.
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
