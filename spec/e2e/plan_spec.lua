-- The memory planner (plan.lua): its predictions against the peaks real runs
-- measure (summary.json), the gpt2-xl plan against the ZeRO formulas of
-- DESIGN.md, and the pre-flight check that refuses a run before it
-- allocates.
--
-- Tolerances, from the measurements below (gpt2-tiny, 1 step):
--   fp32: every tier and category exact (model state, activations, working
--         buffers), and the device peak equal to the predicted total;
--   bf16: model state and working buffers exact; activations predicted
--         within 15% below the measured peak (precision.lua's fp32 work
--         copies and the bf16 GEMM operand copies are not predicted:
--         measured 10.5-12.5% more).
local util = require "helpers.util"
local zt = require "ztrain"
local plan = require "ztrain.plan"

local TIERS, CATS = zt.memory.tiers, zt.memory.categories
local ONE_STEP = "train.steps=1 train.eval_every=0 train.eval_batches=0 -q"

-- run(nproc, recipe, overrides) -> summary, the resolved recipe (same overrides)
local function run(nproc, recipe, over)
  local dir = util.outdir()
  local launch = nproc > 1 and ("--nproc " .. nproc .. " ") or ""
  local out, rc = util.sh(("timeout 120 build/ztrain %s%s %s %s out=%s"):format(launch, recipe, over, ONE_STEP, dir))
  assert.are.equal(0, rc, out)
  local s = util.summary(dir)
  util.rm(dir)
  local list = {}
  for kv in over:gmatch("%S+") do list[#list + 1] = kv end
  return s, assert(zt.recipe.load(recipe, list))
end

-- measured - predicted, as "tier category: predicted P, measured M" lines
local function differences(t, m, cats_exact)
  local bad = {}
  for _, tier in ipairs(TIERS) do
    for _, c in ipairs(CATS) do
      local got, want = m.by_category[c][tier], t[tier][c]
      if cats_exact[c] and got ~= want then
        bad[#bad + 1] = ("%s %s: predicted %d, measured %d"):format(tier, c, want, got)
      end
    end
  end
  return bad
end

describe("plan: predicted against measured peaks", function()
  local ALL = {}
  for _, c in ipairs(CATS) do ALL[c] = true end
  local cases = {
    { "single", 1, "recipes/single.lua", "batch.micro=8" },
    { "dp 2", 2, "recipes/dp.lua", "" },
    { "zero2 2", 2, "recipes/zero2.lua", "" },
    { "zero3 2", 2, "recipes/zero3.lua", "" },
    { "zero3_offload 2", 2, "recipes/zero3_offload.lua", "sample.tokens=0" },
    { "zero3 2, gpt2-mini", 2, "recipes/zero3.lua", "model.size=gpt2-mini batch.micro=2" },
    { "zero3_infinity 2, gpt2-mini (nvme)", 2, "recipes/infinity.lua", "batch.micro=2" },
    { "single, checkpointed activations on the host", 1, "recipes/single.lua",
      "train.checkpoint_activations=true train.checkpoint_host=true" },
  }
  -- the plan is rank 0's (the heaviest: it samples); the others hold no more
  local function check(case, exact)
    local s, r = run(case[2], case[3], case[4])
    local t = plan.predict(r, { nproc = case[2] })
    for _, m in ipairs(s.memory) do
      if m.rank == 0 then
        assert.are.same({}, differences(t, m, exact))
        if exact == ALL then assert.are.equal(plan.totals(t).device, m.device_peak, "device peak") end
      else
        assert.is_true(m.device_peak <= plan.totals(t).device, "rank " .. m.rank)
      end
    end
    return s.memory[1], t
  end
  for _, case in ipairs(cases) do
    it(case[1] .. ": every tier and category exact (fp32)", function() check(case, ALL) end)
  end

  it("zero3_offload 2 (samples at the end): exact but the sample's activations, within 0.1% above", function()
    -- recipes/zero3_offload.lua samples 40 tokens: a full fp32 copy of the
    -- model ("other", exact) and the generation cache and rows (activations)
    local m, t = check({ "", 2, "recipes/zero3_offload.lua", "" },
                       { params = true, grads = true, optim = true, comm = true, other = true })
    assert.is_true(m.by_category.other.device > 0, "the sample's model copy")
    local got, want = m.by_category.activations.device, t.device.activations
    assert.is_true(want >= got and want <= 1.001 * got, ("activations predicted %d, measured %d"):format(want, got))
  end)

  it("zero1 2, accumulating: model state and activations exact, working buffers within 15% below the bound", function()
    -- how many reduction buffers are alive at once depends on when the
    -- reductions complete: the plan gives the upper bound
    local s, r = run(2, "recipes/zero1.lua", "batch.accumulate=2")
    local t = plan.predict(r, { nproc = 2 })
    local m = s.memory[1]
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, activations = true }))
    local got, want = m.by_category.comm.device, t.device.comm
    assert.is_true(got <= want and got >= 0.85 * want, ("comm predicted %d, measured %d"):format(want, got))
  end)

  -- pipelines: the plan is the heaviest stage's rank (here the last: the
  -- tied embedding's replica, the head)
  local function heaviest(s)
    local m = s.memory[1]
    for _, x in ipairs(s.memory) do if x.device_peak > m.device_peak then m = x end end
    return m
  end

  it("pipeline GPipe 2 stages: model state and activations exact, the tied gradient's sends (2 predicted) up to one per micro-batch", function()
    local s, r = run(2, "recipes/pipeline_gpipe.lua", "")
    local t, m = plan.predict(r, { nproc = 2, strategy = "pipeline_1f1b" }), heaviest(s)
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, activations = true }))
    local wte, micro_batches = 4 * 256 * 128, r.batch.accumulate
    local got = m.by_category.comm.device
    assert.is_true(got >= wte and got <= micro_batches * wte, ("comm predicted %d, measured %d"):format(t.device.comm, got))
  end)

  -- checkpointed blocks are every k-th block of the model, counted over all
  -- its units (the trainer's rule): the second stage (blocks 1-3 and the
  -- head) checkpoints block 2 only; counting from the stage's own first block
  -- would say blocks 1 and 3
  it("pipeline GPipe 2 stages, every 2nd block checkpointed, uneven split: activations exact", function()
    local s, r = run(2, "recipes/pipeline_gpipe.lua",
                     "model.size=gpt2-mini batch.micro=2 train.checkpoint_activations=2 pipeline.split={2,4}")
    local t, m = plan.predict(r, { nproc = 2, strategy = "pipeline_1f1b" }), heaviest(s)
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, activations = true }))
  end)

  it("pipeline 1F1B 2 stages: model state exact, activations exact or one set more (a send taken late)", function()
    local s, r = run(2, "recipes/pipeline_1f1b.lua", "")
    local t, m = plan.predict(r, { nproc = 2, strategy = "pipeline_1f1b" }), heaviest(s)
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true }))
    local got, want = m.by_category.activations.device, t.device.activations
    assert.is_true(got >= want and got <= 1.5 * want, ("activations predicted %d, measured %d"):format(want, got))
  end)

  it("bf16 (dp 2): model state exact, working buffers at most the predicted peak, activations within 15% below", function()
    local s, r = run(2, "recipes/dp.lua", "precision=bf16")
    local t = plan.predict(r, { nproc = 2 })
    local m = s.memory[1]
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, other = true }))
    -- bf16's gradient buckets (fp32 reduction buffers) overlap as timing
    -- allows: the plan is their peak when all are in flight; a loaded
    -- machine measured 86% of it (600320 of 698624 bytes), an idle one 100%
    local gc, wc = m.by_category.comm.device, t.device.comm
    assert.is_true(gc <= wc and gc >= 0.75 * wc, ("comm predicted %d, measured %d"):format(wc, gc))
    local got, want = m.by_category.activations.device, t.device.activations
    assert.is_true(want <= got and want >= 0.85 * got, ("activations predicted %d, measured %d"):format(want, got))
  end)
end)

describe("plan: gpt2-xl against the ZeRO formulas", function()
  -- DESIGN.md, mixed precision, per rank: dp 16Psi, zero1 4Psi + 12Psi/N,
  -- zero2 2Psi + 14Psi/N, zero3 16Psi/N. ztrain adds what it keeps in fp32:
  -- the gradient accumulator (single, dp: 4Psi; zero1: its shard 4Psi/N),
  -- the reduced gradient shards of zero2/3 (4 bytes, not 2: +2Psi/N).
  local r = assert(zt.recipe.resolve({}, { "model.size=gpt2-xl", "model.vocab_size=50257", "precision=bf16",
                                           "device.memory_limit=16GiB",
                                           "batch.micro=1", "data.seq_len=1024" }))
  local N = 8
  local rows = plan.rows(r, N)
  local by = {}
  for _, row in ipairs(rows) do by[row.name] = row end
  local psi = rows.psi

  it("counts GPT-2 XL's 1,557,611,200 parameters (vocabulary 50257)", function()
    assert.are.equal(1557611200, psi)
  end)

  it("model state per rank is the formula plus the documented fp32 extras (padding aside)", function()
    local want = { single = 16 * psi + 4 * psi, dp = 16 * psi + 4 * psi, zero1 = 4 * psi + 12 * psi / N + 4 * psi / N,
                   zero2 = 2 * psi + 14 * psi / N + 2 * psi / N, zero3 = 16 * psi / N + 2 * psi / N,
                   zero3_offload = 16 * psi / N + 2 * psi / N }
    for name, w in pairs(want) do
      local t, got = by[name].t, 0
      for _, tier in ipairs(TIERS) do got = got + t[tier].params + t[tier].grads + t[tier].optim end
      assert.is_true(math.abs(got - w) / w < 0.001, ("%s: model state %d, formula %d"):format(name, got, w))
    end
  end)

  it("says which fit 16 GiB at 8 ranks, and the fastest to try", function()
    local verdict = {}
    for _, row in ipairs(rows) do verdict[row.name] = row.fits end
    -- 16Psi = 24.9 GB of model state alone cannot fit; ZeRO's shards can
    assert.is_false(verdict.single)
    assert.is_false(verdict.dp)
    for _, name in ipairs({ "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_infinity" }) do
      assert.is_true(verdict[name], name)
    end
    -- zero1 and zero2 move the same bytes; zero2 holds fewer
    assert.are.equal("zero2", rows.best.name)
    local text = require("ztrain.insight.plan_report").table(rows, r)
    assert.matches("fits: zero1, zero2, zero3, zero2_offload, zero3_offload, zero3_infinity", text, 1, true)
    assert.matches("fastest to try: zero2", text, 1, true)
  end)

  it("on one rank under 16 GiB (fp32) only offload fits", function()
    local r1 = assert(zt.recipe.resolve({}, { "model.size=gpt2-xl", "model.vocab_size=50257",
                                              "device.memory_limit=16GiB" }))
    local v = {}
    for _, row in ipairs(plan.rows(r1, 1)) do v[row.name] = row.fits end
    assert.are.same({ single = false, zero2_offload = true, zero3_offload = true, zero3_infinity = true }, v)
  end)

  it("`ztrain plan` prints the table", function()
    local out, rc = util.sh("build/ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB precision=bf16")
    assert.are.equal(0, rc, out)
    assert.matches("gpt2-xl: 1557.6M parameters", out, 1, true)
    assert.matches("zero3_offload", out, 1, true)
    assert.matches("fastest to try: ", out, 1, true)
    local bad, rc2 = util.sh("build/ztrain plan nproc=0")
    assert.are.equal(1, rc2)
    assert.matches("nproc=0 must be a whole number >= 1", bad, 1, true)
  end)
end)

describe("plan: the pre-flight check", function()
  it("refuses an oversized run before allocating, naming the bytes per category and what to try", function()
    -- (how soon it comes: tools/bench_timings.lua, make bench)
    local out, rc = util.sh("timeout 60 build/ztrain recipes/single.lua model.size=gpt2-xl " ..
                            "device.memory_limit=16GiB train.steps=1 -q out=" .. util.outdir())
    assert.are.equal(1, rc, out)
    for _, want in ipairs({ "device memory limit exceeded (predicted before the run): gpt2-xl under single needs",
                            "params 5.50 GiB", "grads 5.50 GiB", "optim 11.01 GiB", "activations ",
                            "over device.memory_limit = 16.00 GiB", "try strategy=zero3_offload",
                            "ztrain plan recipes/single.lua nproc=1" }) do
      assert.matches(want, out, 1, true)
    end
  end)

  it("refuses a run over the machine's available memory without a limit", function()
    local r = assert(zt.recipe.load("recipes/single.lua", { "model.size=gpt2-xl" }))
    local t = plan.totals(plan.predict(r, { nproc = 1 }))
    local avail = plan.available()
    if not avail or t.device + t.host <= avail then
      pending("this machine has room for gpt2-xl on one rank")
      return
    end
    local out, rc = util.sh("timeout 60 build/ztrain recipes/single.lua model.size=gpt2-xl train.steps=1 -q out=" ..
                            util.outdir())
    assert.are.equal(1, rc, out)
    assert.matches("not enough memory (predicted before the run)", out, 1, true)
    assert.matches("MemAvailable", out, 1, true)
  end)

  it("lets a run at its predicted peak through, and refuses it one byte below", function()
    local r = assert(zt.recipe.load("recipes/zero3.lua", { "model.size=gpt2-mini", "batch.micro=2" }))
    local peak = plan.totals(plan.predict(r, { nproc = 2 })).device
    local base = "--nproc 2 recipes/zero3.lua model.size=gpt2-mini batch.micro=2 " .. ONE_STEP
    local out, rc = util.sh(("timeout 120 build/ztrain %s device.memory_limit=%d out=%s"):format(base, peak,
                                                                                               util.outdir()))
    assert.are.equal(0, rc, out)
    local out2, rc2 = util.sh(("timeout 120 build/ztrain %s device.memory_limit=%d out=%s"):format(base, peak - 1,
                                                                                                 util.outdir()))
    assert.are.equal(1, rc2, out2)
    assert.matches("device memory limit exceeded (predicted before the run): gpt2-mini under zero3", out2, 1, true)
  end)
end)

describe("plan: the step-time column (steptime.lua)", function()
  local st = require "ztrain.plan.steptime"
  local r = assert(zt.recipe.resolve({}, { "model.size=gpt2-xl", "model.vocab_size=50257", "precision=bf16",
                                           "batch.micro=1", "data.seq_len=1024", "batch.accumulate=2" }))
  local function by_name(rows)
    local by = {}
    for _, row in ipairs(rows) do by[row.name] = row end
    return by
  end

  it("without a layout, ranks a host are the largest divisor of nproc up to the cluster's 8", function()
    local hw = plan.hardware(12)
    assert.are.equal(6, hw.gpus_per_host)
    assert.are.equal(2, hw.hosts)
    assert.are.equal(7, plan.hardware(7).gpus_per_host)
    assert.are.equal(8, plan.hardware(16).gpus_per_host)
  end)

  it("each row's step is the model's for its strategy and layout, tokens/s every replica's tokens over it", function()
    local hw = plan.hardware(16, { hosts = 2, link = st.parse_rate("100gbit") })
    assert.are.equal(2, hw.hosts)
    assert.are.equal(8, hw.gpus_per_host)
    local rows = plan.rows(r, 16, nil, hw)
    local by = by_name(rows)
    local want = st.step({ cfg = rows.cfg, strategy = "zero3", B = 1, T = 1024, m = 2, hosts = 2, gpus = 8, lowp = true,
                           units = rows.cfg.L + 2 }, hw)
    assert.are.equal(want.step, by.zero3.time.step)
    assert.are.equal(1024 * 2 * 16 / want.step, by.zero3.tokens_per_s)
    -- the pipeline: one replica's micro-batches
    assert.are.equal(1024 * 2 / by.pipeline_1f1b.time.step, by.pipeline_1f1b.tokens_per_s)
    -- single: one rank, no network
    assert.are.equal(0, by.single.time.comm)
  end)

  it("a slower link slows every multi-rank strategy, zero3 more than dp, and leaves single alone", function()
    local fast = by_name(plan.rows(r, 16, nil, plan.hardware(16, { hosts = 2, link = st.parse_rate("400gbit") })))
    local slow = by_name(plan.rows(r, 16, nil, plan.hardware(16, { hosts = 2, link = st.parse_rate("10gbit") })))
    for name, row in pairs(slow) do
      if name == "single" then assert.are.equal(fast[name].time.step, row.time.step)
      else assert.is_true(row.time.step > fast[name].time.step, name) end
    end
    -- fp32: zero3 gathers 4-byte parameters twice, 1.5x dp's bytes (in bf16, 2-byte gathers: as many as dp)
    local r32 = assert(zt.recipe.resolve({}, { "model.size=gpt2-xl", "model.vocab_size=50257", "batch.micro=1",
                                               "data.seq_len=1024" }))
    local f32 = by_name(plan.rows(r32, 16, nil, plan.hardware(16, { hosts = 2, link = st.parse_rate("400gbit") })))
    local s32 = by_name(plan.rows(r32, 16, nil, plan.hardware(16, { hosts = 2, link = st.parse_rate("10gbit") })))
    assert.is_true(s32.zero3.time.step - f32.zero3.time.step > s32.dp.time.step - f32.dp.time.step)
    -- 1.5x, and the embedding gathered once more for the head (its tied wte)
    local cfg = s32.zero3.t and plan.model_config(r32)
    local extra = 4 * (cfg.V + cfg.maxT) * cfg.C * 15 / 16
    assert.is_true(math.abs(1.5 * s32.dp.time.bytes + extra - s32.zero3.time.bytes) < 1)
  end)

  it("`ztrain plan` prints the columns and the hardware; bad flags are named", function()
    local out, rc = util.sh("build/ztrain plan model.size=gpt2-xl --hosts 2 --gpus-per-host 4 --link=10gbit " ..
                            "--latency 1ms precision=bf16 device.memory_limit=80GiB")
    assert.are.equal(0, rc, out)
    assert.matches("step +tokens/s", out)
    assert.matches("8 rank(s)", out, 1, true)
    assert.matches("on 2 host(s) x 4 rank(s)", out, 1, true)
    assert.matches("links 10 Gbit/s across hosts (1 ms a message)", out, 1, true)
    assert.matches("quickest by the step-time model: ", out, 1, true)
    for cmd, want in pairs({ ["--hosts 3 nproc=8"] = "nproc=8 ranks cannot be laid out as 3 host(s)",
                             ["--link fast"] = "--link: fast is not a link rate",
                             ["--mfu 2"] = "--mfu 2 must be a fraction in (0, 1]",
                             ["--latency"] = "--latency needs a value",
                             ["--speed 1"] = "unknown flag --speed" }) do
      local bad, brc = util.sh("build/ztrain plan " .. cmd)
      assert.are.equal(1, brc, bad)
      assert.matches(want, bad, 1, true)
    end
  end)
end)
