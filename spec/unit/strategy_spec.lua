-- Strategy objects: options and hooks checked when the recipe is resolved,
-- clean failure paths (nothing left accounted after a failed setup), and
-- strategies that work on their data-parallel group only. (A bad option
-- through the program: spec/e2e/program_errors_spec.lua.)
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

describe("strategy options", function()
  it("an unknown option is an error naming the valid ones", function()
    assert.are.equal('zero: unknown option "offload"; did you mean "offload_optimizer"? valid options: ' ..
                     'stage, offload_optimizer, offload_params',
                     err_of(zt.strategy.zero, { stage = 3, offload = "host" }))
    assert.are.equal('dp: unknown option "defer"; did you mean "defer_reduction"? valid options: defer_reduction',
                     err_of(zt.strategy.dp, { defer = true }))
    assert.are.equal('single: unknown option "stage"; it takes no options', err_of(zt.strategy.single, { stage = 1 }))
    assert.are.equal("zero: stage must be 1, 2 or 3, got 4", err_of(zt.strategy.zero, { stage = 4 }))
  end)
end)

describe("strategy hooks", function()
  local function resolve(S)
    return zt.recipe.resolve({ strategy = S }, {})
  end

  it("a strategy without a required hook is refused when the recipe is resolved", function()
    local r, e = resolve({ name = "mine", setup = function() end })
    assert.is_nil(r)
    assert.matches('strategy: strategy "mine" has no step hook: a strategy needs setup, step', e, 1, true)
  end)

  it("a misspelt hook is named with the right spelling", function()
    local S = zt.strategy.single()
    S.pre_foward = function() end
    local r, e = resolve(S)
    assert.is_nil(r)
    assert.matches("unknown hook pre_foward; did you mean pre_forward?", e, 1, true)
  end)

  it("a hook that is not a function is refused", function()
    local S = zt.strategy.single()
    S.post_backward = true
    local r, e = resolve(S)
    assert.is_nil(r)
    assert.matches("hook post_backward must be a function, got boolean", e, 1, true)
  end)

  it("missing per-unit hooks are no-ops, so a minimal strategy trains", function()
    -- the smallest strategy: single's setup and step only
    local base = zt.strategy.single()
    local S = { name = "minimal", setup = base.setup, step = base.step, free = base.free }
    local r = assert(zt.recipe.resolve({ strategy = S }, { "model.size=gpt2-tiny", "data.seq_len=32",
                                                         "batch.micro=2", "train.eval_every=0",
                                                         "data.tokenizer=bytes" }))
    local tr = trainer.new(r)
    local rec = tr:train_step()
    assert.is_true(rec.loss > 4 and rec.loss < 7)
    tr:free()
  end)
end)

describe("failure paths", function()
  it("a setup that fails part-way leaves nothing accounted", function()
    local before = {}
    for _, cat in ipairs(zt.memory.categories) do before[cat] = zt.memory.current("device", cat) end
    -- gpt2-mini under zero3 at a limit that admits a few units, not all
    local r = assert(zt.recipe.resolve({ strategy = "zero3" },
      { "model.size=gpt2-mini", "data.seq_len=32", "batch.micro=2", "device.memory_limit=3MiB" }))
    local e = err_of(trainer.new, r)
    assert.matches("memory limit", e, 1, true)
    zt.memory.set_limit("device", 0)
    for _, cat in ipairs(zt.memory.categories) do
      assert.are.equal(before[cat], zt.memory.current("device", cat), cat .. " still accounted")
    end
  end)

  it("a build or step that runs out of memory at any point leaves nothing accounted, limit restored", function()
    -- every limit from "almost nothing fits" to "everything fits", so the
    -- failure lands at every allocation in turn (GC stopped: no backstop)
    collectgarbage("stop")
    local leaks = {}
    for _, strat in ipairs({ "single", "zero1", "zero3" }) do
      for kib = 200, 4200, 61 do
        local r = assert(zt.recipe.resolve({ strategy = strat }, { "model.size=gpt2-tiny", "data.seq_len=64",
          "batch.micro=4", "device.memory_limit=" .. kib .. "KiB", "train.eval_every=0" }))
        local ok, tr = pcall(trainer.new, r)
        if ok then pcall(tr.train_step, tr); tr:free() end
        zt.memory.set_limit("device", 0)
        for _, cat in ipairs(zt.memory.categories) do
          local c = zt.memory.current("device", cat)
          if c ~= 0 then leaks[#leaks + 1] = ("%s at %d KiB: %d bytes of %s"):format(strat, kib, c, cat) end
        end
      end
    end
    collectgarbage("restart")
    assert.are.same({}, leaks)
    local r = assert(zt.recipe.resolve({}, { "device.memory_limit=300KiB" }))
    assert.is_false(pcall(trainer.new, r))
    assert.are.equal(0, zt.memory.limit("device"), "a failed build keeps its memory limit")
  end)

  it("built-in strategies use their data-parallel group, never the world", function()
    for _, f in ipairs({ "single", "dp", "zero", "replicated", "shard", "norm", "state", "options" }) do
      local src = assert(io.open("lua/ztrain/parallel/strategy/" .. f .. ".lua")):read("*a")
      assert.is_nil(src:find("comm.world", 1, true), f .. ".lua reaches for the world communicator")
      assert.is_nil(src:find('require "ztrain.core.comm"', 1, true), f .. ".lua requires the comm module")
    end
  end)
end)
