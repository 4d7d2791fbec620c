-- Recipes compared by meaning (issue 30 item 6), end to end: a user
-- schedule holding table literals with several keys (string.dump of it
-- differs between processes in this LuaJIT) no longer makes ranks disagree
-- on the recipe at random. (spec/unit/recipe_functions_spec.lua: the
-- serialization itself across processes.)
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"

-- the example's schedule with its forwards written as table literals
local function literal_schedule(dir)
  local src = u.read(ROOT .. "/examples/all_forward_first.lua")
  local changed, n = src:gsub('A%("F", 0, i%)', '{ op = "F", stage = 0, mb = i }')
  assert.are.equal(1, n)
  local path = dir .. "/aff_literal.lua"
  u.write(path, changed)
  return path
end

describe("ranks agree on a recipe with a user schedule", function()
  it("--nproc 2: the example with table literals trains on 4 of 4 tries", function()
    local d = u.tmpdir()
    local path = literal_schedule(d)
    for i = 1, 4 do
      local out, rc = u.sh(("%s --nproc 2 %s strategy=zero3 train.steps=1 data.tokenizer=bytes -q out=%s/run%d")
                           :format(ZT, path, d, i))
      assert.are.equal(0, rc, out)
      assert.not_matches("ranks disagree", out)
    end
    u.rm(d)
  end)

  it("--nproc 2: ranks whose schedules are different functions still disagree, naming where each is", function()
    local d = u.tmpdir()
    local path = d .. "/by_rank.lua"
    u.write(path, [[
local A = require("ztrain").schedule.action
local function fwd_first(p)
  local list = {}
  for i = 0, p.microbatches - 1 do list[#list + 1] = { op = "F", stage = 0, mb = i } end
  for i = 0, p.microbatches - 1 do list[#list + 1] = A("B", 0, i) end
  list[#list + 1] = { op = "REDUCE_GRAD" }
  list[#list + 1] = { op = "STEP" }
  return { list }
end
local function fwd_first_too(p) return fwd_first(p) end
local one = os.getenv("OMPI_COMM_WORLD_RANK") == "1"
return { model = { size = "gpt2-tiny" }, data = { seq_len = 64, tokenizer = "bytes" },
         schedule = one and fwd_first_too or fwd_first, batch = { micro = 4, accumulate = 4 },
         train = { steps = 1, eval_every = 0 } }
]])
    local out, rc = u.sh(("%s --nproc 2 %s strategy=zero3 -q out=%s/run"):format(ZT, path, d))
    assert.are.equal(1, rc, out)
    local p = path:gsub("%p", "%%%0")
    assert.matches("ranks disagree on the recipe: schedule %(rank 0: function:" .. p .. ":2%-9:%x+:%x+, " ..
                   "rank 1: function:" .. p .. ":10%-10:%x+:%x+%)", out)
    u.rm(d)
  end)
end)
