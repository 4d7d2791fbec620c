-- ztrain.record.profile (tools/bench_ops.lua's hook): profiling changes no bit, counts
-- every op of a step exactly once (calls and FLOPs against GPT-2's formulas),
-- its families add up to the measured step, and stop() undoes every swap.
local zt = require "ztrain"
local ops = require "ztrain.core.ops"
local gpt2 = require "ztrain.model.gpt2"
local profile = require "ztrain.record.profile"
local trainer = require "ztrain.train.trainer"
local C = zt.ffi.C

local B, T = 2, 32
local function new(extra)
  local o = { "model.size=gpt2-tiny", "data.seq_len=" .. T, "batch.micro=" .. B, "train.eval_every=0",
              "optim.clip=0.05" }
  for _, x in ipairs(extra or {}) do o[#o + 1] = x end
  return trainer.new(assert(zt.recipe.resolve({}, o)), { quiet = true })
end

-- digest after two steps, with or without a profile running
local function digest(extra, profiled)
  local tr = new(extra)
  local prof = profiled and profile.start(tr.model, tr.ctx)
  tr:train_step(); tr:train_step()
  if prof then prof:stop() end
  local d = tr:param_digest()
  tr:free()
  return d
end

local function by_family(prof)
  local f = {}
  for _, e in ipairs(prof:rows()) do
    local k = e.phase .. "/" .. e.family
    f[k] = e
  end
  return f
end

describe("profile", function()
  for _, case in ipairs({ { "fp32", {} }, { "fp32, accumulate 2", { "batch.accumulate=2" } },
                          { "bf16 with bf16 GEMMs", { "precision=bf16", "device.bf16_gemm=on" } } }) do
    it(case[1] .. ": profiling on gives the same param_digest as off", function()
      assert.are.equal(digest(case[2], false), digest(case[2], true))
    end)
  end

  it("counts every op of a step once: calls and FLOPs match GPT-2's formulas", function()
    local tr = new()
    local cfg = tr.model.cfg
    local L, Cw, V = cfg.L, cfg.C, cfg.V
    local prof = profile.start(tr.model, tr.ctx)
    tr:train_step()
    prof:stop()
    local f = by_family(prof)
    local BT = B * T
    -- forward: one GEMM per role per block, the head once; backward: dinp and dW
    for _, r in ipairs({ { "qkv", 3 * Cw * Cw, L }, { "attn proj", Cw * Cw, L }, { "mlp fc", 4 * Cw * Cw, L },
                         { "mlp proj", 4 * Cw * Cw, L }, { "lm head", V * Cw, 1 } }) do
      local fw, bw = f["forward/matmul " .. r[1]], f["backward/matmul " .. r[1]]
      assert.are.equal(r[3], fw.calls, r[1])
      assert.are.equal(r[3], bw.calls, r[1])
      assert.are.equal(2 * BT * r[2] * r[3], fw.flops, r[1])
      assert.are.equal(4 * BT * r[2] * r[3], bw.flops, r[1])
    end
    -- attention: PaLM's 12 L C T per token over forward and backward
    assert.are.equal(12 * L * Cw * T * BT,
                     f["forward/attention"].flops + f["backward/attention"].flops)
    assert.are.equal(2 * L + 1, f["forward/layernorm"].calls)
    assert.are.equal(2 * L + 1, f["backward/layernorm"].calls)
    assert.are.equal(L, f["forward/gelu"].calls)
    assert.are.equal(1, f["forward/cross-entropy"].calls)
    assert.is_table(f["optimizer/AdamW"])
    assert.is_table(f["optimizer/grad norm"])
    -- AdamW moves 28 bytes a parameter (p, m, v read and written; g read)
    local padded = 0
    for _, u in ipairs(tr.model.units) do padded = padded + u.padded end
    assert.are.equal(28 * padded, f["optimizer/AdamW"].bytes)
    tr:free()
  end)

  -- what bench-ops found on bf16 steps: each bf16 GEMM cast its weight again
  -- though the policy had just cast the stored bf16 weight to fp32; then the
  -- policy cast each block's 5 runs of non-matmul parameters (norms,
  -- biases): a launch each on a GPU
  it("bf16 GEMMs: the ops read the stored bf16 parameters and bf16 inputs: no cast in the forward", function()
    local tr = new({ "precision=bf16", "device.bf16_gemm=on" })
    local L = tr.model.cfg.L
    local prof = profile.start(tr.model, tr.ctx)
    tr:train_step()
    prof:stop()
    local f = by_family(prof)
    -- no parameter is widened (the norms and the GEMMs read their bf16
    -- weights and biases, the embedding its tables: Model:reads_stored), and
    -- no GEMM input is cast: ln1, ln2, fch_gelu, lnf and the attention's
    -- output are written bf16 by their kernels (model/activations.lua)
    assert.is_nil(f["forward/precision casts"])
    -- nor in the backward: the ops write the stored bf16 gradients, each
    -- element rounded once (Model:writes_stored), the embedding adding to
    -- its stored table; the policy only zeroes what no op writes (the tied
    -- head's: the embedding's position table; blocks' padding: none here)
    assert.is_nil(f["backward/precision casts"])
    assert.is_true(L >= 1)
    tr:free()
  end)

  it("its families' time falls within the measured steps (their share of it: make bench)", function()
    local tr = new()
    local prof = profile.start(tr.model, tr.ctx)
    tr:train_step()
    prof:reset()
    local t0 = C.zt_now()
    for _ = 1, 3 do tr:train_step() end
    local step = C.zt_now() - t0
    prof:stop()
    local total = prof:total()
    -- every op runs inside the step (what is left is Lua, data loading and
    -- allocation; tools/bench_timings.lua measures the ops' share)
    assert.is_true(total > 0, "no op time recorded")
    assert.is_true(total <= step, ("ops %.6f s > step %.6f s"):format(total, step))
    tr:free()
  end)

  it("stop() puts back every function it swapped; one profile at a time", function()
    local saved = {}
    for k, v in pairs(ops) do saved[k] = v end
    local fwd, mmf = gpt2.Model.forward, gpt2.fp32_matmuls.forward
    local tr = new({ "precision=bf16" })
    local prof = profile.start(tr.model, tr.ctx)
    assert.are_not.equal(saved.matmul_forward, ops.matmul_forward)
    assert.has_error(function() profile.start(tr.model, tr.ctx) end,
                     "profile.start: a profile is already running; stop it first")
    prof:stop()
    for k, v in pairs(saved) do assert.are.equal(v, ops[k], k) end
    assert.are.equal(fwd, gpt2.Model.forward)
    assert.are.equal(mmf, gpt2.fp32_matmuls.forward)
    assert.is_nil(rawget(tr.ctx.precision, "enter"))
    tr:free()
  end)
end)
