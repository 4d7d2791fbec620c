-- recipes/pipeline_pipedream.lua -- PipeDream's asynchronous 1F1B with
-- weight stashing (Narayanan et al., SOSP 2019; the seeds' "weight
-- versioning"): GPT-2 in 2 pipeline stages on 2 ranks, each stage updating
-- its weights after every micro-batch's backward, on its own.
--
--   build/ztrain --nproc 2 recipes/pipeline_pipedream.lua
--   build/ztrain schedule pipedream p=2 m=8   # its order (1F1B's), without training
--
-- Staleness, stated: stage s of p runs micro-batch i's forward and its
-- backward on the same weights (the stash), which are min(i, p - s - 1)
-- updates old when its own update is applied (here: stage 0 one update
-- behind from the second micro-batch on, stage 1 never). Stages of one
-- micro-batch use different versions (no vertical sync). The head's copy
-- of the tied embedding is refreshed from the first stage at the end of
-- each step, and each step ends with a flush, so nothing is staler than one
-- step. Each micro-batch is an optimizer step of its own (batch.micro
-- sequences; train.steps x batch.accumulate updates in all, at each step's
-- learning rate), so this is NOT the same math as one rank: the digest
-- differs from every synchronous schedule's. With one stage it equals
-- recipes/single.lua at batch.accumulate=1 over accumulate x the steps.
-- Clipping by the global norm needs every stage's gradient at once:
-- optim.clip must be 0.
return {
  launch   = { nproc = 2 },
  model    = { size = "gpt2-mini", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  pipeline = { stages = 2, split = "params" },
  schedule = "pipedream",
  strategy = "single",
  optim    = { name = "adamw", lr = 1e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 0 },
  lr       = { warmup = 100, schedule = "cosine" },
  batch    = { micro = 4, accumulate = 8 },      -- 8 updates per step per stage
  train    = { steps = 30, log_every = 5, eval_every = 0, eval_batches = 0 },
}
