-- ztrain.record.throughput: one way to count a run's speed, used by the live
-- line, metrics.jsonl and the summary alike.
--
--   the live line   tokens/s smoothed over the recent steps (an exponential
--                   average of step time, weight 0.2 for the newest), and
--                   the ETA from the same figure
--   the summary     the median step's tokens/s, the wall clock's (tokens
--                   trained over the time from the first step's start to
--                   the last one's end), each named; model FLOP/s and MFU
--   metrics.jsonl   each step's own tokens/s and the smoothed one
--
-- Model FLOPs a token: 6 N + 12 L T C (N parameters; the attention's
-- products, causal or not, as PaLM's appendix and nanoGPT count them), the
-- count tools/torch_gpt2_bench.py and tools/bench_gpu.lua use. MFU divides
-- the job's model FLOP/s by the job's peak, one device a rank: world_size x
-- report.peak_tflops when set, else x the device's known dense peak for the
-- precision (the GPUs below), else none (a CPU's peak is the machine's:
-- `make bench` measures its sgemm peak; ranks sharing a machine share it).
local M = {}

local ALPHA = 0.2

-- smoother() -> a function(step_ms) -> the smoothed step time in ms
function M.smoother()
  local ema
  return function(ms)
    ema = ema and (1 - ALPHA) * ema + ALPHA * ms or ms
    return ema
  end
end

-- flops_per_token(params, cfg, T) -> model FLOPs a trained token
function M.flops_per_token(params, cfg, T)
  return 6 * params + 12 * cfg.L * T * cfg.C
end

-- dense TFLOP/s by card name (a substring of the CUDA device's name), for
-- bf16/fp16 tensor cores and plain fp32 (ztrain's fp32 GEMMs use no TF32)
local CARDS = {
  { "H200", bf16 = 989, fp32 = 67 }, { "H100 PCIe", bf16 = 756, fp32 = 51 }, { "H100", bf16 = 989, fp32 = 67 },
  { "A100", bf16 = 312, fp32 = 19.5 }, { "L40S", bf16 = 362, fp32 = 91.6 },
}

-- peak_tflops(given, device, gpu_name, lowp) -> TFLOP/s, where it comes
-- from | nil: given > 0 wins; a CUDA card by name; else unknown
function M.peak_tflops(given, device, gpu_name, lowp)
  if given and given > 0 then return given, "report.peak_tflops" end
  if device == "cuda" and gpu_name then
    for _, c in ipairs(CARDS) do
      if gpu_name:find(c[1], 1, true) then return lowp and c.bf16 or c.fp32, c[1] end
    end
  end
  return nil
end

return M
