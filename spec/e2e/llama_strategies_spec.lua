-- The Llama family under every strategy and schedule (issue 33's "train
-- under every strategy and schedule with the one-rank digest"): llama-tiny
-- (GQA, Llama 3 RoPE scaling, untied head), qwen-tiny (tied embeddings
-- across the first and last pipeline stage, q/k/v biases) and mistral-tiny
-- (sliding window 16 < T = 32), random-initialised, on 2 ranks: each run's
-- parameter digest equals one rank accumulating the same micro-batches
-- (between them every data-parallel recipe and every schedule: GPipe,
-- 1F1B, interleaved, ZB-H1, ZB-V, DualPipe-V; pipeline_dp = zero1 on 2);
-- export.hf from ZeRO-3's shards loads back (model/hf.lua) with the run's
-- digest, and `ztrain generate` samples from the export; a checkpoint of a
-- mistral-tiny run resumes under another strategy to the uninterrupted
-- digest, `ztrain export` of it loads back with the run's digest, and a
-- GPT-2 run refuses to resume from it.
local util = require "spec.helpers.util"

local function base(size, acc)
  return ("model.size=%s data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.steps=3 " ..
          "train.eval_every=0 lr.warmup=1 batch.accumulate=%d -q 'data.text=docs/*.md'"):format(size, acc)
end

local function digest(args, size, acc)
  local s, out = util.summary_of(args .. " " .. base(size, acc), 120)
  assert.is_truthy(s, out)
  return s.param_digest
end

describe("Llama-family models on 2 ranks give one rank's digest", function()
  local cases = {
    { "llama-tiny", { "recipes/dp.lua", "recipes/zero1.lua", "recipes/zero3.lua", "recipes/zero3_offload.lua",
                      "recipes/infinity.lua" }, { "recipes/pipeline_1f1b.lua", "recipes/pipeline_zbv.lua" } },
    { "qwen-tiny", { "recipes/zero2.lua" }, { "recipes/pipeline_1f1b.lua", "recipes/pipeline_zbv.lua",
                                              "recipes/pipeline_gpipe.lua", "recipes/pipeline_zb.lua" } },
    { "mistral-tiny", { "recipes/dp.lua", "recipes/zero3.lua", "recipes/zero2_offload.lua" },
      { "recipes/pipeline_1f1b.lua", "recipes/pipeline_interleaved.lua",
        "recipes/pipeline_zbv.lua schedule=dualpipev" } },
  }
  for _, c in ipairs(cases) do
    local size, data_parallel, pipelines = c[1], c[2], c[3]
    it(size .. ": " .. #data_parallel .. " data-parallel strategies and " .. #pipelines .. " schedule(s)", function()
      local one2 = digest("recipes/single.lua", size, 2)      -- what 2 ranks x micro-batch 2 take a step
      for _, r in ipairs(data_parallel) do
        assert.are.equal(one2, digest("--nproc 2 " .. r, size, 1), size .. " " .. r)
      end
      local one4 = digest("recipes/single.lua", size, 4)
      for _, r in ipairs(pipelines) do
        assert.are.equal(one4, digest("--nproc 2 " .. r, size, 4), size .. " " .. r)
      end
    end)
  end

  -- bf16 GEMMs (bf16 activations: model/llama.lua, llama_bf16_spec): other
  -- math than fp32, the same under every strategy, schedule and checkpointing
  -- (ZB-V's W pass reads the SwiGLU backward's bf16 dgu; qwen-tiny's tied
  -- head across the first and last stage; checkpointed blocks recompute into
  -- the scratch's bf16 buffers)
  it("bf16 GEMMs: llama-tiny and qwen-tiny under strategies and schedules give one rank's digest", function()
    local G = " precision=bf16 device.bf16_gemm=on"
    for _, size in ipairs({ "llama-tiny", "qwen-tiny" }) do
      local one2 = digest("recipes/single.lua" .. G, size, 2)
      assert.are_not.equal(digest("recipes/single.lua precision=bf16 device.bf16_gemm=off", size, 2), one2, size)
      for _, r in ipairs({ "--nproc 2 recipes/zero3.lua", "--nproc 2 recipes/zero3_offload.lua",
                           "recipes/single.lua train.checkpoint_activations=true train.checkpoint_host=true" }) do
        local acc = r:match("^recipes/single") and 2 or 1
        assert.are.equal(one2, digest(r .. G, size, acc), size .. " " .. r)
      end
      local one4 = digest("recipes/single.lua" .. G, size, 4)
      assert.are.equal(one4, digest("--nproc 2 recipes/pipeline_zbv.lua" .. G, size, 4), size .. " zbv")
    end
  end)

  -- pipeline_dp (2 stages x 2 replicas on 4 ranks) sums as zero1 on 2 ranks
  -- accumulating 2 (no one-rank run sums 2 ranks x 2 micro-batches so)
  it("qwen-tiny: pipeline_dp on 4 ranks gives zero1's digest on 2 accumulating 2", function()
    assert.are.equal(digest("--nproc 2 recipes/zero1.lua", "qwen-tiny", 2),
                     digest("--nproc 4 --oversubscribe recipes/pipeline_dp.lua", "qwen-tiny", 2))
  end)

  it("qwen-tiny: export.hf from zero3's shards loads back with the run's digest, and generate reads it", function()
    local ex = util.outdir()
    local s, out = util.summary_of("--nproc 2 recipes/zero3.lua export.hf=" .. ex .. " " .. base("qwen-tiny", 1), 120)
    assert.is_truthy(s, out)
    local script = os.tmpname()
    util.write(script, 'local zt = require "ztrain"\nlocal m = require("ztrain.model.hf").load(arg[1], ' ..
                       '{ tier = "host" })\nprint("digest " .. zt.digest.params(m))\n')
    local got = util.sh(("build/ztrain --script %s %s"):format(script, ex))
    assert.matches("digest " .. s.param_digest, got, 1, true)
    local cfg = require("cjson").decode(util.read(ex .. "/config.json"))
    assert.are.equal("qwen2", cfg.model_type)
    assert.is_true(cfg.tie_word_embeddings)
    local gen, rc = util.sh(("build/ztrain generate %s 'The ' max_tokens=8 temperature=0"):format(ex))
    assert.are.equal(0, rc, gen)
    os.remove(script)
    util.rm(ex)
  end)

  it("mistral-tiny: a checkpoint resumes under another strategy, exports, and is refused by a GPT-2 run", function()
    local C = "model.size=mistral-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.eval_every=0 " ..
              "'data.text=docs/*.md' lr.schedule=constant lr.warmup=0 -q"
    local whole = util.summary_of("--nproc 2 recipes/zero3.lua train.steps=4 " .. C, 120)
    assert.is_truthy(whole)
    local dir = util.outdir()
    local run = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 build/ztrain --nproc 2 "
    local out, rc = util.sh(run .. "recipes/zero3.lua train.steps=2 train.ckpt_every=2 " .. C .. " out=" .. dir)
    assert.are.equal(0, rc, out)
    out, rc = util.sh(run .. "recipes/zero1.lua train.steps=4 resume=latest " .. C .. " out=" .. dir)
    assert.are.equal(0, rc, out)
    assert.are.equal(whole.param_digest, util.summary(dir).param_digest)
    local ex = util.outdir()
    out, rc = util.sh(("build/ztrain export %s/checkpoints %s"):format(dir, ex))
    assert.are.equal(0, rc, out)
    local script = os.tmpname()
    util.write(script, 'local zt = require "ztrain"\nlocal m = require("ztrain.model.hf").load(arg[1], ' ..
                       '{ tier = "host" })\nprint("digest " .. zt.digest.params(m))\n')
    local ck2 = util.summary_of("--nproc 2 recipes/zero3.lua train.steps=2 " .. C, 120)   -- the checkpoint's step
    assert.matches("digest " .. ck2.param_digest, util.sh(("build/ztrain --script %s %s"):format(script, ex)), 1, true)
    out, rc = util.sh(run .. "recipes/zero1.lua model.size=gpt2-tiny train.steps=6 resume=" .. dir ..
                      "/checkpoints " .. C:gsub("model.size=mistral%-tiny ", "") .. " out=" .. dir .. "/g")
    assert.are_not.equal(0, rc)
    assert.matches("holds a Llama-family model, this run's is GPT-2 (model.size or model=hf:DIR differ)", out, 1, true)
    -- the same shapes, another model: llama-tiny's RoPE and no window on mistral-tiny's checkpoint
    out, rc = util.sh(run .. "recipes/zero1.lua train.steps=6 resume=" .. dir .. "/checkpoints " ..
                      C:gsub("mistral%-tiny", "llama-tiny") .. " out=" .. dir .. "/l")
    assert.are_not.equal(0, rc)
    assert.matches("holds another Llama-family model than this run's: theta 10000 -> 500000, window 16 -> 0, " ..
                   "rope scaling factor nil -> 8", out, 1, true)
    os.remove(script); util.rm(dir); util.rm(ex)
  end)
end)
