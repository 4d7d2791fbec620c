-- tools/bench_host.lua -- the host's own time in a training step: what Lua
-- dispatch and the runtime's checks cost, apart from the kernels' work.
--
--   build/ztrain --script tools/bench_host.lua [model=gpt2] [steps=20]
--
-- A GPU step is the host issuing a sequence of ops while the device runs
-- them; where the host's own time nears the device's, launches bound the
-- step and a CUDA graph of the micro-batch would pay (issue 26 item 6).
-- This runs `model`'s op sequence -- its L blocks, the same ops and the
-- same count as the real model, bf16 with the bf16 GEMMs -- at widths too
-- small to cost anything (C = 64, 4 heads, V = 256, B = 1, T = 16) through
-- tools/bench_gpu.lua on the cpu device and on fakegpu-async (which queues
-- every op as the cuda device does): the step is then about the host's own
-- time, an upper bound of it before a GPU's launch calls (a few us each)
-- are added. Compare with the GPU's step time for that model
-- (docs/gpu.md: GPT-2 124M at B=16, T=1024 is 43.6 ms on an H200).
local zt = require "ztrain"
local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local model = args.model or "gpt2"
local base = zt.gpt2.sizes[model]
if not base then
  error(("bench_host: unknown GPT-2 size %q (a gpt2 family size: gpt2, gpt2-medium, ...)"):format(model), 0)
end
local steps = A.whole(args, "steps", 20, 3, "bench_host")

-- the model's depth at tiny widths: its op sequence, nothing to compute
local name = model .. "-ops"
zt.gpt2.sizes[name] = { L = base.L, C = 64, NH = 4, maxT = 1024 }
local config = zt.gpt2.config
zt.gpt2.config = function(size, over)
  local c = config(size, over)
  if size == name then c.V = 256 end
  return c
end

print(("bench_host: %s's op sequence (L = %d) at C = 64, V = 256, B = 1, T = 16, bf16: the host's own time a step")
      :format(model, base.L))
for _, backend in ipairs({ "cpu", "fakegpu-async" }) do
  arg = { "backend=" .. backend, "model=" .. name, "B=1", "T=16", "steps=" .. steps, "profile=0",
          "precision=bf16" }
  local ok, err = pcall(dofile, zt.home .. "/tools/bench_gpu.lua")
  if not ok then
    zt.gpt2.config, zt.gpt2.sizes[name] = config, nil
    error(err, 0)
  end
end
zt.gpt2.config, zt.gpt2.sizes[name] = config, nil
