-- PyTorch's pipelining CSV (parallel/schedule/csv.lua). The independent side is the
-- two fixtures in spec/fixtures/pytorch_*.csv, written by hand from
-- PyTorch's source (see spec/fixtures/README.md), not by this module:
--   pytorch_1f1b_p2_m4.csv: Schedule1F1B's order (p = 2, m = 4) with its
--     SEND/RECV cells and per-stage REDUCE_GRAD, CRLF rows.
--   pytorch_interleaved1f1b_p2_v1_m4_compute_only.csv: ScheduleInterleaved
--     1F1B's compute-only grid (p = 2, one stage per rank, m = 4), idle
--     slots as empty cells; its rank 0 warms up with 2 forwards, not 1.
local util = require "helpers.util"
local S = require "ztrain.parallel.schedule"
local P = require "ztrain.parallel.schedule.library"
local sim = require "ztrain.parallel.schedule.simulate"
local C = require "ztrain.parallel.schedule.csv"

local FIX = "spec/fixtures/"
local TMP = os.tmpname()

local function write(text) util.write(TMP, text); return TMP end

local function fmt(lists)
  local out = {}
  for r, l in ipairs(lists) do
    local t = {}
    for _, a in ipairs(l) do t[#t + 1] = S.format(a) end
    out[r] = table.concat(t, " ")
  end
  return out
end

local function compute(lists)
  local out = {}
  for r, l in ipairs(lists) do
    local t = {}
    for _, a in ipairs(l) do
      if a.op == "F" or a.op == "B" or a.op == "I" or a.op == "W" then t[#t + 1] = S.format(a) end
    end
    out[r] = table.concat(t, " ")
  end
  return out
end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(e)
end

describe("pipeline csv: PyTorch fixtures", function()
  teardown(function() os.remove(TMP); os.remove(TMP .. ".tmp") end)

  it("loads the 1F1B fixture, which validates and simulates without deadlock", function()
    local lists, info = C.load(FIX .. "pytorch_1f1b_p2_m4.csv", { stages = 2, microbatches = 4 })
    assert.equals(2, #lists)
    assert.is_false(info.compute_only)
    assert.is_true((S.validate(lists, info)))
    local res = sim.run(lists)
    assert.is_true(res.ok, res.deadlock)
    -- GPipe/1F1B bubble (p-1)/(m+p-1) with F=1, B=2: makespan (m+p-1)(F+B)
    assert.equals(15, res.makespan)
    -- PyTorch's per-stage REDUCE_GRAD became ztrain's rank-wide one; STEP added
    assert.equals("REDUCE_GRAD STEP", fmt(lists)[1]:match("(%S+ %S+)$"))
    assert.truthy(table.concat(info.notes, "; "):find("STEP appended", 1, true))
    assert.truthy(table.concat(info.notes, "; "):find("2 per-stage REDUCE_GRAD", 1, true))
  end)

  it("the fixture has the compute order per rank of ztrain's 1f1b (and its comms)", function()
    local lists = C.load(FIX .. "pytorch_1f1b_p2_m4.csv", { stages = 2, microbatches = 4 })
    local ours = P.build("1f1b", { stages = 2, microbatches = 4 })
    assert.same(compute(ours), compute(lists))
    assert.same({ "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3", "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3" }, compute(lists))
    -- the fixture's SEND/RECV sit where with_comms puts them: same lists
    assert.same(ours, lists)
  end)

  it("loads the compute-only fixture: idle cells skipped, comms inserted, runs", function()
    local lists, info = C.load(FIX .. "pytorch_interleaved1f1b_p2_v1_m4_compute_only.csv",
                               { stages = 2, microbatches = 4 })
    assert.is_true(info.compute_only)
    assert.same({ "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3", "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3" }, compute(lists))
    assert.is_true((S.validate(lists, info)))
    local res = sim.run(lists)
    assert.is_true(res.ok, res.deadlock)
    -- every F past stage 0 reads a RECV_F right before it
    local l = lists[2]
    for k, a in ipairs(l) do
      if a.op == "F" then assert.same({ op = "RECV_F", stage = 1, mb = a.mb }, l[k - 1]) end
    end
  end)

  it("stages and micro-batches default to what the file uses", function()
    local lists, info = C.load(FIX .. "pytorch_1f1b_p2_m4.csv")
    assert.equals(2, info.stages); assert.equals(4, info.microbatches); assert.equals(2, #lists)
  end)
end)

describe("pipeline csv: dump then load", function()
  teardown(function() os.remove(TMP); os.remove(TMP .. ".tmp") end)

  local cases = {
    { "gpipe", { stages = 4, microbatches = 6 } },
    { "1f1b", { stages = 2, microbatches = 4 } },
    { "1f1b", { stages = 4, microbatches = 3 } },
    { "interleaved_1f1b", { ranks = 2, chunks = 2, microbatches = 4 } },
    { "interleaved_1f1b", { ranks = 3, chunks = 3, microbatches = 6 } },
    { "zb_h1", { stages = 4, microbatches = 8 } },
    { "one_stage", { stages = 1, microbatches = 3, ranks = 1 } },
    { "one_stage_iw", { stages = 1, microbatches = 3, ranks = 1 } },
  }
  for _, c in ipairs(cases) do
    local name, p = c[1], c[2]
    local desc = {}
    for k, v in pairs(p) do desc[#desc + 1] = k .. "=" .. v end
    table.sort(desc)
    it(("round-trips %s bit for bit (%s)"):format(name, table.concat(desc, ", ")), function()
      local lists, q
      local R = require "ztrain.parallel.schedule.registry"
      if R.builtin[name] then
        q = { stages = 1, microbatches = p.microbatches, ranks = 1 }
        lists = R.resolve(name, q)
      else
        lists, q = P.build(name, p)
      end
      C.dump(lists, TMP)
      local back = C.load(TMP, { stages = q.stages, microbatches = q.microbatches })
      assert.same(lists, back)
      -- and again: the file is a fixed point
      local f = assert(io.open(TMP, "rb")); local first = f:read("*a"); f:close()
      C.dump(back, TMP)
      f = assert(io.open(TMP, "rb")); local second = f:read("*a"); f:close()
      assert.equals(first, second)
    end)
  end

  -- torch 2.5.1's _Action.from_str knows (\d+)(F|B|W|UNSHARD|RESHARD|SEND_F|
  -- RECV_F|SEND_B|RECV_B)(\d*) only: no I, no REDUCE_GRAD ("Invalid action
  -- string: 0REDUCE_GRAD"), and its B is input-only in a schedule with W.
  -- torch 2.5.1 from PyPI loaded (_PipelineScheduleRuntime._load_csv,
  -- format="compute_comms") ztrain's 2.5 dumps of 1f1b, zb_h1 and
  -- interleaved_1f1b by hand, having refused them with REDUCE_GRAD and I.
  it("writes what torch 2.5.1 reads: CRLF rows, B for I, no REDUCE_GRAD, no STEP; reads it back", function()
    local lists = P.build("1f1b", { stages = 2, microbatches = 4 })
    C.dump(lists, TMP, { format = "2.5" })
    local f = assert(io.open(TMP, "rb")); local got = f:read("*a"); f:close()
    f = assert(io.open(FIX .. "pytorch_1f1b_p2_m4.csv", "rb")); local want = f:read("*a"); f:close()
    assert.equals((want:gsub(",%dREDUCE_GRAD", "")), got)
    for _, case in ipairs({ { "zb_h1", { ranks = 2, microbatches = 4 } },
                            { "interleaved_1f1b", { ranks = 2, chunks = 2, microbatches = 2 } } }) do
      lists = P.build(case[1], case[2])
      C.dump(lists, TMP, { format = "2.5" })
      f = assert(io.open(TMP, "rb")); got = f:read("*a"); f:close()
      for c in got:gsub("\r\n", ","):gmatch("([^,]+)") do
        local ty = c:match("^%d+(%u[%u_]*)%d*$")
        assert.truthy(({ F = 1, B = 1, W = 1, UNSHARD = 1, RESHARD = 1, SEND_F = 1, RECV_F = 1, SEND_B = 1,
                         RECV_B = 1 })[ty], c)
      end
      assert.same(lists, (C.load(TMP)))
    end
    -- one schedule with full backwards and input-gradient ones: 2.5 cannot say which B is which
    lists = P.build("zb_h1", { ranks = 2, microbatches = 4 })
    table.insert(lists[1], 1, S.action("B", 0, 3))
    assert.matches("one meaning per schedule", err_of(C.dump, lists, TMP, { format = "2.5" }), 1, true)
  end)

  -- torch 2.15's _load_csv(format="compute_comms") wants each REDUCE_GRAD
  -- followed by its WAIT_REDUCE_GRAD and one WAIT_SEND after every send, and
  -- (its own dumps) no SEND/RECV between two stages of one rank. torch
  -- 2.15.0 loaded ztrain's dumps of dualpipev, zbv, looped_bfs,
  -- interleaved_1f1b and 1f1b by hand (no torch here); this checks the rules.
  it("writes what torch 2.15 reads by default, and reads it back as the same schedule", function()
    local lists = P.build("dualpipev", { ranks = 2, microbatches = 4 })
    C.dump(lists, TMP)
    local f = assert(io.open(TMP, "rb")); local got = f:read("*a"); f:close()
    for row in got:gmatch("([^\r\n]+)\r\n") do
      local pending, seen_rg = {}, nil
      for c in (row .. ","):gmatch("([^,]*),") do
        local st, ty, mb = c:match("^(%d+)([%u_]+)(%d*)$")
        if ty == "SEND_F" or ty == "SEND_B" then pending[st .. ty .. mb] = true
        elseif ty == "WAIT_SEND_F" or ty == "WAIT_SEND_B" then
          assert.is_true(pending[st .. ty:sub(6) .. mb], c); pending[st .. ty:sub(6) .. mb] = nil
        elseif ty == "REDUCE_GRAD" then assert.is_nil(seen_rg, c); seen_rg = st
        elseif ty == "WAIT_REDUCE_GRAD" then assert.equals(seen_rg, st); seen_rg = nil end
      end
      assert.is_nil(next(pending), row)
      assert.is_nil(seen_rg, row)
    end
    -- rank 1 holds stages 1 and 2 (the V's turn): no SEND/RECV between them
    assert.falsy(got:find("1SEND_F", 1, true)); assert.falsy(got:find("2RECV_F", 1, true))
    assert.falsy(got:find("2SEND_B", 1, true)); assert.falsy(got:find("1RECV_B", 1, true))
    local back, info = C.load(TMP)
    assert.truthy(table.concat(info.notes, "; "):find("8 SEND/RECV pair(s) added between two stages of one rank", 1,
                                                       true))
    assert.equals(sim.run(lists, { posted = true }).makespan, sim.run(back, { posted = true }).makespan)
    assert.same(compute(lists), compute(back))         -- the same compute order on every rank
  end)

  -- PyTorch's runtime (2.5.1 and 2.15) posts untagged SEND/RECV: between two
  -- ranks the k-th receive takes the k-th message sent. With ztrain's
  -- receives (right before the reader) ZB-V at p=2, and PyTorch 2.5's own
  -- interleaved zero-bubble order, ran in torch's runtime on 2 gloo ranks
  -- with gradients off by up to 1.2 (both versions); with the receives in
  -- the sender's order, within 6e-8 of one process's.
  it("dump posts each rank's receives from a peer in the order that peer sends them", function()
    -- (ZB-V and DualPipe-V have full and split backwards both: not for 2.5)
    local cases = { P.build("zbv", { ranks = 2, microbatches = 4 }), P.build("zbv", { ranks = 4, microbatches = 8 }),
                    P.build("dualpipev", { ranks = 4, microbatches = 8 }),
                    (C.load(FIX .. "pytorch/2.5/interleaved_zb_p2_m4.compute.csv")) }
    for n, lists in ipairs(cases) do
      for _, format in ipairs(n == 4 and { "compute_comms", "2.5" } or { "compute_comms" }) do
        C.dump(lists, TMP, { format = format })
        local f = assert(io.open(TMP, "rb")); local got = f:read("*a"); f:close()
        local own, sends, recvs, r = {}, {}, {}, 0
        for row in got:gmatch("([^\r\n]+)\r\n") do
          for st in row:gmatch("(%d+)F%d+") do own[tonumber(st)] = r end
          r = r + 1
        end
        r = 0
        for row in got:gmatch("([^\r\n]+)\r\n") do
          for c in (row .. ","):gmatch("([^,]*),") do
            local st, ty, mb = c:match("^(%d+)([%u_]+)(%d+)$")
            st = tonumber(st)
            local peer = ty == "SEND_F" and st + 1 or ty == "SEND_B" and st - 1 or ty == "RECV_F" and st - 1 or
                         ty == "RECV_B" and st + 1
            if peer and own[peer] ~= r then
              local msg = ty:sub(-1) .. (ty:match("^SEND") and peer or st) .. ":" .. mb
              local key = ty:match("^SEND") and (r .. ">" .. own[peer]) or (own[peer] .. ">" .. r)
              local t = ty:match("^SEND") and sends or recvs
              t[key] = t[key] or {}
              table.insert(t[key], msg)
            end
          end
          r = r + 1
        end
        assert.same(sends, recvs, ("case %d, %s"):format(n, format))
        assert.same(compute(lists), compute((C.load(TMP))))      -- valid, the same compute order
      end
    end
  end)

  it("dump names the file it cannot write and the action it cannot hold", function()
    local lists = P.build("1f1b", { stages = 2, microbatches = 2 })
    local e = err_of(C.dump, lists, "/nonexistent-dir/x.csv")
    assert.truthy(e:find("/nonexistent-dir/x.csv", 1, true))
    local bad = { { { op = "F", stage = 0 } , { op = "STEP" } } }
    e = err_of(C.dump, bad, TMP)
    assert.truthy(e:find(TMP, 1, true)); assert.truthy(e:find("rank 0 action 1", 1, true))
  end)
end)

describe("pipeline csv: malformed files", function()
  teardown(function() os.remove(TMP) end)

  local function load_err(text, opts)
    return err_of(C.load, write(text), opts or { stages = 2, microbatches = 2 })
  end

  it("names file, row (rank), column and cell for a bad cell", function()
    local e = load_err("0F0,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1X0,1B0,1SEND_B0\r\n")
    assert.truthy(e:find(TMP, 1, true))
    assert.truthy(e:find("row 2 (rank 1) column 2", 1, true))
    assert.truthy(e:find('"1X0"', 1, true))
    assert.truthy(e:find("unknown action type X", 1, true))
  end)

  it("rejects cells that are not {stage}{TYPE}{mb}", function()
    for _, c in ipairs({ "F0", "0F", "0f1", "0F1x", "0REDUCE_GRAD1", "-1F0", "0 F1" }) do
      local e = load_err(c .. "\n")
      assert.truthy(e:find("row 1 (rank 0) column 1", 1, true), e)
      assert.truthy(e:find(("%q"):format(c), 1, true), e)
    end
    local e = load_err("(0F1;1B0)OVERLAP\n")
    assert.truthy(e:find("expected (F;B)OVERLAP_F_B", 1, true), e)
    e = load_err("(0F1;0SEND_F1)OVERLAP_F_B\n")
    assert.truthy(e:find("sub-action 0SEND_F1 is not a compute action (F, B, I, W)", 1, true), e)
  end)

  it("accepts UNSHARD/RESHARD and drops them with a note; skips blank cells and spaces", function()
    local lists, info = C.load(write("0UNSHARD, 0F0 ,,0B0,0RESHARD,0REDUCE_GRAD\n"),
                               { stages = 1, microbatches = 1 })
    assert.same({ "0F0 0B0 REDUCE_GRAD STEP" }, fmt(lists))
    assert.truthy(table.concat(info.notes, "; "):find("dropped 2 UNSHARD/RESHARD", 1, true))
  end)

  it("rejects a stage on two ranks, out-of-range indices, and invalid schedules", function()
    local e = load_err("0F0,0B0\n0F1,0B1\n")
    assert.truthy(e:find("row 2 (rank 1) column 1", 1, true)); assert.truthy(e:find("stage 0 is already on rank 0", 1, true))
    e = load_err("0F0,0B0,0F2,0B2\n", { stages = 1, microbatches = 2 })
    assert.truthy(e:find("micro-batch 2 but microbatches = 2", 1, true))
    e = load_err("0B0,0F0\n", { stages = 1, microbatches = 1 })
    assert.truthy(e:find("not a valid schedule", 1, true)); assert.truthy(e:find("backward before the forward", 1, true))
    e = load_err("", { stages = 1, microbatches = 1 })
    assert.truthy(e:find("empty file", 1, true))
    e = err_of(C.load, "/nonexistent-dir/none.csv")
    assert.truthy(e:find("/nonexistent-dir/none.csv", 1, true))
  end)

  it("rejects a REDUCE_GRAD before the rank's last backward", function()
    local e = load_err("0F0,0F1,0B0,0REDUCE_GRAD,0B1,0SEND_F0\n", { stages = 1, microbatches = 2 })
    assert.truthy(e:find("row 1 (rank 0) column 5", 1, true)); assert.truthy(e:find("0B1", 1, true))
  end)

  it("a compute-only file's placement is looped or V, read from the file", function()
    local e = load_err("1F0,1B0\n0F0,0B0\n", { stages = 2, microbatches = 1 })
    assert.truthy(e:find("compute-only file has stage 0 on rank 1, neither looped (stage s on rank s % 2) nor V " ..
                         "(ranks r and 3 - r)", 1, true), e)
  end)
end)

describe("pipeline csv: what an error echoes", function()
  teardown(function() os.remove(TMP) end)

  it("a long cell is cut to its first 60 bytes, with its length; other bytes escaped", function()
    local big = ("A"):rep(2 * 1024 * 1024)
    local e = err_of(C.load, write("0F0," .. big .. "\n"))
    assert.truthy(e:find('cell "' .. ("A"):rep(60) .. '..." (2097152 bytes; the first 60 shown)', 1, true), e:sub(1, 300))
    assert.is_true(#e < 600, ("%d bytes of message"):format(#e))
    e = err_of(C.load, write("0F0,0" .. ("Q"):rep(5000) .. "1\n"))    -- an unknown type, echoed twice
    assert.is_true(#e < 800, ("%d bytes of message"):format(#e))
    e = err_of(C.load, write('0F0,x\1\27[31m\255"\n'))
    assert.truthy(e:find('cell "x\\x01\\x1B[31m\\xFF\\""', 1, true), e)
    assert.is_nil(e:find("[%z\1-\31\127-\255]"), e)
    e = err_of(C.load, write("(0F1;" .. ("Z"):rep(3000) .. ")OVERLAP_F_B\n"))
    assert.is_true(#e < 800, ("%d bytes of message"):format(#e))
  end)

  it("a directory is refused naming it, not with a Lua error", function()
    local e = err_of(C.load, "/tmp")
    assert.truthy(e:find("pipeline csv load /tmp: cannot read (Is a directory)", 1, true), e)
  end)

  it("a file past a schedule's bounds is said to be past them, not told to lower p, m or v", function()
    local e = err_of(C.load, write("0F0,0B0,0F99999,0B99999\n"))
    assert.truthy(e:find("the file uses 1 stages x 100000 micro-batches", 1, true), e)
    assert.truthy(e:find("more than the bound of 65536", 1, true), e)
    assert.is_nil(e:find("lower", 1, true), e)
    assert.is_nil(e:find("pipeline csv: ", 1, true), e)
    e = err_of(C.load, write("0F0,0B0,2000F0,2000B0\n"))
    assert.truthy(e:find("the file uses 2001 stages", 1, true), e)
    assert.truthy(e:find("more than the bound of 1024 pipeline stages", 1, true), e)
    assert.is_nil(e:find("(p)", 1, true), e)
  end)
end)
