-- The launcher checks what the recipe and the rank count decide before any
-- rank starts (train/world_checks.lua), warns when a data-parallel recipe
-- runs on one rank, and keeps Open MPI's own text out of the terminal
-- (job/launch.lua: into OUT/mpirun.log, $ZTRAIN_MPI_LOG or $TMPDIR).
-- Issue 29, items 4 and 11.
local util = require "spec.helpers.util"

local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=1 train.eval_every=0 " ..
             "data.tokenizer=bytes 'data.text=docs/*.md'"
local ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "

-- the output's lines, util.sh's closing "rc=N" left out
local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  if t[#t] and t[#t]:match("^rc=%d+$") then t[#t] = nil end
  return t
end

describe("the launcher, before it starts ranks", function()
  local cases = {
    { "--nproc 2 recipes/dp.lua batch.global=10",
      "ztrain: batch.global 10 does not divide into 2 rank(s) x batch.micro 2 = 4 sequences per micro-step; " ..
      "use batch.global=8, or batch.global=12, or batch.micro=1" },
    { "--nproc 3 recipes/pipeline_1f1b.lua",
      "ztrain: 3 rank(s) do not divide into 2 pipeline stages; use 1, 3 stages, or a multiple of 2 ranks" },
    { "--nproc 2 recipes/single.lua", "ztrain: strategy single runs on one rank, but the job has 2; use dp or zero" },
    { "--nproc 4 recipes/pipeline_dp.lua batch.global=6",
      "ztrain: batch.global 6 does not divide into 2 rank(s) x batch.micro 2 = 4 sequences per micro-step" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1] .. " in one line, with no rank started and no output left", function()
      local dir = util.outdir()
      local env, mpi = util.mpi_log()
      local out, rc = util.sh(("%s%stimeout 60 build/ztrain %s %s out=%s"):format(env, ENV, c[1], BASE, dir))
      assert.are.equal(1, rc, out)
      local l = lines(out)
      assert.are.equal(1, #l, out)                    -- one line: the launcher's, not one a rank
      assert.are.equal(1, l[1]:find(c[2], 1, true), out)
      assert.are.equal("", mpi(), "mpirun was started")
      assert.is_nil(io.open(dir), "an output directory was left")
    end)
  end

  it("the same recipe on ranks of the right count passes the checks (the check is not a refusal of all)", function()
    local dir = util.outdir()
    local out, rc = util.sh(("%stimeout 120 build/ztrain --nproc 2 recipes/dp.lua %s batch.global=8 -q out=%s")
                            :format(ENV, BASE, dir))
    assert.are.equal(0, rc, out)
    assert.are.equal(1, util.summary(dir).steps)
    util.rm(dir)
  end)
end)

describe("a data-parallel recipe on one rank", function()
  it("warns, naming --nproc; offload on one rank does not", function()
    local dir = util.outdir()
    local out, rc = util.sh(("timeout 60 build/ztrain recipes/zero2.lua %s out=%s"):format(BASE, dir))
    assert.are.equal(0, rc, out)
    assert.matches("ztrain: warning: strategy zero2 on 1 rank trains what single would, with nothing to split " ..
                   "or hide; start ranks with --nproc N (ztrain --nproc 2 recipes/zero2.lua)", out, 1, true)
    util.rm(dir)
    out, rc = util.sh(("timeout 60 build/ztrain recipes/zero2_offload.lua %s out=%s"):format(BASE, dir))
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("warning", 1, true), out)
    util.rm(dir)
  end)
end)

describe("a rank's own lines", function()
  it("pass to the terminal whatever they look like: a line of dashes is not Open MPI's unless it is its 74", function()
    local p = os.tmpname() .. ".lua"
    util.write(p, 'io.stderr:write(("-"):rep(20), "\\nuser text after a rule\\n", ("-"):rep(20), "\\n")\n' ..
                  'local r = dofile("recipes/dp.lua"); return r\n')
    local d = util.outdir()
    local out, rc = util.sh(("%stimeout 60 build/ztrain --nproc 2 %s %s -q out=%s"):format(ENV, p, BASE, d))
    assert.are.equal(0, rc, out)
    local _, n = out:gsub("user text after a rule", "")
    assert.is_true(n >= 2, out)                      -- the launcher's read and each rank's
    assert.matches(("-"):rep(20) .. "\n", out, 1, true)
    os.remove(p); util.rm(d)
  end)
end)

describe("Open MPI's own text", function()
  it("stays out of the terminal: a failed job's last line is the ranks' message; the text is in the log", function()
    local dir = util.outdir()
    local env, mpi = util.mpi_log()
    -- every rank fails on its own (the data glob): Open MPI prints its abort banner
    local out, rc = util.sh(("%s%stimeout 60 build/ztrain --nproc 2 recipes/dp.lua %s data.text=/nonexistent " ..
                             "out=%s"):format(env, ENV, BASE, dir))
    assert.are.equal(1, rc, out)
    local l = lines(out)
    assert.matches('^ztrain: rank %d: data.text: no file matches "/nonexistent"', l[#l])
    assert.is_nil(out:find("MPI_ABORT", 1, true), out)
    assert.is_nil(out:find("%-%-%-%-%-%-%-%-%-%-"), out)
    -- Open MPI's text went to the log: its abort banner, or where mpirun
    -- could not format it, its ORTE_ERROR_LOG lines about show_help
    local text = mpi()
    assert.is_truthy(text:find("MPI_ABORT was invoked on rank %d") or text:find("ORTE_ERROR_LOG"), text)
  end)
end)
