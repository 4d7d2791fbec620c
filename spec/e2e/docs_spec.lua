-- The worked examples in docs/strategies.md are run as written: the code
-- blocks marked "-- example: NAME" are extracted, put in a recipe and
-- trained, and their digests compared with the built-in equivalents.
local util = require "helpers.util"
local cjson = require "cjson"

local read = util.read
local write = util.write
local sh = util.sh

local function example(name)
  local doc = read("docs/strategies.md")
  local code = doc:match("```lua\n(%-%- example: " .. name .. "\n.-)```")
  assert(code, "docs/strategies.md has no example " .. name)
  return code
end

local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 " ..
             "train.eval_every=0 lr.warmup=1 -q"

local dir
local function digest(args)
  local out_dir = os.tmpname(); os.remove(out_dir)
  local out, rc = sh(("timeout 120 build/ztrain %s %s out=%s"):format(args, BASE, out_dir))
  assert.are.equal(0, rc, out)
  local s = cjson.decode(read(out_dir .. "/summary.json"))
  sh("rm -rf " .. out_dir)
  return s.param_digest
end

describe("docs/strategies.md examples", function()
  setup(function() dir = os.tmpname(); os.remove(dir); assert(os.execute("mkdir -p " .. dir) == 0) end)
  teardown(function() sh("rm -rf " .. dir) end)

  it("the user-written strategy gives dp's digest at N=2", function()
    write(dir .. "/my_dp.lua", example("user_strategy"))
    write(dir .. "/recipe.lua", ('local r = dofile("recipes/dp.lua"); r.strategy = dofile(%q); return r')
          :format(dir .. "/my_dp.lua"))
    local want = digest("--nproc 2 recipes/dp.lua batch.accumulate=2")
    assert.are.equal(want, digest("--nproc 2 " .. dir .. "/recipe.lua batch.accumulate=2"))
  end)

  it("every block marked '-- from examples/FILE' is a verbatim piece of that file", function()
    -- (the files themselves are trained and checked by spec/e2e/examples_spec.lua)
    local doc = read("docs/strategies.md")
    local n = 0
    for path, body in doc:gmatch("```lua\n%-%- from (examples/[%w_]+%.lua)\n(.-)```") do
      n = n + 1
      assert.is_true(#body > 40, path .. ": an empty excerpt")
      assert.is_truthy(read(path):find(body, 1, true),
                       "docs/strategies.md quotes " .. path .. " but the file does not contain:\n" .. body)
    end
    assert.is_true(n >= 8, ("only %d excerpts found"):format(n))
  end)

  it("the user-written schedule gives the sequential step's digest", function()
    write(dir .. "/sched.lua", example("user_schedule"))
    write(dir .. "/recipe.lua", ('local r = dofile("recipes/single.lua"); r.schedule = dofile(%q); return r')
          :format(dir .. "/sched.lua"))
    local want = digest("recipes/single.lua batch.accumulate=3")
    assert.are.equal(want, digest(dir .. "/recipe.lua batch.accumulate=3"))
  end)
end)
