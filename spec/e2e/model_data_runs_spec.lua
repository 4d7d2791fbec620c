-- Real data and evaluation in a run: the BPE vocabulary by default, a
-- WikiText directory with its own splits (the test split evaluated at the
-- end), evaluation split over the data-parallel ranks (each rank runs
-- ceil(n / N) forwards, the loss bits are those of one rank), samples
-- printed at each evaluation; activation checkpointing changes no bits and
-- keeps less activation memory.
local cjson = require "cjson"
local util = require "helpers.util"

local function run(args, after)
  local dir = util.outdir()
  local out, rc = util.sh(("timeout 180 build/ztrain %s out=%s %s"):format(args, dir, after or ""))
  assert.are.equal(0, rc, args .. "\n" .. out)
  local s = util.summary(dir)
  util.rm(dir)
  return s, out
end

local SMALL = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 lr.warmup=2 -q"

describe("models and data in a run", function()
  it("trains on the shipped BPE vocabulary by default, reports perplexity and prints a sample", function()
    local s, out = run("recipes/single.lua data.tokenizer=bpe train.steps=30 train.eval_every=15 sample.tokens=12 " ..
                       "sample.prompt=Q: " .. SMALL:gsub(" %-q$", ""))
    assert.are.equal("bpe", s.data.tokenizer)
    assert.are.equal(8192, s.model.vocab)
    assert.is_true(s.first_loss > 8.5, "starts near ln(8192) = 9.01: " .. s.first_loss)
    assert.is_true(s.final_loss < s.first_loss - 1, ("%.3f -> %.3f"):format(s.first_loss, s.final_loss))
    assert.is_number(s.perplexity)
    assert.is_true(math.abs(s.perplexity - math.exp(s.eval_loss)) < 1e-9 * s.perplexity)
    assert.is_string(s.sample)
    assert.are.equal("Q:", s.sample:sub(1, 2))
    assert.is_true(require("ztrain.model.data.utf8").check(s.sample), "the sample is valid UTF-8")
    assert.matches("sample at step 15: Q:", out, 1, true)
    assert.matches("sample at step 30: Q:", out, 1, true)
  end)

  it("a WikiText directory: its own train/validation/test files, the test split evaluated at the end", function()
    local s = run("recipes/single.lua data.text=wikitext:spec/fixtures/wikitext data.tokenizer=bytes " ..
                  "train.steps=4 train.eval_batches=2 " .. SMALL)
    assert.are.equal("wikitext", s.data.kind)
    assert.is_true(s.data.test_tokens > 0)
    assert.is_number(s.test_loss)
    assert.is_true(math.abs(s.test_perplexity - math.exp(s.test_loss)) < 1e-9 * s.test_perplexity)
    assert.are_not.equal(s.eval_loss, s.test_loss)
  end)

  it("evaluation is split over data-parallel ranks: ceil(n/N) forwards each, the same loss bits as one rank", function()
    -- a wrapper strategy counting each rank's evaluation forwards of the embedding
    local recipe = os.tmpname() .. ".lua"
    local counts = os.tmpname()
    util.write(recipe, ([[
      local r = dofile("recipes/dp.lua")
      local base = require("ztrain.parallel.strategy").resolve(os.getenv("ZT_STRAT"))
      local n = 0
      r.strategy = setmetatable({ name = base.name,
        pre_forward = function(ctx, u, mb)
          if not ctx.training and u.kind == "embed" then n = n + 1 end
          return base.pre_forward(ctx, u, mb)
        end,
        free = function(ctx)
          local f = assert(io.open("%s." .. ctx.rank, "w")); f:write(n); f:close()
          return base.free(ctx)
        end }, { __index = base })
      return r]]):format(counts))
    local EV = "data.tokenizer=bytes train.steps=2 train.eval_every=0 train.eval_batches=5 " .. SMALL
    for _, c in ipairs({ { 1, "single" }, { 2, "dp" }, { 4, "zero3" } }) do
      -- one rank accumulating N: the same parameters, all 5 batches on one rank
      local ref = run("recipes/single.lua batch.accumulate=" .. c[1] .. " " .. EV)
      local dir = util.outdir()
      local out, rc = util.sh(("ZT_STRAT=%s timeout 180 build/ztrain --nproc %d %s %s out=%s")
                              :format(c[2], c[1], recipe, EV, dir))
      assert.are.equal(0, rc, out)
      local s = cjson.decode(util.read(dir .. "/summary.json"))
      util.rm(dir)
      -- the bits of one rank evaluating all 5 batches
      assert.are.equal(("%a"):format(ref.eval_loss), ("%a"):format(s.eval_loss), c[2] .. " N=" .. c[1])
      -- one evaluation (at the last step): ceil(5 / N) forwards on every rank
      for r = 0, c[1] - 1 do
        assert.are.equal(math.ceil(5 / c[1]), tonumber(util.read(counts .. "." .. r)), c[2] .. " rank " .. r)
      end
    end
    os.remove(recipe)
    for r = 0, 3 do os.remove(counts .. "." .. r) end
  end)

  it("activation checkpointing: the same bits, less activation memory; refused with a split backward", function()
    local A = "data.tokenizer=bytes train.steps=3 train.eval_every=0 model.size=gpt2-mini data.seq_len=64 " ..
              "batch.micro=4 batch.accumulate=2 lr.warmup=1 -q"
    for _, c in ipairs({ { "recipes/single.lua" }, { "--nproc 2 recipes/zero3.lua" },
                         { "--nproc 2 recipes/pipeline_1f1b.lua" } }) do
      local s0 = run(c[1] .. " " .. A)
      local s1 = run(c[1] .. " " .. A .. " train.checkpoint_activations=true")
      local s2 = run(c[1] .. " " .. A .. " train.checkpoint_activations=2")
      assert.are.equal(s0.param_digest, s1.param_digest, c[1])
      assert.are.equal(s0.param_digest, s2.param_digest, c[1] .. " every 2nd block")
      local function act(s) return s.memory[1].by_category.activations.device end
      -- the summary states both: what a set holds, and would without checkpointing
      assert.are.equal(s0.activations.per_set, s0.activations.per_set_without)
      assert.is_true(s1.activations.per_set < s1.activations.per_set_without)
      assert.are.equal(s0.activations.per_set, s1.activations.per_set_without)
      -- the kept inputs on the host tier: the same bits, fewer device bytes per set
      local s3 = run(c[1] .. " " .. A .. " train.checkpoint_activations=true train.checkpoint_host=true")
      assert.are.equal(s0.param_digest, s3.param_digest, c[1] .. " host")
      assert.is_true(s3.activations.per_set < s1.activations.per_set)
      assert.is_true(s3.memory[1].by_category.activations.host > 0)
      assert.is_true(act(s1) < act(s2) and act(s2) < act(s0),
                     ("%s: activations %d (all) < %d (every 2nd) < %d (none)"):format(c[1], act(s1), act(s2), act(s0)))
    end
    local dir = util.outdir()
    local out, rc = util.sh(("timeout 60 build/ztrain --nproc 2 recipes/pipeline_zb.lua %s " ..
                             "train.checkpoint_activations=true out=%s"):format(A, dir))
    assert.are.equal(1, rc, out)
    assert.matches("train.checkpoint_activations needs the fused backward, and schedule zb_h1 splits it", out, 1, true)
  end)
end)
