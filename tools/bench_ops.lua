-- tools/bench_ops.lua -- where a training step's time goes, per op family.
--
--   build/ztrain --script tools/bench_ops.lua [model=gpt2,gpt2-medium] [B=4] [T=256]
--                [steps=3] [precision=fp32] [threads=N] [out=build/bench_ops.md]
--   (make bench-ops runs it with OPENBLAS_* unset, as on a user's machine)
--
-- For each model: `steps` training steps after one warm-up (a trainer as
-- `ztrain` builds it: strategy single, one rank, so no communication), with
-- ztrain.record.profile timing every op the model, the precision policy and the
-- strategy call, per phase (forward, backward, optimizer) and family. Each
-- row: time per step, its share of the measured step, and the rate it
-- reached -- GFLOP/s for GEMMs and attention (beside the sgemm peak and
-- ztrain's own GEMM rate, measured in the same run) or GB/s for the
-- memory-bound ops (the bytes each op must move at the least: every operand
-- read or written once; beside the copy and triad bandwidth measured in the
-- same run). The row "(unaccounted)" is the step minus the sum of the ops:
-- Lua, data loading, allocation. Prints markdown; writes it to `out` too.
local zt = require "ztrain"
local profile = require "ztrain.record.profile"
local bc = dofile(zt.home .. "/tools/bench_common.lua")
local C = zt.ffi.C

local args = dofile(zt.home .. "/tools/args.lua")(arg)
local models = {}
for m in (args.model or "gpt2,gpt2-medium"):gmatch("[^,]+") do
  zt.gpt2.config(m)   -- an unknown size fails here, naming the known ones, before any measuring
  models[#models + 1] = m
end
local B, Tlen = tonumber(args.B or 4), tonumber(args.T or 256)
local steps = tonumber(args.steps or 3)
local precision = args.precision or "fp32"
if precision ~= "fp32" and precision ~= "bf16" then
  error(("bench_ops.lua: precision must be fp32 or bf16, got %q"):format(precision), 0)
end
local outpath = args.out or (zt.home .. "/build/bench_ops.md")
if args.threads then zt.threads(tonumber(args.threads)) end

local lines = {}
local function say(s) print(s); lines[#lines + 1] = s end

bc.header("ztrain bench-ops")
local peak, pshape = bc.sgemm_peak()
local own = bc.gemm_rate(precision == "bf16" and "bf16" or "f32")
local copy, triad, cast = bc.bandwidth()
say(("Reference rates, same run: sgemm peak %.1f GFLOP/s (OpenBLAS, %d threads, %s); ztrain %s GEMM "
     .. "%.1f GFLOP/s (1024x768->3072); copy %.1f GB/s, triad %.1f GB/s, fp32->bf16 cast %.1f GB/s "
     .. "(ztrain's kernels, 128 MiB operands)")
    :format(peak, zt.threads(), pshape, precision, own, copy, triad, cast))
say("")

local function fmt(x, f) if x == nil then return "" end return (f or "%.1f"):format(x) end

for _, size in ipairs(models) do
  local tr = bc.trainer(size, B, Tlen, precision)
  local prof = profile.start(tr.model, tr.ctx)
  local ok, err = pcall(function()
    tr:train_step()   -- warm-up: first touch, packing buffers
    prof:reset()
    local times = {}
    for _ = 1, steps do
      local t0 = C.zt_now()
      tr:train_step()
      times[#times + 1] = C.zt_now() - t0
    end
    local total = 0
    for _, t in ipairs(times) do total = total + t end
    local step = total / steps
    local flops = bc.step_flops(tr.model, B, Tlen)
    say(("### %s, B=%d T=%d, %s: %.1f ms/step (mean of %d; median %.1f), %.1f tok/s, %.1f GFLOP/s = %.1f%% of the sgemm peak")
        :format(size, B, Tlen, precision, step * 1e3, steps, bc.median(times) * 1e3, B * Tlen / step,
                flops / step / 1e9, 100 * flops / step / 1e9 / peak))
    say("")
    say("| phase | op family | calls/step | ms/step | % of step | GFLOP/s | % of sgemm peak | MB/step | GB/s | % of copy bw |")
    say("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    local summed, by_phase = 0, {}
    for _, e in ipairs(prof:rows()) do
      local s = e.s / steps
      summed = summed + s
      by_phase[e.phase] = (by_phase[e.phase] or 0) + s
      local gf = e.flops > 0 and e.flops / e.s / 1e9 or nil
      local gb = e.flops == 0 and e.bytes > 0 and e.bytes / e.s / 1e9 or nil
      say(("| %s | %s | %d | %.2f | %.1f | %s | %s | %s | %s | %s |"):format(
        e.phase, e.family, e.calls / steps, s * 1e3, 100 * s / step, fmt(gf), gf and fmt(100 * gf / peak) or "",
        fmt(e.bytes / steps / 1e6, "%.0f"), fmt(gb), gb and fmt(100 * gb / copy) or ""))
    end
    for _, ph in ipairs({ "forward", "backward", "optimizer" }) do
      if by_phase[ph] then
        say(("| **%s** | all ops | | %.2f | %.1f | | | | | |"):format(ph, by_phase[ph] * 1e3, 100 * by_phase[ph] / step))
      end
    end
    say("| optimizer | communication (none: one rank) | 0 | 0.00 | 0.0 | | | | | |")
    say(("| | (unaccounted: Lua, data, allocation) | | %.2f | %.1f | | | | | |")
        :format((step - summed) * 1e3, 100 * (step - summed) / step))
    say(("| | **step** | | %.2f | 100.0 | %.1f | %.1f | | | |"):format(step * 1e3, flops / step / 1e9,
        100 * flops / step / 1e9 / peak))
    say("")
  end)
  prof:stop()
  tr:free()
  if not ok then error(err, 0) end
end

local f, err = io.open(outpath, "w")
if not f then error(("bench-ops: cannot write %s (%s); the table is above"):format(outpath, err), 0) end
f:write(table.concat(lines, "\n"), "\n")
f:close()
print("(written to " .. outpath .. ")")
