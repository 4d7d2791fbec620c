-- examples/diloco.lua -- DiLoCo on the tiny model: each rank takes 8 AdamW
-- steps on its own data, then the ranks average how far they moved and
-- take one Nesterov step on it (examples/local_sgd.lua). Eight times less
-- communication than dp; not dp's math (see the example's header).
--
--   build/ztrain --nproc 2 examples/diloco.lua
--   build/ztrain --nproc 2 examples/diloco.lua train.steps=64 optim.lr=3e-3
local zt = require "ztrain"
local local_sgd = dofile((zt.home or ".") .. "/examples/local_sgd.lua")

return {
  model    = { size = "gpt2-tiny" },
  data     = { seq_len = 64 },
  strategy = local_sgd.new { every = 8, outer = "nesterov", outer_lr = 0.7, outer_momentum = 0.9 },
  optim    = { lr = 3e-3 },
  batch    = { micro = 4 },
  train    = { steps = 48, log_every = 8, eval_every = 24 },
}
