-- The memory planner (plan.lua) against real runs: its predictions against
-- the peaks they measure (summary.json), the pre-flight check that refuses a
-- run before it allocates, and the `ztrain plan` command. (The planner's
-- rows called directly -- gpt2-xl against the ZeRO formulas, the step-time
-- column: unit/plan_rows_spec.lua.)
--
-- Tolerances, from the measurements below (gpt2-tiny, 1 step):
--   fp32: every tier and category exact (model state, activations, working
--         buffers), and the device peak equal to the predicted total;
--   bf16: model state and activations exact, with the bf16 GEMMs or
--         without (then precision.lua's fp32 work buffers); working
--         buffers exact but dp's widened gradients in flight (timing);
--   runs of the schedule driver (pipelines, a schedule on one stage):
--         every rank exact in every category (plan/pipeline.lua), bf16
--         with the bf16 GEMMs included.
local util = require "helpers.util"
local zt = require "ztrain"
local plan = require "ztrain.plan"

local TIERS, CATS = zt.memory.tiers, zt.memory.categories
local ONE_STEP = "train.steps=1 train.eval_every=0 train.eval_batches=0 -q"

-- run(nproc, recipe, overrides) -> summary, the resolved recipe (same overrides)
local function run(nproc, recipe, over)
  local dir = util.outdir()
  local launch = nproc > 1 and ("--nproc " .. nproc .. " ") or ""
  local out, rc = util.sh(("timeout 120 build/ztrain %s%s %s %s out=%s"):format(launch, recipe, over, ONE_STEP, dir))
  assert.are.equal(0, rc, out)
  local s = util.summary(dir)
  util.rm(dir)
  local list = {}
  for kv in over:gmatch("%S+") do list[#list + 1] = kv end
  return s, assert(zt.recipe.load(recipe, list))
end

-- measured - predicted, as "tier category: predicted P, measured M" lines
local function differences(t, m, cats_exact)
  local bad = {}
  for _, tier in ipairs(TIERS) do
    for _, c in ipairs(CATS) do
      local got, want = m.by_category[c][tier], t[tier][c]
      if cats_exact[c] and got ~= want then
        bad[#bad + 1] = ("%s %s: predicted %d, measured %d"):format(tier, c, want, got)
      end
    end
  end
  return bad
end

describe("plan: predicted against measured peaks", function()
  local ALL = {}
  for _, c in ipairs(CATS) do ALL[c] = true end
  local cases = {
    { "single", 1, "recipes/single.lua", "batch.micro=8" },
    { "dp 2", 2, "recipes/dp.lua", "" },
    { "zero2 2", 2, "recipes/zero2.lua", "" },
    { "zero3 2", 2, "recipes/zero3.lua", "" },
    { "zero3_offload 2", 2, "recipes/zero3_offload.lua", "sample.tokens=0" },
    { "zero3 2, gpt2-mini", 2, "recipes/zero3.lua", "model.size=gpt2-mini batch.micro=2" },
    { "zero3_infinity 2, gpt2-mini (nvme)", 2, "recipes/infinity.lua", "batch.micro=2" },
    { "single, checkpointed activations on the host", 1, "recipes/single.lua",
      "train.checkpoint_activations=true train.checkpoint_host=true" },
    -- the Llama family (issue 33's "sizes the planner knows"): its own
    -- saved tensors, scratch and RoPE tables; tied (qwen) and untied heads
    { "single, llama-tiny", 1, "recipes/single.lua", "model.size=llama-tiny data.tokenizer=bytes" },
    { "zero3 2, qwen-tiny", 2, "recipes/zero3.lua", "model.size=qwen-tiny data.tokenizer=bytes" },
    { "zero3_offload 2, qwen-tiny", 2, "recipes/zero3_offload.lua",
      "model.size=qwen-tiny data.tokenizer=bytes sample.tokens=0" },
  }
  -- the plan is rank 0's (the heaviest: it samples); the others hold no more
  local function check(case, exact)
    local s, r = run(case[2], case[3], case[4])
    local t = plan.predict(r, { nproc = case[2] })
    for _, m in ipairs(s.memory) do
      if m.rank == 0 then
        assert.are.same({}, differences(t, m, exact))
        if exact == ALL then assert.are.equal(plan.totals(t).device, m.device_peak, "device peak") end
      else
        assert.is_true(m.device_peak <= plan.totals(t).device, "rank " .. m.rank)
      end
    end
    return s.memory[1], t
  end
  for _, case in ipairs(cases) do
    it(case[1] .. ": every tier and category exact (fp32)", function() check(case, ALL) end)
  end

  it("zero3_offload 2 (samples at the end): exact but the sample's activations, within 0.1% above", function()
    -- recipes/zero3_offload.lua samples 40 tokens: a full fp32 copy of the
    -- model ("other", exact) and the generation cache and rows (activations)
    local m, t = check({ "", 2, "recipes/zero3_offload.lua", "" },
                       { params = true, grads = true, optim = true, comm = true, other = true })
    assert.is_true(m.by_category.other.device > 0, "the sample's model copy")
    local got, want = m.by_category.activations.device, t.device.activations
    assert.is_true(want >= got and want <= 1.001 * got, ("activations predicted %d, measured %d"):format(want, got))
  end)

  it("zero2, zero3 and zero3_offload 2, untied heads: exact but the working buffers, within 10% below", function()
    -- the bound counts the embedding's gathered unit and bucket beside the
    -- head's; an untied head never reads the embedding, so whether its
    -- buffers are alive at the peak depends on when the gathers complete
    -- (measured: the bound, or one embedding's bytes less)
    for _, c in ipairs({ { "recipes/zero2.lua", "model.size=llama-tiny data.tokenizer=bytes" },
                         { "recipes/zero3.lua", "model.size=llama-tiny data.tokenizer=bytes" },
                         { "recipes/zero3_offload.lua", "model.size=mistral-tiny data.tokenizer=bytes sample.tokens=0" } }) do
      local s, r = run(2, c[1], c[2])
      local t = plan.predict(r, { nproc = 2 })
      local m = s.memory[1]
      assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, activations = true,
                                              other = true }))
      local got, want = m.by_category.comm.device, t.device.comm
      assert.is_true(got <= want and got >= 0.9 * want, ("%s comm predicted %d, measured %d"):format(c[2], want, got))
    end
  end)

  -- (single: one micro-batch, so no fp32 accumulator: the norm and AdamW
  -- read the stored bf16 gradients)
  -- (without the bf16 GEMMs the activations hold precision.lua's fp32 work
  -- buffers, two slots of the largest units' sizes: unpredicted until they
  -- were, 10-13% of the activations)
  it("bf16 on one rank, gpt2-tiny with and without the bf16 GEMMs, llama-tiny with them: exact", function()
    for _, over in ipairs({ "model.size=gpt2-tiny precision=bf16 device.bf16_gemm=off",
                            "model.size=gpt2-tiny precision=bf16 device.bf16_gemm=on",
                            "model.size=llama-tiny data.tokenizer=bytes precision=bf16 device.bf16_gemm=on" }) do
      local s, r = run(1, "recipes/single.lua", over)
      local t = plan.predict(r, { nproc = 1 })
      assert.are.same({}, differences(t, s.memory[1], ALL), over)
    end
  end)

  it("zero1 2, accumulating: model state and activations exact, working buffers within 15% below the bound", function()
    -- how many reduction buffers are alive at once depends on when the
    -- reductions complete: the plan gives the upper bound
    local s, r = run(2, "recipes/zero1.lua", "batch.accumulate=2")
    local t = plan.predict(r, { nproc = 2 })
    local m = s.memory[1]
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, activations = true }))
    local got, want = m.by_category.comm.device, t.device.comm
    assert.is_true(got <= want and got >= 0.85 * want, ("comm predicted %d, measured %d"):format(want, got))
  end)

  -- pipelines: the plan is the heaviest stage's rank (here the last: the
  -- tied embedding's replica, the head)
  local function heaviest(s)
    local m = s.memory[1]
    for _, x in ipairs(s.memory) do if x.device_peak > m.device_peak then m = x end end
    return m
  end

  -- every rank of a run the schedule driver executes against its own
  -- prediction (plan.predict's third value: pipeline rank floor(w / N))
  local function every_rank(s, r, nproc, cats)
    local _, _, ranks = plan.predict(r, { nproc = nproc })
    assert.are.equal(nproc, #s.memory, "every rank's peaks")
    local N = nproc / math.max(r.pipeline.stages, 1)
    for _, m in ipairs(s.memory) do
      local t = ranks[math.floor(m.rank / N) + 1]
      assert.are.same({}, differences(t, m, cats), "rank " .. m.rank)
    end
    return ranks
  end

  -- (the tied gradient's sends: as many buffers as parallel/schedule/sets.lua
  -- keeps, 3 for GPipe at p=2, m=8, 2 for 1F1B; before they were reused
  -- when seen sent, 1 to 8 by timing)
  it("pipelines GPipe and 1F1B, 2 stages: every rank exact, the tied gradient's sends too", function()
    for _, c in ipairs({ { "recipes/pipeline_gpipe.lua", 3 }, { "recipes/pipeline_1f1b.lua", 2 } }) do
      local s, r = run(2, c[1], "")
      every_rank(s, r, 2, ALL)
      -- the plan adds each category's peak: the device's peak is that sum,
      -- less the first exchanges' 4-byte buffer where it alone made the
      -- comm peak (freed at build, before the step's peak)
      local over = plan.totals(plan.predict(r, { nproc = 2 })).device - heaviest(s).device_peak
      assert.is_true(over == 0 or over == 4, c[1] .. ": total predicted less the measured peak " .. over)
      local last                                   -- the head's rank (for 1F1B not the heaviest)
      for _, x in ipairs(s.memory) do if x.rank == 1 then last = x end end
      assert.are.equal(c[2] * 4 * 256 * 128, last.by_category.comm.device, c[1] .. ": the tied parts' buffers")
    end
  end)

  -- what each case adds to the planner (plan/pipeline.lua), every one of
  -- them seen wrong before it was modelled:
  --  * dualpipev, qwen-tiny bf16: two stages a rank in a V, the split
  --    backward's W records (bf16), the head's wte parts kept apart on rank
  --    0, the RoPE table once a rank, the tied replica's fp32 start-up copy;
  --  * interleaved, every 2nd block checkpointed: a stage recomputes only
  --    with checkpointed blocks of its own;
  --  * PipeDream: the stashed weights;
  --  * pipeline_dp under zero2 with batch.global: ZeRO over each stage's
  --    data-parallel group, the accumulation the trainer derives;
  --  * zb_h1 on one stage under zero2, accumulating: a schedule without a
  --    pipeline, and the tied head taking the embedding's next bucket.
  it("every pipeline the schedule driver runs (chunks, V, I/W, stash, data-parallel stages, one stage): " ..
     "every rank exact", function()
    local cases = {
      { 2, "recipes/pipeline_zbv.lua", "schedule=dualpipev model.size=qwen-tiny data.tokenizer=bytes precision=bf16 " ..
                                       "device.bf16_gemm=on" },
      { 2, "recipes/pipeline_interleaved.lua", "train.checkpoint_activations=2" },
      { 2, "recipes/pipeline_pipedream.lua", "" },
      { 4, "recipes/pipeline_dp.lua", "strategy=zero2 batch.global=32 batch.accumulate=1" },
      { 2, "recipes/zero2.lua", "schedule=zb_h1 batch.accumulate=4" },
    }
    for _, c in ipairs(cases) do
      local s, r = run(c[1], c[2], c[3])
      every_rank(s, r, c[1], ALL)
    end
  end)

  -- looped BFS completes every stage's gradients in reverse: they reach
  -- zero2 in bursts, a unit's micro-batches one after another, and how many
  -- buckets of a size are out at once follows its reductions' completion:
  -- the plan bounds them (three of each size), measured 90-100% of it
  it("zero2 under looped BFS, 2 stages x 2 replicas: every rank exact but the buckets, at most the bound", function()
    local s, r = run(4, "recipes/pipeline_dp.lua", "strategy=zero2 schedule=looped_bfs pipeline.chunks=2")
    local cats = {}
    for c in pairs(ALL) do cats[c] = c ~= "comm" end
    local ranks = every_rank(s, r, 4, cats)
    for _, m in ipairs(s.memory) do
      local got, want = m.by_category.comm.device, ranks[math.floor(m.rank / 2) + 1].device.comm
      assert.is_true(got <= want and got >= 0.85 * want, ("rank %d comm predicted %d, measured %d"):format(m.rank,
                     want, got))
    end
  end)

  -- the Llama family with bf16 GEMMs: an untied head's stage keeps no
  -- replica of the embedding; each stage accumulates its bf16 gradients
  -- into fp32 as it reads them (no widening buffer); dp on one rank widens
  -- through its pool
  -- (1F1B's activations exact: the sets a stage holds are fixed from the
  -- lists, parallel/schedule/sets.lua; before, a gradient's send still out
  -- made the last stage hold 2 or 3 sets, by timing)
  it("llama-tiny in bf16: 1F1B on 2 ranks and dp on 1 rank exact", function()
    local L = "model.size=llama-tiny data.tokenizer=bytes precision=bf16 device.bf16_gemm=on"
    for _, c in ipairs({ { 2, "recipes/pipeline_1f1b.lua", L, "pipeline_1f1b" },
                         { 1, "recipes/dp.lua", L .. " launch.nproc=1" } }) do
      local s, r = run(c[1], c[2], c[3])
      local t = plan.predict(r, { nproc = c[1] })
      local m = c[4] and heaviest(s) or s.memory[1]
      assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, comm = true, other = true }))
      assert.are.equal(t.device.activations, m.by_category.activations.device, c[2] .. " activations")
    end
  end)

  -- a strategy without full parameters samples from a full fp32 copy, with
  -- its own RoPE table of the sample's positions: what 80 more sampled
  -- positions add (KV cache and table) is predicted to the byte
  it("qwen-tiny zero3 2 sampling 20 and 100 tokens: the sample's growth exact, activations within 0.1% above",
     function()
    local got, want = {}, {}
    for i, n in ipairs({ 20, 100 }) do
      local s, r = run(2, "recipes/zero3.lua", "model.size=qwen-tiny data.tokenizer=bytes sample.tokens=" .. n)
      local t = plan.predict(r, { nproc = 2 })
      local m = s.memory[1]
      assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, comm = true, other = true }))
      assert.is_true(m.by_category.other.device > 0, "the sample's model copy")
      got[i], want[i] = m.by_category.activations.device, t.device.activations
      assert.is_true(want[i] >= got[i] and want[i] <= 1.001 * got[i],
                     ("activations predicted %d, measured %d"):format(want[i], got[i]))
    end
    assert.are.equal(got[2] - got[1], want[2] - want[1], "80 more sampled positions")
  end)

  -- checkpointed blocks are every k-th block of the model, counted over all
  -- its units (the trainer's rule): the second stage (blocks 1-3 and the
  -- head) checkpoints block 2 only; counting from the stage's own first block
  -- would say blocks 1 and 3
  it("pipeline GPipe 2 stages, every 2nd block checkpointed, uneven split: every rank exact", function()
    local s, r = run(2, "recipes/pipeline_gpipe.lua",
                     "model.size=gpt2-mini batch.micro=2 train.checkpoint_activations=2 pipeline.split={2,4}")
    every_rank(s, r, 2, ALL)
  end)

  it("bf16 (dp 2): model state and activations exact, working buffers at most the predicted peak", function()
    local s, r = run(2, "recipes/dp.lua", "precision=bf16 device.bf16_gemm=off")
    local t = plan.predict(r, { nproc = 2 })
    local m = s.memory[1]
    assert.are.same({}, differences(t, m, { params = true, grads = true, optim = true, other = true }))
    -- bf16's gradient buckets (fp32 reduction buffers) overlap as timing
    -- allows: the plan is their peak when all are in flight; a loaded
    -- machine measured 86% of it (600320 of 698624 bytes), an idle one 100%
    local gc, wc = m.by_category.comm.device, t.device.comm
    assert.is_true(gc <= wc and gc >= 0.75 * wc, ("comm predicted %d, measured %d"):format(wc, gc))
    assert.are.equal(t.device.activations, m.by_category.activations.device, "activations")
  end)
end)

describe("plan: the pre-flight check", function()
  it("refuses an oversized run before allocating, naming the bytes per category and what to try", function()
    -- (how soon it comes: tools/bench_timings.lua, make bench)
    local out, rc = util.sh("timeout 60 build/ztrain recipes/single.lua model.size=gpt2-xl " ..
                            "device.memory_limit=16GiB train.steps=1 -q out=" .. util.outdir())
    assert.are.equal(1, rc, out)
    for _, want in ipairs({ "device memory limit exceeded (predicted before the run): gpt2-xl under single needs",
                            "params 5.50 GiB", "grads 5.50 GiB", "optim 11.01 GiB", "activations ",
                            "over device.memory_limit = 16.00 GiB", "try strategy=zero3_offload",
                            "ztrain plan recipes/single.lua nproc=1" }) do
      assert.matches(want, out, 1, true)
    end
  end)

  it("refuses a run over the machine's available memory without a limit", function()
    local r = assert(zt.recipe.load("recipes/single.lua", { "model.size=gpt2-xl" }))
    local t = plan.totals(plan.predict(r, { nproc = 1 }))
    local avail = plan.available()
    if not avail or t.device + t.host <= avail then
      pending("this machine has room for gpt2-xl on one rank")
      return
    end
    local out, rc = util.sh("timeout 60 build/ztrain recipes/single.lua model.size=gpt2-xl train.steps=1 -q out=" ..
                            util.outdir())
    assert.are.equal(1, rc, out)
    assert.matches("not enough memory (predicted before the run)", out, 1, true)
    assert.matches("MemAvailable", out, 1, true)
  end)

  it("lets a run at its predicted peak through, and refuses it one byte below", function()
    local r = assert(zt.recipe.load("recipes/zero3.lua", { "model.size=gpt2-mini", "batch.micro=2" }))
    local peak = plan.totals(plan.predict(r, { nproc = 2 })).device
    local base = "--nproc 2 recipes/zero3.lua model.size=gpt2-mini batch.micro=2 " .. ONE_STEP
    local out, rc = util.sh(("timeout 120 build/ztrain %s device.memory_limit=%d out=%s"):format(base, peak,
                                                                                               util.outdir()))
    assert.are.equal(0, rc, out)
    local out2, rc2 = util.sh(("timeout 120 build/ztrain %s device.memory_limit=%d out=%s"):format(base, peak - 1,
                                                                                                 util.outdir()))
    assert.are.equal(1, rc2, out2)
    assert.matches("device memory limit exceeded (predicted before the run): gpt2-mini under zero3", out2, 1, true)
  end)

  -- (pipelines were checked on model state only before plan/pipeline.lua)
  it("a pipeline with data-parallel stages: refused over a limit with the strategies that fit it, and let " ..
     "through at its predicted peak", function()
    local base = "--nproc 4 recipes/pipeline_dp.lua " .. ONE_STEP
    local peaks = {}
    for _, st in ipairs({ "dp", "zero1", "zero2" }) do
      local r = assert(zt.recipe.load("recipes/pipeline_dp.lua", { "strategy=" .. st }))
      peaks[st] = plan.totals(plan.predict(r, { nproc = 4 })).device
    end
    assert.is_true(peaks.zero1 < peaks.dp, "zero1 shards each stage's optimizer state over its 2 replicas")
    local out, rc = util.sh(("timeout 120 build/ztrain %s strategy=dp device.memory_limit=%d out=%s")
                            :format(base, peaks.dp - 1, util.outdir()))
    assert.are.equal(1, rc, out)
    assert.matches("device memory limit exceeded (predicted before the run): gpt2-mini under dp, 2 pipeline " ..
                   "stages (the heaviest rank) needs " .. zt.memory.format(peaks.dp), out, 1, true)
    assert.matches(("try strategy=zero1 (%s), strategy=zero2 (%s), use more pipeline.stages")
                   :format(zt.memory.format(peaks.zero1), zt.memory.format(peaks.zero2)), out, 1, true)
    local out2, rc2 = util.sh(("timeout 120 build/ztrain %s device.memory_limit=%d out=%s")
                              :format(base, peaks.zero1, util.outdir()))
    assert.are.equal(0, rc2, out2)
  end)
end)

describe("plan: the `ztrain plan` command", function()
  it("`ztrain plan` prints the table", function()
    local out, rc = util.sh("build/ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB precision=bf16")
    assert.are.equal(0, rc, out)
    assert.matches("gpt2-xl: 1557.6M parameters", out, 1, true)
    assert.matches("zero3_offload", out, 1, true)
    assert.matches("fastest to try: ", out, 1, true)
    local bad, rc2 = util.sh("build/ztrain plan nproc=0")
    assert.are.equal(1, rc2)
    assert.matches("nproc=0 must be a whole number >= 1", bad, 1, true)
  end)

  it("`ztrain plan` of a pipeline recipe prints its own row first, the run as asked for", function()
    local out, rc = util.sh("build/ztrain plan recipes/pipeline_zbv.lua")
    assert.are.equal(0, rc, out)
    local r = assert(zt.recipe.load("recipes/pipeline_zbv.lua", {}))
    local t = plan.totals(plan.predict(r, { nproc = 2 }))
    local first = out:match("\nstrategy[^\n]*\n([^\n]*)\n")
    assert.matches("^recipe%+ +2 +" .. zt.memory.format(t.device):gsub("%.", "%%."), first)
    assert.matches("+ recipe: the run as asked for, single over 1 data-parallel rank(s) x 2 pipeline stages x 2 " ..
                   "chunk(s), schedule zbv: its heaviest rank", out, 1, true)
  end)

  it("`ztrain plan` prints the columns and the hardware; bad flags are named", function()
    local out, rc = util.sh("build/ztrain plan model.size=gpt2-xl --hosts 2 --gpus-per-host 4 --link=10gbit " ..
                            "--latency 1ms precision=bf16 device.memory_limit=80GiB")
    assert.are.equal(0, rc, out)
    assert.matches("step +tokens/s", out)
    assert.matches("8 rank(s)", out, 1, true)
    assert.matches("on 2 host(s) x 4 rank(s)", out, 1, true)
    assert.matches("links 10 Gbit/s across hosts (1 ms a message)", out, 1, true)
    assert.matches("quickest by the step-time model: ", out, 1, true)
    for cmd, want in pairs({ ["--hosts 3 nproc=8"] = "nproc=8 ranks cannot be laid out as 3 host(s)",
                             ["--link fast"] = "--link: fast is not a link rate",
                             ["--mfu 2"] = "--mfu 2 must be a fraction in (0, 1]",
                             ["--latency"] = "--latency needs a value",
                             ["--speed 1"] = "unknown flag --speed" }) do
      local bad, brc = util.sh("build/ztrain plan " .. cmd)
      assert.are.equal(1, brc, bad)
      assert.matches(want, bad, 1, true)
    end
  end)
end)

describe("plan: rank counts it cannot plan for", function()
  -- plan(args) -> output, exit code; timeout: inf once planned without end
  local function plan_cmd(args) return util.sh("timeout 30 build/ztrain plan " .. args) end

  it("refuses inf, 1e300 and past-the-bound nproc, --hosts and --gpus-per-host, naming them and the range", function()
    for args, want in pairs({
      ["model.size=gpt2-tiny nproc=inf"] = "plan: nproc=inf must be a whole number >= 1 and at most 1048576",
      ["model.size=gpt2-tiny nproc=1e300"] = "plan: nproc=1e300 must be a whole number >= 1 and at most 1048576",
      ["model.size=gpt2-tiny nproc=2.5"] = "plan: nproc=2.5 must be a whole number >= 1 and at most 1048576",
      ["model.size=gpt2-tiny --hosts inf --gpus-per-host 8"] = "plan: --hosts inf must be a whole number >= 1 " ..
                                                              "and at most 1048576",
      ["model.size=gpt2 --hosts 2000 --gpus-per-host 1000"] = "plan: --hosts 2000 x --gpus-per-host 1000 = " ..
        "2000000 ranks: the ranks to plan for must be a whole number from 1 to 1048576",
      ["model.size=gpt2 --mfu nan"] = "plan: --mfu nan must be a fraction in (0, 1]",
      ["model.size=gpt2 --flops 1e999"] = "plan: --flops 1e999 is not a finite number",
    }) do
      local out, rc = plan_cmd(args)
      assert.are.equal(1, rc, args .. "\n" .. out)
      assert.matches(want, out, 1, true)
      assert.is_nil(out:find("%.lua:%d+"), out)
      assert.is_true(#out < 1000, out)
    end
  end)

  it("more ranks than the model's units: the rows but pipeline_1f1b (one stage a rank), not a refusal", function()
    -- (before: refused with a pipeline's message about p and v)
    local out, rc = plan_cmd("model.size=gpt2 nproc=16")
    assert.are.equal(0, rc, out)
    assert.matches("zero3", out, 1, true)
    assert.is_nil(out:find("pipeline_1f1b", 1, true), out)
    out, rc = plan_cmd("model.size=gpt2 nproc=2048")
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("pipeline_1f1b", 1, true), out)
    -- this machine's memory is shared by a host's ranks (the layout's 8), not by all 2048
    assert.matches("over 8 local rank(s)", out, 1, true)
    assert.matches("fits: single, dp, zero1", out, 1, true)
    -- up to one unit a rank it is there (gpt2: embedding, 12 blocks, head)
    out, rc = plan_cmd("model.size=gpt2 nproc=14")
    assert.are.equal(0, rc, out)
    assert.matches("pipeline_1f1b", out, 1, true)
    -- a pipeline recipe's rows use its own stages: more ranks than units are fine
    out, rc = plan_cmd("recipes/pipeline_dp.lua nproc=64")
    assert.are.equal(0, rc, out)
  end)
end)
