-- The memory planner's rows (plan.rows, plan.hardware; lua/ztrain/plan/)
-- called directly: the gpt2-xl plan against the ZeRO formulas of DESIGN.md
-- and which strategies fit, and the step-time column against steptime.lua's
-- model. (Against the peaks of real runs, the pre-flight check and `ztrain
-- plan`: e2e/plan_spec.lua.)
local zt = require "ztrain"
local plan = require "ztrain.plan"

local TIERS = zt.memory.tiers

describe("plan: gpt2-xl against the ZeRO formulas", function()
  -- DESIGN.md, mixed precision, per rank: dp 16Psi, zero1 4Psi + 12Psi/N,
  -- zero2 2Psi + 14Psi/N, zero3 16Psi/N. ztrain adds what it keeps in fp32:
  -- the gradient accumulator (dp: 4Psi; single only when it accumulates,
  -- not here; zero1: its shard 4Psi/N),
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
    local want = { single = 16 * psi, dp = 16 * psi + 4 * psi, zero1 = 4 * psi + 12 * psi / N + 4 * psi / N,
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
end)
