-- A machine busier than its cores (issue 29, item 12): OpenMP waits
-- passively there (core/ffi.lua: measured 59-80 ms a gpt2-mini step against
-- 170-356 spinning, under a load of 3.7 on 2 cores; spinning is faster on
-- a quiet machine), a user's OMP_WAIT_POLICY wins, and the banner says so.
local zffi = require "ztrain.core.ffi"
local report = require "ztrain.record.report"

describe("OpenMP's wait policy", function()
  it("is passive where the load average is above the CPUs, untouched otherwise or when the user set one", function()
    assert.are.equal("passive", zffi.omp_wait_choice(3.7, 2, nil))
    assert.is_nil(zffi.omp_wait_choice(1.9, 2, nil))
    assert.is_nil(zffi.omp_wait_choice(2.0, 2, nil))
    assert.is_nil(zffi.omp_wait_choice(9, 2, "active"))
    assert.is_nil(zffi.omp_wait_choice(nil, 2, nil))     -- no /proc/loadavg
  end)
end)

describe("the banner", function()
  local function banner(b)
    local base = { model = "gpt2-tiny", params = 124672, strategy = "dp", world = 2, stages = 1, device = "cpu",
                   precision = "fp32", global = 8, micro = 2, accumulate = 2, dp = 2, T = 32, steps = 10,
                   from_step = 0, step_tokens = 256, out = "runs/x", cores = 2, threads = 1 }
    for k, v in pairs(b) do base[k] = v end
    local parts = {}
    report.print_banner(base, { write = function(_, ...) for _, p in ipairs({ ... }) do parts[#parts + 1] = p end end,
                                flush = function() end })
    return table.concat(parts)
  end
  it("says when the machine is busy, and who set the wait policy", function()
    local t = banner({ load = 3.7, omp_wait = "passive", omp_wait_auto = "passive" })
    assert.matches("  machine   busy: load average 3.7 over the last minute on 2 core(s) (this rank: 1 thread(s), " ..
                   "OMP_WAIT_POLICY=passive set by ztrain); steps will be slower and vary\n", t, 1, true)
    assert.is_nil(banner({ load = 1.5 }):find("machine", 1, true))
    t = banner({ load = 2.5, omp_wait = "active" })
    assert.matches("OMP_WAIT_POLICY=active); steps", t, 1, true)
  end)
  it("names a resume and the step it starts from", function()
    local t = banner({ from_step = 4, resumed = "runs/x/checkpoints/step-00000004" })
    assert.matches("  steps     10 from step 4, 1,536 tokens to train\n  resumed   from runs/x/checkpoints/step-00000004\n",
                   t, 1, true)
  end)
end)
