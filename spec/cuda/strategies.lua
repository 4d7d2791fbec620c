-- spec/cuda/strategies.lua -- the same-math guarantee on one device backend,
-- for every recipe in recipes/: each run twice (the same param_digest and
-- per-step loss bits run to run: a missing stream ordering shows here) and
-- against its one-rank reference (the digest oracle's equalities,
-- spec/fixtures/digest_cases.lua), all on the backend asked for. Run by
-- `make test-cuda`:
--
--   ZTRAIN_LIB=build-cuda/libztrain.so build-cuda/ztrain --script spec/cuda/strategies.lua
--
-- The cases (at the oracle's small settings, digest_cases.BASE; "tiny" =
-- gpt2-tiny, "accum2" = gpt2-tiny accumulating 2 micro-batches):
--   fp32   dp, zero1, zero2, zero3, zero2_offload, zero3_offload, infinity on
--          2 ranks = one rank accumulating 2 (single accum2); the pipelines
--          (1f1b, gpipe, zb, interleaved, zbv) accum2 on 2 ranks = single
--          accum2; pipeline_dp accum2 on 4 ranks = zero1 accum2 on 2 ranks
--          (no one-rank run sums 2 ranks x 2 micro-batches in that order); llama_finetune (zero3 + offload of
--          llama-tiny) on 2 ranks = single accum2 of llama-tiny, its settings
--   bf16   precision=bf16 device.bf16_gemm=on: dp, zero3, zero2_offload,
--          zero3_offload, infinity, pipeline_1f1b = single accum2 in bf16;
--          llama_finetune of llama-tiny in bf16 (bf16 activations: RMS norm,
--          RoPE, SwiGLU, GQA attention) = single accum2 of it in bf16
--   fp16   precision=fp16 (dynamic loss scaling): zero2, zero3_offload,
--          pipeline_gpipe = single accum2 in fp16
--   ckpt   train.checkpoint_activations=true (recomputed in backward, the
--          same bits): zero3 and pipeline_1f1b with the checkpoints on the
--          host tier (train.checkpoint_host=true), zero3_offload,
--          pipeline_interleaved = single accum2 (no checkpointing)
--   pipeline_pipedream (asynchronous: an update per micro-batch, no
--          synchronous twin): on 2 stages run twice (same bits); on one
--          stage = single updating after every micro-batch for twice the
--          steps (constant lr, no clipping: spec/e2e/pipeline_train_spec.lua's
--          oracle), the digest only (its steps are not single's)
--   single is every reference, run twice itself.
-- Every recipe in recipes/ must have a case here or an entry in EXEMPT
-- (with the reason and where its oracle lives); a recipe with neither fails
-- the run (plan=1 checks that without training).
--
-- keys: backend=cuda (or cpu, fakegpu, fakegpu-async[:SEED]: the CPU
-- stand-ins; plain fakegpu-async runs each case's first run on schedule
-- seed 1 and its second on seed 2, two timings as on a GPU),
-- strategies=zero3_offload,pipeline_1f1b (the recipes whose cases run,
-- with the references they need; default every recipe), variants=fp32,bf16,
-- fp16,ckpt,async (the groups above; default all), plan=1 (print the
-- cases and the coverage, run nothing), break=1 (the reference made one
-- rank without accumulation, another batch: must fail), break=twice (each
-- second run with another model.seed: the run-to-run check must fail),
-- ztrain=PATH. Without a GPU it prints one skip line and exits 0;
-- spec/e2e/cuda_step_harness_spec.lua checks it on the CPU.
local cjson = require "cjson"
local zt = require "ztrain"
local common = dofile(zt.home .. "/spec/cuda/common.lua")

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local backend = args.backend or "cuda"
local what = "cuda strategies"
local util, cases = common.util, common.cases

-- ---- the plan ----

local BF16 = "precision=bf16 device.bf16_gemm=on"
local FP16 = "precision=fp16"
-- the Llama family (llama-tiny: GQA, RMSNorm, RoPE, SwiGLU) with
-- recipes/llama_finetune.lua's optimizer settings and no export
local LLAMA = "model.size=llama-tiny optim.lr=1e-3 lr.schedule=constant lr.warmup=0 optim.clip=1 " ..
              "optim.weight_decay=0.1 'optim.betas={0.9,0.95}' export.hf="

-- pipedream's one-stage oracle: a constant learning rate and no clipping
-- (clipping needs every stage's gradient; pipedream refuses it)
local FIXED = "lr.schedule=constant lr.warmup=0 optim.clip=0 optim.lr=1e-3"

-- the references: { path, setting, nproc, extra, label, digest_only }
local REFS = {
  one  = { path = "recipes/single.lua", setting = args["break"] == "1" and "tiny" or "accum2", extra = "",
           label = "one rank accumulating 2 micro-batches" },
  bf16 = { path = "recipes/single.lua", setting = "accum2", extra = BF16,
           label = "one rank accumulating 2 micro-batches, bf16" },
  fp16 = { path = "recipes/single.lua", setting = "accum2", extra = FP16,
           label = "one rank accumulating 2 micro-batches, fp16" },
  zero1x2 = { path = "recipes/zero1.lua", setting = "accum2", nproc = 2, extra = "",
              label = "zero1 on 2 ranks accumulating 2 (the oracle's pipeline_dp case)" },
  each = { path = "recipes/single.lua", setting = "tiny", extra = FIXED .. " train.steps=6", digest_only = true,
           label = "one rank updating after every micro-batch, 6 steps (the digest)" },
  llama = { path = "recipes/single.lua", setting = "accum2", extra = LLAMA,
            label = "one rank accumulating 2 micro-batches, llama-tiny" },
  llama16 = { path = "recipes/single.lua", setting = "accum2", extra = LLAMA .. " " .. BF16,
              label = "one rank accumulating 2 micro-batches, llama-tiny, bf16" },
}

-- the cases: { recipe name, setting, nproc, extra, ref (a REFS key or nil: twice only) }
local CASES = {}
-- (variant: fp32, bf16, fp16, ckpt or async, the groups of the header)
local CASES = {}
local function add(variant, name, setting, n, extra, ref)
  CASES[#CASES + 1] = { variant = variant, name = name, path = "recipes/" .. name .. ".lua", setting = setting,
                        nproc = n, extra = extra, ref = ref }
end
for _, r in ipairs({ "dp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "infinity" }) do
  add("fp32", r, "tiny", 2, "", "one")
end
for _, r in ipairs({ "pipeline_1f1b", "pipeline_gpipe", "pipeline_zb", "pipeline_interleaved", "pipeline_zbv" }) do
  add("fp32", r, "accum2", 2, "", "one")
end
add("fp32", "pipeline_dp", "accum2", 4, "", "zero1x2")
add("fp32", "llama_finetune", "tiny", 2, LLAMA, "llama")
for _, r in ipairs({ "dp", "zero3", "zero2_offload", "zero3_offload", "infinity" }) do
  add("bf16", r, "tiny", 2, BF16, "bf16")
end
add("bf16", "pipeline_1f1b", "accum2", 2, BF16, "bf16")
add("bf16", "llama_finetune", "tiny", 2, LLAMA .. " " .. BF16, "llama16")
for _, r in ipairs({ "zero2", "zero3_offload" }) do add("fp16", r, "tiny", 2, FP16, "fp16") end
add("fp16", "pipeline_gpipe", "accum2", 2, FP16, "fp16")
local CKPT, CKPT_HOST = "train.checkpoint_activations=true", "train.checkpoint_activations=true train.checkpoint_host=true"
add("ckpt", "zero3", "tiny", 2, CKPT_HOST, "one")
add("ckpt", "zero3_offload", "tiny", 2, CKPT, "one")
add("ckpt", "pipeline_1f1b", "accum2", 2, CKPT_HOST, "one")
add("ckpt", "pipeline_interleaved", "accum2", 2, CKPT, "one")
add("async", "pipeline_pipedream", "accum2", 2, "", nil)
add("async", "pipeline_pipedream", "accum2", nil, "launch.nproc=1 pipeline.stages=1 " .. FIXED, "each")

-- recipes with no case here: name -> why, and where their oracle lives
local EXEMPT = {}

-- coverage: every recipe in recipes/ has a case (single: the references) or is exempt
local function coverage()
  local have = { single = true }
  for _, c in ipairs(CASES) do have[c.name] = true end
  local names, missing = {}, {}
  for f in util.sh("ls " .. zt.home .. "/recipes"):gmatch("([%w_]+)%.lua") do
    names[#names + 1] = f
    if not have[f] and not EXEMPT[f] then missing[#missing + 1] = f end
  end
  return names, missing
end

local function label(c)
  local s = ("%s %s n=%s"):format(c.name or c.path:match("([%w_]+)%.lua$"), c.setting, tostring(c.nproc or 0))
  return c.extra ~= "" and (s .. " " .. c.extra) or s
end

local names, missing = coverage()
local wanted = {}
for _, n in ipairs(A.list(args.strategies, table.concat(names, ","))) do wanted[n] = true end
for n in pairs(wanted) do
  local known = n == "single"
  for _, c in ipairs(CASES) do known = known or c.name == n end
  if not known then error(("%s: strategies=%s: no case for %q (known: the recipes in recipes/)")
                          :format(what, args.strategies, n), 0) end
end
local variants = {}
for _, v in ipairs(A.list(args.variants, "fp32,bf16,fp16,ckpt,async")) do
  if not ({ fp32 = 1, bf16 = 1, fp16 = 1, ckpt = 1, async = 1 })[v] then
    error(("%s: variants=%s: unknown %q (known: fp32, bf16, fp16, ckpt, async)"):format(what, args.variants, v), 0)
  end
  variants[v] = true
end
local run_cases = {}
for _, c in ipairs(CASES) do
  if wanted[c.name] and variants[c.variant] then run_cases[#run_cases + 1] = c end
end

if args.plan then
  for _, c in ipairs(CASES) do
    print(("%s: case %s (%s): twice%s"):format(what, label(c), c.variant,
                                              c.ref and (", against " .. label(REFS[c.ref])) or ""))
  end
  for n, why in pairs(EXEMPT) do print(("%s: exempt %s: %s"):format(what, n, why)) end
  if #missing > 0 then
    print(("%s: recipes with no case and not exempt: %s: FAILED"):format(what, table.concat(missing, ", ")))
    os.exit(1)
  end
  print(("%s: every recipe in recipes/ covered (%d): %s"):format(what, #names, table.concat(names, ", ")))
  os.exit(0)
end

-- ---- the runs ----

common.need_backend(backend:match("^fakegpu%-async$") and "fakegpu-async:1" or backend, what)
local prog = common.program(args)

-- the first line of a failed run's output that ztrain wrote (its error)
local function first_error(err)
  return tostring(err):match("\n(ztrain: [^\n]*)") or "(no ztrain: line in its output)"
end

-- run(case, k) -> param_digest, "step:loss_hex ..." of run k (1 or 2) on `backend`
local function run(c, k)
  local be = backend == "fakegpu-async" and ("fakegpu-async:" .. k) or backend
  local extra = c.extra
  if k == 2 and args["break"] == "twice" then extra = extra .. " model.seed=1338" end
  local dir = util.outdir()
  local cmd = cases.command({ path = c.path, setting = c.setting, nproc = c.nproc, extra = extra }, dir, prog) ..
              (" device.backend=%s %s"):format(be, common.DATA)
  common.run(cmd, ("%s: %s, run %d"):format(what, label(c), k))
  local s = cjson.decode(util.read(dir .. "/summary.json"))
  local losses = cases.loss_bits(dir)
  util.rm(dir)
  return s.param_digest, losses
end

-- twice(c) -> { digest, losses } (nil when a run failed), list of failures
local function twice(c)
  local ok, d1, l1 = pcall(run, c, 1)
  if not ok then return nil, { (tostring(d1):gsub("\n.*", "")), first_error(d1) } end
  local ok2, d2, l2 = pcall(run, c, 2)
  if not ok2 then return nil, { (tostring(d2):gsub("\n.*", "")), first_error(d2) } end
  local bad = {}
  if d1 ~= d2 then bad[#bad + 1] = ("run to run: param_digest %s, then %s"):format(d1, d2) end
  if l1 ~= l2 then bad[#bad + 1] = ("run to run: loss bits %s, then %s"):format(l1, l2) end
  return { digest = d1, losses = l1 }, bad
end

local failed, ref_out = 0, {}
local function report(c, bad, tail)
  print(("%s: %s (%s): %s"):format(what, label(c), backend, #bad == 0 and tail or "FAILED"))
  for _, b in ipairs(bad) do print("  " .. b) end
  if #bad > 0 then failed = failed + 1 end
end

local function reference(key)
  if ref_out[key] ~= nil then return ref_out[key] or nil end
  local r = REFS[key]
  local out, bad = twice(r)
  report(r, bad, ("the reference, %s: twice the same digest %s, same loss bits")
                 :format(r.label, out and out.digest:sub(1, 16) or "-"))
  ref_out[key] = out or false
  return out
end

local ran = 0
if wanted.single then reference("one") end
for _, c in ipairs(run_cases) do
  local want = c.ref and reference(c.ref)
  local got, bad = twice(c)
  local tail = "twice the same digest " .. (got and got.digest:sub(1, 16) or "-") .. ", same loss bits"
  if c.ref and not want then bad[#bad + 1] = "no reference to compare with: " .. REFS[c.ref].label .. " failed" end
  if got and want then
    local r = REFS[c.ref]
    if got.digest ~= want.digest then
      bad[#bad + 1] = ("param_digest %s, %s %s"):format(got.digest, r.label, want.digest)
    end
    if not r.digest_only and got.losses ~= want.losses then
      bad[#bad + 1] = ("loss bits %s, %s %s"):format(got.losses, r.label, want.losses)
    end
    tail = tail .. ("; against %s: the same %s"):format(r.label, r.digest_only and "digest" or "digest and loss bits")
  end
  report(c, bad, tail)
  ran = ran + 1
end
print(("%s: %d cases on %s, each run twice%s: %s"):format(what, ran, backend,
      #missing > 0 and ("; recipes with no case and not exempt: " .. table.concat(missing, ", ")) or "",
      (failed == 0 and #missing == 0) and "ok" or "FAILED"))
os.exit((failed == 0 and #missing == 0) and 0 or 1)
