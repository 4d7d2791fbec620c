-- recipes/zero2_offload.lua -- ZeRO stage 2 with the optimizer state on the
-- host (ZeRO-Offload): full parameters and the gradient shard stay on the
-- device, AdamW's moments (8P/N) live on the host and the update runs there,
-- streamed through offload.staging bytes of host buffers in chunks.
--
--   build/ztrain --nproc 2 recipes/zero2_offload.lua
--
-- Same bits as recipes/zero2.lua (equal param_digest) with the same settings.
local zt = require "ztrain"
return {
  model    = { size = "gpt2-tiny", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  strategy = zt.strategy.zero { stage = 2, offload_optimizer = "host" },
  offload  = { staging = "16MiB" },
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 8, accumulate = 1 },      -- global batch = ranks x 8
  train    = { steps = 300, log_every = 50, eval_every = 100, eval_batches = 20 },
}
