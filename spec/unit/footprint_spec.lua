-- Each strategy owns its memory model (strategy/footprint.lua): S.placement
-- and S.footprint, which plan.lua asks without knowing strategies by name.
local zt = require "ztrain"
local plan = require "ztrain.plan"
local fp = require "ztrain.parallel.strategy.footprint"

local function recipe(...)
  return assert(zt.recipe.resolve({}, { "model.size=gpt2-tiny", "data.tokenizer=bytes", ... }))
end

local function tiers()
  local t = {}
  for _, tier in ipairs(zt.memory.tiers) do
    t[tier] = {}
    for _, c in ipairs(zt.memory.categories) do t[tier][c] = 0 end
  end
  return t
end

describe("strategy footprints", function()
  it("ZeRO-3 on 4 ranks keeps a quarter of every padded unit, ZeRO's formula per unit", function()
    local r = recipe("precision=bf16")
    local S = zt.strategy.zero { stage = 3 }
    local units = plan.units(plan.model_config(r), 4 * require("ztrain.parallel.strategy.shard").BLOCK)
    local t = tiers()
    S.footprint(t, { units = units, N = 4, lowp = true, accumulate = 1, recipe = r })
    local padded, numel = 0, 0
    for _, u in ipairs(units) do padded = padded + u.padded; numel = numel + u.numel end
    assert.is_true(padded > numel)
    assert.are.equal(2 * padded / 4, t.device.params)              -- bf16 parameter shards
    assert.are.equal(4 * padded / 4, t.device.grads)               -- fp32 gradient shards
    assert.are.equal(12 * padded / 4, t.device.optim)              -- master + two moments
    assert.are.same({ stage = 3 }, S.placement)
  end)

  it("offload tiers move the optimizer (and stage 3's parameters) off the device", function()
    local r = recipe()
    local S = zt.strategy.resolve("zero3_offload")
    assert.are.same({ stage = 3, otier = "host", ptier = "host" }, S.placement)
    local units = plan.units(plan.model_config(r), 2 * require("ztrain.parallel.strategy.shard").BLOCK)
    local t = tiers()
    S.footprint(t, { units = units, N = 2, lowp = false, accumulate = 1, recipe = r })
    assert.are.equal(0, t.device.params); assert.are.equal(0, t.device.optim)
    assert.is_true(t.host.params > 0 and t.host.optim > 0 and t.host.comm > 0)
  end)

  it("the planner asks the object, not its name: a 'zero3' with a replicated model is predicted replicated", function()
    local r = recipe()
    local rep = require "ztrain.parallel.strategy.replicated"
    local S = zt.strategy.single()
    S.name = "zero3"
    local as_single = plan.predict(r, { strategy = "single", nproc = 1 })
    assert.are.same(as_single, (plan.predict(r, { strategy = S, nproc = 1 })))
    assert.are.equal(rep.footprint, S.footprint)
  end)

  it("a strategy of one's own is predicted from its footprint, and refused without one", function()
    local r = recipe()
    local S = zt.strategy.single()
    local base = plan.predict(r, { strategy = S, nproc = 1 })
    local extra = 12345
    S.footprint = function(t, f) require("ztrain.parallel.strategy.replicated").footprint(t, f); fp.add(t, "host", "other", extra) end
    local mine = plan.predict(r, { strategy = S, nproc = 1 })
    assert.are.equal(base.host.other + extra, mine.host.other)
    S.footprint = nil
    local ok, err = pcall(plan.predict, r, { strategy = S, nproc = 1 })
    assert.is_false(ok)
    assert.matches("cannot predict strategy", err)
  end)
end)
