-- tools/scale_predict.lua -- docs/scaling.md's predictions block: the
-- step-time model (lua/ztrain/plan/steptime.lua) on GPU clusters it was not
-- measured on, with the hardware stated as assumptions (steptime.CLUSTER).
--
--   build/ztrain --script tools/scale_predict.lua [print=1] [mfu=0.4] [gpus=8,64,256,1024] [results=DIR]
--
-- For each model (GPT-2 xl and GPT-3-style 6.7B, 13B and 175B shapes) and
-- GPU count (8 a host), each strategy's step time and tokens/s per GPU at
-- the same work per GPU (one sequence a micro-batch, 8 micro-batches a step
-- per data-parallel rank; the pipeline 8 x stages), bf16 with checkpointed
-- activations; the memory per GPU from plan.lua (device tier, 80 GiB); the
-- fastest that fits. The hidden share of communication: the median of
-- the measured table's (build/bench_scale/*.json) per strategy, else 0.
-- The calibration's error (build/bench_scale/fit.json) is quoted.
local cjson = require "cjson"
local zt = require "ztrain"
local st = require "ztrain.plan.steptime"
local plan = require "ztrain.plan"
local gpt2 = require "ztrain.model.gpt2"
local run = require "ztrain.train.run"

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local report = dofile(zt.home .. "/tools/scale_report.lua")
local fitmod = dofile(zt.home .. "/tools/scale_fit.lua")
local RESULTS = args.results or (zt.home .. "/build/bench_scale")

local MODELS = {
  { cfg = gpt2.config("gpt2-xl"), T = 1024, label = "gpt2-xl (1.56B; 48 layers, 1600 channels)" },
  { cfg = gpt2.custom({ name = "gpt-6.7b", L = 32, C = 4096, NH = 32, maxT = 2048, V = 50257 }), T = 2048,
    label = "GPT-3 6.7B shape (32 layers, 4096 channels, 32 heads, T 2048)" },
  { cfg = gpt2.custom({ name = "gpt-13b", L = 40, C = 5120, NH = 40, maxT = 2048, V = 50257 }), T = 2048,
    label = "GPT-3 13B shape (40 layers, 5120 channels, 40 heads, T 2048)" },
  { cfg = gpt2.custom({ name = "gpt-175b", L = 96, C = 12288, NH = 96, maxT = 2048, V = 50257 }), T = 2048,
    label = "GPT-3 175B shape (96 layers, 12288 channels, 96 heads, T 2048)" },
}
local STRATEGIES = { "dp", "zero2", "zero3", "zero3_offload", "pipeline_dp" }
local M_MICRO = 8

local GPUS = A.list(args.gpus, "8,64,256,1024", tonumber)

local hw = setmetatable({}, { __index = st.CLUSTER })
if args.mfu then hw.mfu = tonumber(args.mfu); hw.flops = hw.peak_flops * hw.mfu end

-- measured hidden shares, per strategy (median), and the fit's error
local function measured()
  local hidden, by = {}, {}
  for _, r in ipairs(report.load(RESULTS)) do
    local h = fitmod.hidden_of(r)
    if r.ok and h then by[r.strategy] = by[r.strategy] or {}; table.insert(by[r.strategy], h) end
  end
  for s, v in pairs(by) do hidden[s] = run.median(v, true) end
  -- zero2 runs zero1's collectives (a reduce-scatter a micro-batch, a gather a step)
  hidden.zero2 = hidden.zero2 or hidden.zero1
  local f = io.open(RESULTS .. "/fit.json")
  local fitres = f and cjson.decode(f:read("*a"))
  if f then f:close() end
  return hidden, fitres
end

-- memory(model, s, N, p) -> bytes per GPU on the device tier (plan.lua)
local recipe_cache = {}
local function memory(model, s, N, p)
  local key = model.T
  local r = recipe_cache[key]
  if not r then
    r = assert(zt.recipe.resolve({}, { "model.vocab_size=50257", "precision=bf16", "batch.micro=1",
      "data.seq_len=" .. model.T, "train.checkpoint_activations=true", "batch.accumulate=" .. M_MICRO,
      "sample.tokens=0" }))
    recipe_cache[key] = r
  end
  local t
  if s == "pipeline_dp" then
    -- one stage's replicated state (an upper bound: zero1 over the stage's
    -- data-parallel group shards the optimizer further)
    r.pipeline.stages = p
    t = plan.predict(r, { strategy = "pipeline_1f1b", nproc = p, cfg = model.cfg })
    r.pipeline.stages = 1
  else
    t = plan.predict(r, { strategy = s, nproc = N, cfg = model.cfg })
  end
  return plan.totals(t).device
end

local function predict(model, s, N, hidden)
  if N > hw.gpus_per_host and N % hw.gpus_per_host ~= 0 then
    error(("scale_predict: %d GPUs are not whole hosts of %d: give counts that are"):format(N, hw.gpus_per_host), 0)
  end
  local H = math.max(1, N / hw.gpus_per_host)
  local G = math.min(N, hw.gpus_per_host)
  local o = { cfg = model.cfg, strategy = s, B = 1, T = model.T, m = M_MICRO, hosts = H, gpus = G, lowp = true,
              recompute = true, units = model.cfg.L + 2, hidden = hidden[s] or 0 }
  local p
  if s == "pipeline_dp" then
    if H < 2 then return nil end
    p = math.min(H, 8)
    o.stages, o.m = p, M_MICRO * p
  end
  local r = st.step(o, hw)
  local tokens = o.B * o.T * o.m * (p and N / p or N)
  return { step = r.step, tps_gpu = tokens / r.step / N, mem = memory(model, s, N, p), parts = r, stages = p }
end

local function fmt_s(x) return x >= 10 and ("%.0f s"):format(x) or x >= 1 and ("%.1f s"):format(x) or ("%.0f ms"):format(x * 1000) end

local hidden, fitres = measured()
local out = {}
local function say(s, ...) out[#out + 1] = select("#", ...) > 0 and s:format(...) or s end
say("Generated by `tools/scale_predict.lua`. **Assumptions** (steptime.CLUSTER): H100 SXM GPUs, %.0f TFLOP/s " ..
    "dense bf16 x MFU %.0f%% = %.0f TFLOP/s each; 8 GPUs a host on NVLink 4 (450 GB/s each way per GPU), hosts on " ..
    "NDR InfiniBand (400 Gbit/s per GPU); NCCL at 80%% of either, 2 us a message within a host, 5 us across; HBM3 " ..
    "3.35 TB/s; offload over PCIe 5 at 25 GB/s a GPU to a host of 200 GB/s memory bandwidth (CPU AdamW); 80 GiB a " ..
    "GPU (memory from `lua/ztrain/plan/init.lua`, device tier).", hw.peak_flops / 1e12, hw.mfu * 100, hw.flops / 1e12)
say("Work per GPU alike: one sequence a micro-batch, %d micro-batches a step per data-parallel rank (pipeline_dp: " ..
    "%d x stages through min(hosts, 8) stages across hosts, zero1 within a stage's group: the seeds' pipeline across " ..
    "nodes, data parallelism within); bf16, checkpointed activations (recompute: 4 x the forward FLOPs); ztrain's own " ..
    "collectives (every micro-batch reduced, unit by unit).", M_MICRO, M_MICRO)
local hs = {}
for _, s in ipairs(STRATEGIES) do
  if s ~= "pipeline_dp" then
    hs[#hs + 1] = ("%s %s"):format(s, hidden[s] and ("%.0f%%"):format(100 * hidden[s]) or "0 (not measured)")
  end
end
say("Communication hidden behind compute, the median of the measured table's (zero2: zero1's): %s; " ..
    "pipeline_dp's overlap is the schedule simulator's.", table.concat(hs, ", "))
say(fitres and ("On the measured table (this machine) the model's error is mean %.1f%%, max %.1f%% (%d points); " ..
                "on a cluster the link efficiency and latencies are the assumptions above, not that fit.")
               :format(100 * fitres.mean, 100 * fitres.max, #fitres.points) or
    "The model has not been calibrated on a measured table yet (`make bench-scale`).")
say("")
local wins = {}
for _, model in ipairs(MODELS) do
  say("**%s**, %.2fB parameters: step time, tokens/s per GPU; — where it does not fit 80 GiB", model.label,
      st.params(model.cfg) / 1e9)
  say("")
  local head = { "| GPUs |" }
  for _, s in ipairs(STRATEGIES) do head[#head + 1] = " " .. s .. " |" end
  say(table.concat(head) .. " fastest that fits |")
  say("|---|" .. ("---|"):rep(#STRATEGIES + 1))
  for _, N in ipairs(GPUS) do
    local cells, best, bests = {}, nil, nil
    for _, s in ipairs(STRATEGIES) do
      local r = predict(model, s, N, hidden)
      if not r then cells[#cells + 1] = "n/a"
      else
        local fits = r.mem <= hw.memory
        cells[#cells + 1] = (fits and "%s, %.0f" or "— (%s, %.0f; %.0f GiB)"):format(fmt_s(r.step), r.tps_gpu,
                                                                                     r.mem / 2 ^ 30)
        if fits and (not best or r.tps_gpu > best.tps_gpu) then best, bests = r, s end
      end
    end
    say("| %d | %s | %s |", N, table.concat(cells, " | "), bests and ("**%s**"):format(bests) or "none")
    wins[#wins + 1] = { model = model.cfg.name, N = N, s = bests }
  end
  say("")
end
local by = {}
for _, w in ipairs(wins) do
  local k = w.s or "none"
  by[k] = by[k] or {}
  table.insert(by[k], ("%s@%d"):format(w.model, w.N))
end
local keys = {}
for k in pairs(by) do keys[#keys + 1] = k end
table.sort(keys)
local parts = {}
for _, k in ipairs(keys) do parts[#parts + 1] = ("%s: %s"):format(k, table.concat(by[k], ", ")) end
say("Which wins where (model, GPUs): %s.", table.concat(parts, "; "))
local block = table.concat(out, "\n")
if args.print then io.stdout:write(block, "\n") return end
local path = zt.home .. "/docs/scaling.md"
local f = assert(io.open(path))
local text = f:read("*a")
f:close()
require("ztrain.util.svg").write(path, report.replace_block(text, "predictions", block))
io.stdout:write(block, "\n")
