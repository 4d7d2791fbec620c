-- No silent no-op training (issue 30 item 5): an fp16 run whose loss scale
-- is stuck at its minimum stops (DeepSpeed's raise_error_at_min_scale), and
-- a run every step of which was skipped exits non-zero, summary.json's exit
-- saying so. Checked on the process's exit status, its stderr and
-- summary.json, not on the scaler's fields.
local u = require "spec.helpers.util"
local cjson = require "cjson.safe"
local precision = require "ztrain.model.precision"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local TINY = ROOT .. "/recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes -q precision=fp16"
-- the issue's case: 2^40 overflows, the minimum 1e12 is reached at step 1
local STUCK = "fp16.initial_scale_power=40 fp16.min_loss_scale=1e12 fp16.hysteresis=1 train.steps=20"

local function summary(d) return cjson.decode(u.read(d .. "/summary.json")) end

describe("fp16 loss scale at its minimum", function()
  it("the scaler marks an overflow at min_scale with no hysteresis left, not before", function()
    local LS = precision.loss_scaler { initial = 4, min_scale = 2, hysteresis = 2 }
    assert.is_true(LS:update(true))        -- uses up the hysteresis budget
    assert.is_nil(LS.stuck)
    assert.is_true(LS:update(true))        -- 4 -> 2, the minimum
    assert.is_nil(LS.stuck)
    assert.is_true(LS:update(true))        -- at the minimum, nothing left
    assert.is_true(LS.stuck)
  end)

  it("one rank: the issue's recipe stops at step 2 with exit 1, not 20 skipped steps and exit 0", function()
    local d = u.outdir()
    local out, rc = u.sh(("%s %s %s out=%s"):format(ZT, TINY, STUCK, d))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: fp16: step 2 overflowed (inf or NaN gradients) with the loss scale already at its " ..
                   "minimum, fp16.min_loss_scale = 1e+12, and no hysteresis left: training cannot go on; lower " ..
                   "fp16.min_loss_scale, lower optim.lr or use precision=bf16", out, 1, true)
    assert.not_matches("%.lua:%d+:", out)
    local s = summary(d)
    assert.matches("^error: fp16: step 2 overflowed", s.exit)
    u.rm(d)
  end)

  it("--nproc 2: every rank stops at the same step, one message, exit 1", function()
    local d = u.outdir()
    local out, rc = u.sh(("%s --nproc 2 %s strategy=zero2 %s out=%s"):format(ZT, TINY, STUCK, d))
    assert.are.equal(1, rc, out)
    local _, n = out:gsub("fp16: step 2 overflowed", "")
    assert.are.equal(1, n, out)
    assert.not_matches("MPI_Abort", out)
    assert.matches("^error: fp16: step 2 overflowed", summary(d).exit)
    u.rm(d)
  end)

  it("a run all of whose steps were skipped exits 1 and says so (summary.json's exit too)", function()
    local d = u.outdir()
    -- 2^40 halves each step from step 2 (hysteresis 2): 3 steps, all overflow,
    -- the minimum (1) never reached
    local out, rc = u.sh(("%s %s fp16.initial_scale_power=40 train.steps=3 out=%s"):format(ZT, TINY, d))
    assert.are.equal(1, rc, out)
    local msg = "fp16: every step of this run was skipped (3 of 3: inf or NaN gradients at every loss scale " ..
                "tried, the last 2.74878e+11): the weights are unchanged; lower fp16.initial_scale_power, " ..
                "lower optim.lr or use precision=bf16"
    assert.matches("ztrain: " .. msg, out, 1, true)
    assert.are.equal("error: " .. msg, summary(d).exit)
    u.rm(d)
  end)

  it("a run that skips some steps and trains others still ends ok", function()
    local d = u.outdir()
    -- 2^20 overflows a few times, then trains
    local out, rc = u.sh(("%s %s fp16.initial_scale_power=20 train.steps=8 out=%s"):format(ZT, TINY, d))
    assert.are.equal(0, rc, out)
    assert.are.equal("ok", summary(d).exit)
    local last = u.read(d .. "/metrics.jsonl"):match("([^\n]+)\n$")
    local skipped = cjson.decode(last).skipped_steps
    assert.is_true(skipped > 0 and skipped < 8, last)
    u.rm(d)
  end)
end)
