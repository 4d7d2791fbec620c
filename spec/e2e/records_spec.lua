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
    local got, want = u.metrics(dir), u.metrics(whole)
    local steps = {}
    for i, l in ipairs(got) do steps[i] = l.step end
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8 }, steps)
    for i = 1, 8 do assert.are.equal(want[i].loss_hex, got[i].loss_hex, "step " .. i) end
  end)

  it("every line says when: the wall clock within the run, elapsed seconds of its process", function()
    local prev = 0
    for _, l in ipairs(u.metrics(dir)) do
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

describe("records: a resume keeps the math its checkpoint's run computed", function()
  local dir
  local Z = "build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 " ..
            "train.ckpt_every=3 train.eval_every=0 -q lr.warmup=1"
  setup(function()
    dir = u.outdir()
    -- one rank accumulating 2 micro-batches of 1: what 2 dp ranks compute
    local out, rc = u.sh(Z .. " batch.micro=1 batch.accumulate=2 train.steps=6 out=" .. dir)
    assert.are.equal(0, rc, out)
  end)
  teardown(function() u.rm(dir) end)

  local function resume(args)
    local out = u.outdir()
    local text, rc = u.sh(("%s resume=%s/checkpoints/step-00000003 out=%s %s"):format(Z, dir, out, args))
    u.rm(out)
    return text, rc
  end

  it("refuses another global batch, naming both values and the key that allows it", function()
    local text, rc = resume("batch.micro=2 batch.accumulate=2 train.steps=6")
    assert.are.equal(1, rc, text)
    assert.matches("would change what the run computes %-%- batch: batch.global %(micro x accumulate x ranks%) 2 %-> 4",
                   text)
    assert.matches("ztrain: resume from .- would change what the run computes %-%- batch: ", text)
    assert.matches("; resume with the checkpoint's settings, or allow it with allow_changes=batch", text, 1, true)
    assert.not_matches("%.lua:%d+:", text)
  end)

  it("refuses a longer cosine schedule (the learning rate of step 4 changes), and allows it when asked", function()
    local text, rc = resume("batch.micro=1 batch.accumulate=2 train.steps=12")
    assert.are.equal(1, rc, text)
    assert.matches("lr: train.steps 6 %-> 12 %(the learning rate at step 4: ", text)
    -- the rates it names are the schedules' own
    local lr = require "ztrain.model.lr"
    local a, b = lr.make(3e-3, { warmup = 1, schedule = "cosine", min_ratio = 0.1 }, 6)(4),
                 lr.make(3e-3, { warmup = 1, schedule = "cosine", min_ratio = 0.1 }, 12)(4)
    assert.matches(("%.4g %%-> %.4g"):format(a, b), text)
    text, rc = resume("batch.micro=1 batch.accumulate=2 train.steps=12 allow_changes=lr")
    assert.are.equal(0, rc, text)
  end)

  it("lets train.steps change under a constant schedule: the rates to come are the same", function()
    local d = u.outdir()
    local out, rc = u.sh(Z .. " lr.schedule=constant batch.micro=2 train.steps=6 out=" .. d)
    assert.are.equal(0, rc, out)
    out, rc = u.sh(("%s lr.schedule=constant batch.micro=2 train.steps=9 resume=latest out=%s"):format(Z, d))
    assert.are.equal(0, rc, out)
    u.rm(d)
  end)

  it("proceeds under another strategy and world size with the same global batch, and says what moved", function()
    local out = u.outdir()
    local text, rc = u.sh(("build/ztrain --nproc 2 recipes/dp.lua model.size=gpt2-tiny data.tokenizer=bytes " ..
                           "data.seq_len=32 train.ckpt_every=3 train.eval_every=0 lr.warmup=1 batch.micro=1 " ..
                           "train.steps=6 resume=%s/checkpoints/step-00000003 out=%s"):format(dir, out))
    assert.are.equal(0, rc, text)
    assert.matches("resumed from .- at step 3 %(placed otherwise: strategy single %-> dp, world_size 1 %-> 2; " ..
                   "the same math%)", text)
    -- and the digest is the uninterrupted single run's
    local a = cjson.decode(u.read(out .. "/summary.json")).param_digest
    local b = cjson.decode(u.read(dir .. "/summary.json")).param_digest
    assert.are.equal(b, a)
    u.rm(out)
  end)

  it("an unknown group in allow_changes is refused, naming the known ones", function()
    local text, rc = resume("batch.micro=1 batch.accumulate=2 allow_changes=lrr")
    assert.are.equal(1, rc, text)
    assert.matches('allow_changes: unknown group "lrr" (known: batch, lr, optim, data, precision, all)', text, 1, true)
  end)
end)
