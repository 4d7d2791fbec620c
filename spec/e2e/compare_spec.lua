-- `ztrain compare`: strategies run one after another; results.csv/.md and
-- the charts say what each run's summary.json and metrics.jsonl say.
--
-- One comparison (gpt2-tiny, 4 steps) serves most tests: single (1 rank x
-- 2 micro-batches), dp, zero3 and infinity (host and nvme tiers) on 2
-- ranks (the same bits), zero2 with
-- another model.seed (other bits) and zero1 with a bad key (a failed row).
local cjson = require "cjson"
local compare = require "ztrain.insight.compare"

local util = require "helpers.util"

local tmpdir, slurp, run = util.tmpdir, util.read, util.sh

-- parse_csv(text) -> { header = {...}, rows = { { name = value } } } (RFC 4180)
local function parse_csv(text)
  local lines, fields, cur, i, inq = {}, {}, {}, 1, false
  local function push_field() fields[#fields + 1] = table.concat(cur); cur = {} end
  while i <= #text do
    local c = text:sub(i, i)
    if inq then
      if c == '"' and text:sub(i + 1, i + 1) == '"' then cur[#cur + 1] = '"'; i = i + 1
      elseif c == '"' then inq = false
      else cur[#cur + 1] = c end
    elseif c == '"' then inq = true
    elseif c == "," then push_field()
    elseif c == "\n" then push_field(); lines[#lines + 1] = fields; fields = {}
    else cur[#cur + 1] = c end
    i = i + 1
  end
  local header, rows = lines[1], {}
  for k = 2, #lines do
    local r = {}
    for j, name in ipairs(header) do r[name] = lines[k][j] end
    rows[#rows + 1] = r
  end
  return { header = header, rows = rows }
end

local function attr(tag, name) return tag:match(" " .. name .. '="([^"]*)"') end

-- ticks(svg_text, class) -> { { pos = px, value = label's number } } from
-- <g class="xtick|ytick"><line .../><text ...>label</text></g>
local function ticks(text, class, coord)
  local out = {}
  for line, label in text:gmatch('<g class="' .. class .. '">\n(<line[^>]*>)\n<text[^>]*>([^<]*)</text>') do
    out[#out + 1] = { pos = tonumber(attr(line, coord)), value = tonumber((label:gsub(",", ""))) }
  end
  return out
end

-- a linear map from two ticks: value -> pixel
local function axis_map(t)
  local a, b = t[1], t[#t]
  return function(v) return a.pos + (v - a.value) / (b.value - a.value) * (b.pos - a.pos) end
end

local ROOT = tmpdir()
local OUT = ROOT .. "/cmp"
local ITEMS = { "single", "dp", "zero3", "infinity", "zero2,model.seed=7", "zero1,train.stepz=1" }
local out, rc, csv

describe("ztrain compare", function()
  lazy_setup(function()
    out, rc = run(("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 build/ztrain compare %s " ..
                   "train.steps=4 out=%s"):format(table.concat(ITEMS, " "), OUT))
    csv = parse_csv(slurp(OUT .. "/results.csv"))
  end)
  lazy_teardown(function() os.execute("rm -rf " .. ROOT) end)

  local function row(label)
    for _, r in ipairs(csv.rows) do if r.strategy == label then return r end end
    error("no row " .. label)
  end
  local function summary(label)
    return cjson.decode(slurp(OUT .. "/" .. compare.plan({ items = { label }, nproc = 2, accumulate = 1 })[1].dir ..
                              "/summary.json"))
  end

  it("runs every item, exits 0 when one succeeded, and says which failed", function()
    assert.are.equal(0, rc, out)
    assert.are.equal(#ITEMS, #csv.rows)
    assert.truthy(out:find("1 of 6 run(s) failed", 1, true), out)
    for _, f in ipairs({ "results.md", "results.csv", "memory.svg", "throughput.svg", "loss.svg" }) do
      assert.truthy(io.open(OUT .. "/" .. f), f)
    end
  end)

  it("writes each summary.json's numbers into the CSV", function()
    for _, label in ipairs({ "single", "dp", "zero3", "infinity", "zero2,model.seed=7" }) do
      local r, s = row(label), summary(label)
      assert.are.equal("ok", r.status)
      assert.are.equal(s.step_ms_median, tonumber(r.step_ms_median), label)
      assert.are.equal(s.tokens_per_s, tonumber(r.tokens_per_s), label)
      assert.are.equal(s.final_loss, tonumber(r.final_loss), label)
      assert.are.equal(s.param_digest, r.param_digest, label)
      assert.are.equal(s.threads, tonumber(r.threads), label)
      local p = s.predicted
      assert.are.equal(p.params + p.grads + p.optim + p.accumulator, tonumber(r.model_state_predicted), label)
      -- per rank: the largest rank's value of each
      local state, peaks, cats = 0, { device = 0, host = 0, nvme = 0 }, {}
      for _, m in ipairs(s.memory) do
        state = math.max(state, m.model_state)
        for tier in pairs(peaks) do
          peaks[tier] = math.max(peaks[tier], m[tier .. "_peak"])
          for cat, by in pairs(m.by_category) do
            cats[tier .. "_" .. cat] = math.max(cats[tier .. "_" .. cat] or 0, by[tier])
          end
        end
      end
      assert.are.equal(state, tonumber(r.model_state_measured), label)
      for tier, v in pairs(peaks) do assert.are.equal(v, tonumber(r[tier .. "_peak"]), label .. " " .. tier) end
      for name, v in pairs(cats) do assert.are.equal(v, tonumber(r[name]), label .. " " .. name) end
    end
    assert.are.equal(1, tonumber(row("single").ranks))
    assert.are.equal(2, tonumber(row("single").accumulate))
    assert.are.equal(2, tonumber(row("dp").ranks))
  end)

  it("says same bits where the digests are equal, differs where not", function()
    assert.are.equal("reference", row("single").same_bits)
    assert.are.equal("same", row("dp").same_bits)
    assert.are.equal("same", row("zero3").same_bits)
    assert.are.equal("same", row("infinity").same_bits)
    assert.are.equal(row("single").param_digest, row("zero3").param_digest)
    assert.are.equal("differs", row("zero2,model.seed=7").same_bits)
    assert.are_not.equal(row("single").param_digest, row("zero2,model.seed=7").param_digest)
    local md = slurp(OUT .. "/results.md")
    assert.truthy(md:find("| zero3 | 2 x 1 (", 1, true), md)
    assert.truthy(md:find("| differs | ok |", 1, true), md)
  end)

  it("makes a failed run a row with its exit status and error", function()
    local r = row("zero1,train.stepz=1")
    assert.are.equal("failed", r.status)
    assert.are.equal("1", r.exit_code)
    assert.truthy(r.error:find('unknown recipe key "train.stepz"', 1, true), r.error)
    assert.are.equal("", r.param_digest)
    assert.truthy(slurp(OUT .. "/results.md"):find("failed (exit 1): ", 1, true))
  end)

  it("draws one loss polyline per run, a point per metrics line, through the axes", function()
    local svgt = slurp(OUT .. "/loss.svg")
    local X, Y = axis_map(ticks(svgt, "xtick", "x1")), axis_map(ticks(svgt, "ytick", "y1"))
    local drawn = 0
    for tag in svgt:gmatch('<polyline[^>]*class="loss"[^>]*>') do
      local label = attr(tag, "data%-label")
      local dir = compare.plan({ items = { label }, nproc = 2, accumulate = 1 })[1].dir
      local recs = {}
      for line in slurp(OUT .. "/" .. dir .. "/metrics.jsonl"):gmatch("[^\n]+") do recs[#recs + 1] = cjson.decode(line) end
      local pts = {}
      for x, y in attr(tag, "points"):gmatch("([%d.]+),([%d.]+)") do pts[#pts + 1] = { tonumber(x), tonumber(y) } end
      assert.are.equal(#recs, #pts, label)
      assert.are.equal(4, #pts, label)
      for k, rec in ipairs(recs) do
        assert.is_true(math.abs(pts[k][1] - X(rec.step)) < 0.02, label)
        assert.is_true(math.abs(pts[k][2] - Y(rec.loss)) < 0.02, ("%s step %d: y %g, loss %g maps to %g")
                       :format(label, rec.step, pts[k][2], rec.loss, Y(rec.loss)))
      end
      drawn = drawn + 1
    end
    assert.are.equal(5, drawn)        -- the failed run has no curve
  end)

  it("stacks memory bars in proportion to the bytes, on each tier's axis", function()
    local svgt = slurp(OUT .. "/memory.svg")
    local segs = 0
    local starts = {}
    for at, tier in svgt:gmatch('()<g class="panel" data%-tier="(%a+)">') do starts[#starts + 1] = { at, tier } end
    assert.are.equal(3, #starts)      -- device, host and nvme (infinity)
    for k, st in ipairs(starts) do
      local tier, panel = st[2], svgt:sub(st[1], starts[k + 1] and starts[k + 1][1] or #svgt)
      local unit = panel:match("peak bytes per rank %((%a+)%)")
      local div = ({ B = 1, KiB = 1024, MiB = 1024 ^ 2, GiB = 1024 ^ 3 })[unit]
      local t = ticks(panel, "xtick", "x1")
      local X = axis_map(t)
      -- the axis ends inside the drawing, with room for the value labels
      local width = tonumber(svgt:match('<svg[^>]* width="(%d+)"'))
      assert.is_true(t[#t].pos <= width - 100, ("%s axis ends at %g of %d px"):format(tier, t[#t].pos, width))
      for tag in panel:gmatch('<rect class="seg"[^>]*>') do
        local r = row(attr(tag, "data%-label"))
        local bytes = tonumber(r[tier .. "_" .. attr(tag, "data%-category")])
        local w = tonumber(attr(tag, "width"))
        assert.is_true(math.abs(w - (X(bytes / div) - X(0))) < 0.02, ("%s: width %g for %d bytes"):format(tag, w, bytes))
        segs = segs + 1
      end
    end
    assert.is_true(segs >= 12, "segments checked: " .. segs)
  end)

  it("counts a run whose summary.json says it failed as failed, whatever its exit status", function()
    local dir = tmpdir()
    local f = assert(io.open(dir .. "/summary.json", "w"))
    f:write('{"exit": "error: loss is nan at step 3: training diverged", "memory": [], "param_digest": "ab"}')
    f:close()
    local runinfo = { label = "x", ranks = 2, accumulate = 1, recipe = "r.lua" }
    for _, code in ipairs({ 0, 1 }) do
      local r = compare.collect(runinfo, dir, code, "")
      assert.are.equal("loss is nan at step 3: training diverged", r.failed)
      assert.are.equal(1, r.code)
    end
    local r = compare.collect(runinfo, dir .. "/none", 137, "ztrain: rank 1: killed\n")
    assert.are.equal("rank 1: killed", r.failed)
    assert.are.equal(137, r.code)
  end)

  it("exits 1 when every run failed", function()
    local o, code = run(("build/ztrain compare single,train.stepz=1 out=%s/allfail"):format(ROOT))
    assert.are.equal(1, code, o)
    assert.truthy(o:find("1 of 1 run(s) failed", 1, true), o)
    assert.truthy(parse_csv(slurp(ROOT .. "/allfail/results.csv")).rows[1].status == "failed")
  end)

  it("refuses bad input with one line naming it, before running anything", function()
    for _, case in ipairs({
      { "nope", 'unknown recipe "nope" (recipes: ' },
      { "--nproc 0", "--nproc needs a rank count >= 1" },
      { "--frobnicate", "unknown option --frobnicate" },
      { "dp@x", '"dp@x": the rank count after' },
      -- inf passes n == math.floor(n): it read as -9223372036854775808 ranks
      { "dp@inf", '"dp@inf": the rank count after \'@\' must be a whole number >= 1' },
      { "--nproc inf", "--nproc needs a rank count >= 1" },
      { "--nproc 1000000 single", "at most " },
      { "dp@3", "3 rank(s) cannot share the global batch of 2 micro-batches" },
      { "dp,seed", 'cannot read "seed": expected key=value' },
      { "out=", "out= needs a directory" },
      { "single batch.accumulate=0", "batch.accumulate must be a whole number" },
      { "single dp train.stepz=3", 'no recipe takes the shared settings: ' },
    }) do
      local o, code = run("build/ztrain compare " .. case[1] .. (case[1] == "out=" and "" or (" out=" .. ROOT .. "/bad")))
      assert.are.equal(1, code, o)
      assert.truthy(o:find("^ztrain: compare: "), o)
      assert.truthy(o:find(case[2], 1, true), case[1] .. ": " .. o)
      assert.are.equal(2, select(2, o:gsub("\n", "\n")), o)        -- the message and rc=
    end
    assert.is_nil(io.open(ROOT .. "/bad/results.csv"))
  end)

  it("refuses an item directory holding a run it did not make, and reruns over its own", function()
    local d = ROOT .. "/again"
    local TINY = "model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.eval_every=0 " ..
                 "train.steps=2 train.ckpt_every=1"
    -- a run of the user's own where the item "single" would go: left as it was
    local _, rc0 = run(("build/ztrain recipes/single.lua %s -q out=%s/single"):format(TINY, d))
    assert.are.equal(0, rc0)
    local before = slurp(d .. "/single/summary.json")
    local o, code = run(("build/ztrain compare single %s out=%s"):format(TINY, d))
    assert.are.equal(1, code, o)
    assert.truthy(o:find("compare: " .. d .. "/single holds a run compare did not make (summary.json); choose " ..
                         "another out=", 1, true), o)
    assert.are.equal(before, slurp(d .. "/single/summary.json"))
    assert.is_nil(io.open(d .. "/single/log.txt"))
    -- compare's own items (checkpoints too) are replaced when it runs again
    local d2 = ROOT .. "/again2"
    for i = 1, 2 do
      local o2, code2 = run(("build/ztrain compare single %s out=%s"):format(TINY, d2))
      assert.are.equal(0, code2, i .. ": " .. o2)
      assert.are.equal("ok", cjson.decode(slurp(d2 .. "/single/summary.json")).exit)
    end
  end)

  it("splits items: ranks, own overrides, commas inside values", function()
    local runs = compare.plan({ items = { "single", "zero3@2,model.seed=7,data.text=bin:a,b,c", "dp@1" },
                                nproc = 2, accumulate = 1 })
    assert.are.equal(1, runs[1].ranks); assert.are.equal(2, runs[1].accumulate)
    assert.are.equal(2, runs[2].ranks); assert.are.equal(1, runs[2].accumulate)
    assert.are.same({ "model.seed=7", "data.text=bin:a,b,c" }, runs[2].overrides)
    assert.are.equal(1, runs[3].ranks); assert.are.equal(2, runs[3].accumulate)
    assert.are_not.equal(runs[1].dir, runs[2].dir)
  end)
end)
