-- The collective watchdog and checked collectives (runtime/comm_watch.c):
-- a stuck collective ends the job within comm.timeout naming who did not
-- arrive; collectives that differ between ranks fail at once naming both
-- call sites. (Issue "Reliability" items 4 and 5.)
local u = require "spec.helpers.util"

local ZT = "build/ztrain --nproc 2 --script spec/helpers/watchdog.lua "

local function run(args)
  local t0 = os.time()
  local out, rc = u.sh("ZTRAIN_COMM_CHECK= timeout 60 " .. ZT .. args)
  return out, rc, os.time() - t0
end

describe("comm watchdog", function()
  setup(function()
    require("ztrain.core.libc").setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1)
    require("ztrain.core.libc").setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1)
  end)

  it("a rank that never arrives: the job ends with status 5, naming who arrived and the other's last op", function()
    local out, rc, secs = run("stall 2 keys")       -- as a run names the setting: the recipe key
    assert.are.equal(5, rc)
    assert.is_true(secs < 15, "took " .. secs .. " s")
    assert.matches("ztrain: rank 0: comm.timeout: all_reduce #2 on the world (2 ranks), 4096 bytes, " ..
                   "has waited 2.0 s for its peers (comm.timeout = 2 s):", out, 1, true)
    assert.matches("  rank 0 (this rank): arrived\n", out, 1, true)
    assert.matches("  rank 1: last completed all_reduce #1 on that group [%d.]+ s ago; now not in any " ..
                   "collective %(computing, or waiting elsewhere%)", out)
    assert.matches("ztrain: ending the job (exit status 5)", out, 1, true)
  end)

  it("a stopped rank (SIGSTOP) gives no answer and is named as such", function()
    local out, rc, secs = run("stop 2")             -- no names given: the runtime's, not a recipe key
    assert.are.equal(5, rc)
    assert.is_true(secs < 20, "took " .. secs .. " s")
    assert.matches("ztrain: rank 0: zt_comm_watch timeout: all_reduce #2 on the world (2 ranks), 4096 bytes, " ..
                   "has waited 2.0 s for its peers (zt_comm_watch timeout = 2 s):", out, 1, true)
    assert.is_nil(out:find("comm.timeout", 1, true), out)
    assert.matches("  rank 1: no answer: stopped (SIGSTOP), dead, or stuck outside ztrain's engine", out, 1, true)
    assert.are.equal("", (u.sh("pgrep -f '[s]pec/helpers/watchdog.lua stop' || true"):gsub("rc=0\n", "")))
  end)

  it("checked collectives: ranks issuing different collectives fail at once, naming both call sites", function()
    local out, rc, secs = run("check 30 keys")
    assert.are.equal(1, rc, out)
    assert.is_true(secs < 15, "took " .. secs .. " s (it should not wait for the 30 s timeout)")
    assert.matches("comm.check: collective #2 on the world (2 ranks) differs between ranks: rank 0 calls " ..
                   "all_reduce (f32, 1024 elements) at helpers/watchdog.lua:18; rank 1 calls broadcast (f32, " ..
                   "1024 elements, root 0) at helpers/watchdog.lua:18", out, 1, true)
    -- without names: the runtime's own, no recipe key
    out, rc = run("check 30")
    assert.are_not.equal(0, rc)
    assert.matches("zt_comm_watch check: collective #2 on the world (2 ranks) differs between ranks", out, 1, true)
    assert.is_nil(out:find("comm.check", 1, true), out)
  end)

  it("comm.timeout is a recipe key, checked", function()
    local r, err = require("ztrain.train.recipe").resolve({}, { "comm.timeout=-1" })
    assert.is_nil(r)
    assert.matches("comm.timeout must be", err, 1, true)
    local out, rc = u.sh("build/ztrain recipes/single.lua comm.timeout=-1 -q out=" .. u.outdir())  -- made by no run
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: recipes/single.lua: comm.timeout must be a number in [0, 1000000000], got -1", out, 1, true)
    r = assert(require("ztrain.train.recipe").resolve({}, { "comm.timeout=7", "comm.check=true" }))
    assert.are.equal(7, r.comm.timeout)
    assert.is_true(r.comm.check)
  end)
end)
