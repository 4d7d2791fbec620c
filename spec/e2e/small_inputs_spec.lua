-- Reliability-2's smaller items (issue 30, item 8): each input that slipped
-- through or said the wrong thing, with the message and status it gets now.
local util = require "spec.helpers.util"

local ZT = "timeout 60 build/ztrain"
local TINY = "recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes train.eval_every=0 -q"

local function write(text)
  local path = os.tmpname()
  util.write(path, text)
  return path
end

describe("DeepSpeed configs", function()
  it("a number out of range (1e999 decodes to inf) is refused, naming its key", function()
    local p = write('{"optimizer": {"type": "AdamW", "params": {"lr": 1e999}}}')
    local out, rc = util.sh(("%s ds-convert %s"):format(ZT, p))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: ds-config: optimizer.params.lr is inf, not a finite number; give a value in range",
                   out, 1, true)
    assert.is_nil(out:find("lr = inf", 1, true), out)
    os.remove(p)
  end)
  it("a JSON array is not a config", function()
    local p = write("[1, 2]")
    local out, rc = util.sh(("%s ds-convert %s"):format(ZT, p))
    assert.are.equal(1, rc, out)
    assert.matches("holds a JSON array, not an object: a DeepSpeed config is an object of keys", out, 1, true)
    os.remove(p)
  end)
  it("a directory named as the config says so", function()
    local d = util.tmpdir()
    local out, rc = util.sh(("%s --ds-config %s %s"):format(ZT, d, TINY))
    assert.are.equal(1, rc, out)
    assert.matches(("ztrain: ds-config: cannot read %s: Is a directory (a DeepSpeed config is a JSON file)")
                   :format(d), out, 1, true)
    assert.is_nil(out:find("bad argument", 1, true), out)
    util.rm(d)
  end)
  it("ds-convert nproc=0 is refused", function()
    local out, rc = util.sh(("%s ds-convert examples/ds_config.json nproc=0"):format(ZT))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: ds-convert: nproc=0: give a world size >= 1 (the ranks the config's batch sizes " ..
                   "are divided among): a whole number from 1 to 4096", out, 1, true)
    assert.is_nil(out:find("world size 0", 1, true), out)
  end)
end)

describe("recipes and the environment", function()
  it("a recipe whose table raises when read says so in one line, no traceback", function()
    local p = write('return setmetatable({}, { __index = function() error("boom") end })')
    os.rename(p, p .. ".lua"); p = p .. ".lua"
    local out, rc = util.sh(("%s %s"):format(ZT, p))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: recipe " .. p .. ": reading the table it returned raised: " .. p .. ":1: boom", out, 1, true)
    assert.is_nil(out:find("stack traceback", 1, true), out)
    os.remove(p)
  end)
  it("ZTRAIN_COMM_TIMEOUT that is not a number is refused, not ignored", function()
    local d = util.outdir()
    local out, rc = util.sh(("ZTRAIN_COMM_TIMEOUT=abc %s %s train.steps=1 out=%s"):format(ZT, TINY, d))
    assert.are.equal(1, rc, out)
    assert.matches("ZTRAIN_COMM_TIMEOUT=abc: not a number of seconds >= 0 (0: no timeout); fix or unset it, " ..
                   "or set comm.timeout", out, 1, true)
    out, rc = util.sh(("ZTRAIN_COMM_TIMEOUT=30 %s %s train.steps=1 out=%s"):format(ZT, TINY, d))
    assert.are.equal(0, rc, out)
    util.rm(d)
  end)
end)

describe("an override's table literal", function()
  it("that would not end is stopped and refused, naming the key; a plain literal still reads", function()
    local out, rc = util.sh(("%s %s 'optim.betas={(function() while true do end end)()}'"):format(ZT, TINY))
    assert.are.equal(1, rc, out)                     -- not 124: timeout 60 did not have to end it
    assert.matches("optim.betas: runs past 10000000 Lua instructions: an override's table literal is data, " ..
                   "not a program", out, 1, true)
    local d = util.outdir()
    out, rc = util.sh(("%s %s train.steps=1 'optim.betas={0.8,0.9}' 'data.text=docs/*.md' out=%s"):format(ZT, TINY, d))
    assert.are.equal(0, rc, out)
    assert.are.same({ 0.8, 0.9 }, util.summary(d).recipe_json.optim.betas)
    util.rm(d)
  end)
  it("that builds a 1 GiB value still ends on SIGTERM, not after it is refused", function()
    -- the literal takes ~6 s to build and be refused (exit 1); a SIGTERM 1 s
    -- in must end the process by that signal (143), not wait for it
    local cmd = ("exec 2>/dev/null; build/ztrain %s 'optim.betas={(\"x\"):rep(2^30)}' > /dev/null 2>&1 & p=$!; sleep 1; "
                 .. "kill -TERM $p; wait $p; echo rc=$?"):format(TINY)
    local out = util.sh(cmd)
    assert.matches("rc=143", out, 1, true)
  end)
end)

describe("a run's output directory removed while it runs", function()
  it("ends the run with exit 3 naming metrics.jsonl, not silently", function()
    local d = util.outdir()
    local rcfile = os.tmpname()
    -- (the background job lets go of util.sh's pipe, or util.sh waits for it)
    util.sh(("(%s %s train.steps=100000 'data.text=docs/*.md' out=%s > %s.log 2>&1; echo $? > %s) " ..
             "> /dev/null 2>&1 &")
            :format(ZT, TINY, d, rcfile, rcfile))
    local seen = false
    for _ = 1, 300 do
      local f = io.open(d .. "/metrics.jsonl")
      if f then seen = f:read(1) ~= nil; f:close() end
      if seen then break end
      util.sh("sleep 0.1")
    end
    assert.is_true(seen, "the run never wrote metrics.jsonl")
    util.rm(d)
    local rc
    for _ = 1, 300 do
      rc = tonumber(util.read(rcfile):match("%d+") or "")
      if rc then break end
      util.sh("sleep 0.1")
    end
    local log = util.read(rcfile .. ".log")
    assert.are.equal(3, rc, log)
    assert.matches("ztrain: cannot write " .. d .. "/summary.json: No such file or directory (the run had failed: " ..
                   "cannot write " .. d .. "/metrics.jsonl: the file was deleted while the run wrote it " ..
                   "(its directory removed?))", log, 1, true)
    os.remove(rcfile); os.remove(rcfile .. ".log")
  end)
end)
