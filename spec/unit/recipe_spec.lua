local recipe = require "ztrain.train.recipe"

local function tmpfile(text)
  local p = os.tmpname() .. ".lua"
  local f = assert(io.open(p, "w")); f:write(text); f:close()
  return p
end

describe("recipe", function()
  it("fills defaults and applies dotted overrides with types", function()
    local r = assert(recipe.resolve({ train = { steps = 5 } },
                                    { "model.size=gpt2-mini", "optim.lr=0.01", "lr.schedule=linear",
                                      "optim.betas={0.8,0.9}" }))
    assert.are.equal(5, r.train.steps)
    assert.are.equal("gpt2-mini", r.model.size)
    assert.are.equal(0.01, r.optim.lr)
    assert.are.equal("linear", r.lr.schedule)
    assert.are.same({ 0.8, 0.9 }, r.optim.betas)
    assert.are.equal(4, r.batch.micro)             -- a default
  end)

  it("names an unknown key and the nearest valid one", function()
    local r, err = recipe.resolve({ train = { stpes = 1 } })
    assert.is_nil(r)
    assert.matches('unknown recipe key "train.stpes"; did you mean "train.steps"', err, 1, true)
    r, err = recipe.resolve({}, { "optim.learning_rate=1" })
    assert.is_nil(r)
    assert.matches('did you mean "optim.lr"', err, 1, true)
    r, err = recipe.resolve({}, { "modle.size=gpt2" })
    assert.matches('did you mean "model.size"', err, 1, true)
  end)

  it("suggests from the same section first, then from other tools' names", function()
    -- the same section: batch.size is batch.micro, not model.size
    for typed, want in pairs({ ["batch.size"] = "batch.micro", ["optim.learning_rate"] = "optim.lr",
                               ["train.max_steps"] = "train.steps", ["batch.mirco"] = "batch.micro",
                               ["optim.weight_dcay"] = "optim.weight_decay",
                               ["data.block_size"] = "data.seq_len",
                               -- names users bring from PyTorch, HF, DeepSpeed, nanoGPT
                               learning_rate = "optim.lr", batch_size = "batch.micro",
                               epochs = "train.steps", max_steps = "train.steps",
                               weight_decay = "optim.weight_decay", warmup_steps = "lr.warmup",
                               gradient_accumulation_steps = "batch.accumulate",
                               ["train.stpes"] = "train.steps", ["modle.size"] = "model.size" }) do
      local _, err = recipe.resolve({}, { typed .. "=1" })
      assert.matches(('unknown recipe key "%s"; did you mean "%s"?'):format(typed, want), err, 1, true)
    end
    -- lr is a section here (warmup, schedule): its message names optim.lr
    local _, err = recipe.resolve({}, { "lr=3e-4" })
    assert.are.equal("lr is a table of keys; set one of them (lr.min_ratio, lr.schedule, lr.warmup); " ..
                     "the learning rate itself is optim.lr", err)
  end)

  it("rejects non-finite, fractional and out-of-range numbers by key", function()
    for _, o in ipairs({ "train.steps=nan", "train.steps=2.5", "batch.micro=0", "optim.lr=-1",
                         "lr.min_ratio=2" }) do
      local r, err = recipe.resolve({}, { o })
      assert.is_nil(r, o)
      assert.matches(o:match("^[^=]+") .. " must be", err, 1, true)
    end
    local _, err = recipe.resolve({}, { "model=5" })
    assert.matches("model is a table of keys; set one of them (model.seed, model.size", err, 1, true)
  end)

  it("rejects wrong types and malformed overrides", function()
    local r, err = recipe.resolve({}, { "train.steps=many" })
    assert.is_nil(r)
    assert.matches("train.steps must be a number", err, 1, true)
    r, err = recipe.resolve({ batch = 4 })
    assert.matches('"batch" must be a table', err, 1, true)
    r, err = recipe.resolve({}, { "train.steps" })
    assert.matches("key=value", err, 1, true)
    -- a table where a string goes: named by type, without its address
    r, err = recipe.resolve({ name = {} })
    assert.are.equal('recipe key "name" must be a string, got table', err)
  end)

  it("loads a file, names it, and reports a file that returns no table", function()
    local p = tmpfile("return { train = { steps = 3 } }")
    local r = assert(recipe.load(p, { "batch.micro=2" }))
    assert.are.equal(3, r.train.steps)
    assert.are.equal(2, r.batch.micro)
    assert.are.equal(p:match("([^/]+)%.lua$"), r.name)
    os.remove(p)
    p = tmpfile("return 42")
    local _, err = recipe.load(p)
    assert.matches("must return a table", err, 1, true)
    os.remove(p)
    local _, err2 = recipe.load("/nonexistent/recipe.lua")
    assert.matches("cannot load recipe", err2, 1, true)
  end)

  it("serializes stably", function()
    local a = recipe.serialize(assert(recipe.resolve({ train = { steps = 2 } })))
    local b = recipe.serialize(assert(recipe.resolve({}, { "train.steps=2" })))
    assert.are.equal(a, b)
  end)

  it("every shipped recipe resolves, with the strategy it is named for", function()
    local strategy = require "ztrain.parallel.strategy"
    -- recipes/NAME.lua runs strategy NAME; examples say theirs here
    local expect = { ["examples/timed_zero2.lua"] = "zero2", ["examples/all_forward_first.lua"] = "single",
                     ["examples/diloco.lua"] = "diloco", ["examples/topk_dp.lua"] = "topk_ef",
                     ["recipes/infinity.lua"] = "zero3_infinity", ["recipes/pipeline_1f1b.lua"] = "single",
                     ["recipes/pipeline_gpipe.lua"] = "single", ["recipes/pipeline_zb.lua"] = "single",
                     ["recipes/pipeline_interleaved.lua"] = "single", ["recipes/pipeline_zbv.lua"] = "single",
                     ["recipes/pipeline_pipedream.lua"] = "single",
                     ["recipes/pipeline_dp.lua"] = "zero1", ["recipes/llama_finetune.lua"] = "zero3_offload" }
    local p = io.popen("ls recipes/*.lua examples/*.lua")
    local paths = {}
    for line in p:lines() do paths[#paths + 1] = line end
    p:close()
    local checked = {}
    for _, path in ipairs(paths) do
      -- examples may be modules for recipes to use (a table of functions)
      local chunk = assert(loadfile(path))
      local ok, value = pcall(chunk)
      assert(ok, path .. ": " .. tostring(value))
      local module = type(value) == "table" and next(value) ~= nil
      for _, v in pairs(type(value) == "table" and value or {}) do
        if type(v) ~= "function" then module = false end
      end
      if not module then
        local r, err = recipe.load(path)
        assert(r, err)
        local want = expect[path] or (path:match("^recipes/(.+)%.lua$"))
        assert(want, path .. ": say which strategy this example runs in `expect` above")
        local s = strategy.resolve(r.strategy)
        assert.are.equal(want, s.name, path)
        checked[#checked + 1] = path
      end
    end
    -- every recipe and the example recipe were checked, not the example module
    local seen = {}
    for _, c in ipairs(checked) do seen[c] = true end
    for _, want in ipairs({ "examples/timed_zero2.lua", "recipes/dp.lua", "recipes/single.lua",
                            "recipes/zero1.lua", "recipes/zero2.lua", "recipes/zero3.lua" }) do
      assert.is_true(seen[want], want .. " was not checked")
    end
    assert.is_nil(seen["examples/timed_strategy.lua"])
  end)
end)
