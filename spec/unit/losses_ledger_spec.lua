-- The step's loss ledger (lua/ztrain/parallel/driver/losses.lua) with
-- per-position losses written here: the total is the sum of each kept
-- row's mean (values chosen so the fp64 sums are exact), read once
-- and emptied, rows beyond the micro-batches refused, and the planner's
-- byte count.
local T = require "ztrain.core.tensor"
local ffi = require "ffi"
local losses = require "ztrain.parallel.driver.losses"

-- a stand-in activation set whose last forward left `vals` as its losses
local function set(vals)
  local t = T.new({ #vals }, { category = "activations" })
  local a = ffi.new("float[?]", #vals)
  for i, v in ipairs(vals) do a[i - 1] = v end
  t:write(a)
  return { losses = function() return t end, t = t }
end

describe("driver.losses: the ledger", function()
  it("totals the kept rows' means, then is empty", function()
    local L = losses.new(3)
    local sets = { set { 1, 2, 3, 4 }, set { 0.5, 0.5, 0.5, 0.5 }, set { 8, 0, 0, 0 } }
    for _, s in ipairs(sets) do L:keep(s) end
    assert.are.equal(2.5 + 0.5 + 2, L:total())
    assert.is_nil(L:total(), "emptied by the read")
    -- the same set kept again (the activation set is reused): its values now
    sets[1].t:write(ffi.new("float[4]", { 4, 4, 4, 4 }))
    L:keep(sets[1])
    assert.are.equal(4, L:total())
    L:free()
    for _, s in ipairs(sets) do s.t:free() end
  end)

  it("refuses more head forwards than micro-batches; reset forgets the rows", function()
    local L = losses.new(1)
    local s = set { 1, 1 }
    L:keep(s)
    local ok, e = pcall(L.keep, L, s)
    assert.is_false(ok)
    assert.matches("losses ledger: more head forwards in a step than micro-batches", tostring(e), 1, true)
    L:reset()
    assert.is_nil(L:total())
    L:keep(s)
    assert.are.equal(1, L:total())
    L:free(); s.t:free()
  end)

  it("follows a change of shape, and counts its bytes as the planner does", function()
    local L = losses.new(2)
    local a, b = set { 2, 4 }, set { 1, 2, 3 }
    L:keep(a)
    assert.are.equal(3, L:total())
    L:keep(b)                                     -- 3 positions now: new rows
    assert.are.equal(2, L:total())
    L:free(); a.t:free(); b.t:free()
    assert.are.equal(2 * 4 * 64 * 4, losses.bytes(2, 4, 64))
    assert.are.equal(4 * 64 * 4, losses.bytes(0, 4, 64))   -- at least one row
  end)
end)
