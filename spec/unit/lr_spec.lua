local lr = require "ztrain.model.lr"

describe("lr schedules", function()
  it("warms up linearly then follows a cosine to min_ratio", function()
    local f = lr.make(1.0, { warmup = 10, schedule = "cosine", min_ratio = 0.1 }, 110)
    assert.are.equal(0.1, f(1))
    assert.are.equal(1.0, f(10))
    assert.is_true(math.abs(f(60) - 0.55) < 1e-12)   -- halfway: (1 + 0.1) / 2
    assert.is_true(math.abs(f(110) - 0.1) < 1e-12)
    for s = 11, 109 do assert.is_true(f(s + 1) <= f(s)) end
  end)

  it("linear and constant", function()
    local f = lr.make(2.0, { warmup = 0, schedule = "linear", min_ratio = 0 }, 100)
    assert.is_true(math.abs(f(50) - 1.0) < 1e-12)
    assert.are.equal(0, f(100))
    local g = lr.make(2.0, { warmup = 5, schedule = "constant" }, 100)
    assert.are.equal(2.0, g(5)); assert.are.equal(2.0, g(99))
  end)

  it("rejects an unknown schedule by name", function()
    assert.has_error(function() lr.make(1, { schedule = "cosin" }, 10) end,
                     'unknown lr.schedule "cosin" (known: cosine, linear, constant)')
  end)
end)
