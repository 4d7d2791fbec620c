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

  it("a value of the wrong kind stops a --ds-config run naming the key (fp16.enabled \"yes\" is not fp32)", function()
    local path = os.tmpname()
    util.write(path, '{ "fp16": { "enabled": "yes" } }')
    local dir = util.outdir()
    local out, rc = util.sh(("timeout 120 build/ztrain recipes/single.lua --ds-config %s model.size=gpt2-tiny " ..
                             "data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.steps=2 %s out=%s")
                            :format(path, BASE, dir))
    local made = io.open(dir .. "/summary.json")
    if made then made:close() end
    os.remove(path); util.rm(dir)
    assert.are.equal(1, rc, out)
    assert.matches('ztrain: ds-config: fp16.enabled must be true or false, got "yes"', out, 1, true)
    assert.is_nil(out:find("%.lua:%d+:"), out)
    assert.is_nil(made, "the run trained")
  end)

  it("ds-convert says what is wrong with nproc=, and the range", function()
    local f = DIR .. "ds_config_offload.json"
    for _, n in ipairs({ "-2", "abc", "1e9", "0", "2.5", "", "0x10", "4097" }) do
      local out, rc = util.sh(("build/ztrain ds-convert %s 'nproc=%s'"):format(f, n))
      assert.are.equal(1, rc, out)
      assert.matches(("ztrain: ds-convert: nproc=%s: give a world size >= 1 (the ranks the config's batch sizes " ..
                      "are divided among): a whole number from 1 to 4096"):format(n), out, 1, true)
    end
    local out, rc = util.sh("build/ztrain ds-convert " .. f .. " world=2")
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: ds-convert: unexpected argument world=2: expected ztrain ds-convert FILE [nproc=N]", out, 1, true)
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
