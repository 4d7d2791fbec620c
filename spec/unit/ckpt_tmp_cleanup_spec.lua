-- After a job ended at once (issue 30, family 1), its launcher removes the
-- temporary checkpoint directories its dead ranks noted (registry "ckpt
-- ROOT"), and nothing else of the checkpoint root.
local u = require "spec.helpers.util"
local cleanup = require "ztrain.job.cleanup"
local registry = require "ztrain.job.registry"

local function exists(p) local f = io.open(p, "rb"); if f then f:close() end; return f ~= nil end

describe("a job's temporary checkpoint directories", function()
  it("are removed after the job when a dead rank noted their root", function()
    local job, root = u.tmpdir(), u.tmpdir()
    u.sh(("mkdir -p %s/.step-00000009.tmp %s/step-00000008"):format(root, root))
    u.write(root .. "/.step-00000009.tmp/rank-00000.bin", "partial")
    u.write(root .. "/step-00000008/manifest.json", "{}")
    u.write(root .. "/latest", "step-00000008\n")
    u.write(root .. "/.latest.tmp", "step-00000009\n")
    -- a rank that is gone (a pid no process has)
    u.write(job .. "/4194302", "rank 0\nckpt " .. root .. "\n")
    assert.are.same({ root }, registry.read(job)[4194302].ckpt)
    cleanup.cleanup_job(job)
    assert.is_false(exists(root .. "/.step-00000009.tmp"))
    assert.is_false(exists(root .. "/.latest.tmp"))
    assert.is_true(exists(root .. "/step-00000008/manifest.json"))
    assert.are.equal("step-00000008\n", u.read(root .. "/latest"))
    assert.is_false(exists(job))
    u.rm(root)
  end)
end)
