-- Training across pipeline stages on real ranks: every synchronous schedule
-- gives the parameters and loss bits of one rank accumulating the same m
-- micro-batches (the tied embedding summed in one rank's order), and p x d
-- ranks give those of d data-parallel ranks accumulating m each.
local util = require "helpers.util"

local BASE = "model.size=gpt2-mini data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 " ..
             "train.eval_every=0 lr.warmup=1 optim.clip=0.05 -q"

-- after: overrides that come after BASE's
local function run(args, after)
  local dir = util.outdir()
  local out, rc = util.sh(("timeout 120 build/ztrain %s %s %s out=%s"):format(args, BASE, after or "", dir))
  assert.are.equal(0, rc, args .. "\n" .. out)
  local s, losses = util.summary(dir), {}
  for _, m in ipairs(util.metrics(dir)) do losses[#losses + 1] = m.loss_hex end
  util.rm(dir)
  return s.param_digest, table.concat(losses, " "), s
end

describe("pipeline training", function()
  it("2 stages (gpipe, 1f1b, zb_h1), 4 stages (1f1b), 2 ranks x 2 chunks (interleaved, zbv) equal one rank accumulating 8",
     function()
    local d0, l0 = run("recipes/single.lua batch.accumulate=8")
    for _, c in ipairs({ { 2, "gpipe" }, { 2, "1f1b" }, { 2, "zb_h1" }, { 4, "1f1b" }, { 2, "interleaved_1f1b", 2 },
                         { 2, "zbv", 2 } }) do
      local d, l, s = run(("--nproc %d recipes/single.lua batch.accumulate=8 pipeline.stages=%d " ..
                           "pipeline.chunks=%d schedule=%s"):format(c[1], c[1], c[3] or 1, c[2]))
      assert.are.equal(d0, d, c[2] .. " p=" .. c[1])
      assert.are.equal(l0, l, c[2] .. " p=" .. c[1] .. " loss bits")
      assert.are.equal("schedule", s.driver)
    end
  end)

  it("ZB-V on 4 ranks (8 stages of gpt2's 14 units in a V) equals one rank accumulating 8", function()
    -- gpt2's shape (12 layers, 12 heads, 1024 positions) at 192 channels
    -- instead of 768: the same 14 units in the same 8 stages by parameters
    -- (2,2,1,2,1,2,1,3), at a 15th of gpt2's parameters (65 s -> 4 s here)
    local recipe = os.tmpname() .. ".lua"
    util.write(recipe, [[
      require("ztrain.model.gpt2").sizes["gpt2-narrow"] = { L = 12, C = 192, NH = 12, maxT = 1024 }
      return dofile("recipes/single.lua")]])
    local more = "model.size=gpt2-narrow train.steps=2"
    local d0, l0, s0 = run(recipe .. " batch.accumulate=8", more)
    local d, l, s = run("--nproc 4 " .. recipe .. " batch.accumulate=8 pipeline.stages=4 pipeline.chunks=2 " ..
                        "schedule=zbv", more)
    os.remove(recipe)
    assert.are.same({ 12, 192, 12, 1024 }, { s0.model.layers, s0.model.channels, s0.model.heads, s0.model.context })
    assert.are.equal(d0, d)
    assert.are.equal(l0, l)
    assert.are.same({ 2, 2, 1, 2, 1, 2, 1, 3 }, s.pipeline.units)
  end)

  it("stages balanced by measured time train to the same bits", function()
    local d0, l0 = run("recipes/single.lua batch.accumulate=4")
    local d, l, s = run("--nproc 2 recipes/single.lua batch.accumulate=4 pipeline.stages=2 pipeline.split=time")
    assert.are.equal(d0, d)
    assert.are.equal(l0, l)
    assert.are.equal(6, s.pipeline.units[1] + s.pipeline.units[2])
    assert.is_table(s.pipeline.unit_seconds)
    assert.is_true(s.pipeline.unit_seconds.head > 0 and s.pipeline.unit_seconds.block > 0)
  end)

  -- PipeDream (asynchronous, weight stashing): no synchronous oracle, so
  -- one stage against one rank updating after every micro-batch, and on
  -- two stages the stash's promise checked from inside: each micro-batch's
  -- backward sees the very weights its forward saw, though the stage was
  -- updated in between
  it("pipedream on one stage equals one rank updating after every micro-batch", function()
    local fixed = " lr.schedule=constant lr.warmup=0 optim.clip=0"
    local d0 = run("recipes/single.lua batch.accumulate=1", "train.steps=12" .. fixed)
    local d1 = run("recipes/single.lua batch.accumulate=4 schedule=pipedream", "train.steps=3" .. fixed)
    assert.are.equal(d0, d1)
    local d2 = run("recipes/single.lua batch.accumulate=4 schedule=1f1b", "train.steps=3" .. fixed)
    assert.are_not.equal(d0, d2)
  end)

  it("pipedream on two stages: every backward runs on its forward's weights (the stash)", function()
    local recipe = os.tmpname() .. ".lua"
    local report = os.tmpname()
    util.write(recipe, ([[
      local zt = require "ztrain"
      local ops = require "ztrain.core.ops"
      local r = dofile("recipes/pipeline_pipedream.lua")
      local base = zt.strategy.single()
      local seen, stale = {}, 0
      local function sum(u) return ops.sum(u.params) end
      r.strategy = setmetatable({ name = "stash_probe",
        pre_forward = function(ctx, u, mb)
          if ctx.training then
            local s = seen[u.index] or { f = {}, b = 0 }; seen[u.index] = s
            s.f[#s.f + 1] = sum(u)
          end
          return base.pre_forward(ctx, u, mb)
        end,
        pre_backward = function(ctx, u, mb)
          local s = seen[u.index]
          s.b = s.b + 1
          local f, now = s.f[s.b], sum(u)
          if f ~= now then
            error(("unit %%s, micro-batch %%d of the run: backward on other weights than its forward (%%.17g vs %%.17g)")
                  :format(u.name, s.b - 1, f, now), 0)
          end
          -- a later forward already saw newer weights: this backward needed the stash
          if s.f[s.b + 1] and s.f[s.b + 1] ~= f then stale = stale + 1 end
          return base.pre_backward(ctx, u, mb)
        end,
        free = function(ctx)
          local f = assert(io.open("%s." .. ctx.rank, "w")); f:write(stale); f:close()
          return base.free(ctx)
        end }, { __index = base })
      return r]]):format(report))
    local d = run("--nproc 2 " .. recipe .. " batch.accumulate=4", "optim.clip=0")
    assert.is_string(d)
    -- stage 0 (warm-up 1) ran backwards on stashed weights; stage 1 never needs to
    assert.is_true(tonumber(util.read(report .. ".0")) > 0)
    assert.are.equal(0, tonumber(util.read(report .. ".1")))
    os.remove(recipe); os.remove(report .. ".0"); os.remove(report .. ".1")
  end)

  it("2 stages x 2 data-parallel replicas equal dp on 2 ranks, under dp and zero1", function()
    local d0, l0 = run("--nproc 2 recipes/dp.lua batch.accumulate=4")
    for _, strat in ipairs({ "dp", "zero1" }) do
      local d, l = run("--nproc 4 recipes/dp.lua batch.accumulate=4 pipeline.stages=2 strategy=" .. strat)
      assert.are.equal(d0, d, strat)
      assert.are.equal(l0, l, strat .. " loss bits")
    end
    local d, l = run("--nproc 4 recipes/dp.lua batch.accumulate=4 pipeline.stages=2 pipeline.chunks=2 strategy=zero1")
    assert.are.equal(d0, d, "interleaved x dp")
    assert.are.equal(l0, l)
  end)

  it("refuses what it cannot run, before any rank blocks", function()
    -- the cases are gathered, launched together and checked one by one: each
    -- is a few ranks that stop at their first check, then about a second in
    -- which mpirun ends the failed job (one after another: 25 s; together: 5)
    local cases = {}
    local function fails(args, msg) cases[#cases + 1] = { args = args, msg = msg } end
    fails("--nproc 4 recipes/single.lua pipeline.stages=3", "4 rank(s) do not divide into 3 pipeline stages")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 'pipeline.split={3,2}'",
          "pipeline.split must give 2 stage sizes adding up to the model's 6 units, got 2 sizes adding up to 5")
    fails("--nproc 2 recipes/zero3.lua pipeline.stages=2",
          "zero3 across pipeline stages is not supported yet")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 pipeline.chunks=4",
          "8 pipeline stages (pipeline.stages x pipeline.chunks) are more than gpt2-mini's 6 units")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 'pipeline.split={0,6}'",
          "pipeline.split[1] must be a whole number of units >= 1, got 0")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 pipeline.split=fast",
          'pipeline.split must be "params", "time" or a list of unit counts per stage, got fast')
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 pipeline.chunks=2 batch.accumulate=3",
          "interleaved_1f1b: microbatches (3) must be a multiple of the pipeline ranks (2)")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 schedule=zbv",
          "schedule zbv places two stages on each rank in a V: set pipeline.chunks = 2 (it is 1)")
    -- (before, the sequential driver's internal assertion at the first step)
    fails("--nproc 1 recipes/single.lua pipeline.chunks=2",
          "pipeline.chunks = 2 cuts the model into 2 stages on one rank, which only a schedule runs: set " ..
          "pipeline.stages > 1, a schedule (e.g. interleaved_1f1b), or pipeline.chunks = 1")
    fails("--nproc 2 recipes/pipeline_pipedream.lua optim.clip=1",
          "schedule pipedream updates each stage after every micro-batch, on its own")
    fails("--nproc 2 recipes/single.lua pipeline.stages=2 pipeline.placement=w",
          'pipeline.placement must be "" (the schedule\'s), "loop" or "v", got "w"')
    -- a user schedule that drops a micro-batch
    local drop = os.tmpname() .. ".lua"
    util.write(drop, [[
      local r = dofile("recipes/pipeline_1f1b.lua")
      local base = require("ztrain.parallel.schedule.library").one_f_one_b
      r.schedule = function(p)
        local lists = base(p)
        for _, l in ipairs(lists) do
          for i = #l, 1, -1 do if l[i].mb == 1 then table.remove(l, i) end end
        end
        return lists
      end
      return r]])
    fails(drop .. " batch.accumulate=2", "schedule: stage 0 micro-batch 1: forward missing")
    -- a user schedule whose stages wait for each other: refused before running
    local recipe = os.tmpname() .. ".lua"
    util.write(recipe, [[
      local r = dofile("recipes/pipeline_1f1b.lua")
      local A = require("ztrain.parallel.schedule").action
      r.schedule = function(p)
        return {
          { A("F", 0, 0), A("SEND_F", 0, 0), A("RECV_B", 0, 0), A("B", 0, 0), A("F", 0, 1), A("SEND_F", 0, 1),
            A("RECV_B", 0, 1), A("B", 0, 1), { op = "STEP" } },
          { A("RECV_F", 1, 0), A("F", 1, 0), A("RECV_F", 1, 1), A("F", 1, 1), A("B", 1, 0), A("SEND_B", 1, 0),
            A("B", 1, 1), A("SEND_B", 1, 1), { op = "STEP" } } }
      end
      return r]])
    fails(recipe .. " batch.accumulate=2", "the recipe's schedule would deadlock: rank 0 blocked at action 4 (0B0)")
    -- one that waits on the tied embedding: rank 0's W0 takes the head's part
    -- of micro-batch 0's wte gradient, which rank 1's W0 sends only after its
    -- F2, whose input rank 0 sends after that W0 (before, a hang)
    local tied = os.tmpname() .. ".lua"
    util.write(tied, [[
      local r = dofile("recipes/pipeline_1f1b.lua")
      local S = require("ztrain.parallel.schedule")
      local function parse(str)
        local l = {}
        for w in str:gmatch("%S+") do l[#l + 1] = S.parse(w) end
        return l
      end
      r.schedule = function(p)
        return { parse("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0F2 0SEND_F2 0RECV_B1 0I1 0W1 0RECV_B2 0I2 0W2 STEP"),
                 parse("1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1RECV_F2 1F2 1W0 1I2 1SEND_B2 1W1 1W2 STEP") }
      end
      return r]])
    fails(tied .. " batch.accumulate=3", "the recipe's schedule would deadlock: rank 0 blocked at action 7 (0W0) " ..
          "waiting for the tied embedding's gradient part of stage 1's weight pass of micro-batch 0")
    local logs, jobs = util.tmpdir(), {}
    for i, c in ipairs(cases) do
      jobs[i] = ("(ZTRAIN_MPI_LOG=%s/mpi%d timeout 60 build/ztrain %s %s out=%s > %s/%d 2>&1; echo \"rc=$?\" >> %s/%d) &")
                :format(logs, i, c.args, BASE, util.outdir(), logs, i, logs, i)
    end
    util.sh(table.concat(jobs, "\n") .. "\nwait")
    for i, c in ipairs(cases) do
      local out = util.read(("%s/%d"):format(logs, i))
      local rc = tonumber(out:match("rc=(%d+)%s*$"))
      assert.are_not.equal(0, rc, out)
      assert.are_not.equal(124, rc, "hung: " .. out)
      assert.matches(c.msg, out, 1, true)
      local f = io.open(("%s/mpi%d"):format(logs, i))        -- Open MPI's own text (job/launch.lua)
      local said = out .. (f and f:read("*a") or "")
      if f then f:close() end
      assert.is_nil(said:find("MPI_ABORT", 1, true), "every rank stops alike, no abort: " .. said)
    end
    assert.are.equal(14, #cases)
    os.remove(drop); os.remove(recipe); os.remove(tied); util.rm(logs)
  end)
end)
