-- --overwrite replaces a run only when the new one ends (issue 30, item 4:
-- "an --overwrite that fails leaves the previous run's files as they
-- were, all of them"): job/rundir.lua stages the earlier run's files in
-- DIR/.replaced (ROOT/.replaced for an outside train.ckpt_dir), removes
-- them when the new run ends or stops with its checkpoint, puts them back
-- when it fails.
local util = require "spec.helpers.util"

local ZT = "timeout 120 build/ztrain recipes/single.lua model.size=gpt2-tiny data.seq_len=32 batch.micro=2 " ..
           "train.eval_every=0 data.tokenizer=bytes -q 'data.text=docs/*.md'"
local DIVERGE = "train.steps=20 optim.lr=1000 optim.clip=0 lr.warmup=0"

-- tree(dir) -> "path md5" lines of every file under dir, sorted
local function tree(dir)
  local out = util.sh(("cd %s && find . -type f ! -name .lock ! -name .ckpt.lock -exec md5sum {} + | sort -k2")
                      :format(dir))
  return (out:gsub("rc=%d+%s*$", ""))
end

describe("--overwrite", function()
  it("that fails leaves the earlier run's files as they were, all of them", function()
    local d = util.outdir()
    local out, rc = util.sh(("%s train.steps=4 train.ckpt_every=2 out=%s"):format(ZT, d))
    assert.are.equal(0, rc, out)
    local before = tree(d)
    assert.matches("checkpoints/step%-00000004/", before)
    -- the new run writes checkpoints and metrics, then diverges
    out, rc = util.sh(("%s %s train.ckpt_every=2 out=%s --overwrite"):format(ZT, DIVERGE, d))
    assert.are.equal(1, rc, out)
    assert.matches("training diverged", out, 1, true)
    assert.matches(("ztrain: %s holds the run it was to replace again, as it was (--overwrite replaces a run only " ..
                    "when the new one ends)"):format(d), out, 1, true)
    assert.are.equal(before, tree(d))
    assert.is_nil(io.open(d .. "/.replaced"), "the stage was left")
    -- one that ends replaces it: no old checkpoint, no stage
    out, rc = util.sh(("%s train.steps=3 out=%s --overwrite"):format(ZT, d))
    assert.are.equal(0, rc, out)
    assert.are.equal(3, util.summary(d).steps)
    assert.is_nil(io.open(d .. "/checkpoints"), "the replaced run's checkpoints stayed")
    assert.is_nil(io.open(d .. "/.replaced"), "the stage was left")
    util.rm(d)
  end)

  it("keeps an outside train.ckpt_dir's checkpoints when it fails, and drops them when it ends", function()
    local d, ck = util.outdir(), util.tmpdir()
    local out, rc = util.sh(("%s train.steps=4 train.ckpt_every=2 train.ckpt_dir=%s out=%s"):format(ZT, ck, d))
    assert.are.equal(0, rc, out)
    local before = tree(ck)
    assert.matches("step%-00000004/manifest.json", before)
    out, rc = util.sh(("%s %s train.ckpt_every=2 train.ckpt_dir=%s out=%s --overwrite"):format(ZT, DIVERGE, ck, d))
    assert.are.equal(1, rc, out)
    assert.are.equal(before, tree(ck))
    out, rc = util.sh(("%s train.steps=3 train.ckpt_every=3 train.ckpt_dir=%s out=%s --overwrite"):format(ZT, ck, d))
    assert.are.equal(0, rc, out)
    local after = tree(ck)
    assert.is_nil(after:find("step-00000004", 1, true), after)
    assert.matches("step%-00000003/manifest.json", after)
    assert.is_nil(io.open(ck .. "/.replaced"), "the stage was left")
    util.rm(d); util.rm(ck)
  end)

  it("touches only what a run writes: other files in out= and in train.ckpt_dir stay, whatever the outcome", function()
    -- out= inside the checkpoint directory, which also holds a file of the user's
    local ck = util.tmpdir()
    local d = ck .. "/run1"
    util.write(ck .. "/notes.txt", "mine\n")
    local out, rc = util.sh(("%s train.steps=4 train.ckpt_every=2 train.ckpt_dir=%s out=%s"):format(ZT, ck, d))
    assert.are.equal(0, rc, out)
    util.write(d .. "/data.bin", "also mine\n")
    local before_ck, before_d = tree(ck), tree(d)
    out, rc = util.sh(("%s %s train.ckpt_every=2 train.ckpt_dir=%s out=%s --overwrite"):format(ZT, DIVERGE, ck, d))
    assert.are.equal(1, rc, out)
    assert.matches("loss is nan at step [3-9]", out)           -- after checkpoints of its own were written
    assert.are.equal(before_ck, tree(ck))
    assert.are.equal(before_d, tree(d))
    out, rc = util.sh(("%s train.steps=3 train.ckpt_every=3 train.ckpt_dir=%s out=%s --overwrite"):format(ZT, ck, d))
    assert.are.equal(0, rc, out)
    assert.are.equal("mine\n", util.read(ck .. "/notes.txt"))
    assert.are.equal("also mine\n", util.read(d .. "/data.bin"))
    assert.are.equal(3, util.summary(d).steps)
    util.rm(ck)
  end)

  it("drops the stage a killed --overwrite left, and replaces what is there", function()
    local d = util.outdir()
    local out, rc = util.sh(("%s train.steps=2 out=%s"):format(ZT, d))
    assert.are.equal(0, rc, out)
    util.sh(("mkdir -p %s/.replaced && echo old > %s/.replaced/summary.json"):format(d, d))
    out, rc = util.sh(("%s train.steps=3 out=%s --overwrite"):format(ZT, d))
    assert.are.equal(0, rc, out)
    assert.matches(("ztrain: dropping %s/.replaced, left by an --overwrite that was killed"):format(d), out, 1, true)
    assert.are.equal(3, util.summary(d).steps)
    assert.is_nil(io.open(d .. "/.replaced"), "the stage was left")
    util.rm(d)
  end)
end)
