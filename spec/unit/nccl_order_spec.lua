-- Under comm.backend=nccl a pipeline's messages between two ranks pair by
-- the order they are issued, not by tag (runtime/comm_nccl.c):
-- parallel/schedule/nccl_order.lua refuses lists that MPI runs correctly
-- but NCCL would pair wrongly (same sizes: no error, wrong values), and the
-- launcher's checks (train/world_checks.lua) ask it before any rank starts.
local S = require "ztrain.parallel.schedule"
local P = require "ztrain.parallel.schedule.library"
local sim = require "ztrain.parallel.schedule.simulate"
local nccl = require "ztrain.parallel.schedule.nccl_order"
local world_checks = require "ztrain.train.world_checks"
local zt = require "ztrain"

local function parse(str)
  local l = {}
  for w in str:gmatch("%S+") do l[#l + 1] = S.parse(w) end
  return l
end

describe("nccl_order: messages received in the order they are sent", function()
  -- (over one communicator, ZB-V at every p and DualPipe-V from p = 3 would
  -- not pair: both chunks of a V cross between the same two ranks,
  -- interleaved differently on each side; a link per boundary and
  -- direction, driver/links.lua, keeps them apart)
  it("every built-in schedule pairs over the driver's links, tied or not", function()
    local n = 0
    for name in pairs(P.builtin) do
      for _, p in ipairs({ 2, 3, 4 }) do
        for _, m in ipairs({ 1, 2, 4, 8, 12 }) do
          for _, v in ipairs({ 1, 2 }) do
            local ok, lists = pcall(P.build, name, { ranks = p, microbatches = m, chunks = v })
            if ok then
              n = n + 1
              for _, tied in ipairs({ true, false }) do
                local good, err = nccl.check(lists, { tied = tied })
                assert.is_true(good, ("%s p=%d m=%d v=%d: %s"):format(name, p, m, v, tostring(err)))
              end
            end
          end
        end
      end
    end
    assert.is_true(n >= 120, "cases built: " .. n)
  end)

  it("a list MPI runs (tags) that receives micro-batch 3's activations before 2's is refused", function()
    local lists = {
      parse("0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0F3 0SEND_F3 0RECV_B0 0B0 0RECV_B1 0B1 0RECV_B2 0B2 " ..
            "0RECV_B3 0B3 STEP"),
      parse("1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F3 1RECV_F2 1F2 1B2 1SEND_B2 1F3 1B3 " ..
            "1SEND_B3 STEP") }
    assert(S.validate(lists, { stages = 2, microbatches = 4 }))
    assert.is_true(sim.run(lists, { posted = true, tied = true }).ok)
    local ok, err = nccl.check(lists, { tied = true })
    assert.is_nil(ok)
    assert.are.equal("comm.backend=nccl pairs the messages of a link by order, not tag: rank 0's 3rd message of " ..
                     "boundary 0 -> 1's activations is stage 0's output of micro-batch 2, its action 6 (0SEND_F2), but " ..
                     "rank 1's 3rd receive of them takes stage 0's output of micro-batch 3, its action 9 (1RECV_F3); " ..
                     "reorder the " ..
                     "receiving rank's list to take them in the order they are sent, or run comm.backend=mpi " ..
                     "(messages matched by tag)", err)
  end)

  -- the head's parts of the embedding's gradient leave in the last stage's
  -- weight-pass order and are taken in the first stage's
  it("a list whose activations and gradients pair but whose tied parts do not: refused when tied only", function()
    local lists = {
      parse("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 STEP"),
      parse("1RECV_F0 1F0 1RECV_F1 1F1 1I0 1SEND_B0 1I1 1SEND_B1 1W1 1W0 STEP") }
    assert(S.validate(lists, { stages = 2, microbatches = 2 }))
    assert.is_true(sim.run(lists, { posted = true, tied = true }).ok)
    assert.is_true(nccl.check(lists, { tied = false }))
    local ok, err = nccl.check(lists, { tied = true })
    assert.is_nil(ok)
    assert.matches("comm.backend=nccl pairs the tied embedding's parts by order, not tag: rank 1's 1st part sent " ..
                   "is the head's part of the embedding's gradient of micro-batch 1 (at 1W1), but rank 0's 1st take " ..
                   "(action 6, 0B0) is micro-batch 0's", err, 1, true)
  end)

  it("the launcher's checks ask it under nccl only: a recipe's CSV out of order refused, the built-ins not", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    local csv = dir .. "/crossed.csv"
    -- PyTorch's compute-and-comms CSV: rank 1 posts micro-batch 1's activations' receive first
    local f = assert(io.open(csv, "w"))
    f:write("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n")
    f:write("1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n")
    f:close()
    local function check(path, over)
      local r = assert(zt.recipe.load(path, over))
      return world_checks.check(r, 2)
    end
    local NCCL = { "comm.backend=nccl", "device.backend=cuda" }
    local function with(t, x) local o = { x } for _, v in ipairs(t) do o[#o + 1] = v end return o end
    local ok, err = check("recipes/pipeline_1f1b.lua", with(with(NCCL, "batch.accumulate=2"), "schedule=csv:" .. csv))
    os.remove(csv); os.remove(dir)
    assert.is_nil(ok)
    assert.matches("^schedule csv:.*crossed%.csv: comm%.backend=nccl pairs the messages of a link by order", err)
    for _, rec in ipairs({ "pipeline_1f1b", "pipeline_zbv", "pipeline_interleaved", "pipeline_dp" }) do
      assert.is_true(check("recipes/" .. rec .. ".lua", NCCL), rec)
    end
  end)
end)
