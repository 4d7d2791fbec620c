-- The run's communication per step (lua/ztrain/record/comm.lua) from
-- counter snapshots written here, not from a run: each step's delta, the
-- first step set aside, the means per step and the busiest rank over a
-- 2-rank world (a stand-in whose gather returns the other rank's row), the
-- hidden share, and the printed line. (Against the runtime's counters in
-- real runs: e2e/comm_bytes_spec.lua.)
local comm = require "ztrain.core.comm"
local report = require "ztrain.record.comm"
local null = require("ztrain.util.json").null

-- snap{ sent=, recv=, calls=, busy_ms=, exposed_ms=, kinds = { name = { sent, recv, calls } } }
local function snap(t)
  local by = {}
  for _, k in ipairs(comm.KINDS) do
    local v = t.kinds and t.kinds[k] or { 0, 0, 0 }
    by[k] = { sent = v[1], recv = v[2], calls = v[3] }
  end
  return { sent = t.sent or 0, recv = t.recv or 0, calls = t.calls or 0, busy_ms = t.busy_ms or 0,
           exposed_ms = t.exposed_ms or 0, by_kind = by }
end

-- steps(acc, list) -> the deltas step() returned; list: cumulative snapshots
local function steps(acc, list)
  local out = {}
  for i = 2, #list do out[#out + 1] = report.step(acc, list[i - 1], list[i]) end
  return out
end

local ONE = { size = 1 }

describe("record.comm", function()
  it("a step's delta is the counters' difference; the first step is left out of the means", function()
    local acc = report.new()
    local d = steps(acc, {
      snap {},
      snap { sent = 1000, recv = 1000, busy_ms = 50, exposed_ms = 50, kinds = { all_gather = { 1000, 1000, 4 } } },
      snap { sent = 1100, recv = 1050, busy_ms = 60, exposed_ms = 52, kinds = { all_gather = { 1000, 1000, 4 },
                                                                               all_reduce = { 100, 50, 2 } } },
      snap { sent = 1400, recv = 1200, busy_ms = 90, exposed_ms = 58, kinds = { all_gather = { 1000, 1000, 4 },
                                                                               all_reduce = { 400, 200, 6 } } },
    })
    assert.are.same({ sent = 1000, recv = 1000, busy_ms = 50, exposed_ms = 50 }, d[1])
    assert.are.same({ sent = 300, recv = 150, busy_ms = 30, exposed_ms = 6 }, d[3])
    local cps = report.per_step(ONE, acc)
    assert.are.equal(2, cps.steps)
    local r = cps.ranks[1]
    -- steps 2 and 3: (100 + 300) / 2 sent, (50 + 150) / 2 received, 20 ms busy, 4 exposed
    assert.are.same({ 0, 200, 100, 20, 4 }, { r.rank, r.sent, r.recv, r.busy_ms, r.exposed_ms })
    assert.are.same({ 1400, 1200 }, { r.run_sent, r.run_recv })     -- the whole run, the first step included
    assert.are.same({ all_reduce = { sent = 200, recv = 100, calls = 3 } }, r.by_kind)
    assert.are.equal(1 - 4 / 20, r.hidden_share)
    assert.are.same({ sent = 200, recv = 100 }, cps.max)
  end)

  it("a run of one step reports that step", function()
    local acc = report.new()
    steps(acc, { snap {}, snap { sent = 64, recv = 32, busy_ms = 2, exposed_ms = 1 } })
    local cps = report.per_step(ONE, acc)
    assert.are.equal(1, cps.steps)
    assert.are.same({ 64, 32, 64, 32 }, { cps.ranks[1].sent, cps.ranks[1].recv, cps.ranks[1].run_sent,
                                          cps.ranks[1].run_recv })
    assert.are.equal(null, cps.ranks[1].by_kind)          -- no kind used: JSON null
    assert.are.equal(0.5, cps.hidden_share)
  end)

  it("over ranks: the busiest rank's bytes, and the hidden share of all ranks' time together", function()
    local acc = report.new()
    steps(acc, { snap {}, snap {}, snap { sent = 10, recv = 20, busy_ms = 10, exposed_ms = 10 } })
    local other
    local world = { size = 2, gather_doubles = function(_, vals)
      other = { 1, 30, 5, 30, 0, 30, 5 }
      for _ = 1, 3 * #comm.KINDS do other[#other + 1] = 0 end
      return { vals, other }
    end }
    local cps = report.per_step(world, acc)
    assert.are.same({ sent = 30, recv = 20 }, cps.max)
    assert.are.equal(1, cps.ranks[2].rank)
    assert.are.equal(1, cps.ranks[2].hidden_share)        -- rank 1 waited for none of its 30 ms
    assert.are.equal(0, cps.ranks[1].hidden_share)
    assert.are.equal(1 - 10 / 40, cps.hidden_share)
  end)

  it("the hidden share is null without traffic time and never below 0", function()
    local acc = report.new()
    steps(acc, { snap {}, snap {}, snap { sent = 8 } })
    assert.are.equal(null, report.per_step(ONE, acc).hidden_share)
    acc = report.new()
    steps(acc, { snap {}, snap {}, snap { busy_ms = 1, exposed_ms = 3 } })
    assert.are.equal(0, report.per_step(ONE, acc).hidden_share)
  end)

  it("prints bytes in binary units and the hidden share in percent", function()
    local acc = report.new()
    steps(acc, { snap {}, snap { sent = 1536, recv = 3 * 1048576, busy_ms = 8, exposed_ms = 2 } })
    assert.are.same({
      "  comm        per step: rank 0 sent 1.5 KiB, received 3.0 MiB; most of any rank 1.5 KiB / 3.0 MiB",
      "              in flight 8.0 ms, compute waited 2.0 ms (mean over ranks): 75% hidden",
    }, report.lines(report.per_step(ONE, acc)))
    acc = report.new()
    steps(acc, { snap {}, snap { sent = 100 } })
    assert.are.same({ "  comm        per step: rank 0 sent 100 B, received 0 B; most of any rank 100 B / 0 B" },
                    report.lines(report.per_step(ONE, acc)))
    assert.is_nil(report.lines(nil))
  end)
end)
