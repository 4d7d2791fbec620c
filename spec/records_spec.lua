-- Runs as records (issue 29, "Runs are records"): metrics.jsonl keeps the
-- whole loss curve across a resume into the same out= (no gap, no step
-- twice), every line says when, and summary.json says what ran, where,
-- when, from which command and under which segments. The independent side:
-- an uninterrupted run of the same steps (the same loss bits per step),
-- the checkout's own git metadata, the kernel's hostname, the clock.
local cjson = require "cjson"
local u = require "spec.helpers.util"

local ZT = "build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 " ..
           "batch.micro=2 train.ckpt_every=3 train.log_every=1 train.eval_every=0 -q"

local function lines(path)
  local out = {}
  for l in u.read(path):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(l) end
  return out
end

local function run(args)
  local out, rc = u.sh(ZT .. " " .. args)
  assert.are.equal(0, rc, out)
end

describe("records: a run resumed into its own out=", function()
  local dir, whole, t0, t1
  setup(function()
    dir, whole = u.outdir(), u.outdir()
    t0 = os.time()
    run("train.steps=6 out=" .. dir)
    -- resumed from step 3 although steps 4-6 were trained: the curve keeps 1-3
    -- and the resumed run's 4-8
    run("train.steps=8 out=" .. dir .. " resume=" .. dir .. "/checkpoints/step-00000003")
    t1 = os.time()
    run("train.steps=8 out=" .. whole)
  end)
  teardown(function() u.rm(dir); u.rm(whole) end)

  it("metrics.jsonl holds steps 1..8 once each, with the uninterrupted run's loss bits", function()
    local got, want = lines(dir .. "/metrics.jsonl"), lines(whole .. "/metrics.jsonl")
    local steps = {}
    for i, l in ipairs(got) do steps[i] = l.step end
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8 }, steps)
    for i = 1, 8 do assert.are.equal(want[i].loss_hex, got[i].loss_hex, "step " .. i) end
  end)

  it("every line says when: the wall clock within the run, elapsed seconds of its process", function()
    local prev = 0
    for _, l in ipairs(lines(dir .. "/metrics.jsonl")) do
      assert.is_true(l.time >= t0 - 1 and l.time <= t1 + 1, ("step %d at %s"):format(l.step, tostring(l.time)))
      assert.is_true(l.time >= prev, "time goes forward")
      assert.is_true(l.elapsed >= 0 and l.elapsed < t1 - t0 + 2, "elapsed " .. tostring(l.elapsed))
      prev = l.time
    end
  end)

  it("the summary covers the whole run: first loss, tokens, and both segments", function()
    local s = cjson.decode(u.read(dir .. "/summary.json"))
    local w = cjson.decode(u.read(whole .. "/summary.json"))
    assert.are.equal(w.first_loss, s.first_loss)
    assert.are.equal(8 * 2 * 32, s.tokens)
    assert.are.equal(w.tokens, s.tokens)
    assert.are.equal(w.param_digest, s.param_digest)
    assert.are.equal(2, #s.history)
    assert.are.equal(0, s.history[1].step)
    assert.are.equal(3, s.history[2].step)
    assert.are.equal(dir .. "/checkpoints/step-00000003", s.history[2].from)
    for _, h in ipairs(s.history) do
      assert.are.equal("single", h.strategy)
      assert.are.equal(1, h.world_size)
      assert.are.equal(2, h.global_batch)
    end
    -- and the checkpoint carries the record forward for the next resume
    local man = cjson.decode(u.read(dir .. "/checkpoints/step-00000008/manifest.json"))
    assert.are.equal(8 * 2 * 32, man.run.tokens)
    assert.are.equal(2, #man.run.history)
  end)

  it("a resume that fails leaves metrics.jsonl and summary.json as they were", function()
    local before, summary = u.read(dir .. "/metrics.jsonl"), u.read(dir .. "/summary.json")
    local out, rc = u.sh(ZT .. " train.steps=10 out=" .. dir .. " resume=" .. dir .. "/checkpoints/step-00000099")
    assert.are_not.equal(0, rc, out)
    assert.matches("step%-00000099", out)
    assert.are.equal(before, u.read(dir .. "/metrics.jsonl"))
    assert.are.equal(summary, u.read(dir .. "/summary.json"))
  end)
end)

describe("records: what summary.json says a run is", function()
  it("schema, version, commit, command, host, start and end, the recipe as JSON", function()
    local dir = u.outdir()
    local t0 = os.time()
    run("train.steps=2 out=" .. dir)
    local t1 = os.time()
    local s = cjson.decode(u.read(dir .. "/summary.json"))
    u.rm(dir)
    assert.are.equal(2, s.schema)
    local version = u.sh("build/ztrain --version"):match("^(.-)\n")
    assert.are.equal(version, s.version)
    local head, rc = u.sh("git rev-parse HEAD 2>/dev/null")
    if rc == 0 then assert.are.equal(head:match("^(%x+)"), s.commit) end
    assert.matches("^ztrain recipes/single%.lua model%.size=gpt2%-tiny .* train%.steps=2 out=", s.command)
    assert.are.equal(u.read("/proc/sys/kernel/hostname"):gsub("%s+$", ""), s.host.name)
    assert.are.equal("cpu", s.host.device)
    local function epoch(iso)
      local y, mo, d, h, mi, se = iso:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)Z$")
      assert.is_truthy(y, "not an ISO 8601 UTC time: " .. tostring(iso))
      local t = os.time({ year = y, month = mo, day = d, hour = h, min = mi, sec = se, isdst = false })
      -- os.time reads local time: undo the zone (UTC here, but say it)
      return t - os.difftime(os.time(os.date("*t", t)), os.time(os.date("!*t", t)))
    end
    assert.is_true(epoch(s.started) >= t0 - 1 and epoch(s.started) <= epoch(s.ended))
    assert.is_true(epoch(s.ended) <= t1 + 1)
    -- the recipe as data, not a Lua-ish string
    assert.are.equal("table", type(s.recipe_json))
    assert.are.equal(2, s.recipe_json.train.steps)
    assert.are.equal("gpt2-tiny", s.recipe_json.model.size)
    assert.are.equal(0.9, s.recipe_json.optim.betas[1])
  end)
end)

describe("records: a run that trained no step", function()
  it("leaves nothing that blocks its corrected retry on the same out=", function()
    local dir = u.outdir()
    -- resume=latest where no run saved a checkpoint: refused before any step
    local out, rc = u.sh(ZT .. " train.steps=2 resume=latest out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("resume=latest reads OUT/checkpoints", out, 1, true)
    assert.are.equal("rc=0\n", (u.sh("test ! -e " .. dir .. "/summary.json && test ! -e " .. dir .. "/metrics.jsonl")))
    -- the retry without resume runs (it was refused: "holds an earlier run")
    run("train.steps=2 out=" .. dir)
    assert.are.equal(2, cjson.decode(u.read(dir .. "/summary.json")).steps)
    u.rm(dir)
  end)
end)
