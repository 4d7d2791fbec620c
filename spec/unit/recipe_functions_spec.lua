-- Recipes compared by meaning (issue 30 item 6): ranks agree on a recipe
-- through recipe.serialize, and a function (a user schedule) must serialize
-- the same in every process that loaded the same code. string.dump did not:
-- in this LuaJIT a function holding a table constructor with several keys
-- dumps differently from process to process. Checked across separate
-- luajit processes (spec/e2e/recipe_agreement_spec.lua: --nproc 2 runs).
local u = require "spec.helpers.util"
local recipe = require "ztrain.train.recipe"

local ROOT = io.popen("pwd"):read("*l")

-- the example's schedule with its forwards written as table literals
local function literal_schedule(dir)
  local src = u.read(ROOT .. "/examples/all_forward_first.lua")
  local changed, n = src:gsub('A%("F", 0, i%)', '{ op = "F", stage = 0, mb = i }')
  assert.are.equal(1, n)
  local path = dir .. "/aff_literal.lua"
  u.write(path, changed)
  return path
end

-- the schedule's serialization as a fresh luajit process computes it
local function serialize_in_new_process(path)
  local out = u.sh(("cd %s && luajit -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; " ..
                    "local recipe = require \"ztrain.train.recipe\"; local r = assert(recipe.load(%q, {})); " ..
                    "io.write(\"S=\", recipe.flatten(r).schedule, \"\\n\")'"):format(ROOT, path))
  return assert(out:match("S=([^\n]*)"), out)
end

describe("recipe.serialize of functions", function()
  it("is the same in 10 separate processes for a schedule holding a table literal with several keys", function()
    local d = u.tmpdir()
    local path = literal_schedule(d)
    local seen, n = {}, 0
    for _ = 1, 10 do
      local s = serialize_in_new_process(path)
      if not seen[s] then seen[s], n = true, n + 1 end
    end
    local list = {}
    for s in pairs(seen) do list[#list + 1] = s end
    assert.are.equal(1, n, table.concat(list, "\n"))
    -- and names where the function is
    assert.matches("^function:" .. path:gsub("%p", "%%%0") .. ":13%-20:", list[1])
    u.rm(d)
  end)

  it("tells apart functions whose source or plain upvalues differ", function()
    local a = recipe.serialize({ schedule = function() return 1 end })
    local b = recipe.serialize({ schedule = function() return 2 end })
    assert.are_not.equal(a, b)
    local function make(k) return function() return k end end
    assert.are_not.equal(recipe.serialize({ f = make(1) }), recipe.serialize({ f = make(2) }))
    assert.are.equal(recipe.serialize({ f = make(1) }), recipe.serialize({ f = make(1) }))
    -- a chunk loaded from a string: its text is what is compared
    local c1 = assert(loadstring("return function() return { op = 'F', stage = 0, mb = 1 } end", "=x"))()
    local c2 = assert(loadstring("return function() return { op = 'F', stage = 0, mb = 1 } end"))()
    local c3 = assert(loadstring("return function() return { op = 'B', stage = 0, mb = 1 } end"))()
    assert.is_string(recipe.serialize({ f = c1 }))
    assert.are_not.equal(recipe.serialize({ f = c2 }), recipe.serialize({ f = c3 }))
    assert.are.equal("function:C", recipe.function_text(print))
  end)
end)
