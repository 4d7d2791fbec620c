-- Pipeline schedules (parallel/schedule/library.lua) against the validator
-- (parallel/schedule/init.lua) and the simulator (parallel/schedule/simulate.lua), and the
-- simulated figures against the published formulas, which owe nothing to
-- this code:
--   GPipe, 1F1B: bubble (p-1)/(m+p-1) as idle over all rank-time (makespan
--     x ranks); exact for uniform stages whatever F and B cost.
--   1F1B: stage s (0-based) holds at most min(p-s, m) activations.
--   interleaved 1F1B: (p-1)/(v*m) as idle over busy time (Megatron's
--     normalisation: bubble time over ideal compute time), m a multiple of p.
--   ZB-H1: idle per stage (p-1)(F+I-W) with F = I = W (Qi et al.), below
--     1F1B's (p-1)(F+B); peak activations no more than 1F1B's worst stage.
local S = require "ztrain.parallel.schedule"
local P = require "ztrain.parallel.schedule.library"
local sim = require "ztrain.parallel.schedule.simulate"
local csv = require "ztrain.parallel.schedule.csv"

local A = S.action
local EPS = 1e-12

local function cases(name)
  local out = {}
  for _, p in ipairs({ 2, 4 }) do
    for _, m in ipairs({ p, 2 * p, 4 * p, 8, 3 }) do
      local vs = (name == "interleaved_1f1b" or name == "looped_bfs") and { 1, 2, 3 } or
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

local function label(c) return ("p=%d m=%d v=%d"):format(c.p, c.m, c.v) end

local function run(name, c, opts)
  local lists, q = P.build(name, { ranks = c.p, microbatches = c.m, chunks = c.v })
  assert(S.validate(lists, setmetatable({ tied = true }, { __index = q })))
  local res = sim.run(lists, opts)
  assert(res.ok, res.deadlock)
  -- the posted-receive model (the driver's) must agree where RECVs sit
  -- right before their readers
  local posted = sim.run(lists, { times = opts and opts.times, posted = true })
  assert(posted.ok and posted.makespan == res.makespan, "posted and blocking receives disagree")
  return res, q, lists
end

describe("pipeline schedules", function()
  it("params names what is wrong: no stages it did not get, huge numbers in exponent form", function()
    local L = P
    local ok, err = pcall(L.params, { microbatches = 4, ranks = 1 / 0 }, "1f1b")
    assert.is_false(ok)
    assert.are.equal("1f1b: ranks must be a whole number >= 1, got inf", err)
    ok, err = pcall(L.params, { microbatches = 4, stages = 3, chunks = 2 }, "1f1b")
    assert.are.equal("1f1b: ranks must be a whole number >= 1 (stages 3 / chunks 2), got 1.5", err)
    ok, err = pcall(L.params, { microbatches = 4, ranks = 1e300 }, "1f1b")
    assert.matches("stages (ranks 1e+300 x chunks 1 = 1e+300) exceed the bound of 1024", err, 1, true)
  end)

  for _, name in ipairs({ "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb_h1", "zbv", "dualpipev",
                          "pipedream" }) do
    it(name .. " validates and runs without deadlock over (p, m, v)", function()
      for _, c in ipairs(cases(name)) do
        local res, q, lists = run(name, c)
        assert.are.equal(c.p, #lists, label(c))
        -- each rank ends REDUCE_GRAD, STEP; every compute action ran once
        local n = 0
        for _, l in ipairs(lists) do
          assert.are.equal("REDUCE_GRAD", l[#l - 1].op, label(c))
          assert.are.equal("STEP", l[#l].op, label(c))
          for _, a in ipairs(l) do if a.op == "F" then n = n + 1 end end
        end
        assert.are.equal(q.stages * c.m, n, label(c))
        assert.is_true(res.bubble >= 0 and res.bubble < 1, label(c))
      end
    end)
  end

  it("GPipe and 1F1B: bubble (p-1)/(m+p-1) of all rank-time, with F=1 B=2 and with F=1 B=3", function()
    for _, name in ipairs({ "gpipe", "1f1b" }) do
      for _, c in ipairs(cases(name)) do
        for _, times in ipairs({ nil, { F = 1, B = 3 } }) do
          local res = run(name, c, { times = times })
          local want = (c.p - 1) / (c.m + c.p - 1)
          assert(math.abs(res.bubble - want) < EPS,
                 ("%s %s: bubble %.6f, want %.6f"):format(name, label(c), res.bubble, want))
          local fb = times and 4 or 3
          assert.are.equal((c.m + c.p - 1) * fb, res.makespan, name .. " " .. label(c))
        end
      end
    end
  end)

  it("1F1B holds min(p-s, m) activations on stage s; GPipe holds m", function()
    for _, c in ipairs(cases("1f1b")) do
      local r1, r0 = run("1f1b", c), run("gpipe", c)
      for s = 0, c.p - 1 do
        assert.are.equal(math.min(c.p - s, c.m), r1.peak[s], ("1f1b %s stage %d"):format(label(c), s))
        assert.are.equal(c.m, r0.peak[s], ("gpipe %s stage %d"):format(label(c), s))
      end
    end
  end)

  it("interleaved 1F1B: bubble (p-1)/(v*m) of the busy time (Megatron's normalisation)", function()
    for _, c in ipairs(cases("interleaved_1f1b")) do
      local res = run("interleaved_1f1b", c)
      local want = (c.p - 1) / (c.v * c.m)
      assert(math.abs(res.bubble_busy - want) < EPS,
             ("%s: idle/busy %.6f, want %.6f"):format(label(c), res.bubble_busy, want))
      -- the same thing over all rank-time
      assert(math.abs(res.bubble - (c.p - 1) / (c.v * c.m + c.p - 1)) < EPS, label(c))
      -- stage c*p + r runs on rank r
      for s, r in pairs(res.stage_rank) do assert.are.equal(s % c.p, r, label(c)) end
    end
  end)

  it("ZB-H1: a third of 1F1B's idle time with F=I=W, below it with F=1 B=2, no more activations", function()
    for _, c in ipairs(cases("zb_h1")) do
      local z = run("zb_h1", c, { times = { F = 1, B = 2, I = 1, W = 1 } })
      local f = run("1f1b", c)
      assert(z.bubble < f.bubble, ("%s: zb_h1 %.4f not below 1f1b %.4f"):format(label(c), z.bubble, f.bubble))
      local worst1, worstz = 0, 0
      for s = 0, c.p - 1 do
        worst1, worstz = math.max(worst1, f.peak[s]), math.max(worstz, z.peak[s])
        assert.is_true(z.peak[s] <= math.min(c.p, c.m), label(c))
      end
      assert.is_true(worstz <= worst1, label(c))
      if c.m >= c.p then
        -- Qi et al.: idle (p-1)(F+I-W) per stage against 1F1B's (p-1)(F+I+W)
        local idle_z = c.p * z.makespan - c.p * c.m * 3
        local idle_f = c.p * f.makespan - c.p * c.m * 3
        assert.are.equal(c.p * (c.p - 1) * 1, idle_z, label(c))
        assert.are.equal(3 * idle_z, idle_f, label(c))
      end
    end
  end)

  -- ZB-V (Qi et al. section 6): the V placement, below ZB-H1's bubble for
  -- m >= 2p, each rank holding at most 2p chunks' activations (p full
  -- stages', 1F1B's first stage), and the tied first/last stage's
  -- gradients on rank 0 in one rank's order
  it("ZB-V: V placement, below ZB-H1's bubble, 1F1B's memory, tied gradients in order", function()
    for _, p in ipairs({ 2, 3, 4 }) do
      for _, m in ipairs({ 2 * p, 4 * p }) do
        local c = { p = p, m = m, v = 2 }
        local res, q, lists = run("zbv", c)
        for s = 0, 2 * p - 1 do
          assert.are.equal(s < p and s or 2 * p - 1 - s, q.stage_rank(s), label(c))
        end
        local zb = run("zb_h1", { p = p, m = m, v = 1 })
        assert.is_true(res.bubble < zb.bubble, label(c) .. (" zbv %.4f vs zb_h1 %.4f"):format(res.bubble, zb.bubble))
        -- held per rank: F done, W not yet, over the simulated timeline
        for r = 1, p do
          local held, peak = 0, 0
          for _, e in ipairs(res.timeline[r]) do
            if e.action.op == "F" then held = held + 1; peak = math.max(peak, held)
            elseif e.action.op == "W" then held = held - 1 end
          end
          assert.is_true(peak <= 2 * p, label(c) .. " rank " .. (r - 1) .. " holds " .. peak)
        end
        -- rank 0's W's alternate: last stage (the head) of mb i, stage 0 of mb i, ...
        local order = {}
        for _, a in ipairs(lists[1]) do
          if a.op == "W" and (a.stage == 0 or a.stage == 2 * p - 1) then order[#order + 1] = S.format(a) end
        end
        for i = 0, m - 1 do
          assert.are.equal(("%dW%d"):format(2 * p - 1, i), order[2 * i + 1], label(c))
          assert.are.equal(("0W%d"):format(i), order[2 * i + 2], label(c))
        end
      end
    end
    -- the validator refuses the embedding's W before the head's on one rank
    local lists, q = P.build("zbv", { ranks = 2, microbatches = 4 })
    local l, iw0, iw3 = lists[1], nil, nil
    for k, a in ipairs(l) do
      if a.op == "W" and a.mb == 0 and a.stage == 0 then iw0 = k end
      if a.op == "W" and a.mb == 0 and a.stage == 3 then iw3 = k end
    end
    -- the head's W of micro-batch 0 moved to just after the embedding's
    local w3 = table.remove(l, iw3)
    table.insert(l, iw0, w3)
    local ok, err = S.validate(lists, setmetatable({ tied = true }, { __index = q }))
    assert.is_nil(ok)
    assert.matches("stage 3's gradient of micro-batch 0 must complete first (the tied weights", err, 1, true)
    assert.is_true(S.validate(lists, q))           -- untied: any order of the two
  end)

  -- pipeline.split = "time": contiguous stages whose slowest is as fast as
  -- any contiguous split's (checked against trying every split)
  it("a split by measured time minimises the slowest stage (against every split)", function()
    local stages = require "ztrain.parallel.schedule.stages"
    local function best_by_brute(costs, p)
      local n, best = #costs, math.huge
      local function go(start, left, worst)
        if left == 1 then
          local sum = 0
          for i = start, n do sum = sum + costs[i] end
          best = math.min(best, math.max(worst, sum)); return
        end
        local sum = 0
        for e = start, n - left + 1 do
          sum = sum + costs[e]
          go(e + 1, left - 1, math.max(worst, sum))
        end
      end
      go(1, p, 0)
      return best
    end
    local rng = 12345
    local function rand() rng = (rng * 1103515245 + 12345) % 2147483648; return rng / 2147483648 end
    for trial = 1, 40 do
      local L = 2 + trial % 7
      local times = { embed = rand(), block = 0.5 + rand(), head = 1 + 4 * rand() }
      local units = { { kind = "embed", numel = 1 } }
      for _ = 1, L do units[#units + 1] = { kind = "block", numel = 1 } end
      units[#units + 1] = { kind = "head", numel = 1 }
      local costs = {}
      for i, u in ipairs(units) do costs[i] = times[u.kind] end
      local model = { units = units, cfg = { name = "fake" } }
      for p = 2, math.min(5, #units) do
        local counts = stages.partition(model, p, "time", times)
        local i, worst, total = 1, 0, 0
        for _, c in ipairs(counts) do
          assert.is_true(c >= 1)
          local sum = 0
          for _ = 1, c do sum = sum + costs[i]; i = i + 1 end
          worst = math.max(worst, sum); total = total + c
        end
        assert.are.equal(#units, total)
        assert.is_true(math.abs(worst - best_by_brute(costs, p)) < 1e-12, ("trial %d p=%d"):format(trial, p))
      end
    end
  end)

  it("pipedream: 1F1B's order, marked asynchronous", function()
    local a = P.build("pipedream", { ranks = 4, microbatches = 8 })
    local b = P.build("1f1b", { ranks = 4, microbatches = 8 })
    assert.is_true(a.async)
    assert.is_nil(b.async)
    for r = 1, 4 do
      for k = 1, #b[r] do assert.are.equal(S.format(b[r][k]), S.format(a[r][k])) end
    end
  end)

  it("the grid shows the clock-cycle table", function()
    local res = run("1f1b", { p = 2, m = 2, v = 1 })
    assert.are.equal(table.concat({
      "       0  1  2  3  4  5  6  7  8 ",
      "rank 0 F0 F1 .  .  B0 B0 .  B1 B1",
      "rank 1 .  F0 B0 B0 F1 B1 B1 .  . ",
    }, "\n") .. "\n", sim.grid(res))
    local il = run("interleaved_1f1b", { p = 2, m = 2, v = 2 })
    assert.truthy(sim.grid(il):find("2F0", 1, true), "interleaved cells name the stage")
  end)

  -- rank 0 waits for micro-batch 0's gradient before sending micro-batch 1's
  -- activations; rank 1 runs both forwards before its first backward
  local function criss_crossed()
    local l0 = { A("F", 0, 0), A("SEND_F", 0, 0), A("F", 0, 1), A("RECV_B", 0, 0), A("B", 0, 0),
                 A("SEND_F", 0, 1), A("RECV_B", 0, 1), A("B", 0, 1), { op = "STEP" } }
    local l1 = { A("RECV_F", 1, 0), A("F", 1, 0), A("RECV_F", 1, 1), A("F", 1, 1), A("B", 1, 0),
                 A("SEND_B", 1, 0), A("B", 1, 1), A("SEND_B", 1, 1), { op = "STEP" } }
    return { l0, l1 }
  end

  it("a criss-crossed user schedule passes the static checks and is reported as a deadlock", function()
    local lists = criss_crossed()
    assert.is_true(S.validate(lists, { stages = 2, microbatches = 2 }))
    local res = sim.run(lists)
    assert.is_false(res.ok)
    assert.are.equal(4, res.blocked[1].index)
    assert.are.equal("1SEND_B0", S.format(res.blocked[1].waits))
    assert.are.equal(1, res.blocked[1].on)
    assert.are.equal(3, res.blocked[2].index)
    assert.are.equal("0SEND_F1", S.format(res.blocked[2].waits))
    assert.truthy(res.deadlock:find("rank 0 blocked at action 4 (0RECV_B0) waiting for 1SEND_B0 " ..
                                    "(rank 1 action 6, not reached)", 1, true), res.deadlock)
    assert.truthy(res.deadlock:find("rank 1 blocked at action 3 (1RECV_F1) waiting for 0SEND_F1", 1, true),
                  res.deadlock)
    assert.has_error(function() sim.check(lists) end, res.deadlock)
    -- posted receives (the driver) hang too, one action later, at the reader
    local posted = sim.run(lists, { posted = true })
    assert.is_false(posted.ok)
    assert.are.equal("0B0", S.format(posted.blocked[1].action))
    assert.are.equal("1F1", S.format(posted.blocked[2].action))
  end)

  it("a receive nobody sends is named as such", function()
    local lists = { { A("F", 0, 0), A("RECV_B", 0, 0), A("B", 0, 0), { op = "STEP" } },
                    { A("RECV_F", 1, 0), A("F", 1, 0), A("B", 1, 0), A("SEND_B", 1, 0), { op = "STEP" } } }
    local res = sim.run(lists)
    assert.is_false(res.ok)
    assert.truthy(res.deadlock:find("rank 1 blocked at action 1 (1RECV_F0) waiting for 0SEND_F0, which no rank sends",
                                    1, true), res.deadlock)
  end)

  it("a schedule dropping a micro-batch is refused before anything runs", function()
    local lists, q = P.build("1f1b", { ranks = 4, microbatches = 8 })
    for _, l in ipairs(lists) do
      for k = #l, 1, -1 do if l[k].mb == 7 then table.remove(l, k) end end
    end
    local ok, err = S.validate(lists, q)
    assert.is_nil(ok)
    assert.truthy(err:find("micro-batch 7", 1, true), err)
    local dropped = function(p) local l = P.gpipe(p); table.remove(l[2], 1); table.remove(l[2], 1); return l end
    assert.has_error(function() P.build(dropped, { ranks = 2, microbatches = 2 }) end)
  end)

  it("bad (p, m, v) are refused with the numbers and the valid choices", function()
    local function err(name, p)
      local ok, e = pcall(P.build, name, p)
      assert.is_false(ok)
      return e
    end
    local e = err("interleaved_1f1b", { ranks = 4, microbatches = 6, chunks = 2 })
    assert.truthy(e:find("microbatches (6) must be a multiple of the pipeline ranks (4)", 1, true), e)
    assert.truthy(e:find("try 4 or 8", 1, true), e)
    e = err("interleaved_1f1b", { ranks = 4, microbatches = 8, chunks = 0 })
    assert.truthy(e:find("chunks (v) must be a whole number >= 1, got 0", 1, true), e)
    e = err("gpipe", { ranks = 2, microbatches = 4, chunks = 2 })
    assert.truthy(e:find("gpipe runs one stage per rank (chunks = 1), got chunks = 2", 1, true), e)
    e = err("interleaved_1f1b", { stages = 4, ranks = 4, microbatches = 8, chunks = 2 })
    assert.truthy(e:find("stages (4) must equal ranks (4) x chunks (2) = 8", 1, true), e)
    e = err("1f1b", { ranks = 2, microbatches = 0 })
    assert.truthy(e:find("microbatches must be a whole number >= 1, got 0", 1, true), e)
    e = err("zb_h2", { ranks = 2, microbatches = 2 })
    assert.truthy(e:find("known: 1f1b, dualpipev, gpipe, interleaved_1f1b, looped_bfs, pipedream, zb_h1, zbv", 1, true), e)
    e = err("dualpipev", { ranks = 2, microbatches = 3 })
    assert.truthy(e:find("dualpipev: microbatches (3) must be at least the stages (2 x 2 ranks = 4)", 1, true), e)
    e = err("zbv", { ranks = 2, microbatches = 4, chunks = 3 })
    assert.truthy(e:find("the V placement holds two stages per rank (chunks = 2), got chunks = 3", 1, true), e)
  end)

  -- Looped BFS as PyTorch's ScheduleLoopedBFS writes it (every forward of a
  -- chunk, chunks ascending; then every backward of a chunk, chunks
  -- descending, micro-batches in reverse), and what the driver keeps: m - 1
  -- gradients a stage, all m activations held.
  it("looped_bfs is PyTorch's order, holds m - 1 gradients per stage and all m activations", function()
    local lists = P.build("looped_bfs", { ranks = 2, microbatches = 3, chunks = 2 })
    local t = {}
    for _, a in ipairs(lists[1]) do
      if a.op == "F" or a.op == "B" then t[#t + 1] = S.format(a) end
    end
    assert.are.equal("0F0 0F1 0F2 2F0 2F1 2F2 2B2 2B1 2B0 0B2 0B1 0B0", table.concat(t, " "))
    for _, c in ipairs(cases("looped_bfs")) do
      local res, q = run("looped_bfs", c)
      for s = 0, q.stages - 1 do
        assert.are.equal(c.m - 1, res.held[s], label(c))
        assert.are.equal(c.m, res.peak[s], label(c))
      end
    end
  end)

  -- DualPipe-V: each stage's gradients complete in micro-batch order (no
  -- gradient held), but on rank 0 the head's parts of wte's gradient of p
  -- micro-batches are open at once; the simulator finds it shorter than
  -- interleaved 1F1B (v = 2) at the same p and m, and no longer than ZB-V
  -- for m >= 2p.
  it("dualpipev holds no gradient, opens p head parts on rank 0, and beats interleaved 1F1B", function()
    for _, c in ipairs(cases("dualpipev")) do
      local res, q, lists = run("dualpipev", c)
      for s = 0, q.stages - 1 do assert.are.equal(0, res.held[s], label(c)) end
      assert.are.equal(c.p, S.tied_parts(lists[1], 0, q.stages - 1), label(c))
      local zbv = run("zbv", c)
      assert.is_true(res.makespan <= zbv.makespan, label(c) .. (": %g > zbv's %g"):format(res.makespan, zbv.makespan))
      if c.m % c.p == 0 then
        local i1 = run("interleaved_1f1b", c)
        assert.is_true(res.makespan < i1.makespan, label(c))
      end
    end
    -- p=4 m=8 (F=1, B=2, I=W=1): 51 time units, ZB-V 52, interleaved 1F1B 57
    assert.are.equal(51, run("dualpipev", { p = 4, m = 8, v = 2 }).makespan)
  end)

  -- against PyTorch itself: torch 2.15's dumps (spec/fixtures/pytorch/,
  -- tools/pytorch_schedule_csv.py) hold the same compute order on every rank
  -- as ztrain's looped_bfs, dualpipev and interleaved_1f1b at p=2 and p=4
  -- (ztrain's zbv is its own list scheduler: its order differs)
  it("looped_bfs, dualpipev and interleaved_1f1b are PyTorch's compute orders", function()
    local function compute(lists)
      local out = {}
      for r, l in ipairs(lists) do
        local t = {}
        for _, a in ipairs(l) do if a.op:match("^[FBIW]$") then t[#t + 1] = S.format(a) end end
        out[r] = table.concat(t, " ")
      end
      return out
    end
    for _, name in ipairs({ "looped_bfs", "dualpipev", "interleaved_1f1b" }) do
      for _, p in ipairs({ 2, 4 }) do
        local file = ("spec/fixtures/pytorch/%s_p%d_m%d.compute.csv"):format(name, p, 2 * p)
        assert.same(compute(csv.load(file)), compute(P.build(name, { ranks = p, microbatches = 2 * p, chunks = 2 })),
                    file)
      end
    end
  end)
end)
