-- --ds-config and `ztrain ds-convert` in the program: a converted DeepSpeed
-- config (spec/fixtures/ds_config/) trained to the same digest as the native
-- recipe, DeepSpeed's batch check at one rank, and a printed recipe that loads
-- (the conversion itself: spec/unit/dsconfig_spec.lua).
local cjson = require "cjson"
local util = require "helpers.util"

local DIR = "spec/fixtures/ds_config/"

describe("ds-config: the command line", function()
  local BASE = "train.eval_every=0 -q"

  local function digest(args)
    local dir = util.outdir()
    local out, rc = util.sh(("timeout 120 build/ztrain %s %s out=%s"):format(args, BASE, dir))
    assert.are.equal(0, rc, out)
    local s = cjson.decode(util.read(dir .. "/summary.json"))
    util.rm(dir)
    return s.param_digest, out
  end

  it("a converted config trains to the native recipe's digest (zero2, 2 ranks, 2 steps)", function()
    local got, out = digest("recipes/zero2.lua --nproc 2 --ds-config " .. DIR .. "ds_config_stage2.json")
    -- the notes once, not once per rank
    local _, n = out:gsub("reduce_bucket_size is not supported", "")
    assert.are.equal(1, n, out)
    local want = digest("recipes/zero2.lua --nproc 2 lr.warmup=1 lr.schedule=linear lr.min_ratio=0 train.steps=2")
    assert.are.equal(want, got)
  end)

  it("refuses at one rank what DeepSpeed would (16 != 8 * 1 * 1)", function()
    local out, rc = util.sh("build/ztrain recipes/zero2.lua --ds-config " .. DIR .. "ds_config_stage2.json -q")
    assert.are.equal(1, rc)
    assert.matches("ztrain: ds-config: Check batch related parameters", out, 1, true)
  end)

  it("ds-convert prints a recipe that loads", function()
    local out, rc = util.sh("build/ztrain ds-convert " .. DIR .. "ds_config_offload.json nproc=2")
    assert.are.equal(0, rc, out)
    assert.matches('strategy = "zero3_offload"', out, 1, true)
    local path = os.tmpname() .. ".lua"
    util.write(path, (out:gsub("rc=%d+%s*$", "")))
    local r = assert(require("ztrain.train.recipe").load(path))
    os.remove(path)
    assert.are.same({ 2, 4, 16 }, { r.batch.micro, r.batch.accumulate, r.batch.global })
  end)
end)
