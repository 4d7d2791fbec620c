-- tools/bench.lua -- training-step throughput of full-size GPT-2 on one rank.
--
--   build/ztrain --script tools/bench.lua [model=gpt2] [T=64,256] [B=4] [steps=3]
--   (make bench runs it with OPENBLAS_* unset, as on a user's machine)
-- Prints tokens/s and achieved GFLOP/s of a full step (forward, backward,
-- AdamW) beside the sgemm peak measured in the same process.
-- FLOPs per token = 6 N + 12 L C T (PaLM's count: attention in full, forward
-- and backward, no causal discount), N = all parameters.
local ffi = require "ffi"
local zt = require "ztrain"

ffi.cdef [[
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
]]
local blas = ffi.load("openblas")
local C = zt.ffi.C

local args = dofile(zt.home .. "/tools/args.lua")(arg)
local size = args.model or "gpt2"
local steps = tonumber(args.steps or 3)
local Ts = {}
for t in (args.T or "64,256"):gmatch("%d+") do Ts[#Ts + 1] = tonumber(t) end
local B = tonumber(args.B or 4)
if args.threads then zt.threads(tonumber(args.threads)) end

-- The machine's sgemm peak: OpenBLAS on all threads, best of a few large
-- shapes (including GPT-2's), each timed for at least half a second.
local function sgemm_best()
  local best, best_shape = 0, nil
  for _, s in ipairs({ { 2048, 2048, 2048 }, { 1024, 2304, 768 }, { 1024, 768, 3072 },
                       { 4096, 3072, 768 } }) do
    local m, n, k = s[1], s[2], s[3]
    local a, b, c = ffi.new("float[?]", m * k), ffi.new("float[?]", k * n), ffi.new("float[?]", m * n)
    for i = 0, m * k - 1 do a[i] = (i % 7) * 0.1 end
    for i = 0, k * n - 1 do b[i] = (i % 5) * 0.1 end
    blas.cblas_sgemm(101, 111, 112, m, n, k, 1, a, k, b, k, 0, c, n)   -- warm up
    local reps, t0 = 0, C.zt_now()
    repeat
      blas.cblas_sgemm(101, 111, 112, m, n, k, 1, a, k, b, k, 0, c, n)
      reps = reps + 1
    until C.zt_now() - t0 > 0.5
    local gf = 2 * m * n * k * reps / (C.zt_now() - t0) / 1e9
    if gf > best then best, best_shape = gf, table.concat(s, "x") end
  end
  return best, best_shape
end

-- ztrain keeps OpenBLAS at one thread for the whole process (its GEMMs run
-- fixed blocks over OpenMP, and refuse to run otherwise); this measurement
-- alone sets OpenBLAS's own threading, and puts 1 back afterwards.
local function sgemm_peak()
  blas.openblas_set_num_threads(zt.threads())
  local ok, best, shape = pcall(sgemm_best)
  blas.openblas_set_num_threads(1)
  if not ok then error(best, 0) end
  return best, shape
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

print(("ztrain bench: %s, %s, %d threads"):format(zt.version(), ffi.string(C.zt_blas_info()), zt.threads()))
local auto = zt.ffi.blas_core_auto
print(("OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s"):format(
  auto and ("(unset: ztrain chose " .. auto .. " for this CPU)") or (os.getenv("OPENBLAS_CORETYPE") or "(unset)"),
  os.getenv("OPENBLAS_L2_SIZE") or "(unset)"))
local peak, pshape = sgemm_peak()
print(("sgemm peak: %.1f GFLOP/s (OpenBLAS, %d threads, best shape %s)"):format(peak, zt.threads(), pshape))

local cfg = zt.gpt2.config(size)
local model = zt.gpt2.new(cfg)
model:init(1)
local optim = zt.adamw.new { lr = 1e-4 }
local S = zt.strategy.single()
local ctx = { model = model, optim = optim, accumulate = 1, world_size = 1, rank = 0, clip = 1.0,
              dp = zt.comm.world() }
S.setup(ctx)
print(("model %s: %d parameters, L=%d C=%d V=%d"):format(size, model.nparams, cfg.L, cfg.C, cfg.V))
print(("%-6s %-5s %10s %10s %10s %8s %12s"):format("B", "T", "ms/step", "tokens/s", "GFLOP/s", "% peak", "device peak"))

for _, T in ipairs(Ts) do
  local a = model:activations(B, T)
  local tok = ffi.new("int32_t[?]", B * T)
  for i = 0, B * T - 1 do tok[i] = (i * 7919) % cfg.V end
  a.tokens:write(tok)
  for i = 0, B * T - 1 do tok[i] = (i * 104729 + 1) % cfg.V end
  a.targets:write(tok)
  a.dscale = 1 / (B * T)
  zt.memory.reset_peak()
  local times = {}
  for s = 0, steps do
    local t0 = C.zt_now()
    model:forward_all(a)
    model:backward_all(a)
    S.step(ctx, 1e-4)
    if s > 0 then times[#times + 1] = C.zt_now() - t0 end   -- step 0 warms up
  end
  local t = median(times)
  local flops = (6 * model.nparams + 12 * cfg.L * cfg.C * T) * B * T
  local gf = flops / t / 1e9
  print(("%-6d %-5d %10.1f %10.1f %10.1f %7.1f%% %12s"):format(B, T, t * 1000, B * T / t, gf,
        100 * gf / peak, zt.memory.format(zt.memory.peak("device"))))
  a:free()
end
S.free(ctx); optim:free(); model:free()
