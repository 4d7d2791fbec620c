-- The scaling table's tooling (tools/scale_fit.lua, tools/scale_report.lua)
-- without running anything: the calibration recovers the constants a
-- synthetic table was made with (the model's own step times, so a perfect
-- fit exists), the measured block and chart render from records, and a
-- re-render rewrites only the text between its markers. About a second.
-- (tools/bench_scale.lua's cluster handling: spec/e2e/bench_scale_spec.lua.)
local zt = require "ztrain"
local fit = dofile(zt.home .. "/tools/scale_fit.lua")
local report = dofile(zt.home .. "/tools/scale_report.lua")

-- the constants the synthetic table is made with (mem_bw is assumed, not fitted)
local TRUE = { eta = 0.37, latency = 1.4e-4, contention = 1.15, mem_bw = fit.MEM_BW }
local CONFIG = { model = "gpt2-mini", T = 64, B = 4, accumulate = 2, steps = 5 }

local function record(strategy, hosts, rate)
  local acc = strategy == "pipeline_1f1b" and 2 * hosts or 2
  return { id = ("%s_h%d_%s"):format(strategy, hosts, rate), strategy = strategy, hosts = hosts, rate = rate, ok = true,
           config = CONFIG, batch = { micro = 4, seq_len = 64, accumulate = acc },
           model = { name = "gpt2-mini", layers = 4, channels = 128, vocab = 50257, context = 256 } }
end

local function synthetic()
  local base = record("single", 1, "none")
  base.step_ms = 900
  local recs = { base }
  for _, h in ipairs({ 2, 4 }) do
    for _, rate in ipairs({ "1gbit", "10gbit", "100gbit" }) do
      for _, s in ipairs({ "dp", "zero1", "zero3", "zero3_offload", "pipeline_1f1b" }) do
        local r = record(s, h, rate)
        r.step_ms = fit.predict(r, TRUE, base)
        r.tokens_per_s = 1000
        r.comm_per_step = { max = { sent = 1e6 * h }, hidden_share = nil }
        recs[#recs + 1] = r
      end
    end
  end
  return recs
end

describe("scale_fit: calibration", function()
  local recs = synthetic()
  local res = fit.calibrate(recs)

  it("fits the model's own table to within 1% and recovers its constants", function()
    assert.are.equal(30, res.n)
    assert.is_true(res.mean < 1e-3, ("mean error %.6f"):format(res.mean))
    assert.is_true(res.max < 1e-3, ("max error %.6f"):format(res.max))
    for k, v in pairs(TRUE) do
      assert.is_true(math.abs(res.params[k] - v) / v < 0.01, ("%s: fitted %g, made with %g"):format(k, res.params[k], v))
    end
  end)

  it("the FLOP rate is the baseline's, before the fit", function()
    local o = fit.input(recs[1])
    local tokens = 4 * 64 * 2
    local want = tokens * require("ztrain.plan.steptime").flops_per_token(o.cfg, 64) /
                 (0.9 - 28 * require("ztrain.plan.steptime").params(o.cfg) / res.params.mem_bw)
    assert.is_true(math.abs(res.flops - want) / want < 1e-9)
  end)

  it("says why it cannot calibrate without a baseline", function()
    local r, why = fit.calibrate({ recs[2] })
    assert.is_nil(r)
    assert.matches("no one-rank baseline", why, 1, true)
  end)

  it("link rates: tc's words to bytes per second", function()
    assert.are.equal(1e9 / 8, fit.rate_bytes("1gbit"))
    assert.are.equal(100e6 / 8, fit.rate_bytes("100mbit"))
    assert.is_nil(fit.rate_bytes("local"))
  end)
end)

describe("scale_report: the doc's blocks", function()
  local recs = synthetic()

  it("rewrites only between its markers, and appends the block where there is none", function()
    local doc = "intro\n<!-- BEGIN measured -->\nold\n<!-- END measured -->\nkept\n<!-- BEGIN predictions -->\np\n" ..
                "<!-- END predictions -->\n"
    local out = report.replace_block(doc, "measured", "new")
    assert.are.equal(doc:gsub("\nold\n", "\nnew\n", 1), out)
    assert.are.equal(out, report.replace_block(out, "measured", "new"))
    assert.are.equal("x\n\n<!-- BEGIN measured -->\nnew\n<!-- END measured -->\n", report.replace_block("x\n", "measured", "new"))
  end)

  it("the measured block: a row per run, the model's error, the conclusions from the cells", function()
    local res = fit.calibrate(recs)
    local text = report.measured_block(recs, res)
    assert.matches("| dp | 4 | 1gbit | ", text, 1, true)
    assert.matches("| pipeline_1f1b | 2 | 100gbit | ", text, 1, true)
    assert.matches("**Error: mean ", text, 1, true)
    assert.matches("dp on 4 hosts: %d+ ms at 1gbit vs %d+ ms at 100gbit", text)
    assert.matches("bytes zero3/dp 1.00x", text, 1, true)     -- the synthetic counters: equal
    assert.matches("zero3_offload vs zero3 on 4 hosts at 100gbit", text, 1, true)
    -- what was not measured reads n/a, never an error
    local bare = { recs[1], recs[2] }
    bare[2].comm_per_step = nil
    local t2 = report.measured_block(bare, fit.calibrate(bare))
    assert.matches("| dp | 2 | 1gbit | [%d%.]+ | 1000 | n/a | [%d%.]+ MiB | n/a |", t2)
  end)

  it("the chart: a measured dot per run, a dashed model line per strategy and host count", function()
    local res = fit.calibrate(recs)
    local svgtext = report.chart(recs, res)
    local dots, dashed = 0, 0
    for _ in svgtext:gmatch('<circle[^>]*class="measured"') do dots = dots + 1 end
    for _ in svgtext:gmatch('class="model"') do dashed = dashed + 1 end
    assert.are.equal(30, dots)
    assert.are.equal(10, dashed)
  end)
end)

describe("steptime: bytes against the runtime's counters", function()
  -- Measured by the comm counters (summary.json comm_per_step, the busiest
  -- rank's collective and send bytes per step, the loss exchanges left
  -- out) of real runs on 2 namespace hosts: gpt2-mini, vocabulary 50257,
  -- batch.micro=4, data.seq_len=64, 2 micro-batches a rank (the pipelines 4).
  local st = require "ztrain.plan.steptime"
  local cfg = require("ztrain.model.gpt2").config("gpt2-mini", { vocab_size = 50257 })
  local function bytes(strategy, m, gpus)
    return st.step({ cfg = cfg, strategy = strategy, B = 4, T = 64, m = m, hosts = 2, gpus = gpus },
                   { flops = 1e9, inter_bw = 1e9 }).bytes
  end

  it("dp: 58,072,064 bytes (2 micro-batches x 2·4Ψ(N-1)/N), exactly", function()
    assert.are.equal(58072064, bytes("dp", 2))
  end)

  it("zero3: 113,033,216 bytes (reduce-scatter, two gathers, the embedding's third), within the padding", function()
    local b = bytes("zero3", 2)
    assert.is_true(math.abs(b - 113033216) / 113033216 < 0.002, ("model %d"):format(b))
  end)

  it("1F1B on 2 stages: 103,450,624 bytes from the last stage (gradients back, the head's wte gradient), exactly", function()
    assert.are.equal(103450624, bytes("pipeline_1f1b", 4))
  end)

  it("pipeline x dp, 2 hosts x 2 ranks: 111,417,344 from a last-stage rank (its sends and its stage's zero1)", function()
    local b = bytes("pipeline_dp", 4, 2)
    assert.is_true(math.abs(b - 111417344) / 111417344 < 0.002, ("model %d"):format(b))
  end)
end)
