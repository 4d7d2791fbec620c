-- tools/bench_pipeline.lua -- pipeline schedules measured on real ranks.
--
--   build/ztrain --script tools/bench_pipeline.lua [model=gpt2] [split=time|params|10,4] [m=8] [B=4] [T=256]
--                [steps=3] [p2=0] [p4=0]   (p2=0, p4=0: skip those rows)
--
-- For each schedule at p=2 (the stages split by `split`: by default
-- pipeline.split=time, which times gpt2's units and balances the stages --
-- the head's vocabulary matmul costs about 5 blocks, so it lands near
-- embedding + 9 blocks | 3 blocks + head; or unit counts), trains `steps`
-- steps on 2 ranks and reads summary.json: tokens/s, the split chosen, and
-- the last step's measured bubble beside the simulator's prediction (idle /
-- ranks x span, F=1 B=2). Then the same at p=4 (oversubscribed on 2 cores)
-- with gpt2-mini for the bubble.
local cjson = require "cjson"
local zt = require "ztrain"

local args = dofile(zt.home .. "/tools/args.lua")(arg)
local model = args.model or "gpt2"
local m, B, T, steps = tonumber(args.m or 8), tonumber(args.B or 4), tonumber(args.T or 256), tonumber(args.steps or 3)
local split = args.split or "time"

local function run(p, sched, size, sp, TT)
  local out = os.tmpname(); os.remove(out)
  local chunks = sched == "zbv" and 2 or 1
  local cmd = ("build/ztrain --nproc %d recipes/pipeline_1f1b.lua pipeline.stages=%d pipeline.chunks=" .. chunks ..
               " schedule=%s model.size=%s " ..
               "model.vocab_size=50257 %s data.seq_len=%d batch.micro=%d batch.accumulate=%d " ..
               "train.steps=%d lr.warmup=1 train.log_every=1 -q out=%s 2>&1"):format(p, p, sched, size,
               sp:match("^%a") and ("pipeline.split=" .. sp) or ("'pipeline.split={" .. sp .. "}'"), TT, B, m,
               steps, out)
  local h = io.popen(cmd); local text = h:read("*a"); h:close()
  local f = io.open(out .. "/summary.json")
  if not f then return nil, text end
  local s = cjson.decode(f:read("*a")); f:close()
  os.execute("rm -rf " .. out)
  return s
end

local core = zt.ffi.blas_core_auto and ("OPENBLAS_CORETYPE unset: ztrain chose " .. zt.ffi.blas_core_auto)
             or ("OPENBLAS_CORETYPE=" .. tostring(os.getenv("OPENBLAS_CORETYPE")))
print(("pipeline schedules: %s, B=%d, T=%d, m=%d micro-batches per step, %d steps (medians of steps 2..), %s")
      :format(model, B, T, m, steps, core))
print(("%-8s %2s %-9s %9s %9s %10s %10s"):format("schedule", "p", "split", "tokens/s", "ms/step", "bubble", "predicted"))
local function row(p, sched, size, sp, TT)
  local s, err = run(p, sched, size, sp, TT)
  if not s then print(("%-8s %2d failed: %s"):format(sched, p, err)); return end
  local tl = s.timeline or {}
  local units = s.pipeline and s.pipeline.units and table.concat(s.pipeline.units, ",") or sp
  print(("%-8s %2d %-9s %9.1f %9.0f %9.1f%% %9.1f%%"):format(sched, p, units, s.tokens_per_s, s.step_ms_median,
        100 * (tl.bubble or 0), 100 * (tl.predicted_bubble or 0)))
end
if args.p2 ~= "0" then
  for _, sched in ipairs({ "gpipe", "1f1b", "zb_h1", "zbv" }) do row(2, sched, model, split, T) end
end
if args.p4 ~= "0" then
  -- 4 ranks on this machine's 2 cores: the ranks share cores, so the measured
  -- bubble here says more about oversubscription than about the schedule
  for _, sched in ipairs({ "1f1b", "zb_h1" }) do row(4, sched, "gpt2-mini", "2,1,1,2", 128) end
end
