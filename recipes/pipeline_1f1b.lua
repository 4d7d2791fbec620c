-- recipes/pipeline_1f1b.lua -- GPT-2 cut into 2 pipeline stages on 2 ranks,
-- run by the 1F1B schedule (PipeDream-Flush): after a warm-up, each stage
-- alternates one forward and one backward, so it holds at most p - s
-- micro-batches' activations.
--
--   build/ztrain --nproc 2 recipes/pipeline_1f1b.lua
--   build/ztrain schedule 1f1b p=2 m=8        # its ideal timeline, without training
--
-- Writes timeline.svg / timeline.json (the last step, measured) beside
-- summary.json. Same bits as one rank accumulating the same 8 micro-batches
-- (recipes/single.lua batch.accumulate=8 with these settings).
return {
  launch   = { nproc = 2 },
  model    = { size = "gpt2-mini", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  pipeline = { stages = 2, split = "params" },
  schedule = "1f1b",
  strategy = "single",
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 4, accumulate = 8 },      -- 8 micro-batches in flight through 2 stages
  train    = { steps = 100, log_every = 20, eval_every = 0, eval_batches = 0 },
}
