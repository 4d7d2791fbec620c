-- ztrain.tensor over an opaque zt_tensor (ztrain.h): what a tensor is comes
-- from the runtime's accessors, and the binding cannot reach the structs
-- (a refcount or a shape written from Lua would corrupt the runtime).
local zt = require "ztrain"
local C = require("ztrain.core.ffi").C

describe("tensors through the runtime's accessors", function()
  it("give shape, numel, dtype, bytes, tier and category, and a view's offset and data", function()
    local t = zt.tensor.new({ 3, 4, 5 }, { dtype = "bf16", tier = "host", category = "activations" })
    assert.are.same({ 3, 4, 5 }, t:shape())
    assert.are.equal(60, t:numel())
    assert.are.equal("bf16", t:dtype())
    assert.are.equal(120, t:nbytes())
    assert.are.equal("host", t:tier())
    assert.are.equal("activations", t:category())
    local v = t:view(7, { 2, 5 })
    assert.are.equal(7, tonumber(C.zt_tensor_offset(v.c)))
    assert.are.equal(C.zt_tensor_dim(v.c, 1), 5LL)
    assert.are.equal(0LL, C.zt_tensor_dim(v.c, 2))        -- past ndim
    local ffi = require "ffi"
    assert.are.equal(ffi.cast("char *", C.zt_tensor_data(t.c)) + 14, ffi.cast("char *", C.zt_tensor_data(v.c)))
    v:free(); t:free()
  end)

  it("keep the structs out of the binding's reach", function()
    local t = zt.tensor.new({ 4 })
    assert.is_false(pcall(function() return t.c.refcount end))
    assert.is_false(pcall(function() t.c.numel = 99 end))
    assert.are.equal(4, t:numel())
    t:free()
  end)

  it("refuse a shape or fill value that is not a number as such, not as a Lua location inside the binding", function()
    for _, case in ipairs({ { { 0 / 0 }, "dimension 1 must be a whole number, got nan" },
                            { { 2.5 }, "dimension 1 must be a whole number, got 2.5" },
                            { { 3, 1 / 0 }, "dimension 2 must be a whole number, got inf" },
                            { "abc", "tensor shape must be a table of 1 to 4 dimensions" } }) do
      local ok, err = pcall(zt.tensor.new, case[1])
      assert.is_false(ok)
      assert.matches(case[2], err, 1, true)
      assert.is_nil(err:find("tensor%.lua:%d+"), err)
    end
    local t = zt.tensor.new({ 2 })
    local ok, err = pcall(t.fill, t, "x")
    assert.is_false(ok)
    assert.matches("tensor:fill: the value must be a number, got string", err, 1, true)
    assert.is_nil(err:find("tensor%.lua:%d+"), err)
    t:free()
  end)
end)
