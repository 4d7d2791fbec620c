-- End-to-end: recipes through the trainer, outputs on disk, determinism.
local cjson = require "cjson"
local zt = require "ztrain"

local tmpdir = require("helpers.util").outdir

local function read_lines(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = line end
  return out
end

local base = { "model.size=gpt2-tiny", "data.seq_len=64", "batch.micro=4", "lr.warmup=5",
               "optim.lr=3e-3", "train.eval_batches=4", "train.log_every=10" }

-- base + extra, and out= a fresh temporary directory unless extra names one
-- (a run never writes into the checkout's runs/)
local function with(extra)
  local o = {}
  for _, v in ipairs(base) do o[#o + 1] = v end
  local out = false
  for _, v in ipairs(extra) do o[#o + 1] = v; out = out or v:find("^out=") ~= nil end
  if not out then o[#o + 1] = "out=" .. tmpdir() end
  return o
end

describe("training a recipe", function()
  local out = tmpdir()
  local s

  setup(function()
    s = zt.train("recipes/single.lua", with({ "train.steps=40", "train.eval_every=20", "out=" .. out }),
                 { quiet = true })
  end)

  it("lowers the loss on the fortunes corpus", function()
    assert.are.equal("ok", s.exit)
    assert.is_true(s.first_loss > 5.0, "starts near ln(256): " .. s.first_loss)
    assert.is_true(s.final_loss < s.first_loss - 1.5, ("%.3f -> %.3f"):format(s.first_loss, s.final_loss))
    assert.is_true(s.eval_loss < 4.0)
  end)

  it("writes summary.json with the contract's fields", function()
    local j = cjson.decode(assert(io.open(out .. "/summary.json")):read("*a"))
    for _, k in ipairs({ "recipe", "strategy", "world_size", "backend", "model", "steps", "tokens",
                         "final_loss", "eval_loss", "perplexity", "tokens_per_s", "step_ms_median",
                         "memory", "param_digest", "exit" }) do
      assert.is_not_nil(j[k], "summary.json lacks " .. k)
    end
    assert.are.equal("single", j.strategy)
    assert.are.equal(1, j.world_size)
    assert.are.equal("cpu", j.backend)
    assert.are.equal("gpt2-tiny", j.model.name)
    assert.are.equal(40 * 4 * 64, j.tokens)
    assert.matches("^%x+$", j.param_digest); assert.are.equal(64, #j.param_digest)
    local mem = j.memory[1]
    assert.is_true(mem.device_peak > 0)
    -- params + grads + optim measured equal 16 bytes per parameter (+ padding)
    local by = mem.by_category
    local ms = by.params.device + by.grads.device + by.optim.device
    assert.is_true(ms >= 16 * j.model.params and ms < 16 * j.model.params * 1.01)
  end)

  it("writes one metrics line per step (a run of at most 10,000 steps: loop.EVERY_STEP)", function()
    local lines = read_lines(out .. "/metrics.jsonl")
    local steps = {}
    for _, l in ipairs(lines) do
      local m = cjson.decode(l)
      assert.is_number(m.loss); assert.is_number(m.lr); assert.is_number(m.grad_norm)
      assert.is_number(m.tokens_per_s); assert.is_number(m.step_ms); assert.is_table(m.memory)
      steps[#steps + 1] = m.step
    end
    local want = {}
    for i = 1, 40 do want[i] = i end
    assert.are.same(want, steps)
  end)
end)

describe("determinism", function()
  -- gpt2-mini at B=8, T=128: big enough that every kernel (GEMM blocks,
  -- layernorm, encoder, attention tiles) actually splits across threads
  it("gives identical bits with 1, 2 and 3 threads", function()
    local d = {}
    for _, th in ipairs({ 1, 2, 3 }) do
      local s = zt.train("recipes/single.lua",
                         with({ "model.size=gpt2-mini", "batch.micro=8", "data.seq_len=128",
                                "train.steps=2", "train.eval_every=0", "train.eval_batches=0",
                                "device.threads=" .. th, "batch.accumulate=2" }),
                         { quiet = true })
      d[th] = s.param_digest
    end
    assert.are.equal(d[1], d[2])
    assert.are.equal(d[1], d[3])
  end)
end)

describe("a diverging run", function()
  it("stops with a message and still writes summary.json with null losses", function()
    local out = tmpdir()
    local S = zt.strategy.single()
    local step = S.step
    S.step = function(ctx, lr)          -- poison the parameters after step 1
      local gn = step(ctx, lr)
      zt.ops.fill(ctx.model.units[2].params, 0 / 0)
      return gn
    end
    local r = assert(zt.recipe.resolve({ strategy = S }, with({ "train.steps=5", "out=" .. out })))
    r.name = "nan"
    local ok, err = pcall(require("ztrain.train.run").run, r, { quiet = true })
    assert.is_false(ok)
    assert.matches("training diverged", err, 1, true)
    local j = cjson.decode(assert(io.open(out .. "/summary.json")):read("*a"))
    assert.matches("^error: loss is nan at step 2", j.exit)
    assert.are.equal(cjson.null, j.final_loss)
  end)
end)

describe("training a recipe: bad input", function()
  it("refuses binary data with a message naming the file", function()
    local ok, err = pcall(zt.train, "recipes/single.lua",
                          with({ "data.text=/usr/share/games/fortunes/art.dat", "data.exclude=none",
                                 "train.steps=1" }), { quiet = true })
    assert.is_false(ok)
    assert.matches("art.dat", err, 1, true)
  end)

  it("reports a device memory limit that the model does not fit", function()
    local ok, err = pcall(zt.train, "recipes/single.lua",
                          with({ "device.memory_limit=1MiB", "train.steps=1" }), { quiet = true })
    zt.memory.set_limit("device", 0)
    assert.is_false(ok)
    assert.matches("device memory limit exceeded", err, 1, true)
    assert.matches("device.memory_limit", err, 1, true)
  end)

  it("rejects a model vocabulary smaller than the tokenizer's", function()
    local ok, err = pcall(zt.train, "recipes/single.lua", with({ "model.vocab_size=100", "train.steps=1" }),
                          { quiet = true })
    assert.is_false(ok)
    assert.matches("model.vocab_size 100 is smaller than the bytes tokenizer's 256 tokens", err, 1, true)
  end)

  it("rejects a sequence longer than the model's context", function()
    local ok, err = pcall(zt.train, "recipes/single.lua", with({ "data.seq_len=512", "train.steps=1" }),
                          { quiet = true })
    assert.is_false(ok)
    assert.matches("exceeds gpt2%-tiny's context of 128", err)
  end)
end)
