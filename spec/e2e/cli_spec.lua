-- The ztrain program as a user meets it: help, -e, the REPL, errors, exit codes.
local util = require "helpers.util"

-- run(cmd, input) -> output, exit code (input: the command's stdin)
local run = util.run

-- a fresh path under /tmp: runs never write into the checkout's runs/
local tmpdir = util.outdir

describe("ztrain program", function()
  it("prints help with the recipe keys", function()
    local out, rc = run("build/ztrain --help")
    assert.are.equal(0, rc)
    assert.matches("usage: ztrain", out, 1, true)
    assert.matches("device.memory_limit", out, 1, true)
    assert.matches("launch.nproc", out, 1, true)
    assert.matches("launch = { nproc = N }", out, 1, true)
    assert.matches("ztrain schedule [show|simulate] NAME|compare", out, 1, true)
  end)

  it("runs -e code with ztrain loaded", function()
    local out, rc = run([[build/ztrain -e 'print(zt.gpt2.config("gpt2").C * 2)']])
    assert.are.equal(0, rc)
    assert.matches("1536", out, 1, true)
  end)

  it("has a REPL that prints results, survives errors and reads multi-line input", function()
    local out, rc = run("build/ztrain", "1+1\nerror('boom')\nfor i = 1, 2 do\nprint('line' .. i)\nend\n" ..
                        "zt.ops.fill(nil, 1)\n'still here'\n")
    assert.are.equal(0, rc)
    assert.matches("zt> 2", out, 1, true)
    assert.matches("error: [^\n]*boom", out)
    assert.matches("line1\nline2", out, 1, true)
    assert.matches("x is NULL", out, 1, true)
    assert.matches("still here", out, 1, true)
  end)

  it("exits 1 naming an unknown recipe key and its nearest valid key", function()
    local out, rc = run("build/ztrain recipes/single.lua batch.mirco=2 out=" .. tmpdir())
    assert.are.equal(1, rc)
    assert.matches('unknown recipe key "batch.mirco"; did you mean "batch.micro"?', out, 1, true)
  end)

  it("says what to do when --nproc cannot find mpirun", function()
    local out, rc = run("env PATH=/nonexistent " .. os.getenv("PWD") .. "/build/ztrain --nproc 2 recipes/dp.lua out=" .. tmpdir())
    assert.are.equal(1, rc)
    assert.matches("ztrain: cannot run mpirun (not found in PATH): install Open MPI (make deps) or start the ranks " ..
                   "with your own launcher", out, 1, true)
  end)

  it("counts the cores it may use: affinity mask and cgroup quota", function()
    local out, rc = run([[build/ztrain -e 'print("cores=" .. require("ztrain.job.launch").cores())']])
    assert.are.equal(0, rc, out)
    local all = tonumber(out:match("cores=(%d+)"))
    assert.is_true(all >= 1, out)
    -- taskset (util-linux) pins the process to CPU 0: one core, whatever the machine
    out, rc = run([[taskset -c 0 build/ztrain -e 'print("cores=" .. require("ztrain.job.launch").cores())']])
    assert.are.equal(0, rc, out)
    assert.are.equal(1, tonumber(out:match("cores=(%d+)")), out)
    local launch = require "ztrain.job.launch"
    assert.is_nil(launch.parse_cpu_max("max 100000\n"))
    assert.are.equal(2, launch.parse_cpu_max("200000 100000\n"))
    assert.are.equal(2, launch.parse_cpu_max("150000 100000"))    -- 1.5 CPUs of time: 2 threads
    assert.are.equal(1, launch.parse_cpu_max("20000 100000"))
    assert.is_nil(launch.quota_cores("-1", "100000"))             -- cgroup v1: no quota
    assert.are.equal(3, launch.quota_cores("300000\n", "100000\n"))
    -- cgroup v2 inside a namespace (mount root /kubepods): the cgroup and its parents
    local dirs = launch.cgroup_dirs("0::/kubepods/pod1/c2\n",
      "40 31 0:38 /kubepods /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n")
    local got = {}
    for i, d in ipairs(dirs) do got[i] = d.dir .. (d.v2 and " v2" or " v1") end
    assert.are.same({ "/sys/fs/cgroup/pod1/c2 v2", "/sys/fs/cgroup/pod1 v2", "/sys/fs/cgroup v2" }, got)
    -- cgroup v1: the controller list naming "cpu"
    dirs = launch.cgroup_dirs("4:memory:/m\n2:cpu,cpuacct:/job\n",
      "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" ..
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    got = {}
    for i, d in ipairs(dirs) do got[i] = d.dir .. (d.v2 and " v2" or " v1") end
    assert.are.same({ "/sys/fs/cgroup/cpu,cpuacct/job v1", "/sys/fs/cgroup/cpu,cpuacct v1" }, got)
  end)

  it("declares libc once, under names a user's own cdefs cannot clash with", function()
    -- in a fresh Lua state: load ztrain.libc twice (the second declares
    -- nothing: redefining its glob_t would fail), then declare libc functions
    -- and a glob_t as a recipe might (spec/e2e/dist_spec.lua's rank killer does)
    local out, rc = run([[build/ztrain -e '
      local ffi = require "ffi"
      local libc = require "ztrain.core.libc"
      package.loaded["ztrain.core.libc"] = nil
      local again = require "ztrain.core.libc"
      ffi.cdef "int getpid(void); int kill(int pid, int sig); typedef struct { size_t n; } glob_t;"
      print("same=" .. tostring(ffi.C.getpid() == again.getpid() and libc.glob_t == again.glob_t))']])
    assert.are.equal(0, rc, out)
    assert.matches("same=true", out, 1, true)
  end)

  it("exits 1 on arguments it cannot read", function()
    local out, rc = run("build/ztrain --frobnicate")
    assert.are.equal(1, rc)
    assert.matches("ztrain: unknown option --frobnicate (see ztrain --help)", out, 1, true)
  end)

  it("trains a recipe and prints plain progress lines when not on a terminal", function()
    local dir = tmpdir()
    local out, rc = run("build/ztrain recipes/single.lua train.steps=4 train.log_every=2 " ..
                        "data.seq_len=32 batch.micro=2 train.eval_batches=2 out=" .. dir)
    assert.are.equal(0, rc)
    assert.matches("step     2/4  loss", out, 1, true)
    assert.is_nil(out:find("\r", 1, true))
    assert.matches("digest      %x+", out)
    assert.truthy(io.open(dir .. "/summary.json"))
  end)
end)
