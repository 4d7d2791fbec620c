-- The whole-step GPU tests of `make test-cuda` (spec/cuda/whole_step.lua,
-- spec/cuda/strategies.lua) checked on the CPU, where they cannot meet a GPU:
-- run with the CPU on both sides they pass, with one side perturbed they
-- fail, asked for CUDA on this build they print one skip line and exit 0,
-- and any other failure to select a backend fails them.
local util = require "helpers.util"

local function run(script, args)
  local out, rc = util.sh(("build/ztrain --script spec/cuda/%s.lua %s"):format(script, args))
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
  it("dp and zero2 on 2 ranks equal one rank accumulating", function()
    local out, rc = run("strategies", "backend=cpu strategies=dp,zero2")
    assert.are.equal(0, rc, out)
    assert.matches("cuda strategies: dp on 2 ranks %(cpu%) .*: same digest %x+, same loss bits\n", out)
    assert.matches("cuda strategies: zero2 on 2 ranks %(cpu%) .*: same digest %x+, same loss bits\n", out)
  end)

  it("fails against a reference that does not accumulate (another batch)", function()
    local out, rc = run("strategies", "backend=cpu strategies=dp break=1")
    assert.are.equal(1, rc, out)
    assert.matches("cuda strategies: dp on 2 ranks %(cpu%) .*: FAILED\n  param_digest %x+, one rank accumulating %x+", out)
  end)

  it("prints one skip line and exits 0 when CUDA is asked for on a build without it", function()
    assert_skips("strategies", "cuda strategies")
  end)
end)
