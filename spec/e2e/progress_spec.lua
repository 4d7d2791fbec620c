-- Honest progress (issue 29, item 5): the start banner, one throughput
-- figure computed one way (record/throughput.lua: the live line's smoothed
-- tokens/s and ETA, the summary's median step and wall clock, each named),
-- model FLOPs and MFU against a stated peak. Checked against figures
-- recomputed here from the run's own metrics and model shape.
local util = require "spec.helpers.util"

local RUN = "timeout 120 build/ztrain recipes/single.lua model.size=gpt2-tiny data.seq_len=32 batch.micro=2 " ..
            "train.steps=5 train.log_every=1 train.eval_every=0 data.tokenizer=bytes 'data.text=docs/*.md'"

local function close(a, b, rel) return math.abs(a - b) <= (rel or 1e-9) * math.max(math.abs(a), math.abs(b)) end

describe("a run's progress", function()
  local dir, out, rc, s, m
  setup(function()
    dir = util.outdir()
    out, rc = util.sh(("%s batch.accumulate=2 report.peak_tflops=0.5 out=%s"):format(RUN, dir))
    s, m = util.summary(dir), util.metrics(dir)
  end)
  teardown(function() util.rm(dir) end)

  it("opens with a banner: model, strategy, ranks, the global batch, tokens to train, output", function()
    assert.are.equal(0, rc, out)
    assert.matches("ztrain: gpt2-tiny (124,672 params) with single on 1 rank(s), cpu, fp32\n" ..
                   "  batch     4 sequences of 32 tokens a step = micro 2 x accumulate 2 x 1 data-parallel " ..
                   "rank(s): 128 tokens\n  steps     5, 640 tokens to train\n", out, 1, true)
    -- (a "machine   busy: ..." line may come between, on a loaded machine)
    assert.matches("\n  output    " .. dir .. "\nstep     1/5 ", out, 1, true)
  end)

  it("smooths the live line's figure: the exponential average of step time, weight 0.2, from step 2", function()
    assert.are.equal(5, #m)
    local ema
    for i, rec in ipairs(m) do
      if i == 1 then
        assert.are.equal(rec.step_ms, rec.step_ms_smoothed)
      else
        ema = ema and 0.8 * ema + 0.2 * rec.step_ms or rec.step_ms
        assert.is_true(close(ema, rec.step_ms_smoothed), ("step %d: %s vs %s"):format(i, ema, rec.step_ms_smoothed))
      end
      assert.is_true(close(rec.tokens_per_s_smoothed, 128 / (rec.step_ms_smoothed / 1000)))
      -- the printed line shows that figure (no TTY: one plain line a logged step)
      local line = out:match(("step %%s+%d/5 [^\n]*"):format(i))
      assert.is_truthy(line, out)
      assert.are.equal(("%.0f"):format(rec.tokens_per_s_smoothed), line:match("(%d+) tok/s"))
    end
  end)

  it("sums up the median step, the wall clock, model FLOPs and MFU, each named", function()
    -- 6 N + 12 L T C, from the summary's model shape
    local want = 6 * s.model.params + 12 * s.model.layers * 32 * s.model.channels
    assert.are.equal(want, s.flops_per_token)
    assert.is_true(close(s.model_tflops, s.tokens_per_s * want / 1e12))
    assert.is_true(close(s.mfu, s.model_tflops / 0.5))
    assert.are.equal(0.5, s.peak_tflops)
    assert.are.equal("report.peak_tflops", s.peak_from)
    -- the wall clock's rate: 640 tokens over a span that holds every step's
    -- time and lies inside the run's seconds
    local steps_s = 0
    for _, rec in ipairs(m) do steps_s = steps_s + rec.step_ms / 1000 end
    assert.is_true(s.tokens_per_s_wall <= 640 / steps_s * 1.0001, s.tokens_per_s_wall .. " vs " .. 640 / steps_s)
    assert.is_true(s.tokens_per_s_wall >= 640 / s.seconds, s.tokens_per_s_wall .. " vs " .. 640 / s.seconds)
    assert.matches(("tokens/s at the median step %%(%.1f ms%%), %.0f tokens/s over the steps' wall clock")
                   :format(s.step_ms_median, s.tokens_per_s_wall), out)
    assert.matches(("MFU %.1f%%%% of 1 x 0.5 TFLOP/s %%(report.peak_tflops%%)"):format(100 * s.mfu), out)
  end)
end)

describe("MFU over ranks", function()
  it("divides the job's model FLOP/s by one device a rank", function()
    local dir = util.outdir()
    local out, rc = util.sh(("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 build/ztrain " ..
                             "--nproc 2 recipes/dp.lua model.size=gpt2-tiny data.seq_len=32 batch.micro=2 " ..
                             "train.steps=3 train.eval_every=0 data.tokenizer=bytes 'data.text=docs/*.md' " ..
                             "report.peak_tflops=0.5 out=%s"):format(dir))
    assert.are.equal(0, rc, out)
    local s = util.summary(dir)
    assert.is_true(close(s.mfu, s.model_tflops / (2 * 0.5)))
    assert.matches("of 2 x 0.5 TFLOP/s (report.peak_tflops)", out, 1, true)
    util.rm(dir)
  end)
end)

describe("MFU's peak", function()
  it("is none on a CPU unless report.peak_tflops names one; a bad value is refused", function()
    local dir = util.outdir()
    local out, rc = util.sh(("%s -q out=%s"):format(RUN, dir))
    assert.are.equal(0, rc, out)
    local s = util.summary(dir)
    assert.are.equal(require("cjson").null, s.mfu)
    assert.is_true(s.model_tflops > 0)
    util.rm(dir)
    out, rc = util.sh(("%s report.peak_tflops=-1 out=%s"):format(RUN, dir))
    assert.are.equal(1, rc, out)
    assert.matches("report.peak_tflops must be a number of TFLOP/s >= 0 (0: the device's known peak), got -1",
                   out, 1, true)
  end)
end)

describe("metrics.jsonl", function()
  it("keeps every step of a short run whatever train.log_every prints; a long run the logged steps", function()
    local dir = util.outdir()
    local out, rc = util.sh(("%s train.log_every=10 out=%s"):format(RUN, dir))
    assert.are.equal(0, rc, out)
    local steps = {}
    for _, rec in ipairs(util.metrics(dir)) do steps[#steps + 1] = rec.step end
    assert.are.same({ 1, 2, 3, 4, 5 }, steps)
    local printed = {}
    for n in out:gmatch("step%s+(%d+)/5") do printed[#printed + 1] = tonumber(n) end
    assert.are.same({ 1, 5 }, printed)                  -- the first, the last (log_every 10)
    util.rm(dir)
    -- past the threshold (lowered here to 3 steps): the logged steps only
    out, rc = util.sh(("%s train.log_every=2 -e 'require(\"ztrain.train.loop\").EVERY_STEP = 3' out=%s")
                      :format(RUN, dir))
    assert.are.equal(0, rc, out)
    steps = {}
    for _, rec in ipairs(util.metrics(dir)) do steps[#steps + 1] = rec.step end
    assert.are.same({ 1, 2, 4, 5 }, steps)
    util.rm(dir)
  end)
end)
