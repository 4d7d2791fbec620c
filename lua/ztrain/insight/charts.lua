-- ztrain.insight.charts: the charts of `ztrain compare` (lua/ztrain/insight/compare.lua),
-- drawn with ztrain.util.svg.
--
--   memory(rows, opts)     -> SVG: peak bytes per rank, one panel per tier,
--                             a bar per strategy stacked by category
--   throughput(rows, opts) -> SVG: tokens/s per strategy (bars)
--   loss(rows, opts)       -> SVG: the training loss per step, a line per
--                             strategy (from each run's metrics.jsonl)
--
-- rows = { { label =, failed = "why" or nil, mem = { tier = { cat = bytes } },
--            peak = { tier = bytes }, tokens_per_s =, step_ms =,
--            curve = { { step, loss }, ... } }, ... }
--
-- Marks keep classes and data-* attributes (class "seg" data-tier
-- data-category data-label; "loss" data-label; ticks as <g class="xtick">
-- with a line and its label) so a spec can read a chart back.
local svg = require "ztrain.util.svg"
local fmt = require "ztrain.util.fmt"

local M = {}

M.TIERS = { "device", "host", "nvme" }
M.CATEGORIES = { "params", "grads", "optim", "activations", "comm", "other" }
M.CATEGORY_COLORS = { params = "#4e79a7", grads = "#f28e2b", optim = "#e15759", activations = "#76b7b2",
                      comm = "#59a14f", other = "#bab0ac" }

local W, LEFT, RIGHT = 980, 160, 150
local PLOT = W - LEFT - RIGHT
local BAR, GAP = 20, 8

local thousands = fmt.thousands
M.thousands = thousands

-- grid(doc, values, x_of, y0, y1): light vertical lines at the ticks, drawn
-- before the bars so the bars stay solid
local function grid(doc, values, x_of, y0, y1)
  for _, v in ipairs(values) do doc:line(x_of(v), y0, x_of(v), y1, { stroke = "#e4e4e4" }) end
end

-- x_axis(doc, y, values, step, x_of, label, fmt): a horizontal axis at y
-- with ticks, their labels and the axis title
local function x_axis(doc, y, values, step, x_of, label, fmt)
  for _, v in ipairs(values) do
    local x = x_of(v)
    doc:open("g", { class = "xtick" })
    doc:line(x, y, x, y + 5, { ["data-value"] = v })
    doc:text(x, y + 18, fmt and fmt(v) or svg.tick_label(v, step), { ["text-anchor"] = "middle" })
    doc:close("g")
  end
  doc:line(x_of(values[1]), y, x_of(values[#values]), y)
  doc:text(LEFT + PLOT / 2, y + 36, label, { ["text-anchor"] = "middle", fill = "#555555" })
end

-- the tiers any row used (device always)
local function tiers_used(rows)
  local used = { device = true }
  for _, r in ipairs(rows) do
    for _, tier in ipairs(M.TIERS) do
      if r.peak and (r.peak[tier] or 0) > 0 then used[tier] = true end
    end
  end
  local list = {}
  for _, tier in ipairs(M.TIERS) do if used[tier] then list[#list + 1] = tier end end
  return list
end

local TIER_TITLE = { device = "device tier", host = "host tier (ZeRO-Offload)", nvme = "nvme tier (ZeRO-Infinity)" }

-- one tier's panel at y; returns the y below it
local function memory_panel(doc, rows, tier, y)
  doc:open("g", { class = "panel", ["data-tier"] = tier })
  doc:text(LEFT, y + 14, TIER_TITLE[tier], { ["font-weight"] = "bold" })
  y = y + 26
  local max = 1
  for _, r in ipairs(rows) do
    if not r.failed then
      local sum = 0
      for _, cat in ipairs(M.CATEGORIES) do sum = sum + (r.mem[tier][cat] or 0) end
      max = math.max(max, sum, r.peak[tier] or 0)
    end
  end
  local div, unit = svg.bytes_unit(max)
  local step, values, _, hi = svg.ticks(0, max / div, 5)
  local px_per_byte = PLOT / (hi * div)
  local function x_of(v) return LEFT + v * div * px_per_byte end
  local top = y
  local axis_y = top + #rows * (BAR + GAP) - GAP + 6
  grid(doc, values, x_of, top - 4, axis_y)
  for i, r in ipairs(rows) do
    local by = y + (i - 1) * (BAR + GAP)
    doc:text(LEFT - 8, by + BAR / 2 + 4, svg.fit(r.label, LEFT - 14), { ["text-anchor"] = "end" })
    if r.failed then
      doc:text(LEFT + 6, by + BAR / 2 + 4, "failed: no measurement", { fill = "#777777" })
    else
      local x = LEFT
      for _, cat in ipairs(M.CATEGORIES) do
        local b = r.mem[tier][cat] or 0
        if b > 0 then
          local w = b * px_per_byte
          doc:rect(x, by, w, BAR, { class = "seg", fill = M.CATEGORY_COLORS[cat], ["data-tier"] = tier,
                                    ["data-category"] = cat, ["data-label"] = r.label,
                                    tooltip = ("%s %s %s: %s"):format(r.label, tier, cat, svg.format_bytes(b)) })
          x = x + w
        end
      end
      local peak = r.peak[tier] or 0
      if peak > 0 then
        local px = LEFT + peak * px_per_byte
        doc:line(px, by - 3, px, by + BAR + 3, { class = "peak", stroke = "#000000", ["stroke-width"] = 2,
                                                 ["data-label"] = r.label, ["data-tier"] = tier })
      end
      doc:text(math.max(x, LEFT + peak * px_per_byte) + 8, by + BAR / 2 + 4,
               peak > 0 and ("peak " .. svg.format_bytes(peak)) or "0")
    end
  end
  x_axis(doc, axis_y, values, step, x_of, ("peak bytes per rank (%s)"):format(unit))
  doc:close("g")
  return axis_y + 52
end

-- memory(rows, opts) -> SVG text. opts.title, opts.subtitle.
function M.memory(rows, opts)
  opts = opts or {}
  local tiers = tiers_used(rows)
  local H = 96 + #tiers * (26 + #rows * (BAR + GAP) + 58)
  local doc = svg.new(W, H)
  doc:title(LEFT, opts.title or "peak memory per rank, by tier and category",
            opts.subtitle or "bars: each category's peak, stacked; black mark: the tier's peak " ..
                             "(categories peak at different moments); the largest rank")
  local items = {}
  for _, cat in ipairs(M.CATEGORIES) do items[#items + 1] = { label = cat, color = M.CATEGORY_COLORS[cat] } end
  items[#items + 1] = { label = "tier peak", color = "#000000", kind = "mark" }
  local y = 56 + svg.legend(doc, LEFT, 56, items, PLOT + RIGHT) + 8
  for _, tier in ipairs(tiers) do y = memory_panel(doc, rows, tier, y) end
  return doc:finish()
end

-- throughput(rows, opts) -> SVG text: median tokens/s per strategy
function M.throughput(rows, opts)
  opts = opts or {}
  local top = 64
  local H = top + #rows * (BAR + GAP) + 60
  local doc = svg.new(W, H)
  doc:title(LEFT, opts.title or "throughput per strategy",
            opts.subtitle or "median tokens/s over the steps after the first (the whole global batch)")
  local max = 1
  for _, r in ipairs(rows) do if not r.failed then max = math.max(max, r.tokens_per_s or 0) end end
  local step, values, _, hi = svg.ticks(0, max, 5)
  local function x_of(v) return LEFT + v / hi * PLOT end
  local axis_y = top + #rows * (BAR + GAP) - GAP + 6
  grid(doc, values, x_of, top - 4, axis_y)
  for i, r in ipairs(rows) do
    local by = top + (i - 1) * (BAR + GAP)
    doc:text(LEFT - 8, by + BAR / 2 + 4, svg.fit(r.label, LEFT - 14), { ["text-anchor"] = "end" })
    if r.failed then
      doc:text(LEFT + 6, by + BAR / 2 + 4, "failed", { fill = "#777777" })
    else
      local w = x_of(r.tokens_per_s) - LEFT
      doc:rect(LEFT, by, w, BAR, { class = "bar", fill = svg.PALETTE[(i - 1) % #svg.PALETTE + 1],
                                   ["data-label"] = r.label })
      doc:text(LEFT + w + 8, by + BAR / 2 + 4, ("%s tok/s, %.1f ms/step"):format(thousands(r.tokens_per_s),
                                                                                 r.step_ms))
    end
  end
  x_axis(doc, axis_y, values, step, x_of, "tokens per second", function(v) return thousands(v) end)
  return doc:finish()
end

-- the curves' ranges: steps and losses over every finite point
local function curve_range(rows)
  local s0, s1, l0, l1
  for _, r in ipairs(rows) do
    for _, p in ipairs(r.curve or {}) do
      local s, l = p[1], p[2]
      if l == l and math.abs(l) ~= math.huge then
        s0, s1 = math.min(s0 or s, s), math.max(s1 or s, s)
        l0, l1 = math.min(l0 or l, l), math.max(l1 or l, l)
      end
    end
  end
  return s0 or 0, s1 or 1, l0 or 0, l1 or 1
end

-- same_curves(rows) -> group[i] = { first = index of the first row with
-- row i's exact curve, k = how many share it, j = i's place among them }
local function same_curves(rows)
  local by, group = {}, {}
  for i, r in ipairs(rows) do
    local key = {}
    for n, p in ipairs(r.curve or {}) do key[n] = ("%d:%a"):format(p[1], p[2]) end
    key = table.concat(key, " ")
    local g = by[key]
    if not g then g = { first = i, members = {} }; by[key] = g end
    g.members[#g.members + 1] = i
    group[i] = g
  end
  local out = {}
  for i, g in pairs(group) do
    for j, m in ipairs(g.members) do if m == i then out[i] = { first = g.first, k = #g.members, j = j - 1 } end end
  end
  return out
end

-- loss(rows, opts) -> SVG text: loss per step, one polyline per strategy.
-- Strategies with the same bits draw exactly the same curve: those are
-- dashed in turns (each colour a dash, one after the other), so every
-- strategy stays visible on the shared line, and the legend names the
-- first one it equals.
function M.loss(rows, opts)
  opts = opts or {}
  local LW, left, top, right, bottom = 980, 76, 64, 280, 70
  local H = 560
  local pw, ph = LW - left - right, H - top - bottom
  local doc = svg.new(LW, H)
  doc:title(left, opts.title or "training loss per step",
            opts.subtitle or "from each run's metrics.jsonl; curves equal at every step share one " ..
                             "line, dashed in turns")
  local s0, s1, l0, l1 = curve_range(rows)
  local xstep, xs, xlo, xhi = svg.ticks(s0, s1, 8)
  if xstep < 1 then xstep, xs, xlo, xhi = svg.ticks(s0, math.max(s1, s0 + 1), math.max(1, s1 - s0)) end
  local ystep, ys, ylo, yhi = svg.ticks(l0, l1, 6)
  local function X(s) return left + (s - xlo) / (xhi - xlo) * pw end
  local function Y(l) return top + ph - (l - ylo) / (yhi - ylo) * ph end
  doc:rect(left, top, pw, ph, { fill = "none", stroke = "#cccccc", class = "plot", ["data-x0"] = xlo,
                                ["data-x1"] = xhi, ["data-y0"] = ylo, ["data-y1"] = yhi })
  for _, v in ipairs(ys) do
    doc:line(left, Y(v), left + pw, Y(v), { stroke = "#ececec" })
    doc:open("g", { class = "ytick" })
    doc:line(left - 5, Y(v), left, Y(v), { ["data-value"] = v })
    doc:text(left - 8, Y(v) + 4, svg.tick_label(v, ystep), { ["text-anchor"] = "end" })
    doc:close("g")
  end
  for _, v in ipairs(xs) do
    doc:line(X(v), top, X(v), top + ph, { stroke = "#ececec" })
    doc:open("g", { class = "xtick" })
    doc:line(X(v), top + ph, X(v), top + ph + 5, { ["data-value"] = v })
    doc:text(X(v), top + ph + 18, svg.tick_label(v, xstep), { ["text-anchor"] = "middle" })
    doc:close("g")
  end
  doc:line(left, top, left, top + ph)
  doc:line(left, top + ph, left + pw, top + ph)
  doc:text(left + pw / 2, top + ph + 40, "step", { ["text-anchor"] = "middle", fill = "#555555" })
  doc:text(18, top + ph / 2, "loss (cross-entropy, nats)", { ["text-anchor"] = "middle", fill = "#555555",
                                                     transform = ("rotate(-90 18 %s)"):format(svg.num(top + ph / 2)) })
  local group, ly, DASH = same_curves(rows), top, 14
  for i, r in ipairs(rows) do
    local color = svg.PALETTE[(i - 1) % #svg.PALETTE + 1]
    local g = group[i]
    local pts = {}
    for _, p in ipairs(r.curve or {}) do
      if p[2] == p[2] and math.abs(p[2]) ~= math.huge then pts[#pts + 1] = { X(p[1]), Y(p[2]) } end
    end
    local a = { class = "loss", stroke = color, ["stroke-width"] = 3, ["stroke-linejoin"] = "round",
                ["data-label"] = r.label, tooltip = r.label }
    if g.k > 1 then
      a["stroke-dasharray"] = ("%d %d"):format(DASH, (g.k - 1) * DASH)
      a["stroke-dashoffset"] = -g.j * DASH
    end
    if #pts > 1 then
      doc:polyline(pts, a)
    elseif #pts == 1 then
      doc:element("circle", { class = "loss", cx = pts[1][1], cy = pts[1][2], r = 4, fill = color,
                              ["data-label"] = r.label })
    end
    -- legend on the right: the label, cut to leave room for its note
    local note = #pts == 0 and (r.failed and " (failed)" or " (no metrics)") or
                 (g.j > 0 and (" = " .. svg.fit(rows[g.first].label, 100)) or "")
    if #pts > 0 then
      doc:line(left + pw + 16, ly + 7, left + pw + 40, ly + 7, { stroke = color, ["stroke-width"] = 3 })
    end
    local label = svg.fit(r.label, right - 60 - svg.text_width(note)) .. note
    doc:text(left + pw + 48, ly + 11, label, { fill = #pts == 0 and "#777777" or "#000000" })
    ly = ly + 22
  end
  return doc:finish()
end

return M
