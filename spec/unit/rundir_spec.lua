-- A run's output directory (lua/ztrain/job/rundir.lua), claimed directly on
-- one rank (the local communicator): an out= made and locked with this
-- process's pid, an earlier run's directory refused unless overwritten or
-- resumed, a second claim refused naming the holder, an empty directory the
-- run made removed on release. (Runs started together, default directories
-- and a killed run's lock, through the program: e2e/reliability_spec.lua.)
local util = require "helpers.util"
local rundir = require "ztrain.job.rundir"
local errors = require "ztrain.core.errors"
local comm = require "ztrain.core.comm"
local libc = require "ztrain.core.libc"

local function claim(out, more)
  local r = { name = "t", out = out, overwrite = false, resume = "" }
  for k, v in pairs(more or {}) do r[k] = v end
  return rundir.claim(r, comm.world())
end

local function refusal(out, more)
  local ok, e = pcall(claim, out, more)
  assert.is_false(ok, "claimed " .. out)
  assert.is_true(errors.is_all_ranks(e), "every rank raises it")
  return errors.message(e)
end

describe("rundir.claim", function()
  local root
  before_each(function() root = util.tmpdir() end)
  after_each(function() util.rm(root) end)

  it("makes out= (and its parents), locks it with this pid, and removes it on release when left empty", function()
    local dir = root .. "/a/b/run"
    local out, lock = claim(dir .. "/")                -- a trailing slash names the same directory
    assert.are.equal(dir, out)
    assert.are.equal(tostring(libc.getpid()) .. "\n", util.read(dir .. "/.lock"))
    lock:release()
    assert.is_false(util.exists(dir), "an empty directory the run made is removed")
    assert.is_true(util.exists(root .. "/a/b"))
    lock:release()                                     -- twice is fine
  end)

  it("keeps a directory that was there before, or that the run wrote into", function()
    local _, lock = claim(root)
    lock:release()
    assert.is_true(util.exists(root))
    local out, lock2 = claim(root .. "/new")
    util.write(out .. "/log", "x")
    lock2:release()
    assert.are.equal("x", util.read(out .. "/log"))
    assert.is_false(util.exists(out .. "/.lock"))
  end)

  it("refuses an earlier run's directory unless --overwrite or resume=, and leaves it unlocked", function()
    for _, f in ipairs({ "summary.json", "metrics.jsonl" }) do
      local dir = root .. "/" .. f
      util.sh("mkdir -p " .. dir)
      util.write(dir .. "/" .. f, "{}")
      assert.are.equal(("out=%s holds an earlier run (%s); choose another out=, continue it with resume=latest, " ..
                        "or replace it with --overwrite"):format(dir, f), refusal(dir))
      assert.is_false(util.exists(dir .. "/.lock"))
      local _, l1 = claim(dir, { overwrite = true }); l1:release()
      local _, l2 = claim(dir, { resume = "latest" }); l2:release()
    end
  end)

  it("refuses a train.ckpt_dir with an earlier run's checkpoints: by latest, else by its newest step", function()
    local ck = root .. "/ck"
    util.sh(("mkdir -p %s/step-00000002 %s/step-00000010 %s/.step-00000012.tmp"):format(ck, ck, ck))
    local function msg(held)
      return ("train.ckpt_dir=%s holds an earlier run's checkpoints (%s); choose another train.ckpt_dir, continue " ..
              "that run with resume=latest, or replace them with --overwrite"):format(ck, held)
    end
    -- no latest (a failed write's .tmp is not a checkpoint): the newest step named
    assert.are.equal(msg("step-00000010"), refusal(root .. "/a", { train = { ckpt_dir = ck, ckpt_every = 1 } }))
    util.write(ck .. "/latest", "step-00000002\n")
    assert.are.equal(msg("latest -> step-00000002"), refusal(root .. "/a", { train = { ckpt_dir = ck } }))
    assert.is_false(util.exists(ck .. "/.ckpt.lock"))
    -- only .tmp left: nothing of a run's to keep
    util.sh(("rm -rf %s/latest %s/step-*"):format(ck, ck))
    local _, l = claim(root .. "/a", { train = { ckpt_dir = ck, ckpt_every = 1 } }); l:release()
  end)

  it("refuses a second claim while the first holds the lock, naming its pid", function()
    local _, lock = claim(root)
    assert.are.equal(("out=%s is in use by another run (pid %d); wait for it to end, or choose another out=")
                     :format(root, libc.getpid()), refusal(root))
    lock:release()
    local _, again = claim(root)                       -- free again
    again:release()
  end)

  it("says why it cannot make out=", function()
    util.write(root .. "/file", "")
    assert.matches("^cannot create output directory " .. (root .. "/file/run"):gsub("%p", "%%%0") .. ": Not a directory; choose another out=$",
                   refusal(root .. "/file/run"))
  end)
end)
