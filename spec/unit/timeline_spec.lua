-- Pipeline timelines: timeline.svg / timeline.json from events, the bubble
-- in simulate.lua's normalisation (`ztrain schedule` on the command line:
-- spec/e2e/schedule_command_spec.lua).
local cjson = require "cjson"
local util = require "helpers.util"
local schedules = require "ztrain.parallel.schedule.library"
local simulate = require "ztrain.parallel.schedule.simulate"
local timeline = require "ztrain.record.timeline"

local COMPUTE = { F = true, B = true, I = true, W = true }

-- tmpdir: a fresh directory under /tmp: nothing is written into the checkout
local tmpdir, slurp, well_formed = util.tmpdir, util.read, util.well_formed

local function simulated(name, p, m, v)
  local lists = schedules.build(name, { ranks = p, microbatches = m, chunks = v or 1 })
  local res = simulate.check(lists)
  return timeline.from_simulation(res), res
end

-- a measured-looking step on 2 ranks (seconds): receives that take time,
-- gaps, a reduction and a step, written by hand
local function measured()
  local ev = {}
  for r = 1, 2 do
    local l, t = {}, 0.001 * r
    for i = 0, 3 do
      l[#l + 1] = { op = "RECV_F", stage = r - 1, mb = i, t0 = t, t1 = t + 0.0003 }; t = t + 0.0003
      l[#l + 1] = { op = "F", stage = r - 1, mb = i, t0 = t, t1 = t + 0.004 }; t = t + 0.0045
    end
    for i = 0, 3 do l[#l + 1] = { op = "B", stage = r - 1, mb = i, t0 = t, t1 = t + 0.008 }; t = t + 0.008 end
    l[#l + 1] = { op = "REDUCE_GRAD", t0 = t, t1 = t + 0.002 }; t = t + 0.002
    l[#l + 1] = { op = "STEP", t0 = t, t1 = t + 0.003 }
    ev[r] = l
  end
  return ev
end

local function count_compute(events)
  local n = 0
  for _, l in ipairs(events) do for _, e in ipairs(l) do if COMPUTE[e.op] then n = n + 1 end end end
  return n
end

describe("pipeline timeline", function()
  it("computes the bubble as simulate.lua does: idle / (ranks x span)", function()
    for _, c in ipairs({ { "gpipe", 4, 8 }, { "1f1b", 2, 4 }, { "1f1b", 4, 8 }, { "interleaved_1f1b", 4, 8, 2 },
                         { "zb_h1", 4, 8 } }) do
      local ev, res = simulated(c[1], c[2], c[3], c[4])
      assert.is_true(math.abs(timeline.bubble(ev) - res.bubble) < 1e-12, c[1])
    end
    local ev = simulated("1f1b", 4, 8)
    assert.is_true(math.abs(timeline.bubble(ev) - 3 / 11) < 1e-12)     -- (p-1)/(m+p-1)
    -- by hand: span from rank 0's first F (0.0013) to rank 1's last B (0.0020 + 4 x 0.0048
    -- + 4 x 0.008 = 0.0532); busy 2 x (4 x 0.004 + 4 x 0.008) = 0.096
    local b, busy, span = timeline.bubble(measured())
    assert.is_true(math.abs(busy - 0.096) < 1e-12, busy)
    assert.is_true(math.abs(span - (0.0532 - 0.0013)) < 1e-12, span)
    assert.is_true(math.abs(b - (2 * 0.0519 - 0.096) / (2 * 0.0519)) < 1e-12, b)
    -- overlapping compute on one rank is busy once
    local o = { { { op = "F", stage = 0, mb = 0, t0 = 0, t1 = 2 }, { op = "W", stage = 0, mb = 0, t0 = 1, t1 = 3 } },
                { { op = "F", stage = 1, mb = 0, t0 = 2, t1 = 3 } } }
    assert.are.equal((6 - 4) / 6, (timeline.bubble(o)))
  end)

  it("writes a Chrome trace with one X event per compute action, durations as recorded", function()
    for _, case in ipairs({ { simulated("zb_h1", 4, 8), 1000 }, { measured(), 1e6 } }) do
      local ev, k = case[1], case[2]
      local dir = tmpdir()
      local w = timeline.write(dir, ev, { name = "t", us_per_unit = k, unit = k == 1e6 and "s" or nil })
      assert.are.equal(dir .. "/timeline.json", w.json)
      local doc = cjson.decode(slurp(w.json))
      local lo = math.huge
      for _, l in ipairs(ev) do for _, e in ipairs(l) do lo = math.min(lo, e.t0) end end
      -- the recorded compute actions by rank and name
      local want = {}
      for r, l in ipairs(ev) do
        for _, e in ipairs(l) do
          if COMPUTE[e.op] then want[(r - 1) .. ":" .. e.op .. e.mb .. ":" .. e.stage] = e end
        end
      end
      local n = 0
      for _, x in ipairs(doc.traceEvents) do
        if x.ph == "X" and x.cat == "compute" then
          n = n + 1
          assert.are.equal(0, x.pid)
          local e = want[x.tid .. ":" .. x.name .. ":" .. x.args.stage]
          assert.is_truthy(e, x.name)
          assert.are.equal(e.mb, x.args.mb)
          assert.is_true(math.abs(x.dur - (e.t1 - e.t0) * k) < 1e-6, x.name)
          assert.is_true(math.abs(x.ts - (e.t0 - lo) * k) < 1e-6, x.name)
          want[x.tid .. ":" .. x.name .. ":" .. x.args.stage] = nil
        end
      end
      assert.are.equal(count_compute(ev), n)
      assert.is_nil(next(want))
      os.execute("rm -rf " .. dir)
    end
  end)

  it("draws well-formed SVG with one rectangle per compute action and the bubble in the title", function()
    for _, ev in ipairs({ (simulated("interleaved_1f1b", 4, 8, 2)), (simulated("zb_h1", 2, 4)), measured() }) do
      local dir = tmpdir()
      local w = timeline.write(dir, ev, { name = "sched", predicted_bubble = 0.2 })
      well_formed(w.svg)
      local s = slurp(w.svg)
      local rects = 0
      for op in s:gmatch('<rect class="act (%u+)"') do if COMPUTE[op] then rects = rects + 1 end end
      assert.are.equal(count_compute(ev), rects)
      local idle = 0
      for _ in s:gmatch('<rect class="idle"') do idle = idle + 1 end
      assert.are.equal(#ev, idle)
      assert.matches(("sched: bubble %.1f%%%% %%(predicted 20.0%%%%%%)"):format(100 * timeline.bubble(ev)), s)
      -- atomic: nothing left under a temporary name
      local ls = util.sh("ls " .. dir)
      assert.is_nil(ls:find(".tmp", 1, true), ls)
      os.execute("rm -rf " .. dir)
    end
  end)

  it("names the file it cannot write, and the event it cannot read", function()
    local ok, err = pcall(timeline.write, "/nonexistent-dir", measured(), {})
    assert.is_false(ok)
    assert.matches("cannot write /nonexistent-dir/timeline.svg", err, 1, true)
    ok, err = pcall(timeline.svg, { { { op = "F", stage = 0, mb = 0, t0 = 2, t1 = 1 } } })
    assert.is_false(ok)
    assert.matches("rank 0 event 1 (F) needs times t0 <= t1", err, 1, true)
    ok, err = pcall(timeline.trace, { { { op = "X", t0 = 0, t1 = 1 } } })
    assert.is_false(ok)
    assert.matches("rank 0 event 1 has no known op", err, 1, true)
  end)
end)
