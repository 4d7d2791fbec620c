-- tools/bench.lua -- training-step throughput of full-size GPT-2 on one rank,
-- fp32 and bf16 side by side.
--
--   build/ztrain --script tools/bench.lua [model=gpt2] [T=64,256] [B=4] [steps=3]
--                [precision=fp32,bf16] [threads=N]
--   (make bench runs it with OPENBLAS_* unset, as on a user's machine)
-- Prints tokens/s and achieved GFLOP/s of a full training step (forward,
-- backward, AdamW; a trainer as `ztrain` builds it, strategy single) per
-- precision, beside the peaks measured in the same process: OpenBLAS's
-- sgemm on all threads, and ztrain's own fp32 and bf16 GEMMs. bf16 runs
-- precision = "bf16" with device.bf16_gemm = "on" (AVX512_BF16 or AMX,
-- whichever the CPU has; the portable path elsewhere, say the info line).
-- Then the bf16/fp32 step ratio (issue 15's target: >= 1.7x) and markdown
-- rows for docs/performance.md.
-- FLOPs per token = 6 N + 12 L C T (PaLM's count: attention in full, forward
-- and backward, no causal discount), N = all parameters.
local ffi = require "ffi"
local zt = require "ztrain"
local bc = dofile(zt.home .. "/tools/bench_common.lua")
local C = zt.ffi.C

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local size = args.model or "gpt2"
zt.gpt2.config(size)   -- an unknown size fails here, naming the known ones, before any measuring
local steps = A.whole(args, "steps", 3, 1, "bench", "the timed steps after one warm-up")
local Ts = {}
for t in (args.T or "64,256"):gmatch("%d+") do Ts[#Ts + 1] = tonumber(t) end
local B = tonumber(args.B or 4)
local precs = {}
for p in (args.precision or "fp32,bf16"):gmatch("[^,]+") do
  if p ~= "fp32" and p ~= "bf16" then
    error(("bench.lua: precision must be fp32, bf16 or both (fp32,bf16), got %q"):format(p), 0)
  end
  precs[#precs + 1] = p
end
if args.threads then zt.threads(tonumber(args.threads)) end

bc.header("ztrain bench")
local peak, pshape = bc.sgemm_peak()
print(("sgemm peak: %.1f GFLOP/s (OpenBLAS, %d threads, best shape %s)"):format(peak, zt.threads(), pshape))
local own = {}
for _, p in ipairs(precs) do
  local dt = p == "bf16" and "bf16" or "f32"
  local gf, shape = bc.gemm_peak(dt)
  own[p] = gf
  print(("ztrain %s GEMM: %.1f GFLOP/s (best shape %s; %s)"):format(p, gf, shape,
        p == "bf16" and ffi.string(C.zt_matmul_bf16_info()) or "fp32 matmul.c"))
end
if own.fp32 and own.bf16 then print(("bf16/fp32 GEMM: %.2fx"):format(own.bf16 / own.fp32)) end

print(("%-5s %-6s %-5s %10s %10s %10s %8s %12s"):format("prec", "B", "T", "ms/step", "tokens/s", "GFLOP/s",
      "% sgemm", "device peak"))
local results, nparams = {}, nil
for _, T in ipairs(Ts) do
  for _, p in ipairs(precs) do
    local tr = bc.trainer(size, B, T, p)
    nparams = tr.model.nparams
    zt.memory.reset_peak()
    local ok, err = pcall(function()
      local times = {}
      for s = 0, steps do
        local t0 = C.zt_now()
        tr:train_step()
        if s > 0 then times[#times + 1] = C.zt_now() - t0 end   -- step 0 warms up
      end
      local t = bc.median(times)
      local gf = bc.step_flops(tr.model, B, T) / t / 1e9
      results[T .. p] = { t = t, tps = B * T / t, gf = gf }
      print(("%-5s %-6d %-5d %10.1f %10.1f %10.1f %7.1f%% %12s"):format(p, B, T, t * 1000, B * T / t, gf,
            100 * gf / peak, zt.memory.format(zt.memory.peak("device"))))
    end)
    tr:free()
    if not ok then error(err, 0) end
  end
end
print(("model %s: %d parameters"):format(size, nparams))

print()
print("Markdown rows (docs/performance.md: model | B | T | precision | ms/step | tok/s | GFLOP/s | % of sgemm peak | bf16/fp32):")
for _, T in ipairs(Ts) do
  for _, p in ipairs(precs) do
    local r = results[T .. p]
    local f32 = results[T .. "fp32"]
    local ratio = (p == "bf16" and f32) and ("%.2fx"):format(f32.t / r.t) or ""
    print(("| %s | %d | %d | %s | %.1f | %.1f | %.1f | %.1f%% | %s |"):format(size, B, T, p, r.t * 1000, r.tps,
          r.gf, 100 * r.gf / peak, ratio))
  end
  if results[T .. "fp32"] and results[T .. "bf16"] then
    print(("T=%d: bf16 step %.2fx the fp32 step (target >= 1.7x)"):format(T,
          results[T .. "fp32"].t / results[T .. "bf16"].t))
  end
end
