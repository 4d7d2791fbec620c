-- Errors as a user meets them in the ztrain program: a user error prints
-- "ztrain: MESSAGE" with no Lua file and line; a bug keeps its "file.lua:N:"
-- location (and a traceback where the host prints one). The rule lives in
-- lua/ztrain/core/errors.lua (spec/unit/errors_spec.lua).

local util = require "helpers.util"

-- run(args, input) -> output (stdout and stderr), exit code of build/ztrain ARGS
local function run(args, input) return util.run("timeout 120 build/ztrain " .. args, input) end

local tmpdir = util.outdir

-- write(text) -> a new .lua file holding text
local function write(text)
  local p = os.tmpname() .. ".lua"
  util.write(p, text)
  return p
end

-- a Lua location: "path/file.lua:12:"
local LOCATION = "%.lua:%d+:"

describe("the ztrain program", function()
  it("prints user errors as 'ztrain: MESSAGE' without a Lua location", function()
    local dir = tmpdir()
    local cases = {
      { "recipes/single.lua batch.mirco=2", 'unknown recipe key "batch.mirco"' },
      { "recipes/single.lua lr.schedule=steep", 'unknown lr.schedule "steep"' },
      { "recipes/single.lua data.tokenizer=gpt9", 'unknown tokenizer "gpt9"' },
      { "recipes/single.lua data.text=/nonexistent/*.txt", "no file matches" },
      { "recipes/single.lua data.seq_len=512", "exceeds gpt2-tiny's context of 128" },
      { "--frobnicate", "unknown option --frobnicate" },
    }
    for _, c in ipairs(cases) do
      local out, rc = run(c[1] .. " train.steps=1 -q out=" .. dir)
      assert.are.equal(1, rc, out)
      assert.matches("ztrain: [^\n]*" .. c[2]:gsub("%p", "%%%0"), out)
      assert.is_nil(out:find(LOCATION), c[1] .. " shows a Lua location:\n" .. out)
      assert.is_nil(out:find("stack traceback", 1, true), out)
    end
  end)

  it("keeps the location of a bug reached through a user's recipe", function()
    -- a strategy hook with a bug of its own, and one that misuses a ztrain
    -- function so that the error is raised inside lua/ztrain
    local own = write([[
      local zt = require "ztrain"
      local S = zt.strategy.single()
      S.step = function(ctx, lr)
        local state = nil
        return state.scale
      end
      return { strategy = S, data = { seq_len = 32 }, batch = { micro = 2 } }
    ]])
    local deep = write([[
      local zt = require "ztrain"
      local S = zt.strategy.single()
      S.step = function(ctx, lr) return zt.lr.make(1e-3, {}, nil) end   -- no step count
      return { strategy = S, data = { seq_len = 32 }, batch = { micro = 2 } }
    ]])
    local out, rc = run(own .. " train.steps=2 -q out=" .. tmpdir())
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: [^\n]*" .. own:match("[^/]+$"):gsub("%p", "%%%0") .. ":5: attempt to index local 'state'",
                   out)
    out, rc = run(deep .. " train.steps=2 -q out=" .. tmpdir())
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: [^\n]*lua/ztrain/model/lr%.lua:%d+: attempt to compare", out)
    os.remove(own); os.remove(deep)
  end)

  it("shows -e and REPL bugs with a traceback and user errors without", function()
    local out, rc = run([[-e 'local t = nil; print(t.x)']])
    assert.are.equal(1, rc)
    assert.matches("ztrain: repl:1: attempt to index local 't'", out, 1, true)
    assert.matches("stack traceback:", out, 1, true)
    out, rc = run([[-e 'zt.data.tokenizer("gpt9")']])
    assert.are.equal(1, rc)
    assert.matches('ztrain: data.tokenizer: unknown tokenizer "gpt9"', out, 1, true)
    assert.is_nil(out:find("traceback", 1, true), out)
    out, rc = run("", "zt.lr.make(1, { schedule = 'steep' }, 10)\nlocal t = nil; print(t.x)\n'alive'\n")
    assert.are.equal(0, rc)
    assert.matches('error: unknown lr.schedule "steep" (known: cosine, linear, constant)\nzt> ', out, 1, true)
    assert.matches("error: repl:1: attempt to index local 't' (a nil value)\nstack traceback:", out, 1, true)
    assert.matches("alive", out, 1, true)
  end)

  it("a bad optim.betas on dp is reported as such (not a crash in free)", function()
    local out, rc = run("recipes/dp.lua 'optim.betas={2,3}' -q out=" .. os.tmpname() .. ".d")
    assert.are.equal(1, rc)
    assert.matches("optim.betas must be a pair of numbers in [0, 1)", out, 1, true)
    assert.is_nil(out:find("attempt to", 1, true), out)
  end)
end)
