-- Smaller items of issue 29 (Records), each as a user met it: a forgotten
-- prompt, a misspelt recipe path, the planner's step times for a cluster
-- that is not this machine, compare's results.md citing a file the tree
-- does not have.
local u = require "spec.helpers.util"

describe("smaller records items", function()
  it("generate with the prompt forgotten says so, instead of generating from 'max_tokens=10'", function()
    local out, rc = u.sh("build/ztrain generate spec/fixtures/hf/tiny max_tokens=10")
    assert.are.equal(1, rc, out)
    assert.matches('generate: the prompt is missing ("max_tokens=10" is an option)', out, 1, true)
    -- a prompt that merely holds '=' still generates
    out, rc = u.sh("build/ztrain generate spec/fixtures/hf/tiny 'a=b' max_tokens=2 tokenizer=bytes")
    assert.are.equal(0, rc, out)
  end)

  it("a misspelt recipe path gets the nearest recipe as a suggestion", function()
    local out, rc = u.sh("build/ztrain recipes/zero3_ofload.lua")
    assert.are.equal(1, rc, out)
    assert.matches("did you mean recipes/zero3_offload.lua?", out, 1, true)
    out = u.sh("build/ztrain singel.lua")
    assert.matches("did you mean recipes/single.lua?", out, 1, true)
    -- nothing near: no guess
    out = u.sh("build/ztrain recipes/qqqqqqqqqqqq.lua")
    assert.is_nil(out:find("did you mean", 1, true))
  end)

  it("plan says its step times model an H100 cluster, not this machine", function()
    local out, rc = u.sh("build/ztrain plan model.size=gpt2-tiny")
    assert.are.equal(0, rc, out)
    assert.matches("an H100's dense bf16 peak, not this machine", out, 1, true)
    out = u.sh("build/ztrain plan model.size=gpt2-tiny --flops 1e12")
    assert.is_nil(out:find("H100", 1, true))
  end)

  it("compare's results.md cites only files the tree has", function()
    local text = u.read("lua/ztrain/insight/compare_tables.lua")
    for doc in text:gmatch("([%w_/]+%.md)") do
      if doc ~= "results.md" then
        local path = doc:find("/") and doc or ("docs/" .. doc)
        assert.is_truthy(io.open(path), doc .. " is cited by results.md but is not in the tree")
      end
    end
  end)
end)
