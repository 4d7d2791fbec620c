-- Bounds (issue 30, family 7): requests past what the machine or Open MPI
-- can take are refused, naming the bound, instead of running without end.
-- The launches use a stand-in mpirun (first in PATH) so that nothing here
-- can start thousands of ranks, even on code without the checks.
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
-- dp: the launches below pass the checks a recipe and a rank count decide (train/world_checks.lua)
local RECIPE = ROOT .. "/recipes/dp.lua model.size=gpt2-tiny data.tokenizer=bytes train.steps=1 -q"

-- a directory with an mpirun that notes its pid and arguments, then runs body
local function fake_mpirun(body)
  local d = u.tmpdir()
  u.write(d .. "/mpirun", ("#!/bin/sh\necho $$ > %s/pid\necho \"$@\" > %s/args\n%s\n"):format(d, d, body))
  u.sh("chmod +x " .. d .. "/mpirun")
  return d
end

describe("bounds", function()
  it("ztrain schedule refuses shapes past its bounds, naming them", function()
    local out, rc = u.sh(("timeout 60 %s schedule 1f1b p=100000 m=100000"):format(ZT))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: 1f1b: stages (ranks 100000 x chunks 1 = 100000) exceed the bound of 1024 pipeline " ..
                   "stages a schedule may have; lower the ranks (p) or the chunks (v)", out, 1, true)
    out, rc = u.sh(("timeout 60 %s schedule 1f1b p=1000 m=1000"):format(ZT))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: 1f1b: stages (1000) x microbatches (1000) = 1000000 exceeds the bound of 65536 " ..
                   "(stage, micro-batch) pairs a schedule's action lists may hold; lower the microbatches (m), " ..
                   "ranks (p) or chunks (v)", out, 1, true)
    out, rc = u.sh(("timeout 60 %s schedule compare p=4 m=99999999999999999999"):format(ZT))
    assert.are.equal(1, rc, out)
    -- (past 15 digits in exponent form: 1e300 is not a 301-digit line)
    assert.matches("ztrain: compare: stages (4) x microbatches (1e+20) = 4e+20 exceeds the bound of 65536", out, 1, true)
    -- within the bounds: drawn
    local d = u.tmpdir()
    out, rc = u.sh(("timeout 60 %s schedule interleaved_1f1b p=8 m=16 v=2 out=%s"):format(ZT, d))
    assert.are.equal(0, rc, out)
    u.rm(d)
  end)

  it("--nproc far above the cores is refused unless --oversubscribe", function()
    local d = fake_mpirun("exec sleep 1000")
    local out, rc = u.sh(("PATH=%s:$PATH timeout 30 %s --nproc 999 %s"):format(d, ZT, RECIPE))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: 999 ranks are more than this machine runs %(%d+: %d+ usable core%(s%) x 8%); " ..
                   "ask for %d+ at most, or pass %-%-oversubscribe to start them anyway", out)
    local f = io.open(d .. "/pid"); assert.is_nil(f, "mpirun was started"); if f then f:close() end
    -- a recipe's launch.nproc too
    out, rc = u.sh(("PATH=%s:$PATH timeout 30 %s %s launch.nproc=999"):format(d, ZT, RECIPE))
    assert.are.equal(1, rc, out)
    assert.matches("999 ranks are more than this machine runs", out, 1, true)
    u.rm(d)
    -- --oversubscribe: mpirun is asked for them (and told to oversubscribe)
    d = fake_mpirun("exit 0")
    out, rc = u.sh(("PATH=%s:$PATH timeout 30 %s --nproc 999 --oversubscribe %s"):format(d, ZT, RECIPE))
    assert.are.equal(0, rc, out)
    local args = u.read(d .. "/args")
    assert.matches("-np 999 ", args, 1, true)
    assert.matches(" --oversubscribe --bind-to none ", args, 1, true)
    assert.matches("--nproc 999 --oversubscribe", args, 1, true)     -- the ranks see it too
    u.rm(d)
  end)

  it("a local launch whose ranks never start is ended after the start timeout", function()
    local d = fake_mpirun("exec sleep 1000")
    local out, rc = u.sh(("PATH=%s:$PATH ZTRAIN_START_TIMEOUT=2 timeout 30 %s --nproc 2 %s"):format(d, ZT, RECIPE))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: only 0 of 2 rank(s) started within 2 s; ending the job (ZTRAIN_START_TIMEOUT sets " ..
                   "the wait)", out, 1, true)
    -- and the stand-in mpirun is gone
    local pid = u.read(d .. "/pid"):match("%d+")
    local _, alive = u.sh("kill -0 " .. pid)
    assert.are_not.equal(0, alive)
    u.rm(d)
  end)
end)
