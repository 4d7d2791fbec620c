-- `ztrain schedule NAME|compare`: the simulator's grid, the bubble, the
-- timeline and the comparison chart written by the program, and its errors.
local cjson = require "cjson"
local util = require "helpers.util"
local schedules = require "ztrain.parallel.schedule.library"
local simulate = require "ztrain.parallel.schedule.simulate"
local timeline = require "ztrain.record.timeline"

local tmpdir, slurp, run, well_formed = util.tmpdir, util.read, util.sh, util.well_formed

local function simulated(name, p, m, v)
  local lists = schedules.build(name, { ranks = p, microbatches = m, chunks = v or 1 })
  local res = simulate.check(lists)
  return timeline.from_simulation(res), res
end

-- the output holds every line of the simulator's grid of name at p, m, v; returns the result
local function shows_grid(out, name, p, m, v)
  local _, res = simulated(name, p, m, v)
  for line in simulate.grid(res):gmatch("[^\n]+") do assert.is_truthy(out:find(line, 1, true), line) end
  return res
end

describe("ztrain schedule", function()
  it("prints the simulator's grid and the bubble (p-1)/(m+p-1), and writes the timeline", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain schedule 1f1b p=2 m=4 out=" .. dir)
    assert.are.equal(0, rc, out)
    shows_grid(out, "1f1b", 2, 4)
    local b = tonumber(out:match("bubble ([%d.]+)"))
    assert.is_true(math.abs(b - (2 - 1) / (4 + 2 - 1)) < 1e-6, out)
    assert.matches("peak activations per stage (micro-batches held): s0 2, s1 1", out, 1, true)
    well_formed(dir .. "/timeline.svg")
    local doc = cjson.decode(slurp(dir .. "/timeline.json"))
    local n = 0
    for _, x in ipairs(doc.traceEvents) do if x.ph == "X" then n = n + 1 end end
    assert.are.equal(2 * 4 * 2, n)                 -- F and B of 4 micro-batches on 2 ranks
    os.execute("rm -rf " .. dir)
  end)

  it("compares every schedule in one line each and a bar chart", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain schedule compare p=4 m=8 out=" .. dir)
    assert.are.equal(0, rc, out)
    for _, c in ipairs({ { "naive %(gpipe m=1%)", 3 / 4 }, { "gpipe", 3 / 11 }, { "1f1b", 3 / 11 } }) do
      local b = tonumber(out:match("\n" .. c[1] .. "%s+([%d.]+)"))
      assert.is_true(b and math.abs(b - c[2]) < 1e-6, c[1] .. "\n" .. out)
    end
    assert.matches("\ninterleaved_1f1b%s+0%.", out)
    assert.matches("\nzb_h1%s+0%.", out)
    -- ZB-V below ZB-H1 (p=4 m=8: 1/13 against 1/9)
    local zbv, zb = tonumber(out:match("\nzbv%s+([%d.]+)")), tonumber(out:match("\nzb_h1%s+([%d.]+)"))
    assert.is_true(zbv < zb, out)
    well_formed(dir .. "/compare.svg")
    local bars = 0
    for _ in slurp(dir .. "/compare.svg"):gmatch('<rect class="bar"') do bars = bars + 1 end
    assert.are.equal(8, bars)
    -- DualPipe-V at p=4 m=8: 1/17 of ranks x makespan 51, below ZB-V's
    local dpv = tonumber(out:match("\ndualpipev%s+([%d.]+)"))
    assert.is_true(math.abs(dpv - 3 / 51) < 1e-6 and dpv < zbv, out)
    assert.matches("\nlooped_bfs%s+0%.", out)
    os.execute("rm -rf " .. dir)
  end)

  it("show dualpipev draws the simulator's grid; looped_bfs names the gradients kept for micro-batch order", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain schedule show dualpipev p=2 m=4 out=" .. dir)
    assert.are.equal(0, rc, out)
    assert.matches("dualpipev: p=2 ranks, m=4 micro-batches, v=2 chunk(s) per rank, 4 stages", out, 1, true)
    shows_grid(out, "dualpipev", 2, 4, 2)
    assert.is_nil(out:find("kept until their turn", 1, true), out)
    out, rc = run("build/ztrain schedule simulate looped_bfs p=2 m=4 out=" .. dir)
    assert.are.equal(0, rc, out)
    assert.matches("kept until their turn (micro-batch order) per stage: s0 3, s1 3", out, 1, true)
    os.execute("rm -rf " .. dir)
  end)

  it("exits 1 naming the known schedules, or the number that is wrong, without a Lua location", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain schedule nope p=2 m=4 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches('unknown pipeline schedule "nope" (known: 1f1b, dualpipev, gpipe, interleaved_1f1b, looped_bfs, ' ..
                   'pipedream, zb_h1, zbv, ' ..
                   'compare, or csv:PATH (a PyTorch pipelining CSV))',
                   out, 1, true)
    out, rc = run("build/ztrain schedule interleaved_1f1b p=4 m=6 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("microbatches (6) must be a multiple of the pipeline ranks (4)", out, 1, true)
    out, rc = run("build/ztrain schedule 1f1b p=0 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("p=0: pipeline ranks must be a whole number >= 1", out, 1, true)
    out, rc = run("build/ztrain schedule 1f1b size=3 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches('unknown key "size"', out, 1, true)
    assert.is_nil(out:find("%.lua:%d+:"), out)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("ztrain schedule's arguments and output", function()
  local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
  end
  -- the names in dir, sorted
  local function listing(dir)
    local out = run("ls -A " .. dir)
    local names = {}
    for n in out:gmatch("[^\n]+") do if not n:match("^rc=") then names[#names + 1] = n end end
    table.sort(names)
    return table.concat(names, " ")
  end

  it("refuses an empty out= naming it, before writing anything", function()
    local out, rc = run("build/ztrain schedule 1f1b p=2 m=4 out=")
    assert.are.equal(1, rc, out)
    assert.matches("out= is empty", out, 1, true)
    assert.is_nil(out:find("wrote", 1, true), out)
    assert.is_nil(out:find("cannot open", 1, true), out)
  end)

  it("refuses inf and nan naming the key", function()
    for _, c in ipairs({ { "p=inf", "p=inf: pipeline ranks must be a whole number >= 1" },
                         { "m=inf", "m=inf: micro-batches must be a whole number >= 1" },
                         { "v=nan", "v=nan: chunks per rank (interleaved) must be a whole number >= 1" } }) do
      local out, rc = run("build/ztrain schedule 1f1b out=/nonexistent-dir/x " .. c[1])
      assert.are.equal(1, rc, out)
      assert.matches(c[2], out, 1, true)
      assert.is_nil(out:find("nil", 1, true), out)
    end
  end)

  it("csv: refuses p, m and v (the file sets them), and a directory as its file, naming them", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain schedule csv:spec/fixtures/pytorch/gpipe_p2_m4.comms.csv p=7 m=99 v=5 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("p=7 m=99 v=5: the file sets the ranks", out, 1, true)
    assert.are.equal("", listing(dir))
    out, rc = run("build/ztrain schedule csv:" .. dir .. " out=" .. dir .. "/x")
    assert.are.equal(1, rc, out)
    assert.matches("pipeline csv load " .. dir .. ": cannot read (Is a directory)", out, 1, true)
    assert.is_nil(out:find("%.lua:%d+"), out)
    assert.is_nil(out:find("traceback", 1, true), out)
    os.execute("rm -rf " .. dir)
  end)

  it("a write that fails leaves none of the command's files behind", function()
    local dir = tmpdir()
    os.execute("mkdir " .. dir .. "/timeline.json")          -- timeline.svg is written first
    local out, rc = run("build/ztrain schedule 1f1b p=2 m=4 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("cannot write " .. dir .. "/timeline.json", out, 1, true)
    assert.are.equal("timeline.json", listing(dir))
    os.execute("rm -rf " .. dir .. "/timeline.json && mkdir " .. dir .. "/compare.svg")   -- written last
    out, rc = run("build/ztrain schedule compare p=2 m=4 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("cannot write " .. dir .. "/compare.svg", out, 1, true)
    assert.are.equal("compare.svg", listing(dir))
    -- a file that was there before is no part of the failed write's: it stays
    util.write(dir .. "/timeline-gpipe.svg", "mine")
    out, rc = run("build/ztrain schedule compare p=2 m=4 out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.is_true(exists(dir .. "/timeline-gpipe.svg"))
    assert.are.equal("compare.svg timeline-gpipe.svg", listing(dir))
    os.execute("rm -rf " .. dir)
  end)
end)
