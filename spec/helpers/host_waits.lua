-- The host's waits for the device in a training step on fakegpu-async
-- (zt_device_count "host_waits"), for spec/e2e/fakegpu_spec.lua: one line per
-- case, "CASE: W1 W2" over steps 2 and 3 (step 1 allocates).
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"
local C = require("ztrain.core.ffi").C

local BASE = { "model.size=gpt2-tiny", "data.tokenizer=bytes", "data.seq_len=32", "batch.micro=2",
               "train.eval_every=0", "optim.clip=0.05", "device.backend=fakegpu-async:" .. (arg[1] or "3") }
local CASES = {
  { "accumulate 1", "batch.accumulate=1" },
  { "accumulate 4", "batch.accumulate=4" },
  { "accumulate 4 bf16 GEMMs", "batch.accumulate=4", "precision=bf16", "device.bf16_gemm=on" },
  { "accumulate 4 checkpointed", "batch.accumulate=4", "train.checkpoint_activations=true" },
  { "accumulate 4 split backward (one_stage_iw)", "batch.accumulate=4", "schedule=one_stage_iw" },
  -- the Llama family: RMS norm, RoPE (its table made at the first step), SwiGLU, GQA
  { "llama-tiny accumulate 4 bf16 GEMMs", "model.size=llama-tiny", "batch.accumulate=4", "precision=bf16",
    "device.bf16_gemm=on" },
}
for _, c in ipairs(CASES) do
  local o = {}
  for _, x in ipairs(BASE) do o[#o + 1] = x end
  for i = 2, #c do o[#o + 1] = c[i] end
  local tr = trainer.new(assert(zt.recipe.resolve({}, o)), { quiet = true })
  tr:train_step()
  local w = { C.zt_device_count("host_waits") }
  for s = 1, 2 do tr:train_step(); w[s + 1] = C.zt_device_count("host_waits") end
  print(("%s: %d %d"):format(c[1], tonumber(w[2] - w[1]), tonumber(w[3] - w[2])))
  tr:free()
end
