-- ZeRO (lua/ztrain/parallel/strategy/zero.lua, zero_setup.lua, zero_params.lua)
-- tested directly, on one rank with the local communicator: the names its
-- options give, the shard ranges and padding against the partition ZeRO
-- defines, the model-state bytes against the paper's formulas, stage 3's
-- gather and release hooks against the single strategy's parameters, the
-- reduce hooks' accumulation against sums computed here, and whole steps
-- against single and dp. (The same math on 2 and 4 ranks, through whole
-- runs: spec/e2e/dist_spec.lua.)
local ffi = require "ffi"
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"
local zero = require "ztrain.parallel.strategy.zero"
local shard = require "ztrain.parallel.strategy.shard"
local state = require "ztrain.parallel.strategy.state"
local gpt2 = require "ztrain.model.gpt2"

local BASE = { "model.size=gpt2-tiny", "data.seq_len=32", "batch.micro=2", "lr.warmup=1",
               "train.eval_every=0", "data.tokenizer=bytes" }

local function new(strategy, extra)
  local o = {}
  for _, x in ipairs(BASE) do o[#o + 1] = x end
  for _, x in ipairs(extra or {}) do o[#o + 1] = x end
  return trainer.new(assert(zt.recipe.resolve({ strategy = strategy }, o)), { quiet = true })
end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function f32(x) return tonumber(ffi.new("float", x)) end

-- equal(got, want, n, what): got[1..n] == want[1..n] (tables of numbers);
-- the first difference named (busted would print the whole tables)
local function equal(got, want, n, what)
  for k = 1, n do
    if got[k] ~= want[k] then
      error(("%s: element %d is %.9g, want %.9g"):format(what, k - 1, got[k], tostring(want[k])), 2)
    end
  end
end

describe("zero: options", function()
  it("names each stage and placement as the recipes and docs do", function()
    for _, c in ipairs({
      { { stage = 1 }, "zero1" }, { { stage = 2 }, "zero2" }, { { stage = 3 }, "zero3" },
      { { stage = 2, offload_optimizer = "host" }, "zero2_offload" },
      { { stage = 3, offload_optimizer = "host" }, "zero3_offload_optimizer" },
      { { stage = 3, offload_optimizer = "host", offload_params = "host" }, "zero3_offload" },
      { { stage = 2, offload_optimizer = "nvme" }, "zero2_infinity" },
      { { stage = 3, offload_optimizer = "nvme", offload_params = "nvme" }, "zero3_infinity" },
      { { stage = 3, offload_optimizer = "nvme", offload_params = "host" }, "zero3_offload_nvme_host" },
    }) do
      assert.are.equal(c[2], zero.new(c[1]).name)
    end
  end)

  it("refuses placements ZeRO cannot run, saying why", function()
    assert.are.equal("zero: stage must be 1, 2 or 3, got 0", err_of(zero.new, { stage = 0 }))
    assert.are.equal('zero: offload_optimizer must be "none", "host" or "nvme", got disk',
                     err_of(zero.new, { stage = 2, offload_optimizer = "disk" }))
    assert.matches("^zero: offload_params needs stage 3", err_of(zero.new, { stage = 2, offload_optimizer = "host",
                                                                           offload_params = "host" }))
    assert.matches("^zero: offload_params needs offload_optimizer too",
                   err_of(zero.new, { stage = 3, offload_params = "host" }))
  end)
end)

describe("zero: shards", function()
  -- ZeRO's partition: a unit's flat buffer of numel elements is padded to
  -- P, the least multiple of N x the norm block at or above numel, and rank
  -- r owns [r P/N, (r+1) P/N): equal shards, edges on norm-block edges.
  it("pads every unit to the least multiple of N x the norm block, and the N shards tile it", function()
    local cfg = gpt2.config("gpt2-tiny", { vocab_size = 50257 })
    for _, N in ipairs({ 1, 2, 3, 4, 8 }) do
      local S = zero.new({ stage = 3 })
      local model = gpt2.new(cfg, { alloc = false, pad = S.pad(N) })
      local q = N * shard.BLOCK
      for _, u in ipairs(model.units) do
        assert.are.equal(math.ceil(u.numel / q) * q, u.padded, ("%s at N=%d"):format(u.name, N))
      end
      local covered = {}
      for r = 0, N - 1 do
        local st = state.new(model, { size = N, rank = r }, true)
        for i, u in ipairs(model.units) do
          local l = st.layout[i]
          assert.are.same({ r * u.padded / N, (r + 1) * u.padded / N, u.padded / N, u.padded - u.numel },
                          { l.lo, l.hi, l.size, l.padding }, ("%s rank %d of %d"):format(u.name, r, N))
          assert.are.equal(0, l.lo % shard.BLOCK)
          covered[i] = (covered[i] or 0) + l.size
        end
      end
      for i, u in ipairs(model.units) do assert.are.equal(u.padded, covered[i]) end
    end
  end)

  it("on one rank each kind's shard is the whole padded unit, parameters sharded only at stage 3", function()
    for stage = 1, 3 do
      local tr = new("zero" .. stage, { "batch.accumulate=2" })
      local st = tr.ctx.state
      for i, u in ipairs(tr.model.units) do
        assert.are.same({ 0, u.padded }, { st.layout[i].lo, st.layout[i].hi })
        assert.are.equal(u.padded, st.optim[i].exp_avg:numel())
        assert.are.equal(u.padded, st.gshard[i]:numel())          -- accumulating: a gradient shard at every stage
        if stage == 3 then
          assert.is_nil(u.params, "stage 3 holds no full parameters between steps")
          assert.are.equal(u.padded, st.pshard[i]:numel())
        else
          assert.are.equal(u.padded, u.params:numel())
        end
      end
      tr:free()
    end
  end)
end)

describe("zero: model state per rank", function()
  -- The ZeRO paper's bytes per rank for P parameters on N ranks, fp32
  -- parameters and gradients (4 bytes each) and Adam's two moments (8):
  -- stage 1 4P + 4P + 8P/N, stage 2 4P + (4 + 8)P/N, stage 3 (4 + 4 + 8)P/N.
  local P = 1000 * 1024
  local PAPER = {
    function(N) return 4 * P + 4 * P + 8 * P / N end,
    function(N) return 4 * P + 12 * P / N end,
    function(N) return 16 * P / N end,
  }

  it("is the paper's fp32 formula at every stage and N", function()
    for stage = 1, 3 do
      for _, N in ipairs({ 1, 2, 4, 8 }) do
        local p = zero.new({ stage = stage }).predicted({ dp = { size = N }, nparams = P, accumulate = 1 })
        assert.are.equal(PAPER[stage](N), p.params + p.grads + p.optim, ("stage %d N=%d"):format(stage, N))
        assert.are.equal(p.params + p.grads + p.optim,
                         p.tiers.device.params + p.tiers.device.grads + p.tiers.device.optim)
      end
    end
  end)

  it("offload moves the optimizer term (and stage 3's parameters) to the host, the total unchanged", function()
    local ctx = { dp = { size = 4 }, nparams = P, accumulate = 1, recipe = { offload = {} } }
    local a = zero.new({ stage = 3, offload_optimizer = "host", offload_params = "host" }).predicted(ctx)
    assert.are.same({ params = 0, grads = 4 * P / 4, optim = 0 }, a.tiers.device)
    assert.are.same({ params = 4 * P / 4, grads = 0, optim = 8 * P / 4 }, a.tiers.host)
    local b = zero.new({ stage = 2, offload_optimizer = "host" }).predicted(ctx)
    assert.are.same({ params = 4 * P, grads = 4 * P / 4, optim = 0 }, b.tiers.device)
    assert.are.equal(8 * P / 4, b.tiers.host.optim)
  end)

  it("stage 1 accumulating keeps a gradient shard beside the micro-batch gradients", function()
    local p = zero.new({ stage = 1 }).predicted({ dp = { size = 4 }, nparams = P, accumulate = 2 })
    assert.are.equal(4 * P / 4, p.accumulator)
    assert.are.equal(4 * P + 4 * P / 4, p.tiers.device.grads)
  end)
end)

describe("zero: hooks", function()
  it("stage 3 gathers a unit's parameters before its forward (the single strategy's values) and releases them after", function()
    local ref = new("single")
    local want = {}
    for i, u in ipairs(ref.model.units) do want[i] = u.params:totable() end
    ref:free()
    local tr = new("zero3")
    local S, ctx = tr.strategy, tr.ctx
    ctx.training = false
    for i, u in ipairs(tr.model.units) do
      assert.is_nil(u.params, u.name .. " gathered before its forward")
      S.pre_forward(ctx, u)
      -- single pads a unit to 16 elements, zero to N x the norm block: the
      -- parameters are the same, zero's padding is zeros
      local got = u.params:totable()
      equal(got, want[i], u.numel, u.name)
      for k = u.numel + 1, #got do assert.are.equal(0, got[k], u.name .. " padding") end
      S.post_forward(ctx, u)
      assert.is_nil(u.params, u.name .. " kept after its forward")
    end
    tr:free()
  end)

  it("reduces each micro-batch's gradients into the shard: the shard is their sum, at every stage", function()
    for stage = 1, 3 do
      local tr = new("zero" .. stage, { "batch.accumulate=2" })
      local S, ctx = tr.strategy, tr.ctx
      local u = tr.model.units[2]
      local g = {}
      for micro = 0, 1 do
        S.pre_weight_grad(ctx, u, micro)
        zt.ops.randn(u.grads, 7 + micro, 11, 0, 1)          -- what backward would write
        g[micro] = u.grads:totable()
        S.post_backward(ctx, u, micro)
      end
      S.finish_grads(ctx)
      local got = tr.ctx.state.gshard[u.index]:totable()
      assert.are.equal(u.padded, #got)
      local sum = {}
      for k = 1, #got do sum[k] = f32(g[0][k] + g[1][k]) end
      equal(got, sum, #got, "stage " .. stage)
      tr:free()
    end
  end)
end)

describe("zero: whole steps on one rank", function()
  it("zero1, zero2 and zero3 give single's and dp's losses and parameters, bit for bit", function()
    local function run(name)
      local tr = new(name, { "batch.accumulate=2", "optim.clip=0.05" })
      local losses = {}
      for s = 1, 3 do losses[s] = ("%a"):format(tr:train_step().loss) end
      local d = tr:param_digest()
      tr:free()
      return table.concat(losses, " "), d
    end
    local want_l, want_d = run("single")
    for _, name in ipairs({ "dp", "zero1", "zero2", "zero3" }) do
      local l, d = run(name)
      assert.are.equal(want_l, l, name)
      assert.are.equal(want_d, d, name)
    end
  end)
end)
