-- recipes/infinity.lua -- ZeRO-Infinity: ZeRO stage 3 with the parameter
-- shards and AdamW's state on NVMe (swap files written and read with
-- O_DIRECT on libuv's thread pool), on 2 local ranks.
--
--   build/ztrain recipes/infinity.lua
--   build/ztrain recipes/infinity.lua offload.nvme_path=/mnt/nvme/ztrain   # a fast disk
--   build/ztrain recipes/infinity.lua model.size=gpt2-xl launch.nproc=1 batch.micro=1 \
--       data.seq_len=128 train.steps=2 model.vocab_size=50257             # 1.5B on 24 GiB of RAM
--
-- The device holds the gradient shard (4P/N) and working buffers; per step a
-- unit's shard is read from its swap file ahead of its all-gather, and the
-- optimizer step streams every shard's parameters and moments through
-- offload.staging bytes of host buffers: read chunk i+1 while chunk i is
-- updated and chunk i-1 written. Swap files live under offload.nvme_path
-- (default: OUT/nvme) and are removed at exit. Same bits as zero3.
local zt = require "ztrain"
return {
  launch   = { nproc = 2 },
  model    = { size = "gpt2-mini", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "bytes", seq_len = 128 },
  strategy = zt.strategy.zero { stage = 3, offload_optimizer = "nvme", offload_params = "nvme" },
  -- block_size, queue_depth "auto": from a short probe of nvme_path's disk (kept per device)
  offload  = { staging = "32MiB", nvme_path = "", block_size = "auto", queue_depth = "auto", checksum = false },
  optim    = { name = "adamw", lr = 3e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 30, schedule = "cosine" },
  batch    = { micro = 8, accumulate = 1 },      -- global batch = ranks x 8
  train    = { steps = 200, log_every = 50, eval_every = 100, eval_batches = 20 },
}
