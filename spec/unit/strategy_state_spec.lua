-- Public strategy state (strategy/state.lua): the layout and named state
-- kinds every strategy publishes, and state() / load_state() moving a run's
-- state between strategies bit-exactly. Multi-rank resharding (N ranks ->
-- 1 rank, host-tier state into device-tier strategies) is in
-- spec/e2e/state_reshard_spec.lua.
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"
local T = require "ztrain.core.tensor"
local stream = require "ztrain.core.stream"

local BASE = { "model.size=gpt2-tiny", "data.seq_len=32", "batch.micro=2", "lr.warmup=1",
               "train.eval_every=0", "optim.clip=0.05" }

local function new(strategy, extra)
  local o = {}
  for _, x in ipairs(BASE) do o[#o + 1] = x end
  for _, x in ipairs(extra or {}) do o[#o + 1] = x end
  local r = assert(zt.recipe.resolve({ strategy = strategy }, o))
  return trainer.new(r)
end

local function steps(tr, n) for _ = 1, n do tr:train_step() end end

describe("strategy state", function()
  it("describes its layout and kinds with dtype and placement", function()
    for _, name in ipairs({ "single", "dp", "zero1", "zero2", "zero3" }) do
      local tr = new(name)
      local st = tr.ctx.state
      local d = zt.strategy.state.describe(st)
      local kinds = {}
      for _, k in ipairs(d.kinds) do kinds[k.name] = k end
      for _, k in ipairs({ "params", "grads", "exp_avg", "exp_avg_sq" }) do
        assert.is_table(kinds[k], name .. " has no kind " .. k)
        assert.are.equal("f32", kinds[k].dtype)
        assert.are.equal("device", kinds[k].tier)
      end
      assert.are.equal(name == "zero3", kinds.params.sharded, name)
      assert.are.equal(name == "zero2" or name == "zero3", kinds.grads.sharded, name)
      assert.are.equal(name:match("^zero") ~= nil, kinds.exp_avg.sharded, name)
      -- one rank: every unit's shard is the whole padded buffer
      for i, u in ipairs(tr.model.units) do
        local l = d.layout[i]
        assert.are.same({ u.name, 0, u.padded, u.padded, u.padded - u.numel },
                        { l.unit, l.lo, l.hi, l.size, l.padding })
        local sh = st.kinds.exp_avg.shards[i]
        assert.is_true(sh.tensor:numel() >= math.min(sh.hi, u.numel) - sh.lo)
      end
      tr:free()
    end
  end)

  it("exports ranges that cover every parameter once, unpadded", function()
    local tr = new("zero2")
    local ex = tr:state()
    local per = {}
    for _, e in ipairs(ex.entries) do
      per[e.kind] = (per[e.kind] or 0) + (e.hi - e.lo)
      assert.are.equal(e.hi - e.lo, e.tensor:numel())
    end
    assert.are.equal(tr.model.nparams, per.params)
    assert.are.equal(tr.model.nparams, per.exp_avg)
    assert.are.equal(tr.model.nparams, per.exp_avg_sq)
    assert.is_nil(per.grads, "gradients do not outlive a step")
    ex.free()
    tr:free()
  end)

  for _, pair in ipairs({ { "single", "zero3" }, { "zero3", "dp" }, { "zero1", "zero2" } }) do
    it(("moves a run from %s to %s mid-training with the same bits"):format(pair[1], pair[2]), function()
      local ref = new(pair[2])
      steps(ref, 4)
      local want = ref:param_digest()
      ref:free()

      local a = new(pair[1])
      steps(a, 2)
      local ex = a:state()
      local b = new(pair[2])
      b:load_state(zt.strategy.state.reader({ ex }), ex.step)
      ex.free(); a:free()
      steps(b, 2)
      assert.are.equal(want, b:param_digest())
      b:free()
    end)
  end

  -- zero3_infinity's step ends by fetching the next forward's first shards
  -- from nvme (beside its last writes): a load after a step rewrites those
  -- shards, so what was fetched ahead is dropped, not used
  it("moves a run onto a zero3_infinity run that has stepped (shards fetched ahead) with the same bits", function()
    local util = require "helpers.util"
    local dir = util.tmpdir()
    local inf = { "offload.nvme_path=" .. dir, "offload.queue_depth=8", "offload.block_size=1MiB" }
    local ref = new("zero3_infinity", inf)
    steps(ref, 4)
    local want = ref:param_digest()
    ref:free()

    local a = new("zero3", nil)
    steps(a, 2)
    local ex = a:state()
    local b = new("zero3_infinity", inf)
    steps(b, 1)
    assert.is_not_nil(b.ctx.work.fetches[b.model.units[1].index], "the step fetched the first unit ahead")
    -- a device state reaches the swap files through host tensors (as a checkpoint's does)
    local read = zt.strategy.state.reader({ ex })
    b:load_state(function(kind, unit, lo, hi, dst, numel)
      if dst:tier() ~= "nvme" then return read(kind, unit, lo, hi, dst, numel) end
      local tmp = T.new({ hi - lo }, { tier = "host", dtype = dst:dtype() })
      read(kind, unit, lo, hi, tmp, numel)
      stream.copy_async(dst, tmp)
      stream.current():sync()
      tmp:free()
    end, ex.step)
    ex.free(); a:free()
    steps(b, 2)
    assert.are.equal(want, b:param_digest())
    b:free()
    util.rm(dir)
  end)

  it("a state missing a range is an error naming the kind, unit and range", function()
    local a = new("single")
    local ex = a:state()
    table.remove(ex.entries, 3)
    local b = new("single")
    local ok, err = pcall(b.load_state, b, zt.strategy.state.reader({ ex }), 1)
    assert.is_false(ok)
    assert.matches("is not in the saved state", tostring(err), 1, true)
    assert.matches("^state: %a+ of [%w%.]+ %[0, %d+%)", tostring(err))
    ex.free(); a:free(); b:free()
  end)

  it("loading does not change what an unloaded run would compute (a test that can fail)", function()
    -- a state from a different seed must NOT give the reference digest
    local ref = new("single"); steps(ref, 4)
    local want = ref:param_digest(); ref:free()
    local a = new("single", { "model.seed=7" }); steps(a, 2)
    local ex = a:state()
    local b = new("single")
    b:load_state(zt.strategy.state.reader({ ex }), ex.step)
    ex.free(); a:free()
    steps(b, 2)
    assert.are_not.equal(want, b:param_digest())
    b:free()
  end)
end)
