-- ztrain.util.svg: a small SVG writer for ztrain's charts (pipeline timelines,
-- `ztrain compare`'s memory, throughput and loss charts).
--
-- Why our own: Debian has no charting library that fits a C/LuaJIT program
-- (gnuplot and matplotlib are whole programs with their own languages and
-- a Python or X11 stack; librsvg and cairo draw, but lay nothing out). The
-- charts need rectangles, lines, polylines and text with ticks that land on
-- round numbers: a page of Lua, no dependency, and SVG that a spec can read
-- back (every mark keeps its class and data-* attributes).
--
--   doc = svg.new(width, height, {font_size = 12})
--   doc:rect(x, y, w, h, attrs)  doc:line(x1, y1, x2, y2, attrs)
--   doc:text(x, y, s, attrs)     doc:polyline(points, attrs)
--   doc:open("g", attrs) ... doc:close("g")
--   doc:title(x, title, subtitle)  doc:finish() -> SVG text
--   svg.ticks(lo, hi, n) -> step, {values}   svg.bytes_unit(max) -> divisor, "MiB"
--   svg.legend(doc, x, y, items, width) -> height used
--   svg.write(path, text)  (atomic: a temporary name, then rename)
--
-- Pure Lua: no FFI, so it runs without the runtime library.
local durable = require "ztrain.util.durable"
local errors = require "ztrain.core.errors"
local M = {}

-- Tableau 10: distinguishable, and readable on white and in grey print.
M.PALETTE = { "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
              "#ff9da7", "#9c755f", "#bab0ac" }
M.FONT = "Helvetica, Arial, sans-serif"

function M.esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
                                         ['"'] = "&quot;", ["'"] = "&apos;" }))
end

-- num(x) -> "12.5": two decimals at most, trailing zeros dropped (coordinates)
function M.num(x) return (("%.2f"):format(x):gsub("%.?0+$", "")) end

-- nice_step(span, n) -> a 1, 2 or 5 x 10^k step giving about n ticks
function M.nice_step(span, n)
  local raw = span / n
  if raw <= 0 then return 1 end
  local p = 10 ^ math.floor(math.log10(raw))
  for _, f in ipairs({ 1, 2, 5, 10 }) do if f * p >= raw then return f * p end end
  return 10 * p
end

-- ticks(lo, hi, n) -> step, values, lo', hi': about n round values covering
-- [lo, hi]; lo' and hi' are the first and last (the axis range to draw).
function M.ticks(lo, hi, n)
  if hi <= lo then hi = lo + (lo == 0 and 1 or math.abs(lo) * 0.1) end
  local step = M.nice_step(hi - lo, n or 5)
  local first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
  local values = {}
  for k = first, last do values[#values + 1] = k * step end
  return step, values, first * step, last * step
end

-- tick_label(v, step) -> v with as many decimals as the step needs
function M.tick_label(v, step)
  local d = -math.floor(math.log10(step) + 1e-9)
  if math.abs(v) < step * 1e-6 then v = 0 end
  if d <= 0 then return ("%.0f"):format(v) end
  return ("%." .. d .. "f"):format(v)
end

-- bytes_unit(max) -> divisor, unit: the binary unit that shows max as 1..1023
function M.bytes_unit(max)
  local units, d, i = { "B", "KiB", "MiB", "GiB", "TiB" }, 1, 1
  while max >= 1024 * d and i < #units do d, i = d * 1024, i + 1 end
  return d, units[i]
end

-- format_bytes(n) -> "26.57 MiB"
function M.format_bytes(n)
  local d, u = M.bytes_unit(n)
  return d == 1 and ("%d B"):format(n) or ("%.2f %s"):format(n / d, u)
end

-- lighten("#rrggbb", f) -> the colour mixed with white by fraction f
function M.lighten(hex, f)
  local c = {}
  for i = 1, 3 do
    local v = tonumber(hex:sub(2 * i, 2 * i + 1), 16)
    c[i] = math.floor(v + (255 - v) * f + 0.5)
  end
  return ("#%02x%02x%02x"):format(c[1], c[2], c[3])
end

-- text_width(s, size) -> an estimate in pixels (Helvetica averages ~0.6 em;
-- enough to keep labels from overlapping, not to typeset)
function M.text_width(s, size) return #tostring(s) * (size or 12) * 0.6 end

-- fit(s, px, size) -> s, cut with "..." to about px pixels
function M.fit(s, px, size)
  s = tostring(s)
  local max = math.floor(px / ((size or 12) * 0.6))
  if #s <= max then return s end
  return s:sub(1, math.max(1, max - 3)) .. "..."
end

local Doc = {}
Doc.__index = Doc

-- attributes in a stable order (sorted names), values escaped; numbers
-- through num()
local function attrs_of(a)
  if not a then return "" end
  local names = {}
  for k in pairs(a) do names[#names + 1] = k end
  table.sort(names)
  local out = {}
  for _, k in ipairs(names) do
    local v = a[k]
    out[#out + 1] = (' %s="%s"'):format(k, type(v) == "number" and M.num(v) or M.esc(v))
  end
  return table.concat(out)
end

-- new(width, height, opts) -> doc with a white background
function M.new(W, H, opts)
  opts = opts or {}
  local d = setmetatable({ o = {}, W = W, H = H, size = opts.font_size or 12 }, Doc)
  d:add('<?xml version="1.0" encoding="UTF-8"?>')
  d:add(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
         'font-family="%s" font-size="%d">'):format(W, H, W, H, M.FONT, d.size))
  d:add(('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>'):format(W, H))
  return d
end

function Doc:add(s) self.o[#self.o + 1] = s end

-- element(tag, attrs, body): body (escaped text) and an optional tooltip
-- (attrs.tooltip, drawn as a <title> child that viewers show on hover)
function Doc:element(tag, a, body)
  local tip = a and a.tooltip
  if tip then a.tooltip = nil end
  local inner = (tip and ("<title>" .. M.esc(tip) .. "</title>") or "") .. (body and M.esc(body) or "")
  if inner == "" then self:add(("<%s%s/>"):format(tag, attrs_of(a)))
  else self:add(("<%s%s>%s</%s>"):format(tag, attrs_of(a), inner, tag)) end
end

function Doc:rect(x, y, w, h, a)
  a = a or {}
  a.x, a.y, a.width, a.height = x, y, math.max(w, 0), math.max(h, 0)
  self:element("rect", a)
end

function Doc:line(x1, y1, x2, y2, a)
  a = a or {}
  a.x1, a.y1, a.x2, a.y2 = x1, y1, x2, y2
  a.stroke = a.stroke or "#333333"
  self:element("line", a)
end

function Doc:text(x, y, s, a)
  a = a or {}
  a.x, a.y = x, y
  self:element("text", a, s)
end

-- polyline(points, attrs): points = { {x, y}, ... }
function Doc:polyline(points, a)
  a = a or {}
  local p = {}
  for i, xy in ipairs(points) do p[i] = M.num(xy[1]) .. "," .. M.num(xy[2]) end
  a.points = table.concat(p, " ")
  a.fill = a.fill or "none"
  self:element("polyline", a)
end

function Doc:open(tag, a) self:add(("<%s%s>"):format(tag, attrs_of(a))) end
function Doc:close(tag) self:add(("</%s>"):format(tag)) end

-- title(x, title, subtitle): bold title at y 24, grey subtitle at y 42
function Doc:title(x, title, subtitle)
  self:text(x, 24, title, { ["font-size"] = self.size + 4, ["font-weight"] = "bold" })
  if subtitle then self:text(x, 42, subtitle, { fill = "#555555" }) end
end

function Doc:finish()
  self:add("</svg>")
  return table.concat(self.o, "\n") .. "\n"
end

-- legend(doc, x, y, items, width) -> height used. items = { { label =,
-- color =, kind = "box" | "line" | "mark" } }, laid out left to right and
-- wrapped at width pixels.
function M.legend(doc, x, y, items, width)
  local cx, cy, rowh = x, y, doc.size + 8
  for _, it in ipairs(items) do
    local w = 24 + M.text_width(it.label, doc.size) + 18
    if cx > x and cx + w > x + width then cx, cy = x, cy + rowh end
    if it.kind == "line" then
      doc:line(cx, cy + 7, cx + 18, cy + 7, { stroke = it.color, ["stroke-width"] = 3, class = "legend" })
    elseif it.kind == "mark" then
      doc:line(cx + 9, cy, cx + 9, cy + 14, { stroke = it.color, ["stroke-width"] = 2, class = "legend" })
    else
      doc:rect(cx, cy, 14, 14, { fill = it.color, class = "legend" })
    end
    doc:text(cx + 22, cy + 11, it.label)
    cx = cx + w
  end
  return cy + rowh - y
end

-- write(path, text) -> path. Atomic (a temporary name in the same
-- directory, then rename: a reader sees the old file or the new one, never
-- half). Raises an I/O error (errors.io) naming the file.
function M.write(path, text)
  -- durable.lua: temporary name, checked writes, fsync, rename
  local ok, err = durable.write_atomic(path, text)
  if not ok then error(errors.io(err), 0) end
  return path
end

return M
