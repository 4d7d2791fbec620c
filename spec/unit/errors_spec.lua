-- ztrain.core.errors: a user error prints "ztrain: MESSAGE" with no Lua file
-- and line; a bug keeps its "file.lua:N:" location (and a traceback where the
-- host prints one). How the program shows them: spec/e2e/program_errors_spec.lua.
local errors = require "ztrain.core.errors"

describe("ztrain.core.errors", function()
  it("tells user errors from bugs", function()
    local u = errors.user("data.text matches no file")
    assert.is_true(errors.is_user(u))
    assert.are.equal("data.text matches no file", errors.message(u))
    assert.are.equal("data.text matches no file", tostring(u))
    local a = errors.all_ranks("loss is nan")
    assert.is_true(errors.is_user(a)); assert.is_true(errors.is_all_ranks(a))
    assert.is_false(errors.is_all_ranks(u))
    -- raised through error(): level 0 is a user error, a location is a bug
    local _, e0 = pcall(error, "plain message", 0)
    assert.is_true(errors.is_user(e0))
    assert.are.equal("plain message", errors.message(e0))
    local _, e1 = pcall(function() local t = nil; return t.x end)
    assert.is_false(errors.is_user(e1))
    assert.matches("^[^\n]*errors_spec%.lua:%d+: attempt to index", errors.message(e1))
    local _, e2 = pcall(function() error("from a chunk", 1) end)
    assert.matches("errors_spec%.lua:%d+: from a chunk", errors.message(e2))
    assert.is_true(errors.located('[string "x = nil + 1"]:1: attempt to perform arithmetic'))
    assert.is_true(errors.located("repl:3: boom"))
    -- a user message that names a recipe file is not a location
    assert.is_false(errors.located("recipes/single.lua: data.valid_fraction must be a number"))
    assert.is_false(errors.located("ranks disagree on the recipe: train.steps (rank 0: 10, rank 1: 11)"))
    -- non-string objects: a bug, shown through __tostring or by type
    assert.is_false(errors.is_user({}))
    assert.are.equal("(error object is a table value)", errors.message({}))
    assert.are.equal("obj", errors.message(setmetatable({}, { __tostring = function() return "obj" end })))
  end)

  it("gives xpcall a message for user errors and a traceback for bugs", function()
    local _, m = xpcall(function() error(errors.user("bad setting"), 0) end, errors.traceback)
    assert.are.equal("bad setting", m)
    local _, tb = xpcall(function() local t = nil; return t.x + 1 end, errors.traceback)
    assert.matches("errors_spec%.lua:%d+: attempt to index", tb)
    assert.matches("stack traceback:", tb, 1, true)
  end)
end)
