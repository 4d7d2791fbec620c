-- The replicated strategies (lua/ztrain/parallel/strategy/dp.lua, single.lua)
-- tested directly on one rank with the local communicator: their names and
-- refusals, the model state per rank against the paper's 16 bytes a
-- parameter, and the gradient hooks over 2 micro-batches against the sum
-- computed here (dp reducing each micro-batch, dp_deferred the accumulator,
-- single accumulating). (ZeRO: zero_spec.lua; N ranks: e2e/dist_spec.lua.)
local ffi = require "ffi"
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"
local dp = require "ztrain.parallel.strategy.dp"
local single = require "ztrain.parallel.strategy.single"

local BASE = { "model.size=gpt2-tiny", "data.seq_len=32", "batch.micro=2", "lr.warmup=1",
               "train.eval_every=0", "data.tokenizer=bytes", "batch.accumulate=2" }

local function new(strategy, extra)
  local o = {}
  for _, x in ipairs(BASE) do o[#o + 1] = x end
  for _, x in ipairs(extra or {}) do o[#o + 1] = x end
  return trainer.new(assert(zt.recipe.resolve({ strategy = strategy }, o)), { quiet = true })
end

local function f32(x) return tonumber(ffi.new("float", x)) end

describe("dp and single: options", function()
  it("dp defers its reduction only when asked, under its own name", function()
    assert.are.equal("dp", dp.new({}).name)
    assert.are.equal("dp", dp.new({ defer_reduction = false }).name)
    assert.are.equal("dp_deferred", dp.new({ defer_reduction = true }).name)
    assert.are.equal("single", single.new({}).name)
  end)

  it("single refuses a data-parallel group of more than one rank; dp_deferred refuses low precision", function()
    local ok, e = pcall(single.new({}).setup, { dp = { size = 2 } })
    assert.is_false(ok)
    assert.are.equal("strategy single runs on one rank, but the job has 2; use dp or zero", tostring(e))
    -- (a recipe is refused earlier, by the trainer: precision runs with dp, not dp_deferred)
    ok, e = pcall(dp.new({ defer_reduction = true }).setup, { precision = { name = "bf16" } })
    assert.is_false(ok)
    assert.are.equal("dp_deferred runs in fp32 only (it reduces the accumulator); use dp with precision bf16",
                     tostring(e))
  end)
end)

describe("dp and single: model state per rank", function()
  -- the whole model on every rank: fp32 parameters and gradients (4 bytes
  -- each) and Adam's two moments (8), whatever N; 4 more when accumulating
  it("is 16 bytes a parameter at any N, and an fp32 accumulator when accumulating", function()
    local P = 123456
    for _, S in ipairs({ dp.new({}), single.new({}) }) do
      for _, N in ipairs({ 1, 2, 8 }) do
        local p = S.predicted({ dp = { size = N }, nparams = P, accumulate = 1 })
        assert.are.equal(16 * P, p.params + p.grads + p.optim, S.name)
        assert.are.equal(0, p.accumulator)
        assert.are.equal(4 * P, S.predicted({ dp = { size = N }, nparams = P, accumulate = 4 }).accumulator)
      end
    end
  end)
end)

describe("dp and single: gradient hooks", function()
  it("leave each unit's accumulator holding the sum of its micro-batches' gradients, reduced as often as said", function()
    -- reductions: dp one per micro-batch (then accumulated), dp_deferred one
    -- of the accumulator after the last, single none
    for _, c in ipairs({ { "single", {} }, { "dp", { 0, 1 } },
                         { zt.strategy.dp { defer_reduction = true }, { 1 }, "dp_deferred" } }) do
      local tr = new(c[1])
      local S, ctx = tr.strategy, tr.ctx
      -- ctx.dp stands in for the group, noting the micro-batch of each all-reduce
      local real, reductions, micro_now = ctx.dp, {}, nil
      ctx.dp = setmetatable({ all_reduce = function(_, ...)
        reductions[#reductions + 1] = micro_now
        return real:all_reduce(...)
      end }, { __index = real })
      local u = tr.model.units[2]
      local g = {}
      for micro = 0, 1 do
        if S.pre_weight_grad then S.pre_weight_grad(ctx, u, micro) end
        zt.ops.randn(u.grads, 5 + micro, 13, 0, 1)          -- what backward would write
        g[micro] = u.grads:totable()
        micro_now = micro
        S.post_backward(ctx, u, micro)
      end
      if S.finish_grads then S.finish_grads(ctx) end
      ctx.dp = real
      assert.are.same(c[2], reductions, c[3] or c[1])
      local got = ctx.state.acc[u.index]:totable()
      for k = 1, #got do
        if got[k] ~= f32(g[0][k] + g[1][k]) then
          error(("%s element %d: %.9g, want %.9g + %.9g"):format(c[3] or c[1], k - 1, got[k], g[0][k], g[1][k]))
        end
      end
      tr:free()
    end
  end)
end)
