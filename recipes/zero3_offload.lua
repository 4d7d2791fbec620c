-- recipes/zero3_offload.lua -- the main job: ZeRO stage 3 with the optimizer
-- state and the parameter shards on the host (ZeRO-Offload), on 2 local ranks.
--
--   build/ztrain recipes/zero3_offload.lua             # launches its 2 ranks itself
--   build/ztrain --nproc 4 recipes/zero3_offload.lua   # or as many as you say
--
-- Device memory per rank holds only the gradient shard (4P/N) and working
-- buffers; the host holds the parameter shards (4P/N) and AdamW's moments
-- (8P/N), and the update runs there with the same kernel, streamed through
-- offload.staging bytes of host buffers in chunks. Same bits as zero3:
-- summary.json's param_digest equals recipes/zero3.lua's with these settings.
local zt = require "ztrain"
return {
  launch   = { nproc = 2 },
  model    = { size = "gpt2-mini", seed = 1337 },
  -- the BPE vocabulary trained on this corpus (data/bpe/fortunes); "bytes" also works
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bpe", seq_len = 128 },
  strategy = zt.strategy.zero { stage = 3, offload_optimizer = "host", offload_params = "host" },
  offload  = { staging = "16MiB" },
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 8, accumulate = 1 },      -- global batch = ranks x 8
  sample   = { prompt = "Q:", tokens = 40, temperature = 0.8, top_k = 40 },   -- printed at each evaluation
  train    = { steps = 500, log_every = 50, eval_every = 250, eval_batches = 20 },
}
