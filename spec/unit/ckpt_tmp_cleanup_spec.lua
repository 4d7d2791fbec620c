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

  -- A rank mpirun left unreaped when it ended is adopted by the launcher (its
  -- subreaper) and is a zombie until reap_adopted, which runs after
  -- cleanup_job: kill(pid, 0) still finds it, and the .tmp directory of the
  -- checkpoint it was writing stayed (SIGINT twice under --nproc 8 left one in
  -- 2 of 4 tries). A zombie is gone.
  it("are removed when the rank that noted them is a zombie", function()
    local job, root = u.tmpdir(), u.tmpdir()
    u.sh(("mkdir -p %s/.step-00000003.tmp"):format(root))
    u.write(root .. "/.step-00000003.tmp/rank-00001.bin", "partial")
    -- a child that exits under a parent that never reaps it: after the
    -- exec (a child that ended before it could be reaped by the shell, and
    -- no zombie seen: the clean-clone CI at 95e0d33, once)
    u.sh(("sh -c 'sleep 0.3 & echo $! > %s/z; exec sleep 30' >/dev/null 2>&1 & echo $! > %s/parent"):format(job, job))
    local zpid, state
    for _ = 1, 200 do
      zpid = tonumber(u.sh("cat " .. job .. "/z 2>/dev/null"):match("^(%d+)\n"))
      local f = zpid and io.open(("/proc/%d/stat"):format(zpid))
      state = f and f:read("*a"):match("%) (%a)")
      if f then f:close() end
      if state == "Z" then break end
      u.sh("sleep 0.02")
    end
    local parent = u.read(job .. "/parent"):match("%d+")
    finally(function() u.sh("kill " .. parent) end)
    os.remove(job .. "/z"); os.remove(job .. "/parent")
    assert.are.equal("Z", state)
    u.write(("%s/%d"):format(job, zpid), "rank 1\nckpt " .. root .. "\n")
    assert.is_true(cleanup.gone(zpid))
    cleanup.cleanup_job(job)
    assert.is_false(exists(root .. "/.step-00000003.tmp"))
    assert.is_false(exists(job))
    u.rm(root)
  end)
end)
