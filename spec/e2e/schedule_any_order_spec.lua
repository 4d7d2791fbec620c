-- Any backward order, the same bits (issue 32, items 2 and 3): schedules
-- whose stages complete micro-batch gradients out of micro-batch order --
-- looped BFS (every stage in reverse) and DualPipe-V (in order per stage,
-- but on rank 0 the head's parts of the tied wte gradient of p micro-batches
-- open at once) -- train on real ranks with the digest of one rank
-- accumulating the same 4 micro-batches (the driver keeps each early
-- gradient, and each head part, in a buffer of its own until its turn:
-- driver/grad_order.lua). With that off, looped BFS and DualPipe-V give
-- other digests (checked by hand when it was written).
local util = require "spec.helpers.util"
local lib = require "ztrain.parallel.schedule.library"

local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=3 train.eval_every=0 " ..
             "data.tokenizer=bytes lr.warmup=1 batch.accumulate=4 -q 'data.text=docs/*.md'"

local function run(args)
  local s, out = util.summary_of(args .. " " .. BASE, 200)
  assert.is_truthy(s, out)
  return s
end
local function digest(args) return run(args).param_digest end

describe("any backward order gives one rank's digest", function()
  local want, want16, dir
  setup(function()
    dir = util.tmpdir()
    want = digest("recipes/single.lua")
    want16 = digest("recipes/single.lua precision=bf16")
  end)
  teardown(function() util.rm(dir) end)

  it("looped BFS at p=2 (v=1 and v=2) and p=4", function()
    local s = run("--nproc 2 recipes/pipeline_1f1b.lua schedule=looped_bfs")
    assert.are.equal(want, s.param_digest)
    -- rank 0's stage (embedding, block 0) kept 3 micro-batches' gradients: 2 units x 3 buffers
    assert.are.equal(6, s.pipeline.held_gradients.buffers)
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=looped_bfs pipeline.chunks=2"))
    assert.are.equal(want, digest("--nproc 4 --oversubscribe recipes/pipeline_1f1b.lua schedule=looped_bfs " ..
                                  "pipeline.stages=4"))
  end)

  it("looped BFS from PyTorch's compute-only CSV", function()
    local rows = {}
    for r, l in ipairs(lib.build("looped_bfs", { ranks = 2, microbatches = 4, chunks = 2 })) do
      local c = {}
      for _, a in ipairs(l) do
        if a.op == "F" or a.op == "B" then c[#c + 1] = ("%d%s%d"):format(a.stage, a.op, a.mb) end
      end
      rows[r] = table.concat(c, ",")
    end
    local path = dir .. "/looped_bfs.csv"
    util.write(path, table.concat(rows, "\r\n") .. "\r\n")
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua pipeline.chunks=2 schedule=csv:" .. path))
    local out, rc = util.sh("build/ztrain schedule show csv:" .. path .. " out=" .. dir .. "/s")
    assert.are.equal(0, rc, out)
    assert.matches("kept until their turn (micro-batch order) per stage: s0 3, s1 3, s2 3, s3 3", out, 1, true)
  end)

  -- GPT-2's tied embedding links the first stage's weight pass of a
  -- micro-batch to the last stage's (stages.lua's Tied, a blocking
  -- receive). Rank 1 here runs W1 after its take of micro-batch 2, and rank
  -- 0 runs W1 before it posts the receive of micro-batch 0's gradient: a
  -- driver waiting at that take for micro-batch 0's send would hang
  -- (parallel/schedule/sets.lua without the link did)
  it("a CSV with the last stage's weight passes late: no hang on the tied part, the same bits", function()
    local path = dir .. "/late_w.csv"
    util.write(path, "0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0F3,0SEND_F3,0RECV_B1,0I1,0W1,0RECV_B0,0I0,0W0," ..
                     "0RECV_B3,0I3,0W3,0RECV_B2,0I2,0W2\n" ..
                     "1RECV_F0,1F0,1RECV_F1,1F1,1RECV_F3,1F3,1I1,1SEND_B1,1I0,1SEND_B0,1W0,1I3,1SEND_B3,1W3," ..
                     "1RECV_F2,1F2,1I2,1SEND_B2,1W1,1W2\n")
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=csv:" .. path))
    -- rank 1 takes micro-batch 3's activations before 2's: MPI's tags keep
    -- them apart, NCCL (no tags) would hand micro-batch 2's to the receive
    -- of 3's: the launcher refuses it before any rank starts
    local out, rc = util.sh("build/ztrain --nproc 2 recipes/pipeline_1f1b.lua comm.backend=nccl device.backend=cuda " ..
                            "schedule=csv:" .. path .. " " .. BASE .. " out=" .. dir .. "/nccl")
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: schedule csv:" .. path .. ": comm.backend=nccl pairs the messages of a link by order, " ..
                   "not tag: rank 0's 3rd message of boundary 0 -> 1's activations is stage 0's output of micro-batch " ..
                   "2, its action 6 (0SEND_F2), but rank 1's 3rd receive of them takes stage 0's output of " ..
                   "micro-batch 3, its action 5 (1RECV_F3); reorder the receiving rank's list to take them in the order they are " ..
                   "sent, or run comm.backend=mpi (messages matched by tag)", out, 1, true)
    assert.is_nil(io.open(dir .. "/nccl/summary.json"))
  end)

  it("DualPipe-V at p=2, fp32 and bf16", function()
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=dualpipev pipeline.chunks=2"))
    assert.are.equal(want16, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=dualpipev pipeline.chunks=2 " ..
                                    "precision=bf16"))
  end)

  -- two pipeline ranks x two data-parallel ranks: the reduction's order is
  -- per micro-batch, so the reference is the in-order schedule (1F1B)
  it("looped BFS under dp and zero2 equals 1F1B's bits", function()
    for _, st in ipairs({ "dp", "zero2" }) do
      local a = digest("--nproc 4 --oversubscribe recipes/pipeline_dp.lua strategy=" .. st .. " schedule=1f1b")
      assert.are.equal(a, digest("--nproc 4 --oversubscribe recipes/pipeline_dp.lua strategy=" .. st ..
                                 " schedule=looped_bfs"), st)
    end
  end)
end)
