-- tools/bench_common.lua -- what tools/bench.lua and tools/bench_ops.lua
-- share: the machine's reference rates measured in the same process (the
-- OpenBLAS sgemm peak, ztrain's own fp32 and bf16 GEMM rates, copy and
-- triad bandwidth) and a trainer built the way a run builds one.
--   local B = dofile(zt.home .. "/tools/bench_common.lua")
local ffi = require "ffi"
local zt = require "ztrain"
local ops = require "ztrain.core.ops"
local T = require "ztrain.core.tensor"
local C = zt.ffi.C

pcall(ffi.cdef, [[
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
]])
-- by its soname: the runtime package has it, the -dev package's libopenblas.so
-- may be missing (a GPU machine with tools/gpu_kit.sh's libraries)
local okb, blas = pcall(ffi.load, "libopenblas.so.0")
if not okb then blas = ffi.load("openblas") end

local M = {}

-- median(xs) -> the lower middle of xs sorted (ztrain.train.run's median, low)
function M.median(xs) return require("ztrain.train.run").median(xs, true) end

-- repeat f until at least `secs` have passed; returns seconds per call
local function rate(f, secs)
  f()   -- warm up (first touch, packing buffers)
  local reps, t0 = 0, C.zt_now()
  repeat f(); reps = reps + 1 until C.zt_now() - t0 > secs
  return (C.zt_now() - t0) / reps
end
M.rate = rate

-- OpenBLAS sgemm on all threads, best of a few large shapes (GPT-2's among
-- them). ztrain keeps OpenBLAS at one thread (its GEMMs run fixed blocks
-- over OpenMP); this alone sets OpenBLAS's threading, and puts 1 back.
local function sgemm_best()
  local best, best_shape = 0, nil
  for _, s in ipairs({ { 2048, 2048, 2048 }, { 1024, 2304, 768 }, { 1024, 768, 3072 },
                       { 4096, 3072, 768 } }) do
    local m, n, k = s[1], s[2], s[3]
    local a, b, c = ffi.new("float[?]", m * k), ffi.new("float[?]", k * n), ffi.new("float[?]", m * n)
    for i = 0, m * k - 1 do a[i] = (i % 7) * 0.1 end
    for i = 0, k * n - 1 do b[i] = (i % 5) * 0.1 end
    local dt = rate(function() blas.cblas_sgemm(101, 111, 112, m, n, k, 1, a, k, b, k, 0, c, n) end, 0.5)
    local gf = 2 * m * n * k / dt / 1e9
    if gf > best then best, best_shape = gf, table.concat(s, "x") end
  end
  return best, best_shape
end

function M.sgemm_peak()
  blas.openblas_set_num_threads(zt.threads())
  local ok, best, shape = pcall(sgemm_best)
  blas.openblas_set_num_threads(1)
  if not ok then error(best, 0) end
  return best, shape
end

-- ztrain's own GEMM (ops.matmul_forward, or the bf16 one on bf16 operands)
-- at GPT-2's largest block shape: rows = 1024 (B*T), 768 -> 3072. GFLOP/s.
function M.gemm_rate(dtype, rows, cin, cout)
  rows, cin, cout = rows or 1024, cin or 768, cout or 3072
  local opt = { category = "activations" }
  local inp, w = T.new({ rows, cin }, opt), T.new({ cout, cin }, opt)
  local out = T.new({ rows, cout }, opt)
  ops.randn(inp, 1, 0, 0, 1); ops.randn(w, 1, 1, 0, 0.02)
  local f, lo = ops.matmul_forward, {}
  if dtype == "bf16" then
    for i, t in ipairs({ inp, w }) do
      lo[i] = T.new(t:shape(), { category = "activations", dtype = "bf16" })
      ops.cast(lo[i], t)
    end
    f = ops.matmul_bf16_forward
  end
  local a, b = lo[1] or inp, lo[2] or w
  local ok, dt = pcall(rate, function() f(out, a, b, nil) end, 0.5)
  for _, t in ipairs({ inp, w, out, lo[1], lo[2] }) do t:free() end
  if not ok then error(dt, 0) end
  return 2 * rows * cin * cout / dt / 1e9
end

-- best of ztrain's GEMM over GPT-2's block shapes and a square one: the
-- peak its own fp32 (matmul.c) or bf16 (matmul_bf16.c) GEMM reaches here.
function M.gemm_peak(dtype)
  local best, shape = 0, nil
  for _, s in ipairs({ { 1024, 768, 3072 }, { 1024, 3072, 768 }, { 1024, 768, 2304 }, { 2048, 2048, 2048 } }) do
    local gf = M.gemm_rate(dtype, s[1], s[2], s[3])
    if gf > best then best, shape = gf, ("%dx%d->%d"):format(s[1], s[2], s[3]) end
  end
  return best, shape
end

-- copy (8 bytes an element: read + write), triad-like axpy (y += a x: 12
-- bytes) and fp32 -> bf16 cast (6 bytes) bandwidth of ztrain's own threaded
-- kernels over 128 MiB operands, far past any cache. GB/s.
function M.bandwidth()
  local n = 32 * 1024 * 1024
  local opt = { category = "activations" }
  local x, y = T.new({ n }, opt), T.new({ n }, opt)
  local h = T.new({ n }, { category = "activations", dtype = "bf16" })
  ops.fill(x, 1); ops.fill(y, 2)
  local ok, copy, triad, cast = pcall(function()
    return 8 * n / rate(function() ops.copy(y, x) end, 0.5) / 1e9,
           12 * n / rate(function() ops.axpy(y, 1e-30, x) end, 0.5) / 1e9,
           6 * n / rate(function() ops.cast(h, x) end, 0.5) / 1e9
  end)
  x:free(); y:free(); h:free()
  if not ok then error(copy, 0) end
  return copy, triad, cast
end

-- The header lines every bench prints: version, BLAS, threads, core type.
function M.header(title)
  print(("%s: %s, %s, %d threads"):format(title, zt.version(), ffi.string(C.zt_blas_info()), zt.threads()))
  local auto = zt.ffi.blas_core_auto
  print(("OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s"):format(
    auto and ("(unset: ztrain chose " .. auto .. " for this CPU)") or (os.getenv("OPENBLAS_CORETYPE") or "(unset)"),
    os.getenv("OPENBLAS_L2_SIZE") or "(unset)"))
end

-- A trainer as `ztrain` builds one (strategy single, the data pipeline),
-- GPT-2's vocabulary of 50257, no evaluation. precision "bf16" takes the
-- bf16 GEMMs (device.bf16_gemm=on: AVX512_BF16 or AMX, whichever the CPU has).
-- extra: more key=value overrides (tools/bench_gpu.lua: device.backend=cuda).
function M.trainer(size, B, Tlen, precision, extra)
  local o = { "model.size=" .. size, "data.seq_len=" .. Tlen, "batch.micro=" .. B,
              "train.eval_every=0", "model.vocab_size=50257", "precision=" .. precision }
  if precision == "bf16" then o[#o + 1] = "device.bf16_gemm=on" end
  for _, kv in ipairs(extra or {}) do o[#o + 1] = kv end
  local r, err = zt.recipe.resolve({}, o)
  if not r then error(err, 0) end             -- a user's key: no traceback
  return require("ztrain.train.trainer").new(r, { quiet = true })
end

-- FLOPs of one step (PaLM's count: 6 N + 12 L C T per token, attention in
-- full, forward and backward, no causal discount; N = all parameters):
-- steptime.flops_per_token with N for its matmul parameters
function M.step_flops(model, B, Tlen)
  return require("ztrain.plan.steptime").flops_per_token(model.cfg, Tlen, false, model.nparams) * B * Tlen
end

return M
