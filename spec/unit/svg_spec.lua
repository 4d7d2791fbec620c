-- The SVG writer of ztrain's charts (lua/ztrain/util/svg.lua), called
-- directly: axis ticks on round 1-2-5 steps covering the data, their
-- labels, byte units, escaping, coordinates, colours, cut labels, and a
-- document that parses as XML with its marks read back. (The charts drawn
-- by real commands: e2e/compare_spec.lua, unit/timeline_spec.lua.)
local util = require "helpers.util"
local svg = require "ztrain.util.svg"

describe("util.svg", function()
  it("ticks: a 1, 2 or 5 x 10^k step, values on its multiples covering [lo, hi]", function()
    for _, c in ipairs({ { 0, 10, 5, 2 }, { 0, 1, 5, 0.2 }, { 3, 97, 5, 20 }, { 0, 7300, 4, 2000 },
                         { -1, 1, 4, 0.5 }, { 0.013, 0.018, 5, 0.001 } }) do
      local lo, hi, n, want = c[1], c[2], c[3], c[4]
      local step, values, first, last = svg.ticks(lo, hi, n)
      assert.is_true(math.abs(step - want) < want * 1e-9, ("[%g, %g]/%d: step %g, want %g"):format(lo, hi, n, step, want))
      assert.is_true(first <= lo + 1e-12 and last >= hi - 1e-12, ("[%g, %g] not covered by [%g, %g]"):format(lo, hi, first, last))
      assert.is_true(first > lo - step and last < hi + step, "one step of margin at most")
      for k, v in ipairs(values) do
        assert.is_true(math.abs(v / step - math.floor(v / step + 0.5)) < 1e-9, v .. " is not a multiple of " .. step)
        if k > 1 then assert.is_true(math.abs(v - values[k - 1] - step) < step * 1e-9) end
      end
    end
    -- an empty range still gets an axis
    local step, values = svg.ticks(5, 5, 5)
    assert.is_true(step > 0 and #values >= 2)
  end)

  it("labels ticks with the decimals their step needs", function()
    assert.are.same({ "0", "20", "1000", "0.5", "0.25", "0.001", "0.0" },
                    { svg.tick_label(0, 20), svg.tick_label(20, 20), svg.tick_label(1000, 500), svg.tick_label(0.5, 0.5),
                      svg.tick_label(0.25, 0.05), svg.tick_label(0.001, 0.001),
                      svg.tick_label(-1e-17, 0.1) })                -- rounding noise at 0 reads 0, not -0.0
  end)

  it("shows bytes in the binary unit that keeps them in 1..1023", function()
    assert.are.same({ "0 B", "1023 B", "1.00 KiB", "1.50 MiB", "26.57 MiB", "2.00 GiB", "4096.00 TiB" },
                    { svg.format_bytes(0), svg.format_bytes(1023), svg.format_bytes(1024),
                      svg.format_bytes(1.5 * 2 ^ 20), svg.format_bytes(27860664), svg.format_bytes(2 ^ 31),
                      svg.format_bytes(2 ^ 52) })
  end)

  it("escapes text, rounds coordinates, lightens colours towards white, cuts long labels", function()
    assert.are.equal("a &lt;b&gt; &amp; &quot;c&quot; &apos;d&apos;", svg.esc([[a <b> & "c" 'd']]))
    assert.are.same({ "12.5", "100", "0", "3.14", "-2" }, { svg.num(12.5), svg.num(100), svg.num(0), svg.num(3.14159),
                                                          svg.num(-2) })
    -- each channel v + (255 - v) f, rounded: black halfway is 127.5 -> 128 = 0x80
    assert.are.same({ "#4e79a7", "#ffffff", "#808080" }, { svg.lighten("#4e79a7", 0), svg.lighten("#4e79a7", 1),
                                                           svg.lighten("#000000", 0.5) })
    assert.are.equal("short", svg.fit("short", 100, 10))
    local cut = svg.fit(("x"):rep(50), 60, 10)             -- 60 px at 6 px a character: 10 characters
    assert.are.same({ 10, "xxxxxxx..." }, { #cut, cut })
  end)

  it("writes a document that parses, with every mark and its attributes", function()
    local doc = svg.new(200, 100)
    doc:rect(1, 2, 30.456, 4, { class = "bar", ["data-v"] = 'a"b' })
    doc:line(0, 0, 10, 10, { class = "axis" })
    doc:text(5, 5, "a < b", { class = "label" })
    doc:polyline({ { 0, 0 }, { 1, 2 } }, { class = "loss" })
    local text = doc:finish()
    local d = util.tmpdir()
    svg.write(d .. "/c.svg", text)
    assert.are.equal(text, util.read(d .. "/c.svg"))
    util.well_formed(d .. "/c.svg")
    assert.matches('<rect [^>]*class="bar"', text)
    assert.matches('data%-v="a&quot;b"', text)
    assert.matches('width="30.46"', text, 1, true)
    assert.matches(">a &lt; b<", text, 1, true)
    assert.matches('<polyline [^>]*points="0,0 1,2"', text)
    util.rm(d)
  end)
end)
