-- tools/bench_strategies.lua -- the seeds' strategy table, measured.
--
--   build/ztrain --script tools/bench_strategies.lua [model=gpt2] [T=256] [B=4] [steps=4]
--                                                    [only=single,zero2]
--
-- For each configuration, runs a real training job (real MPI ranks for N=2)
-- on GPT-2's shapes (vocabulary 50257, byte data) and reads its summary.json:
-- tokens/s and step time (medians), peak device and host memory per rank,
-- model-state bytes on the device and on the host, predicted by the ZeRO
-- formulas (offload moves terms to the host) and measured by the runtime.
local cjson = require "cjson"
local zt = require "ztrain"

local args = dofile(zt.home .. "/tools/args.lua")(arg)
local model = args.model or "gpt2"
local T, B, steps = tonumber(args.T or 256), tonumber(args.B or 4), tonumber(args.steps or 4)
local exe = "build/ztrain"

local configs = {
  { n = 1, strategy = "single" },
  { n = 2, strategy = "dp" }, { n = 2, strategy = "zero1" },
  { n = 2, strategy = "zero2" }, { n = 2, strategy = "zero3" },
  { n = 2, strategy = "zero2_offload" }, { n = 2, strategy = "zero3_offload" },
  { n = 2, strategy = "zero3_infinity" },
  -- mixed precision (2-byte parameters and gradients, fp32 compute) and
  -- activation checkpointing (blocks recomputed in backward): their cost
  { n = 1, strategy = "single", extra = "precision=bf16", label = "single bf16" },   -- bf16 GEMMs where AMX
  { n = 1, strategy = "single", extra = "precision=bf16 device.bf16_gemm=off", label = "single bf16/f32mm" },
  { n = 2, strategy = "zero3", extra = "precision=bf16", label = "zero3 bf16" },
  { n = 1, strategy = "single", extra = "train.checkpoint_activations=true", label = "single ckpt-act" },
}

if args.only then                      -- e.g. only=single,zero2
  local keep = {}
  for _, c in ipairs(configs) do
    if ("," .. args.only .. ","):find("," .. c.strategy .. ",", 1, true) then keep[#keep + 1] = c end
  end
  configs = keep
end

local function run(c)
  local out = os.tmpname(); os.remove(out)
  local cmd = ("%s %s recipes/single.lua strategy=%s model.size=%s model.vocab_size=50257 " ..
               "data.seq_len=%d batch.micro=%d train.steps=%d train.eval_batches=0 train.eval_every=0 " ..
               "lr.warmup=1 data.tokenizer=bytes %s -q out=%s 2>&1"):format(exe, c.n > 1 and ("--nproc " .. c.n) or "",
               c.strategy, model, T, B, steps, c.extra or "", out)
  local p = io.popen(cmd)
  local text = p:read("*a")
  p:close()
  local f = io.open(out .. "/summary.json")
  if not f then return nil, text end
  local s = cjson.decode(f:read("*a"))
  f:close()
  return s
end

local fmt = zt.memory.format
local core = zt.ffi.blas_core_auto and ("OPENBLAS_CORETYPE unset: ztrain chose " .. zt.ffi.blas_core_auto)
             or ("OPENBLAS_CORETYPE=" .. tostring(os.getenv("OPENBLAS_CORETYPE")))
print(("strategy table: %s (vocabulary 50257), B=%d per rank, T=%d, %d steps (medians of steps 2..%d), %s")
      :format(model, B, T, steps, steps, core))
print(("%-15s %2s %7s %9s %9s %7s %12s %12s %25s %25s"):format("strategy", "N", "threads", "tokens/s", "ms/step",
      "vs N=1", "device peak", "host peak", "state pred. (dev/host)", "state meas. (dev/host)"))
local base
for _, c in ipairs(configs) do
  local s, err = run(c)
  if not s then
    print(("%-8s %2d  failed: %s"):format(c.label or c.strategy, c.n, err))
  else
    base = base or s.tokens_per_s
    local m = s.memory[1]
    local by = m.by_category
    local function state_on(t)
      local p = s.predicted.tiers and s.predicted.tiers[t]
      local pred = p and (p.params + p.grads + p.optim) or
                   (t == "device" and s.predicted.params + s.predicted.grads + s.predicted.optim +
                   (s.predicted.accumulator or 0) or 0)
      return pred, by.params[t] + by.grads[t] + by.optim[t]
    end
    local pd, md = state_on("device")
    local ph, mh = state_on("host")
    print(("%-15s %2d %7d %9.1f %9.0f %6.2fx %12s %12s %25s %25s"):format(c.label or s.strategy, s.world_size, s.threads,
          s.tokens_per_s, s.step_ms_median, s.tokens_per_s / base, fmt(m.device_peak), fmt(m.host_peak),
          fmt(pd) .. " / " .. fmt(ph), fmt(md) .. " / " .. fmt(mh)))
  end
end
