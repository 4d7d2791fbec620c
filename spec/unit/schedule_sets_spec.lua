-- When the schedule driver gives activation sets back (parallel/schedule/sets.lua),
-- against what owes nothing to it: 1F1B's published bound (stage s holds
-- min(p - s, m) micro-batches), the simulator's count of micro-batches in
-- flight (a set per micro-batch between its F and its backward: no fewer
-- can be held), and the simulator's makespan without any wait (the waits
-- must cost none). The driver against the plan on real ranks, with a peer
-- taking its messages late: spec/e2e/driver_spec.lua.
local S = require "ztrain.parallel.schedule"
local P = require "ztrain.parallel.schedule.library"
local sim = require "ztrain.parallel.schedule.simulate"
local sets = require "ztrain.parallel.schedule.sets"

local A = S.action

local function cases(name)
  local out = {}
  for _, p in ipairs({ 2, 4 }) do
    for _, m in ipairs({ p, 2 * p, 8, 3 }) do
      local vs = (name == "interleaved_1f1b" or name == "looped_bfs") and { 1, 2 } or
                 (name == "zbv" or name == "dualpipev") and { 2 } or { 1 }
      for _, v in ipairs(vs) do
        if (name ~= "interleaved_1f1b" or m % p == 0) and (name ~= "dualpipev" or m >= 2 * p) then
          out[#out + 1] = { p = p, m = m, v = v }
        end
      end
    end
  end
  return out
end

local NAMES = { "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb_h1", "zbv", "dualpipev", "pipedream" }

describe("schedule sets: where the driver gives activation sets back", function()
  it("1F1B: stage s holds min(p - s, m) sets, a set with its gradient's send out included", function()
    for _, c in ipairs(cases("1f1b")) do
      local plan = sets.plan(P.build("1f1b", { ranks = c.p, microbatches = c.m, chunks = 1 }))
      for s = 0, c.p - 1 do
        assert.are.equal(math.min(c.p - s, c.m), plan.peak[s], ("p=%d m=%d stage %d"):format(c.p, c.m, s))
      end
    end
  end)

  for _, name in ipairs(NAMES) do
    it(name .. ": the waits deadlock nothing, cost no simulated time, and hold no fewer than are in flight", function()
      for _, c in ipairs(cases(name)) do
        local what = ("%s p=%d m=%d v=%d"):format(name, c.p, c.m, c.v)
        local lists = P.build(name, { ranks = c.p, microbatches = c.m, chunks = c.v })
        local plan = sets.plan(lists)
        local nwaits = 0
        for _, r in ipairs(plan.waits) do for _ in pairs(r) do nwaits = nwaits + 1 end end
        assert.is_true(nwaits > 0, what .. ": no release waits at all")
        for _, lat in ipairs({ 0, 0.25, 1 }) do
          for _, times in ipairs({ {}, { F = 1, B = 3, I = 1.5, W = 1.5 } }) do
            local free = sim.run(lists, { posted = true, latency = lat, times = times })
            local held = sim.run(lists, { posted = true, latency = lat, times = times, waits = plan.waits })
            assert.is_true(held.ok, what .. ": " .. tostring(held.deadlock))
            assert.are.equal(free.makespan, held.makespan, ("%s latency %g"):format(what, lat))
          end
        end
        local flight = sim.run(lists).peak
        for s, n in pairs(flight) do
          assert.is_true(plan.peak[s] >= n, ("%s stage %d: %d sets for %d in flight"):format(what, s, plan.peak[s], n))
        end
      end
    end)
  end

  it("moves a wait that would deadlock on to the stage's next take, and to STEP", function()
    -- rank 0 takes the gradients last first: rank 1 waiting for micro-batch
    -- 0's send before its next forward would never see it taken
    local m, l0, l1 = 3, {}, {}
    for i = 0, m - 1 do
      l0[#l0 + 1] = A("F", 0, i); l0[#l0 + 1] = A("SEND_F", 0, i)
      l1[#l1 + 1] = A("RECV_F", 1, i); l1[#l1 + 1] = A("F", 1, i)
      l1[#l1 + 1] = A("B", 1, i); l1[#l1 + 1] = A("SEND_B", 1, i)
    end
    for i = m - 1, 0, -1 do l0[#l0 + 1] = A("RECV_B", 0, i); l0[#l0 + 1] = A("B", 0, i) end
    l0[#l0 + 1] = { op = "STEP" }; l1[#l1 + 1] = { op = "STEP" }
    local lists = { l0, l1 }
    assert(S.validate(lists, { stages = 2, microbatches = m }))
    -- the first take after micro-batch 0's retire (1RECV_F1, index 5) waiting for it deadlocks
    local greedy = sim.run(lists, { posted = true, waits = { {}, { [5] = { "B0:0" } } } })
    assert.is_false(greedy.ok)
    assert.matches("rank 1 blocked at action 5 (1RECV_F1) waiting for the receive of B0:0 to be posted",
                   greedy.deadlock, 1, true)
    local plan = sets.plan(lists)
    assert.are.equal(m, plan.peak[1])
    local step = #l1
    assert.are.same({ sets.key(1, 0), sets.key(1, 1), sets.key(1, 2) }, plan.release[2][step])
    assert.is_true(sim.run(lists, { posted = true, waits = plan.waits }).ok)
  end)

  -- GPT-2's tied embedding: the first stage's weight pass of a micro-batch
  -- takes the head's part of the wte gradient from the last stage's weight
  -- pass of it (a blocking receive, stages.lua's Tied). Here rank 1 delays
  -- W1 past its take of micro-batch 2; rank 0 runs W1 before it posts the
  -- receive of micro-batch 0's gradient: waiting at that take for
  -- micro-batch 0's send would hang (a list found by a reviewer)
  it("with a tied embedding, a wait that the tied part would hang moves on", function()
    local function parse(str)
      local l = {}
      for w in str:gmatch("%S+") do l[#l + 1] = S.parse(w) end
      return l
    end
    local lists = {
      parse("0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0F3 0SEND_F3 0RECV_B1 0I1 0W1 0RECV_B0 0I0 0W0 " ..
            "0RECV_B3 0I3 0W3 0RECV_B2 0I2 0W2 STEP"),
      parse("1RECV_F0 1F0 1RECV_F1 1F1 1RECV_F3 1F3 1I1 1SEND_B1 1I0 1SEND_B0 1W0 1I3 1SEND_B3 1W3 " ..
            "1RECV_F2 1F2 1I2 1SEND_B2 1W1 1W2 STEP") }
    assert(S.validate(lists, { stages = 2, microbatches = 4, tied = true }))
    local untied = sets.plan(lists)
    assert.are.same({ sets.key(1, 0) }, untied.release[2][15])            -- before 1RECV_F2
    local hang = sim.run(lists, { posted = true, tied = true, waits = untied.waits })
    assert.is_false(hang.ok)
    assert.matches("rank 0 blocked at action 11 (0W1) waiting for the tied embedding's gradient part of stage 1's " ..
                   "weight pass of micro-batch 1", hang.deadlock, 1, true)
    local tied = sets.plan(lists, { tied = true })
    assert.is_nil(tied.release[2][15])
    assert.is_true(sim.run(lists, { posted = true, tied = true, waits = tied.waits }).ok)
    assert.are.equal(4, tied.peak[1])
    -- rank 1 sends its parts in its weight passes' order, W0 W3 W1 W2: Tied
    -- numbers them so (n-th sent), not by micro-batch
    local P_ = sets.PART
    assert.are.same({ [sets.key(P_, 0)] = 1, [sets.key(P_, 3)] = 2, [sets.key(P_, 1)] = 3, [sets.key(P_, 2)] = 4 },
                    tied.part_order[2])
  end)

  -- 1F1B at p=2 (F = 1, B = 2): the head's part of micro-batch k leaves as
  -- rank 1's B(k) starts (t), rank 0's B(k) starts at t + 2 (after the
  -- gradient) and takes the part as it ends, t + 4; rank 1's next weight
  -- pass, B(k+1), starts at t + 3 (after F(k+1)): reusing part k's buffer
  -- there would start it late, at B(k+2) (t + 6) it is free: 2 buffers
  it("a tied embedding on two ranks: the head's parts as stage PART, 2 buffers for 1F1B at p=2", function()
    local plan = sets.plan(P.build("1f1b", { ranks = 2, microbatches = 8, chunks = 1 }), { tied = true })
    assert.are.equal(2, plan.peak[sets.PART])
    local n = 0
    for _ in pairs(plan.part_order[2]) do n = n + 1 end
    assert.are.equal(8, n)                                   -- rank 1 sends 8 parts a step
    assert.are.same({}, plan.part_order[1])
    -- none untied, and none where the first and last stage share a rank (ZB-V's V)
    assert.is_nil(sets.plan(P.build("1f1b", { ranks = 2, microbatches = 8, chunks = 1 })).peak[sets.PART])
    assert.is_nil(sets.plan(P.build("zbv", { ranks = 2, microbatches = 8, chunks = 2 }), { tied = true }).peak[sets.PART])
  end)

  it("one rank: every set given back at its retire, none waited for", function()
    local plan = sets.plan(S.one_stage(4))
    assert.are.same({}, plan.release[1])
    assert.are.equal(1, plan.peak[0])
    assert.are.equal(1, sets.plan(S.one_stage(4, { split = true })).peak[0])
  end)

  it("refuses what is not an action list", function()
    assert.has_error(function() sets.plan({}) end, "sets: expected one action list per rank")
    assert.has_error(function() sets.plan({ { { op = "JUMP" } } }) end, "sets: rank 0 action 1 is not an action")
  end)
end)
