-- The whole-step GPU tests of `make test-cuda` (spec/cuda/whole_step.lua,
-- spec/cuda/strategies.lua) checked on the CPU, where they cannot meet a GPU:
-- run with the CPU on both sides they pass, with one side perturbed they
-- fail (the relative checks, the zero-gradient bounds, the tensor-core
-- count), asked for CUDA on this build they print one skip line and exit 0,
-- and any other failure to select a backend fails them. strategies.lua runs
-- on fakegpu-async (streams run later, in a seeded order: the CPU's stand-in
-- for a GPU), where a missing stream ordering gives wrong bits.
local util = require "helpers.util"

local function run(script, args, env)
  local out, rc = util.sh(("%sbuild/ztrain --script spec/cuda/%s.lua %s"):format(env or "", script, args))
  return out:gsub("rc=%d+%s*$", ""), rc
end

-- run with no arguments (backend cuda) on this CPU build: one line, exit 0
local function assert_skips(script, what)
  local out, rc = run(script, "")
  assert.are.equal(0, rc, out)
  local n = select(2, out:gsub("[^\n]+", ""))
  assert.are.equal(1, n, out)
  assert.matches("^" .. what .. ": no GPU here, skipped %(device.backend=cuda: built without CUDA", out)
end

describe("spec/cuda/whole_step.lua on the CPU", function()
  it("passes with the CPU on both sides (b on one thread), fp32 and bf16", function()
    local out, rc = run("whole_step", "a=cpu b=cpu threads_b=1 steps=2")
    assert.are.equal(0, rc, out)
    assert.matches("cuda whole step fp32 %(cpu against cpu, 2 steps%): losses worst 0 .*: ok\n", out)
    assert.matches("cuda whole step bf16 %(cpu against cpu, 2 steps%): .*: ok\n", out)
  end)

  it("passes with other GEMM kernels on one side (other sums: not the same bits, within the tolerances)", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=3 precision=fp32 env_b=OPENBLAS_CORETYPE=Prescott")
    assert.are.equal(0, rc, out)
    assert.matches("cuda whole step fp32 %(cpu against cpu, 3 steps%): .*: ok\n", out)
    assert.is_nil(out:find("losses worst 0 ", 1, true), out)
    assert.is_nil(out:find("gradients worst 0 ", 1, true), out)
  end)

  it("fails when one side's first-step gradients are scaled by 1 + 1e-3", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=fp32 perturb=1e-3")
    assert.are.equal(1, rc, out)
    assert.matches("cuda whole step fp32 .*: FAILED\n", out)
    assert.matches("  step 1 gradient norm: 0.001 > 0.0001", out, 1, true)
    assert.matches("  gradient wte: 0.001 > 0.0001", out, 1, true)
  end)

  it("gives b alone attention_b (device.attention): a's run passes, b's recipe refuses bf16 off the GPU", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=1 precision=bf16 attention_b=bf16")
    assert.are.equal(1, rc, out)
    assert.matches("the b run (backend cpu) failed", out, 1, true)
    assert.is_nil(out:find("the a run", 1, true), out)
    assert.matches('device.attention = "bf16" needs device.backend = "cuda"', out, 1, true)
  end)

  it("prints one skip line and exits 0 when CUDA is asked for on a build without it", function()
    assert_skips("whole_step", "cuda whole step")
  end)

  it("fails on any other backend error (only a missing GPU skips)", function()
    local out, rc = run("whole_step", "b=bogus")
    assert.are_not.equal(0, rc, out)
    assert.matches('unknown device backend "bogus"', out, 1, true)
  end)
end)

describe("spec/cuda/strategies.lua on the CPU", function()
  it("covers every recipe in recipes/ (plan=1: the cases, nothing run)", function()
    local out, rc = run("strategies", "plan=1")
    assert.are.equal(0, rc, out)
    local n = 0
    for f in util.sh("ls recipes"):gmatch("([%w_]+)%.lua") do
      n = n + 1
      if f ~= "single" then assert.matches("cuda strategies: case " .. f .. " ", out, 1, true) end
    end
    assert.matches(("cuda strategies: every recipe in recipes/ covered (%d): "):format(n), out, 1, true)
    for _, v in ipairs({ "fp32", "bf16", "fp16", "ckpt", "async" }) do
      assert.matches("%(" .. v .. "%): twice", out)
    end
  end)

  it("zero3_offload and pipeline_1f1b on fakegpu-async (seeds 1 and 2): twice the same bits, = one rank", function()
    local out, rc = run("strategies", "backend=fakegpu-async strategies=zero3_offload,pipeline_1f1b")
    assert.are.equal(0, rc, out)
    for _, l in ipairs({ "zero3_offload tiny n=2", "zero3_offload tiny n=2 precision=bf16 device.bf16_gemm=on",
                         "zero3_offload tiny n=2 precision=fp16", "zero3_offload tiny n=2 train.checkpoint_activations=true",
                         "pipeline_1f1b accum2 n=2", "pipeline_1f1b accum2 n=2 precision=bf16 device.bf16_gemm=on",
                         "pipeline_1f1b accum2 n=2 train.checkpoint_activations=true train.checkpoint_host=true" }) do
      assert.matches("cuda strategies: " .. l .. " (fakegpu-async): twice the same digest ", out, 1, true)
    end
    assert.matches("cuda strategies: 7 cases on fakegpu-async, each run twice: ok\n", out, 1, true)
  end)

  it("fails on fakegpu-async when copies do not wait for the compute stream (the H100's zero3_offload symptom)",
     function()
    local out, rc = run("strategies", "backend=fakegpu-async strategies=zero3_offload variants=fp32",
                        "ZTRAIN_UNORDERED_COPIES=1 ")
    assert.are.equal(1, rc, out)
    assert.matches("cuda strategies: zero3_offload tiny n=2 (fakegpu-async): FAILED\n", out, 1, true)
    assert.matches("  loss bits 1:0x1.62e43p+2 ", out, 1, true)        -- ln 256: every logit zero
  end)

  it("fails against a reference that does not accumulate (another batch)", function()
    local out, rc = run("strategies", "backend=cpu strategies=dp variants=fp32 break=1")
    assert.are.equal(1, rc, out)
    assert.matches("cuda strategies: dp tiny n=2 %(cpu%): FAILED\n  param_digest %x+, one rank accumulating " ..
                   "2 micro%-batches %x+", out)
  end)

  it("fails when the second run of a case differs from the first (break=twice)", function()
    local out, rc = run("strategies", "backend=cpu strategies=zero2 variants=fp32 break=twice")
    assert.are.equal(1, rc, out)
    assert.matches("cuda strategies: zero2 tiny n=2 %(cpu%): FAILED\n  run to run: param_digest %x+, then %x+\n" ..
                   "  run to run: loss bits ", out)
  end)

  it("refuses a recipe it has no case for", function()
    local out, rc = run("strategies", "backend=cpu strategies=zero9")
    assert.are_not.equal(0, rc, out)
    assert.matches('strategies=zero9: no case for "zero9"', out, 1, true)
  end)

  it("prints one skip line and exits 0 when CUDA is asked for on a build without it", function()
    assert_skips("strategies", "cuda strategies")
  end)
end)
