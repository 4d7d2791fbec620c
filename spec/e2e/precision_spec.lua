-- Mixed precision (precision = "bf16" | "fp16", lua/ztrain/model/precision.lua):
-- low-precision parameters and gradients, fp32 master weights and optimizer
-- state. Trains with the loss falling; the same-math rule within a
-- precision (dp on N ranks = one rank accumulating N); model state as the
-- mixed-precision formula says; fp16's loss scaler follows DeepSpeed's
-- rules; checkpoints carry the master weights and the scaler.
local util = require "helpers.util"

local BASE = "model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.log_every=1 " ..
             "train.eval_every=0 lr.warmup=1 optim.clip=0.05 -q"

-- want_rc: the exit status expected (0 unless given: a run all of whose
-- steps fp16 skipped exits 1, its summary and metrics still written)
local function run(args, after, want_rc)
  local dir = util.outdir()
  local out, rc = util.sh(("timeout 120 build/ztrain %s %s %s out=%s"):format(args, BASE, after or "", dir))
  assert.are.equal(want_rc or 0, rc, args .. "\n" .. out)
  return util.summary(dir), util.metrics(dir), dir
end

describe("mixed precision", function()
  it("bf16 and fp16 train with the loss falling, close to fp32", function()
    local L = "model.size=gpt2-mini data.seq_len=64 batch.micro=4 train.steps=40 optim.lr=3e-3 lr.warmup=5"
    local f32 = run("recipes/single.lua", L)
    for _, p in ipairs({ "bf16", "fp16" }) do
      local s = run("recipes/single.lua precision=" .. p, L)
      assert.is_true(s.final_loss < s.first_loss - 1.5, ("%s: %.3f -> %.3f"):format(p, s.first_loss, s.final_loss))
      assert.is_true(math.abs(s.final_loss - f32.final_loss) < 0.1, ("%s %.4f vs fp32 %.4f"):format(p, s.final_loss,
                     f32.final_loss))
      assert.are_not.equal(f32.param_digest, s.param_digest, "another precision is other math")
    end
  end)

  -- every strategy and pipeline schedule on N ranks equals one rank
  -- accumulating N micro-batches, within each precision
  for _, p in ipairs({ "bf16", "fp16" }) do
    it("the same math within " .. p .. ": dp, zero1/2/3 on N ranks, pipelines, = one rank accumulating", function()
      local refs = {}
      local function ref(n)
        refs[n] = refs[n] or { run("recipes/single.lua train.steps=3 batch.accumulate=" .. n .. " precision=" .. p) }
        return refs[n][1], refs[n][2]
      end
      local cases = {
        { 2, "--nproc 2 recipes/dp.lua" }, { 4, "--nproc 4 recipes/dp.lua" },
        { 2, "--nproc 2 recipes/zero1.lua" }, { 2, "--nproc 2 recipes/zero2.lua" },
        { 4, "--nproc 4 recipes/zero3.lua" },
        { 2, "--nproc 2 recipes/zero2_offload.lua" }, { 2, "--nproc 2 recipes/zero3_offload.lua" },
        { 2, "--nproc 2 recipes/infinity.lua" },
        { 4, "--nproc 2 recipes/single.lua batch.accumulate=4 pipeline.stages=2 schedule=1f1b" },
        { 4, "--nproc 2 recipes/single.lua batch.accumulate=4 pipeline.stages=2 pipeline.chunks=2 schedule=zbv" },
      }
      for _, c in ipairs(cases) do
        local r, rm = ref(c[1])
        local s, m = run(c[2] .. " train.steps=3 precision=" .. p)
        assert.are.equal(r.param_digest, s.param_digest, p .. ": " .. c[2])
        for i = 1, #rm do assert.are.equal(rm[i].loss_hex, m[i].loss_hex, p .. " step " .. i .. ": " .. c[2]) end
      end
    end)
  end

  it("bf16 GEMMs (device.bf16_gemm=on): other math, the same for every thread count, strategy and pipeline", function()
    local G = " train.steps=3 precision=bf16 device.bf16_gemm=on"
    local ref = run("recipes/single.lua batch.accumulate=2" .. G)
    assert.matches("^bf16 %(", ref.gemm)
    local fp = run("recipes/single.lua batch.accumulate=2 train.steps=3 precision=bf16 device.bf16_gemm=off")
    assert.are.equal("fp32", fp.gemm)
    assert.are_not.equal(fp.param_digest, ref.param_digest, "bf16 operands are other math than fp32 ones")
    -- checkpointed blocks recompute into the scratch's bf16 buffers (device
    -- and host-kept inputs); ZB's W pass reads the GELU backward's bf16 dfch
    for _, c in ipairs({ "recipes/single.lua batch.accumulate=2 device.threads=1", "--nproc 2 recipes/dp.lua",
                         "--nproc 2 recipes/zero3.lua", "--nproc 2 recipes/pipeline_1f1b.lua batch.accumulate=2 model.size=gpt2-tiny",
                         "recipes/single.lua batch.accumulate=2 train.checkpoint_activations=true",
                         "recipes/single.lua batch.accumulate=2 train.checkpoint_activations=true train.checkpoint_host=true",
                         "--nproc 2 recipes/pipeline_zb.lua batch.accumulate=2 model.size=gpt2-tiny" }) do
      assert.are.equal(ref.param_digest, run(c .. G).param_digest, c)
    end
    -- (12 steps: the loss is down ~2.2 by step 10; 40 took ~26 s on a CPU
    -- without AVX512_BF16, whose bf16 GEMMs take the portable path)
    local L = "model.size=gpt2-mini data.seq_len=64 batch.micro=4 train.steps=12 optim.lr=3e-3 lr.warmup=5"
    local s = run("recipes/single.lua precision=bf16 device.bf16_gemm=on", L)
    assert.is_true(s.final_loss < s.first_loss - 1.5, ("%.3f -> %.3f"):format(s.first_loss, s.final_loss))
  end)

  -- with bf16 GEMMs the policy casts no parameter: every op reads the
  -- stored bf16 ones, widened as read (the norms' weights and biases, the
  -- GEMMs' weights and biases, the embedding's tables; llama-tiny's fused
  -- q|k|v and gate|up views, qwen-tiny's fused q|k|v bias), so there is no
  -- fp32 parameter work buffer at all. Against a run that casts every
  -- parameter into fp32 work buffers and hands the ops those (what enter
  -- did before): the same bits, and fewer elements cast.
  for _, size in ipairs({ "gpt2-tiny", "llama-tiny", "qwen-tiny" }) do
  it("bf16 GEMMs: the ops reading the stored bf16 parameters and writing the stored gradients change no bit against casting them all, " .. size,
     function()
    local zt = require "ztrain"
    local trainer = require "ztrain.train.trainer"
    local Pmt = getmetatable(require("ztrain.model.precision").new("bf16", {}))
    local function digest()
      local o = { "model.size=" .. size, "data.tokenizer=bytes", "data.seq_len=32", "batch.micro=2",
                  "train.eval_every=0", "precision=bf16", "device.bf16_gemm=on", "optim.clip=0.05" }
      local tr = trainer.new(assert(zt.recipe.resolve({}, o)), { quiet = true })
      local casts = 0
      local ops = require "ztrain.core.ops"
      local cast = ops.cast
      ops.cast = function(d, s) casts = casts + d:numel(); return cast(d, s) end
      local ok, err = pcall(function() tr:train_step(); tr:train_step() end)
      ops.cast = cast
      assert(ok, err)
      local d = tr:param_digest()
      local sizes, gsizes, want = {}, {}, { 0 }
      for k, w in pairs(tr.ctx.precision.pw) do sizes[k] = w:numel() end
      for k, w in pairs(tr.ctx.precision.gw) do gsizes[k] = w:numel() end
      -- the gradients' work buffers: the largest unit's in slot 1, reused by
      -- every unit, and the tied head's own (small) beside its wte part
      for _, u in ipairs(tr.model.units) do
        want[1] = math.max(want[1], u.padded)
        if u.kind == "head" and tr.model:tied() then want[2] = u.padded end
      end
      tr:free()
      return d, casts, sizes, gsizes, want
    end
    local skip, n_skip, pw, gw, gw_want = digest()
    assert.are.same({}, pw, "no fp32 parameter work buffer")
    -- nor gradient work buffers: the ops write the stored bf16 gradients
    -- (Model:writes_stored), each element rounded once, the embedding's
    -- table added to as stored
    assert.are.same({}, gw, "no fp32 gradient work buffer")
    assert.are.equal(0, n_skip, "nothing cast: neither parameters nor gradients")
    local origw, origwr = Pmt.widens, Pmt.writes
    Pmt.widens = function() return true end
    Pmt.writes = function() return false end
    local ok, full, n_full, pw_full, gw_full = pcall(digest)
    Pmt.widens, Pmt.writes = origw, origwr
    assert(ok, full)
    assert.is_not_nil(pw_full[1], "the all-cast run hands the ops fp32 parameters")
    -- the gradients' work buffers there: the largest unit's in slot 1
    assert.are.same(gw_want, gw_full, "the all-cast run's gradient work buffers")
    assert.are.equal(full, skip)
    assert.is_true(n_skip < n_full, ("elements cast: %d skipping, %d casting all"):format(n_skip, n_full))
  end)
  end

  -- without accumulation no fp32 accumulator: the gradient norm and AdamW
  -- read the stored 2-byte gradient (widened as read). Against the same
  -- run keeping the accumulator (replicated.setup's `widened`, dp's): the
  -- same bits, bf16 and fp16; and on fakegpu-async (the queued device's
  -- 2-byte AdamW and sums of squares) as on the cpu
  it("one micro-batch: no fp32 accumulator, the bits of a run that keeps one (bf16, fp16; cpu, fakegpu-async)", function()
    local zt = require "ztrain"
    local trainer = require "ztrain.train.trainer"
    local replicated = require "ztrain.parallel.strategy.replicated"
    for _, prec in ipairs({ { "precision=bf16", "device.bf16_gemm=on" }, { "precision=fp16" } }) do
      local function digest()
        local o = { "model.size=gpt2-tiny", "data.tokenizer=bytes", "data.seq_len=32", "batch.micro=2",
                    "train.eval_every=0", "optim.clip=0.05", unpack(prec) }
        local tr = trainer.new(assert(zt.recipe.resolve({}, o)), { quiet = true })
        local ok, err = pcall(function() tr:train_step(); tr:train_step() end)
        local d, acc = tr:param_digest(), next(tr.ctx.state.acc) ~= nil
        tr:free()
        assert(ok, err)
        return d, acc
      end
      local d, acc = digest()
      assert.is_false(acc, "no accumulator with one micro-batch")
      local setup = replicated.setup
      replicated.setup = function(ctx) return setup(ctx, true) end
      local ok, d_acc, acc2 = pcall(digest)
      replicated.setup = setup
      assert(ok, d_acc)
      assert.is_true(acc2, "the reference keeps its accumulator")
      assert.are.equal(d_acc, d, prec[1])
      local G = " train.steps=2 " .. table.concat(prec, " ")
      assert.are.equal(run("recipes/single.lua" .. G).param_digest,
                       run("recipes/single.lua device.backend=fakegpu-async:5" .. G).param_digest, prec[1])
    end
  end)

  -- without accumulation the gradient norm and AdamW read the stored bf16
  -- gradient itself (widened as read): 16 bytes a parameter, DeepSpeed's
  -- count; with accumulation (and under dp, which reduces widened copies)
  -- the fp32 accumulator's 4 more
  it("model state: 2 bytes of parameters, 2 of gradients (+ 4 of fp32 accumulator with accumulation), 12 of optimizer state", function()
    for _, c in ipairs({ { "recipes/single.lua train.steps=1 precision=bf16", 0 },
                         { "recipes/single.lua train.steps=1 precision=bf16 batch.accumulate=2", 4 } }) do
      local s = run(c[1])
      local psi = s.model.params
      local cats = s.memory[1].by_category
      -- padded flat buffers: a few elements more than psi per unit
      local function near(got, want, what)
        assert.is_true(got >= want and got < want * 1.01, ("%s: %s %d vs %d"):format(c[1], what, got, want))
      end
      near(cats.params.device, 2 * psi, "params")
      near(cats.grads.device, 2 * psi + c[2] * psi, "grads + accumulator")
      near(cats.optim.device, 12 * psi, "optim (master + two moments)")
      assert.are.equal(2 * psi, s.predicted.params)
      assert.are.equal(12 * psi, s.predicted.optim)
      assert.are.equal(c[2] * psi, s.predicted.accumulator)
    end
  end)

  it("fp16: DeepSpeed's loss scaling -- skip on overflow, halve after the hysteresis, double after the window", function()
    -- 2^40 overflows fp16 gradients: step 1 is skipped at 2^40 (hysteresis 2), each later overflow halves
    -- (every step skipped: exit 1, spec/e2e/fp16_noop_spec.lua)
    local _, m = run("recipes/single.lua train.steps=6 precision=fp16 fp16.initial_scale_power=40", nil, 1)
    assert.are.equal(2 ^ 40, m[1].loss_scale)
    assert.are.equal(1, m[1].skipped_steps)
    assert.are.equal(2 ^ 39, m[2].loss_scale)
    assert.are.equal(2 ^ 38, m[3].loss_scale)
    -- no overflow at 2^4: the scale doubles every loss_scale_window = 2 steps
    local _, m2 = run("recipes/single.lua train.steps=6 precision=fp16 fp16.initial_scale_power=4 " ..
                      "fp16.loss_scale_window=2")
    local want = { 16, 32, 32, 64, 64, 128 }
    for i = 1, 6 do assert.are.equal(want[i], m2[i].loss_scale, "step " .. i) end
    assert.are.equal(0, m2[6].skipped_steps)
    -- skipped steps leave the parameters alone: 6 skipped = the initial model
    local a = run("recipes/single.lua train.steps=3 precision=fp16 fp16.initial_scale_power=60 fp16.hysteresis=10",
                  nil, 1)
    local b = run("recipes/single.lua train.steps=1 precision=fp16 optim.lr=0")
    assert.are.equal(b.param_digest, a.param_digest)
  end)

  it("a bf16 or fp16 run resumed from a checkpoint (fp32 master weights, the loss scaler) equals the uninterrupted run",
     function()
    for _, p in ipairs({ "bf16", "fp16" }) do
      local ref = run("recipes/single.lua train.steps=6 batch.accumulate=2 precision=" .. p)
      local _, _, dir = run("--nproc 2 recipes/zero3.lua train.steps=6 train.ckpt_every=3 precision=" .. p)
      -- saved by zero3 on 2 ranks, resumed by one rank accumulating 2 and by zero1 on 2 ranks
      local ck = dir .. "/checkpoints/step-00000003"
      local s = run(("recipes/single.lua train.steps=6 batch.accumulate=2 precision=%s resume=%s"):format(p, ck))
      assert.are.equal(ref.param_digest, s.param_digest, p .. " zero3 -> single")
      local z = run(("--nproc 2 recipes/zero1.lua train.steps=6 precision=%s resume=%s"):format(p, ck))
      assert.are.equal(ref.param_digest, z.param_digest, p .. " zero3 -> zero1")
      assert.are.same({}, z.resumed.kernels_changed, p .. ": the same kernels")
      if p == "bf16" then
        -- the bf16 GEMMs switched the other way from what auto chose for the
        -- saving run (on where the CPU's path is AMX, off elsewhere): other
        -- kernels, other bits; said, not refused
        local was_on = ref.gemm ~= "fp32"
        local o = run(("recipes/single.lua train.steps=6 batch.accumulate=2 precision=bf16 " ..
                       "device.bf16_gemm=%s resume=%s"):format(was_on and "off" or "on", ck))
        -- (the CPU's path named: AMX has its own bits, kernels.h)
        assert.are.equal(1, #o.resumed.kernels_changed)
        assert.matches(was_on and "^gemm bf16 [%w_]+ %-> fp32$" or "^gemm fp32 %-> bf16 [%w_]+$",
                       o.resumed.kernels_changed[1])
        assert.are_not.equal(ref.param_digest, o.param_digest)
      end
      util.rm(dir)
    end
  end)

  it("refuses what it does not run yet, naming it", function()
    local function fails(args, msg)
      local out, rc = util.sh(("timeout 60 build/ztrain %s %s out=%s"):format(args, BASE, util.outdir()))
      assert.are.equal(1, rc, out)
      assert.matches(msg, out, 1, true)
    end
    fails("recipes/single.lua precision=fp8", 'precision must be "fp32", "bf16" or "fp16", got "fp8"')
    fails("recipes/single.lua precision=fp16 device.bf16_gemm=on", 'device.bf16_gemm = "on" needs precision = "bf16"')
  end)
end)
