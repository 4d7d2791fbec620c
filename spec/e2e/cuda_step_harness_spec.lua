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
  it("passes with the CPU on both sides (b on one thread): fp32 and bf16, tiny and hs64", function()
    local out, rc = run("whole_step", "a=cpu b=cpu threads_b=1 steps=2")
    assert.are.equal(0, rc, out)
    for _, prec in ipairs({ "fp32", "bf16" }) do
      -- tiny: 2 layers x 64 k-slice elements; hs64: 2 x 128 (C 128)
      assert.matches("cuda whole step " .. prec .. " tiny %(cpu against cpu, 2 steps%): losses worst 0 .*" ..
                     "; 128 zero%-gradient elements %(c_attn.bias k%-slices%): |g| worst [%d.e-]+ %(a%) and " ..
                     "[%d.e-]+ %(b%) of its rounding bound, |pa %- pb| worst 0 of 2 sum lr R = [%d.]+; " ..
                     "tensor%-core attention in b: 0 of 8 attention calls: ok\n", out)
      assert.matches("cuda whole step " .. prec .. " hs64 %(cpu against cpu, 2 steps%): losses worst 0 .*" ..
                     "; 256 zero%-gradient elements .*: ok\n", out)
    end
  end)

  it("reads b's tensors from a device mid-backward: b=fakegpu-async:3 (device memory, streams run later) = the CPU",
     function()
    local out, rc = run("whole_step", "a=cpu b=fakegpu-async:3 steps=2")
    assert.are.equal(0, rc, out)
    for _, l in ipairs({ "fp32 tiny", "bf16 tiny", "fp32 hs64", "bf16 hs64" }) do
      assert.matches("cuda whole step " .. l .. " (fakegpu-async:3 against cpu, 2 steps): losses worst 0 ", out, 1, true)
    end
    assert.are.equal(4, select(2, out:gsub(": ok\n", "")), out)
  end)

  it("passes with other GEMM kernels on one side (other sums: not the same bits, within the tolerances)", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=3 precision=fp32 env_b=OPENBLAS_CORETYPE=Prescott")
    assert.are.equal(0, rc, out)
    assert.matches("cuda whole step fp32 tiny %(cpu against cpu, 3 steps%): .*: ok\n", out)
    assert.matches("cuda whole step fp32 hs64 %(cpu against cpu, 3 steps%): .*: ok\n", out)
    assert.is_nil(out:find("losses worst 0 ", 1, true), out)
    assert.is_nil(out:find("gradients worst 0 ", 1, true), out)
    assert.is_nil(out:find("|pa - pb| worst 0 ", 1, true), out)   -- the k-slices moved apart, within the bound
  end)

  it("fails when one side's first-step gradients are scaled by 1 + 1e-3", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=fp32 config=tiny perturb=1e-3")
    assert.are.equal(1, rc, out)
    assert.matches("cuda whole step fp32 tiny .*: FAILED\n", out)
    assert.matches("  step 1 gradient norm: 0.001 > 0.0001", out, 1, true)
    assert.matches("  gradient wte: 0.001 > 0.0001", out, 1, true)
  end)

  -- b's zero-gradient elements set to X times their tensor's largest
  -- |gradient|: within the relative tolerance (fp32 1e-4, bf16 3e-2), and
  -- beyond the rounding of the terms that cancel
  for _, c in ipairs({ { "fp32", "1e-4" }, { "bf16", "1e-3" } }) do
    it(("fails when b's zero-gradient elements hold %s of their tensor's largest gradient (%s)"):format(c[2], c[1]),
       function()
      local out, rc = run("whole_step", ("a=cpu b=cpu steps=1 precision=%s perturb_zero=%s"):format(c[1], c[2]))
      assert.are.equal(1, rc, out)
      assert.matches("cuda whole step " .. c[1] .. " tiny .*: FAILED\n", out)
      assert.matches("cuda whole step " .. c[1] .. " hs64 .*: FAILED\n", out)
      assert.matches("  zero%-gradient h.0.attn.c_attn.bias%[64%] %(k%-slice element 0%), side b: |g| [%d.e-]+ > " ..
                     "its rounding bound [%d.e-]+\n", out)
      assert.is_nil(out:find("side a", 1, true), out)
      assert.is_nil(out:find("  gradient h.", 1, true), out)        -- the relative check saw nothing
    end)
  end

  it("holds the zero-gradient parameters to 2 sum lr_t R_t: 0.006 apart passes, 0.007 fails (2 steps: 0.00665)",
     function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=fp32 config=tiny perturb_param=0.006")
    assert.are.equal(0, rc, out)
    assert.matches("|pa - pb| worst 0.9 of 2 sum lr R = 0.00665", out, 1, true)
    out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=fp32 config=tiny perturb_param=0.007")
    assert.are.equal(1, rc, out)
    assert.matches("  zero-gradient h.0.attn.c_attn.bias[64] (k-slice element 0): |pa - pb| 0.007 > " ..
                   "2 sum lr_t R_t 0.00665\n", out, 1, true)
    assert.is_nil(out:find("  parameter h.", 1, true), out)       -- the relative check left them out
  end)

  it("holds bf16 parameters to the RMS of their difference in units of 2 sum lr_t R_t: 0.06 passes, 0.15 fails",
     function()
    -- 2 steps: 2 sum lr R = 0.00665; every bias of b moved by 0.0004 (0.06 of it), then 0.001 (0.15)
    local out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=bf16 config=tiny perturb_params=0.0004")
    assert.are.equal(0, rc, out)
    assert.matches("params after 2 steps worst 0.06 RMS of 2 sum lr R in parameter h.0.ln_1.bias (tol 1e-01)",
                   out, 1, true)
    out, rc = run("whole_step", "a=cpu b=cpu steps=2 precision=bf16 config=tiny perturb_params=0.001")
    assert.are.equal(1, rc, out)
    assert.matches("  parameter h.0.ln_1.bias: 0.15 > 0.1\n", out)
    assert.is_nil(out:find("  parameter h.0.ln_1.weight", 1, true), out)  -- the weights were not moved
  end)

  it("fails when b's run must take the tensor-core attention and took it 0 times (require_tc=1)", function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=1 precision=bf16 require_tc=1 config=hs64,tiny")
    assert.are.equal(1, rc, out)
    assert.matches("  tensor-core attention in b: 0 of 4 attention calls, want all (C 128 = 64 x 2 heads: " ..
                   "the kernels were not taken)\n", out, 1, true)
    assert.matches("  tensor-core attention in b: 0 of 4 attention calls, want all (C 64 = 64 x 4 heads: " ..
                   "not head size 64, use config=hs64)\n", out, 1, true)
  end)

  it("gives b alone attention_b (device.attention), on hs64: a's run passes, b's recipe refuses bf16 off the GPU",
     function()
    local out, rc = run("whole_step", "a=cpu b=cpu steps=1 precision=bf16 attention_b=bf16")
    assert.are.equal(1, rc, out)
    assert.matches("the b run (backend cpu) failed", out, 1, true)
    assert.matches("config=hs64 attention=bf16", out, 1, true)
    assert.is_nil(out:find("the a run", 1, true), out)
    assert.matches('device.attention = "bf16" needs device.backend = "cuda"', out, 1, true)
  end)

  it("prints one skip line and exits 0 when CUDA is asked for on a build without it", function()
    assert_skips("whole_step", "cuda whole step")
  end)

  it("fails on any other backend error (only a missing GPU skips)", function()
    local out, rc = run("whole_step", "b=bogus")
    assert.are_not.equal(0, rc, out)
    assert.matches('device.backend=bogus: unknown device backend', out, 1, true)
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
