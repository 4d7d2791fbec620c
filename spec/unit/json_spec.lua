-- ztrain.util.json: the codec ztrain's files are written with has its own
-- settings, and loading ztrain leaves the shared `require "cjson"` as
-- lua-cjson ships it (report.lua once set it globally).
local json = require "ztrain.util.json"

describe("util.json", function()
  it("writes NaN and infinities as null, very sparse arrays as objects, 14 significant digits", function()
    assert.are.equal('{"loss":null}', json.encode({ loss = 0 / 0 }))
    assert.are.equal("[null,1]", json.encode({ math.huge, 1 }))
    assert.are.same({ ["1"] = 1, ["13"] = 3 }, json.decode(json.encode({ [1] = 1, [13] = 3 })))
    assert.are.equal("[1,null,3]", json.encode({ [1] = 1, [3] = 3 }))
    assert.are.equal("0.33333333333333", json.encode(1 / 3))
    assert.are.equal(json.null, json.decode("null"))
    assert.are.equal(require("cjson").null, json.null)
  end)

  it("try_decode gives nil and the reason for a cut-short file", function()
    local v, err = json.try_decode('{"a": [1, 2')
    assert.is_nil(v)
    assert.matches("Expected", err)
    assert.are.same({ a = { 1, 2 } }, json.try_decode('{"a": [1, 2]}'))
  end)

  it("loading ztrain and its writers leaves the shared cjson's settings alone", function()
    require "ztrain"
    require "ztrain.record.report"; require "ztrain.record.timeline"; require "ztrain.insight.compare"
    require "ztrain.train.checkpoint"
    local cjson = require "cjson"
    assert.is_false(pcall(cjson.encode, { loss = 0 / 0 }), "the shared cjson writes NaN")
    assert.is_false(pcall(cjson.encode, { [1] = 1, [13] = 3 }), "the shared cjson writes sparse arrays")
  end)
end)
