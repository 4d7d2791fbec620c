-- The schedule IR (lua/ztrain/parallel/schedule/init.lua): a training step
-- as an action list per rank. validate() refuses each rule it enforces with
-- its message and accepts valid lists; format/parse round trips; one_stage's
-- shape; a recipe's schedule name resolved. (The library's schedules:
-- schedule_library_spec.lua; lists run by the drivers: e2e/driver_spec.lua.)
local zt = require "ztrain"
local schedule = require "ztrain.parallel.schedule"

describe("schedule validator", function()
  local A = schedule.action
  local P = { stages = 1, microbatches = 2 }
  local function err(lists, p)
    local ok, e = schedule.validate(lists, p or P)
    assert.is_nil(ok)
    return e
  end

  it("accepts the one-stage lists", function()
    assert.is_true(schedule.validate(schedule.one_stage(2), P))
    assert.is_true(schedule.validate(schedule.one_stage(2, { split = true }), P))
  end)

  it("names the first wrong action", function()
    assert.matches("rank 0 action 1 %(0B0%): backward before the forward",
                   err({ { A("B", 0, 0), A("F", 0, 0), A("F", 0, 1), A("B", 0, 1), { op = "STEP" } } }))
    assert.matches("W before I", err({ { A("F", 0, 0), A("W", 0, 0), { op = "STEP" } } }))
    assert.matches("0F0%): appears twice", err({ { A("F", 0, 0), A("F", 0, 0), { op = "STEP" } } }))
    assert.matches("micro%-batch must be a whole number in 0..1, got 2", err({ { A("F", 0, 2), { op = "STEP" } } }))
    assert.matches("micro%-batch must be a whole number in 0..1, got 0.5", err({ { A("F", 0, 0.5), { op = "STEP" } } }))
    assert.matches("stage must be a whole number in 0..0, got 0", err({ { A("F", "0", 0), { op = "STEP" } } }))
    assert.matches("stage must be a whole number in 0..0, got nil", err({ { A("F", nil, 0), { op = "STEP" } } }))
    assert.matches("action 1 is not an action %(got 7;", err({ { 7 } }))
    assert.matches("rank 0's list is not a table", err({ 5 }) or "")
    assert.matches("one per rank, got 3", err(3))
    assert.matches("schedule parameters need stages", err({ {} }, { stages = 1 }))
    assert.matches("stage 0 micro%-batch 1: forward missing",
                   err({ { A("F", 0, 0), A("B", 0, 0), { op = "STEP" } } }))
    assert.matches("exactly one STEP", err({ { A("F", 0, 0), A("B", 0, 0), A("F", 0, 1), A("B", 0, 1) } }))
    assert.matches("STEP must be the last", err({ { { op = "STEP" }, A("F", 0, 0) } }))
    assert.matches("stage 1 runs on rank 1", err({ { A("F", 1, 0), { op = "STEP" } } },
                                                  { stages = 2, microbatches = 1 }))
  end)

  it("checks the send/receive rules across stages", function()
    local P2 = { stages = 2, microbatches = 1 }
    local function two(r0, r1) return err({ r0, r1 }, P2) end
    local ok0 = { A("F", 0, 0), A("SEND_F", 0, 0), A("RECV_B", 0, 0), A("B", 0, 0), { op = "STEP" } }
    local ok1 = { A("RECV_F", 1, 0), A("F", 1, 0), A("B", 1, 0), A("SEND_B", 1, 0), { op = "STEP" } }
    assert.is_true(schedule.validate({ ok0, ok1 }, P2))
    assert.matches("stage 1 micro%-batch 0: no SEND_B",
                   two(ok0, { A("RECV_F", 1, 0), A("F", 1, 0), A("B", 1, 0), { op = "STEP" } }))
    assert.matches("%(1RECV_F0%): must come before 1F0 %(the forward reads the received input%)",
                   two(ok0, { A("F", 1, 0), A("RECV_F", 1, 0), A("B", 1, 0), A("SEND_B", 1, 0), { op = "STEP" } }))
    assert.matches("%(0SEND_F0%): must come before 0B0",
                   two({ A("F", 0, 0), A("RECV_B", 0, 0), A("B", 0, 0), A("SEND_F", 0, 0), { op = "STEP" } }, ok1))
    assert.matches("the first stage has no previous stage",
                   two({ A("RECV_F", 0, 0), A("F", 0, 0), { op = "STEP" } }, ok1))
    assert.matches("the last stage has no next stage", err({ { A("F", 0, 0), A("SEND_F", 0, 0), { op = "STEP" } } },
                                                            { stages = 1, microbatches = 1 }))
  end)

  it("formats and parses PyTorch's compact action names", function()
    for _, s in ipairs({ "0F3", "1B0", "2SEND_F1", "0RECV_B12", "3I2", "3W2", "STEP", "REDUCE_GRAD" }) do
      assert.are.equal(s, schedule.format(schedule.parse(s)))
    end
    assert.has_error(function() schedule.parse("0X1") end, 'cannot read action "0X1" (expected e.g. 0F3, 1B0, 0SEND_F2, STEP)')
    local ok, e = pcall(schedule.action, "X", 0, 0)
    assert.is_false(ok)
    assert.matches('unknown action "X" (known: F, B, I, W,', tostring(e), 1, true)
  end)

  it("a recipe with an unknown schedule is an error naming the known ones, when it is resolved", function()
    local r, e = zt.recipe.resolve({}, { "schedule=gpipe2", "model.size=gpt2-tiny", "data.seq_len=32" })
    assert.is_nil(r)
    assert.matches('unknown schedule "gpipe2" (known: 1f1b, dualpipev, gpipe, interleaved_1f1b, looped_bfs, one_stage, ' ..
                   'one_stage_iw, pipedream, zb_h1, zbv;',
                   tostring(e), 1, true)
  end)

  it("ranks that loaded different schedule code disagree on the recipe", function()
    local a = zt.recipe.serialize({ schedule = function() return 1 end })
    local b = zt.recipe.serialize({ schedule = function() return 2 end })
    assert.are_not.equal(a, b)
    local f = function() return 1 end
    assert.are.equal(zt.recipe.serialize({ schedule = f }), zt.recipe.serialize({ schedule = f }))
    assert.are_not.equal(zt.recipe.serialize({ strategy = zt.strategy.dp {} }),
                         zt.recipe.serialize({ strategy = zt.strategy.dp { defer_reduction = false } }))
  end)
end)

describe("schedule validator: every rule it enforces", function()
  -- lists from PyTorch's compact names: L("0F0 0B0 STEP") -> { actions }
  local function L(s)
    local l = {}
    for w in s:gmatch("%S+") do l[#l + 1] = schedule.parse(w) end
    return l
  end
  local function err(lists, p)
    local ok, e = schedule.validate(lists, p)
    assert.is_nil(ok, "accepted")
    return e
  end
  local P1, P2 = { stages = 1, microbatches = 1 }, { stages = 2, microbatches = 1 }
  local R0 = "0F0 0SEND_F0 0RECV_B0 0B0 STEP"
  local R1 = "1RECV_F0 1F0 1B0 1SEND_B0 STEP"

  it("accepts a valid two-stage list and a split backward", function()
    assert.is_true(schedule.validate({ L(R0), L(R1) }, P2))
    assert.is_true(schedule.validate({ L("0F0 0SEND_F0 0RECV_B0 0I0 0W0 STEP"),
                                       L("1RECV_F0 1F0 1I0 1SEND_B0 1W0 REDUCE_GRAD STEP") }, P2))
    -- REDUCE_GRAD anywhere; a stage-tagged STEP
    assert.is_true(schedule.validate({ L("REDUCE_GRAD 0F0 0B0 0STEP") }, P1))
  end)

  it("refuses B and I for one micro-batch, either way round", function()
    assert.are.equal("rank 0 action 3 (0I0): both B and I for one micro-batch",
                     err({ L("0F0 0B0 0I0 STEP") }, P1))
    assert.are.equal("rank 0 action 3 (0B0): both B and I for one micro-batch",
                     err({ L("0F0 0I0 0B0 0W0 STEP") }, P1))
  end)

  it("refuses each send and receive out of its place, naming the reason", function()
    local cases = {
      -- rank 0 (stage 0): the output sent after it exists, before the backward frees it
      { "0SEND_F0 0F0 0RECV_B0 0B0 STEP", R1,
        "rank 0 action 2 (0F0): must come before 0SEND_F0 (the output exists only after the forward)" },
      { "0F0 0RECV_B0 0I0 0SEND_F0 0W0 STEP", R1,
        "rank 0 action 4 (0SEND_F0): must come before 0I0 (the output is sent before the backward releases it)" },
      { "0F0 0SEND_F0 0B0 0RECV_B0 STEP", R1,
        "rank 0 action 4 (0RECV_B0): must come before 0B0 (the backward reads the received output gradient)" },
      { "0F0 0SEND_F0 0I0 0RECV_B0 0W0 STEP", R1,
        "rank 0 action 4 (0RECV_B0): must come before 0I0 (the backward reads the received output gradient)" },
      -- rank 1 (stage 1): the input gradient sent after the backward made it
      { R0, "1RECV_F0 1F0 1SEND_B0 1B0 STEP",
        "rank 1 action 4 (1B0): must come before 1SEND_B0 (the input gradient exists only after the backward)" },
      { R0, "1RECV_F0 1F0 1SEND_B0 1I0 1W0 STEP",
        "rank 1 action 4 (1I0): must come before 1SEND_B0 (the input gradient exists only after the backward)" },
    }
    for _, c in ipairs(cases) do assert.are.equal(c[3], err({ L(c[1]), L(c[2]) }, P2)) end
  end)

  it("refuses a stage boundary crossed one way only", function()
    assert.are.equal("stage 0 micro-batch 0: no SEND_F", err({ L("0F0 0RECV_B0 0B0 STEP"), L(R1) }, P2))
    assert.are.equal("stage 0 micro-batch 0: no RECV_B", err({ L("0F0 0SEND_F0 0B0 STEP"), L(R1) }, P2))
    assert.are.equal("stage 1 micro-batch 0: no RECV_F", err({ L(R0), L("1F0 1B0 1SEND_B0 STEP") }, P2))
    assert.are.equal("stage 0 micro-batch 0: backward missing", err({ L("0F0 0SEND_F0 0RECV_B0 STEP"), L(R1) }, P2))
    -- I without W leaves the backward unfinished
    assert.are.equal("stage 0 micro-batch 0: backward missing", err({ L("0F0 0I0 STEP") }, P1))
  end)

  -- issue 32, item 2: the driver keeps the canonical order whatever the
  -- order of the backwards (driver/grad_order.lua), so the validator takes any
  it("accepts gradients completed in any micro-batch order", function()
    local P1 = { stages = 1, microbatches = 2 }
    assert.is_true(schedule.validate({ L("0F0 0F1 0B1 0B0 STEP") }, P1))
    assert.is_true(schedule.validate({ L("0F0 0F1 0I1 0I0 0W0 0W1 STEP") }, P1))
  end)

  it("with tied weights on one rank, the last stage's gradient of a micro-batch comes before the first's", function()
    local one = { stages = 2, microbatches = 2, tied = true, stage_rank = function() return 0 end }
    local fwd = "0F0 0SEND_F0 1RECV_F0 1F0 0F1 0SEND_F1 1RECV_F1 1F1 "
    local back = "1B0 1SEND_B0 0RECV_B0 0B0 1B1 1SEND_B1 0RECV_B1 0B1 STEP"
    assert.is_true(schedule.validate({ L(fwd .. back) }, one))
    -- the first stage adds to the tied gradient before the last wrote it
    assert.are.equal("rank 0 action 11 (0B0): stage 1's gradient of micro-batch 0 must complete first (the tied " ..
                     "weights: the last stage writes their gradient, the first adds to it)",
                     err({ L(fwd .. "1SEND_B0 0RECV_B0 0B0 1B0 1B1 1SEND_B1 0RECV_B1 0B1 STEP") }, one))
    -- the last stage's parts of two micro-batches open at once: the driver keeps them apart
    assert.is_true(schedule.validate({ L(fwd .. "1B0 1B1 1SEND_B0 0RECV_B0 0B0 1SEND_B1 0RECV_B1 0B1 STEP") }, one))
    -- the first stage's W before the last stage's: refused tied, fine untied
    local early = fwd .. "1I0 1SEND_B0 0RECV_B0 0B0 1W0 1B1 1SEND_B1 0RECV_B1 0B1 STEP"
    assert.matches("(0B0): stage 1's gradient of micro-batch 0 must complete first", err({ L(early) }, one), 1, true)
    one.tied = false
    assert.is_true(schedule.validate({ L(early) }, one))
  end)

  -- what the driver holds, counted by hand
  it("held_grads counts the gradients a stage keeps until their turn; tied_parts the head parts open at once", function()
    local function lists(s) local t = {}; for r, l in ipairs(s) do t[r] = L(l) end; return t end
    -- in order: nothing held
    assert.are.same({ [0] = 0 }, schedule.held_grads(lists({ "0F0 0F1 0F2 0B0 0B1 0B2 STEP" })))
    -- reverse: 2 then 1 kept when 0 comes, so 2 at once
    assert.are.same({ [0] = 2 }, schedule.held_grads(lists({ "0F0 0F1 0F2 0B2 0B1 0B0 STEP" })))
    -- 1 early, 0 releases it, then 3 early, 2 releases it: 1 at once
    assert.are.same({ [0] = 1 }, schedule.held_grads(lists({ "0F0 0F1 0F2 0F3 0B1 0B0 0B3 0B2 STEP" })))
    -- W completes the gradient, not I; two stages counted apart
    assert.are.same({ [0] = 1, [1] = 0 }, schedule.held_grads(lists({ "0F0 0F1 0I0 0I1 0W1 0W0 1F0 1B0 STEP" })))
    assert.are.equal(1, schedule.tied_parts(L("1B0 0B0 1B1 0B1 STEP"), 0, 1))
    assert.are.equal(2, schedule.tied_parts(L("1B0 1B1 0B0 0B1 STEP"), 0, 1))
    assert.are.equal(3, schedule.tied_parts(L("1I0 1W0 1B1 1B2 0B0 0B1 0B2 STEP"), 0, 1))
  end)

  it("one_stage(m) is F B per micro-batch (or F I W), then REDUCE_GRAD and STEP", function()
    local function names(lists)
      local t = {}
      for _, a in ipairs(lists[1]) do t[#t + 1] = schedule.format(a) end
      return table.concat(t, " ")
    end
    assert.are.equal("0F0 0B0 0F1 0B1 0F2 0B2 REDUCE_GRAD STEP", names(schedule.one_stage(3)))
    assert.are.equal("0F0 0I0 0W0 0F1 0I1 0W1 REDUCE_GRAD STEP", names(schedule.one_stage(2, { split = true })))
    assert.are.equal(1, #schedule.one_stage(3))
  end)
end)
