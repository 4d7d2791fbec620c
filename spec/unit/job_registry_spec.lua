-- Who is who in a job (lua/ztrain/job/registry.lua): the launcher's reading
-- of the files its ranks and launch agents wrote (written here by hand), and
-- note() doing nothing outside a job. (Through real launches:
-- e2e/faults_spec.lua, e2e/launch_spec.lua.)
local util = require "helpers.util"
local registry = require "ztrain.job.registry"

describe("job.registry", function()
  it("reads each pid's rank, host, nvme and checkpoint directories and session; skips other names", function()
    local d = util.tmpdir()
    util.write(d .. "/4242", "rank 1\nhost nodeB\nnvme /tmp/a\nnvme /tmp/b c\nckpt /tmp/run/checkpoints\n")
    util.write(d .. "/77", "host nodeA\nsession /tmp/ompi.nodeA/1\n")
    util.write(d .. "/notes.txt", "rank 9\n")
    assert.are.same({
      [4242] = { rank = 1, host = "nodeB", nvme = { "/tmp/a", "/tmp/b c" }, ckpt = { "/tmp/run/checkpoints" } },
      [77] = { host = "nodeA", session = "/tmp/ompi.nodeA/1", nvme = {}, ckpt = {} },
    }, registry.read(d))
    assert.are.same({}, registry.read(d .. "/none"))
    util.rm(d)
  end)

  it("note() appends a line to this rank's file under ZTRAIN_JOB, and does nothing outside a job", function()
    local ffi = require "ffi"
    pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
    local saved = os.getenv("ZTRAIN_JOB")
    local d = util.tmpdir()
    ffi.C.setenv("ZTRAIN_JOB", d, 1)
    registry.note("rank 3")
    registry.note("nvme /tmp/swap")
    ffi.C.unsetenv("ZTRAIN_JOB")
    registry.note("host nowhere")                 -- outside a job: nowhere to write, no error
    if saved then ffi.C.setenv("ZTRAIN_JOB", saved, 1) end
    local pid = require("ztrain.core.libc").getpid()
    assert.are.equal("rank 3\nnvme /tmp/swap\n", util.read(("%s/%d"):format(d, pid)))
    assert.are.same({ [pid] = { rank = 3, nvme = { "/tmp/swap" }, ckpt = {} } }, registry.read(d))
    util.rm(d)
  end)

  it("reads rank 0's run directory, and whether --overwrite put an earlier run back there", function()
    local d = util.tmpdir()
    util.write(d .. "/10", "rank 0\nout runs/a b\n")
    util.write(d .. "/11", "rank 0\nout runs/c\nout-restored runs/c\n")
    local r = registry.read(d)
    assert.are.equal("runs/a b", r[10].out)
    assert.is_nil(r[10].out_restored)
    assert.are.equal("runs/c", r[11].out)
    assert.is_true(r[11].out_restored)
    util.rm(d)
  end)
end)
