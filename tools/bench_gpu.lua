-- tools/bench_gpu.lua -- GPT-2 training throughput on the GPU: tokens/s and
-- MFU of ztrain's step, the CUDA issue's figure beside PyTorch's
-- (tools/torch_gpt2_bench.py, the same FLOP count and peak).
--
--   build-cuda/ztrain --script tools/bench_gpu.lua [model=gpt2] [B=16] [T=1024]
--       [precision=bf16] [attention=auto] [steps=10] [profile=3]
--       [peak_tflops=989] [out=FILE] [backend=cuda]
--
-- A trainer as `ztrain` builds it (strategy single, one rank) on
-- device.backend=cuda; bf16 is precision=bf16 with the bf16 GEMMs
-- (device.bf16_gemm=on); attention= is device.attention (auto: the
-- tensor-core kernels in bf16 on the GPU, as a user's run takes them; bf16
-- forces them, exact the fp32 kernels; docs/gpu.md). Two warm-up steps, then `steps` timed ones
-- (train_step waits for the device at its end): the median step gives
-- tokens/s, and MFU = tokens/s x (6 N + 12 L C T) / peak (PaLM's count,
-- torch_gpt2_bench.py's; peak_tflops 989 = H200/H100 SXM dense bf16).
-- Then, unless profile=0, `profile` more steps under ztrain.record.profile with a
-- device sync around every op: where the time goes, per op family (the
-- syncs remove overlap, so these steps run slower than the timed ones).
-- The corpus is generated (a GPU machine need not have the recipes'
-- fortunes, and the tree's docs are too few tokens for B=16 T=1024): words
-- from a fixed list in a fixed pseudo-random order, in byte tokens, written
-- to a temporary file, half of it the validation split, each half at least
-- B windows of T + 1 tokens, whatever B and T. Without a GPU it prints one skip line
-- and exits 0; backend=cpu runs the same on the CPU (a smoke test of this
-- script: spec/e2e/bench_gpu_spec.lua).
local ffi = require "ffi"
local zt = require "ztrain"
local zffi = require "ztrain.core.ffi"
local profile = require "ztrain.record.profile"
local bc = dofile(zt.home .. "/tools/bench_common.lua")
local C = zffi.C

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local function whole(key, default, least) return A.whole(args, key, default, least, "bench_gpu") end
local size = args.model or "gpt2"
zt.gpt2.config(size)   -- an unknown size fails here, naming the known ones
local B, Tlen = whole("B", 16, 1), whole("T", 1024, 1)
local steps, nprof = whole("steps", 10, 1), whole("profile", 3, 0)
local precision = args.precision or "bf16"
if precision ~= "fp32" and precision ~= "bf16" then
  error(("bench_gpu: precision must be fp32 or bf16, got %q"):format(precision), 0)
end
local peak = tonumber(args.peak_tflops or 989)
if not peak or peak < 0 then error("bench_gpu: peak_tflops=" .. tostring(args.peak_tflops) .. " is not a number >= 0", 0) end
local backend = args.backend or "cuda"
local attention = args.attention or "auto"     -- the recipe checks it

-- no GPU: one line, exit 0 (like make test-cuda's tests)
do
  local ok, err = pcall(zffi.check_key, C.zt_device_init(backend), "device.backend=" .. backend)
  if not ok then
    if backend == "cuda" and (err:find("no CUDA GPU is visible", 1, true) or err:find("built without CUDA", 1, true)) then
      print(("bench_gpu: no GPU here, skipped (%s)"):format(err))
      os.exit(0)
    end
    error("bench_gpu: " .. err, 0)
  end
  zffi.check(C.zt_device_init("cpu"), "device.backend")   -- the trainer selects it again
end

local lines = {}
local function say(s) print(s); lines[#lines + 1] = s end

-- corpus(path, bytes): `bytes` or a little more of generated text, lines of
-- words, written to path
local function corpus(path, bytes)
  local words = { "the", "model", "of", "a", "step", "tensor", "and", "to", "in", "gradient", "is",
                  "layer", "for", "attention", "with", "weights", "on", "device", "each", "token",
                  "batch", "loss", "rank", "shard", "stream", "copy", "kernel", "memory", "sum", "mean" }
  local out, line, n, x = {}, {}, 0, 12345
  while n < bytes do
    local len = 0
    repeat
      x = (1103515245 * x + 12345) % 2147483648
      local w = words[math.floor(x / 65536) % #words + 1]
      line[#line + 1] = w
      len = len + #w + 1
    until len > 60
    local s = table.concat(line, " ") .. "\n"
    out[#out + 1] = s
    n = n + #s
    line = {}
  end
  local f = assert(io.open(path, "w"))
  f:write(table.concat(out))
  f:close()
end
-- half of it validation (cut at a line start, so a line short of half):
-- each half holds B windows of T + 1 tokens with T tokens and a line to spare
local text = os.tmpname()
corpus(text, 2 * (B * Tlen + 1 + Tlen + 128))

local extra = { "device.backend=" .. backend, "device.attention=" .. attention, "data.tokenizer=bytes",
                "data.text=" .. text, "data.valid_fraction=0.5", "data.cache=off" }
local tok, tr = pcall(bc.trainer, size, B, Tlen, precision, extra)
if not tok then os.remove(text); error(tr, 0) end
local ok, err = pcall(function()
  local flops = bc.step_flops(tr.model, B, Tlen)
  say(("ztrain bench_gpu: %s, device %s, model %s (%d parameters), B=%d T=%d %s, attention %s")
      :format(zt.version(), ffi.string(C.zt_device_name()), size, tr.model.nparams, B, Tlen, precision,
              tr.attention))
  for _ = 1, 2 do tr:train_step() end   -- warm-up: allocation, cuBLAS heuristics
  local times, loss = {}, nil
  local w0, us0 = C.zt_device_count("host_waits"), C.zt_device_count("host_wait_us")
  local t_all = C.zt_now()
  for _ = 1, steps do
    local t0 = C.zt_now()
    loss = tr:train_step().loss
    times[#times + 1] = C.zt_now() - t0
  end
  t_all = C.zt_now() - t_all
  local waits = tonumber(C.zt_device_count("host_waits") - w0) / steps
  local wait_s = tonumber(C.zt_device_count("host_wait_us") - us0) / 1e6 / steps
  local t = bc.median(times)
  local tps = B * Tlen / t
  local tflops = flops / t / 1e12
  say(("step: median %.2f ms of %d (min %.2f, max %.2f), %.0f tokens/s, %.1f TFLOP/s%s; last loss %.4f")
      :format(t * 1e3, steps, math.min(unpack(times)) * 1e3, math.max(unpack(times)) * 1e3, tps, tflops,
              peak > 0 and (", MFU %.1f%% of %g TFLOP/s"):format(100 * tflops / peak, peak) or "", loss))
  say(("host waits: %.1f a step (every stream or event sync, copy with host memory, value read)"):format(waits))
  -- the host's own time (Lua, launches) against the step: where it nears
  -- the step, the launches bound it and a CUDA graph would pay (GPU-Step)
  local mean = t_all / steps
  say(("host time: %.2f ms a step waiting for the device, %.2f ms its own (Lua, launches), of %.2f ms (the mean step)")
      :format(wait_s * 1e3, (mean - wait_s) * 1e3, mean * 1e3))
  say(("| ztrain | %.0f | %.1f | %s |"):format(tps, t * 1e3,
      peak > 0 and ("%.1f%%"):format(100 * tflops / peak) or "-"))
  if nprof == 0 then return end

  local prof = profile.start(tr.model, tr.ctx, { sync = true })
  local pok, perr = pcall(function()
    tr:train_step()
    prof:reset()
    local t0 = C.zt_now()
    for _ = 1, nprof do tr:train_step() end
    local step = (C.zt_now() - t0) / nprof
    say("")
    say(("Per op family, a device sync around every op (%d steps, %.2f ms/step with the syncs):"):format(nprof, step * 1e3))
    say("| phase | op family | calls/step | ms/step | % of step | TFLOP/s | GB/s |")
    say("|---|---|---:|---:|---:|---:|---:|")
    local summed = 0
    for _, e in ipairs(prof:rows()) do
      local s = e.s / nprof
      summed = summed + s
      say(("| %s | %s | %d | %.3f | %.1f | %s | %s |"):format(e.phase, e.family, e.calls / nprof, s * 1e3,
          100 * s / step, e.flops > 0 and ("%.1f"):format(e.flops / e.s / 1e12) or "",
          e.flops == 0 and e.bytes > 0 and ("%.0f"):format(e.bytes / e.s / 1e9) or ""))
    end
    say(("| | (unaccounted: Lua, launches, data, host waits) | | %.3f | %.1f | | |")
        :format((step - summed) * 1e3, 100 * (step - summed) / step))
  end)
  prof:stop()
  if not pok then error(perr, 0) end
end)
tr:free()
os.remove(text)
if not ok then error(err, 0) end

if args.out then
  local f, ferr = io.open(args.out, "w")
  if not f then error(("bench_gpu: cannot write %s (%s); the figures are above"):format(args.out, ferr), 0) end
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end
