-- examples/all_forward_first.lua -- a schedule written by a user: on one
-- stage, run every micro-batch's forward first, then every backward (the
-- one-stage picture of GPipe). Several micro-batches' activations are alive
-- at once, yet the parameters are bit-identical to the plain sequential
-- step: gradients still complete in micro-batch order.
--
--   build/ztrain examples/all_forward_first.lua
--   build/ztrain --nproc 2 examples/all_forward_first.lua strategy=zero3
local zt = require "ztrain"
local A = zt.schedule.action

-- p: { stages, microbatches, ranks } -> one list of actions per rank
local function all_forward_first(p)
  local list = {}
  for i = 0, p.microbatches - 1 do list[#list + 1] = A("F", 0, i) end
  for i = 0, p.microbatches - 1 do list[#list + 1] = A("B", 0, i) end
  list[#list + 1] = { op = "REDUCE_GRAD" }
  list[#list + 1] = { op = "STEP" }
  return { list }
end

return {
  model    = { size = "gpt2-tiny" },
  data     = { seq_len = 64 },
  strategy = "single",
  schedule = all_forward_first,
  batch    = { micro = 4, accumulate = 4 },
  train    = { steps = 30, log_every = 10, eval_every = 0 },
}
