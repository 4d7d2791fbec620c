-- Checkpoint directories (issue 30, family 3): a train.ckpt_dir is one run's
-- at a time (locked like out=, the holder named), --overwrite removes the
-- replaced run's checkpoints, and a refused start leaves nothing behind
-- that blocks its corrected retry.
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local TINY = ROOT .. "/recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes train.steps=3 -q"

local function exists(p) local f = io.open(p, "rb"); if f then f:close() end; return f ~= nil end
local function pat(s) return (s:gsub("%p", "%%%0")) end

describe("checkpoint directories", function()
  it("two runs with different out= on one train.ckpt_dir: the second is refused, naming the holder", function()
    local d = u.tmpdir()
    local ck = d .. "/ck"
    local first = io.popen(("%s %s out=%s/a train.steps=40 train.ckpt_every=10 train.ckpt_dir=%s 2>&1; echo rc=$?")
                           :format(ZT, TINY, d, ck))
    -- once the first holds the directory (its lock; before the fix: its first checkpoint)
    local t0 = os.time()
    while not (exists(ck .. "/.ckpt.lock") or exists(ck .. "/latest")) and os.time() - t0 < 60 do u.sh("sleep 0.1") end
    local out, rc = u.sh(("%s %s out=%s/b train.steps=3 train.ckpt_every=1 train.ckpt_dir=%s/"):format(ZT, TINY, d, ck))
    local rest = first:read("*a"); first:close()
    assert.are.equal(1, rc, out)
    assert.matches(("ztrain: train.ckpt_dir=%s is in use by another run %%(pid %%d+, out=%s/a%%); wait for it " ..
                    "to end, or choose another train.ckpt_dir="):format(pat(ck), pat(d)), out)
    assert.matches("rc=0", rest, 1, true)
    -- the refused run left no out= behind; the holder's checkpoints are its own
    assert.is_false(exists(d .. "/b"))
    assert.are.equal("step-00000040\n", u.read(ck .. "/latest"))
    assert.is_false(exists(ck .. "/.ckpt.lock"))   -- released at the end
    -- the corrected retry (its own directory) runs
    local _, rc2 = u.sh(("%s %s out=%s/b train.steps=3 train.ckpt_every=1 train.ckpt_dir=%s/ck2"):format(ZT, TINY, d, d))
    assert.are.equal(0, rc2)
    u.rm(d)
  end)

  it("a train.ckpt_dir holding an earlier run's checkpoints is refused unless resume= or --overwrite", function()
    local d = u.tmpdir()
    local ck = d .. "/a/checkpoints"
    local _, rc = u.sh(("%s %s out=%s/a train.steps=4 train.ckpt_every=2"):format(ZT, TINY, d))
    assert.are.equal(0, rc)
    -- another run (another seed) pointed at it: refused before it writes anything
    local out, rc2 = u.sh(("%s %s out=%s/b model.seed=7 train.steps=3 train.ckpt_every=1 train.ckpt_dir=%s")
                          :format(ZT, TINY, d, ck))
    assert.are.equal(1, rc2, out)
    assert.matches(("ztrain: train.ckpt_dir=%s holds an earlier run's checkpoints %%(latest %%-> step%%-00000004%%); " ..
                    "choose another train.ckpt_dir, continue that run with resume=latest, or replace them with " ..
                    "%%-%%-overwrite"):format(pat(ck)), out)
    assert.is_false(exists(d .. "/b"))
    -- the earlier run's checkpoints as they were: latest, both steps
    assert.are.equal("step-00000004\n", u.read(ck .. "/latest"))
    assert.is_true(exists(ck .. "/step-00000002/manifest.json"))
    assert.is_true(exists(ck .. "/step-00000004/manifest.json"))
    -- nor a run without train.ckpt_every: a graceful stop writes a checkpoint there too
    local out4, rc4 = u.sh(("%s %s out=%s/b train.steps=3 train.ckpt_dir=%s"):format(ZT, TINY, d, ck))
    assert.are.equal(1, rc4, out4)
    assert.matches("holds an earlier run's checkpoints", out4, 1, true)
    -- resume= continues it
    local out3, rc3 = u.sh(("%s %s out=%s/c train.steps=6 train.ckpt_every=2 train.ckpt_dir=%s resume=latest")
                           :format(ZT, TINY, d, ck))
    assert.are.equal(0, rc3, out3)
    assert.are.equal("step-00000006\n", u.read(ck .. "/latest"))
    u.rm(d)
  end)

  it("--overwrite removes the replaced run's checkpoints: resume=latest cannot continue it", function()
    local d = u.tmpdir()
    for _, ckdir in ipairs({ "", " train.ckpt_dir=" .. d .. "/ck" }) do
      local x = d .. "/x"
      local _, rc = u.sh(("%s %s out=%s train.steps=6 train.ckpt_every=3%s"):format(ZT, TINY, x, ckdir))
      assert.are.equal(0, rc)
      local root = ckdir == "" and x .. "/checkpoints" or d .. "/ck"
      assert.is_true(exists(root .. "/step-00000006/manifest.json"))
      -- replaced by a run that writes no checkpoint of its own
      local _, rc2 = u.sh(("%s %s out=%s train.steps=2 --overwrite%s"):format(ZT, TINY, x, ckdir))
      assert.are.equal(0, rc2)
      assert.is_false(exists(root .. "/latest"))
      assert.is_false(exists(root .. "/step-00000003"))
      assert.is_false(exists(root .. "/step-00000006"))
      assert.is_false(exists(root))          -- left empty by a run without checkpoints: removed
      local out3, rc3 = u.sh(("%s %s out=%s train.steps=8 resume=latest%s"):format(ZT, TINY, x, ckdir))
      assert.are.equal(1, rc3, out3)
      assert.is_nil(out3:find("resumed from", 1, true), out3)
      assert.matches("ztrain: checkpoint: " .. root .. " is neither a checkpoint (no manifest.json) nor a checkpoint " ..
                     "directory with a `latest` file; ", out3, 1, true)
      u.rm(x); u.rm(d .. "/ck")
    end
    u.rm(d)
  end)

  it("a start refused for its train.ckpt_dir leaves nothing that blocks the corrected retry", function()
    local d = u.tmpdir()
    u.write(d .. "/file", "in the way\n")
    local out, rc = u.sh(("%s %s out=%s/x train.ckpt_every=1 train.ckpt_dir=%s/file/ck"):format(ZT, TINY, d, d))
    assert.are.equal(1, rc, out)
    assert.matches(("ztrain: train.ckpt_dir: cannot create output directory %s/file/ck: Not a directory; " ..
                    "choose another train.ckpt_dir")
                   :format(pat(d)), out)
    assert.is_false(exists(d .. "/x"))
    local out2, rc2 = u.sh(("%s %s out=%s/x train.ckpt_every=1 train.ckpt_dir=%s/ck"):format(ZT, TINY, d, d))
    assert.are.equal(0, rc2, out2)
    assert.is_true(exists(d .. "/ck/step-00000003/manifest.json"))
    u.rm(d)
  end)
end)
