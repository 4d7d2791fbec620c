-- ztrain.record.timeline: a pipeline step's timeline drawn from events,
-- measured (seconds) or simulated (time units).
--
-- events[rank + 1] = { { op = "F", stage = 0, mb = 3, t0 = 1.5, t1 = 2.5 }, ... }
-- in the order the rank ran them; op is an action of ztrain.parallel.schedule (F, B,
-- I, W, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, STEP; the last two
-- without stage or mb).
--
--   bubble(events)            -> idle fraction of the ranks x time rectangle
--   svg(events, opts)         -> timeline.svg text (ranks x time)
--   trace(events, opts)       -> timeline.json text (Chrome trace, Perfetto)
--   write(dir, events, opts)  -> { svg = path, json = path, bubble = b }
--   files(dir, events, opts)  -> what write writes: { { path, text }, ... }
--   write_files(files)        -> each written; on a failure, those it created removed
--   from_simulation(res)      -> events of simulate.run's result
--   compare_svg(rows, opts)   -> bar chart of bubble fraction per schedule
--   write_file(path, text)    -> atomic write (temporary name, then rename)
--
-- Pure Lua plus cjson (util/json): no FFI, so it runs without the runtime library.
-- Escaping, coordinates, tick steps, colours and the atomic write come
-- from ztrain.util.svg (shared with `ztrain compare`'s charts).
local json = require "ztrain.util.json"
local svg = require "ztrain.util.svg"

local M = {}

M.COMPUTE = { F = true, B = true, I = true, W = true }
local COMM = { SEND_F = true, RECV_F = true, SEND_B = true, RECV_B = true }
local OPS = { F = true, B = true, I = true, W = true, SEND_F = true, RECV_F = true, SEND_B = true,
              RECV_B = true, REDUCE_GRAD = true, STEP = true }

-- Colours (Tableau 10): forward blue, full backward red, its halves I
-- orange and W green, communication grey, the optimizer purple/brown.
M.COLORS = { F = "#4e79a7", B = "#e15759", I = "#f28e2b", W = "#59a14f", COMM = "#9c9c9c",
             REDUCE_GRAD = "#b07aa1", STEP = "#9c755f" }

-- check(events) -> ranks. Raises a user error naming the rank and event.
local function check(events)
  if type(events) ~= "table" or #events < 1 then
    error("timeline: expected events as a list per rank ({ { op, stage, mb, t0, t1 }, ... })", 0)
  end
  for r, list in ipairs(events) do
    if type(list) ~= "table" then error(("timeline: rank %d's events are not a list"):format(r - 1), 0) end
    for k, e in ipairs(list) do
      if type(e) ~= "table" or not OPS[e.op] then
        error(("timeline: rank %d event %d has no known op (F, B, I, W, SEND_F, RECV_F, SEND_B, " ..
               "RECV_B, REDUCE_GRAD, STEP)"):format(r - 1, k), 0)
      end
      if type(e.t0) ~= "number" or type(e.t1) ~= "number" or e.t0 ~= e.t0 or e.t1 < e.t0 then
        error(("timeline: rank %d event %d (%s) needs times t0 <= t1, got %s, %s")
              :format(r - 1, k, e.op, tostring(e.t0), tostring(e.t1)), 0)
      end
    end
  end
  return #events
end

-- window(events) -> t0, t1: from the first compute action's start to the
-- last one's finish over all ranks (0, 0 when there is none).
local function window(events)
  local lo, hi
  for _, list in ipairs(events) do
    for _, e in ipairs(list) do
      if M.COMPUTE[e.op] then
        lo = lo and math.min(lo, e.t0) or e.t0
        hi = hi and math.max(hi, e.t1) or e.t1
      end
    end
  end
  return lo or 0, hi or 0
end

-- bubble(events) -> fraction, busy, span. The normalisation of
-- simulate.lua's res.bubble: idle / (ranks x span), where busy is the time
-- each rank spends in F, B, I or W (overlaps counted once) and span runs
-- from the first compute start to the last compute finish over all ranks.
-- Waiting on a RECV inside that span counts as idle (it is the bubble);
-- REDUCE_GRAD and STEP after the last backward are outside it (they take 0
-- in the simulator, whose makespan is then the same span), so a measured
-- bubble compares with the predicted one.
function M.bubble(events)
  local R = check(events)
  local lo, hi = window(events)
  local span = hi - lo
  if span <= 0 then return 0, 0, 0 end
  local busy = 0
  for _, list in ipairs(events) do
    local iv = {}
    for _, e in ipairs(list) do if M.COMPUTE[e.op] then iv[#iv + 1] = { e.t0, e.t1 } end end
    table.sort(iv, function(a, b) return a[1] < b[1] end)
    local cs, ce
    for _, x in ipairs(iv) do
      if ce and x[1] <= ce then ce = math.max(ce, x[2])
      else
        if ce then busy = busy + (ce - cs) end
        cs, ce = x[1], x[2]
      end
    end
    if ce then busy = busy + (ce - cs) end
  end
  return (R * span - busy) / (R * span), busy, span
end

-- from_simulation(res) -> events: simulate.run's timeline as events (time
-- units).
function M.from_simulation(res)
  local events = {}
  for r, tl in ipairs(res.timeline) do
    local list = {}
    for k, x in ipairs(tl) do
      local a = x.action
      list[k] = { op = a.op, stage = a.stage, mb = a.mb, t0 = x.start, t1 = x.finish }
    end
    events[r] = list
  end
  return events
end

-- SVG ------------------------------------------------------------------

local esc, num, nice_step, lighten = svg.esc, svg.num, svg.nice_step, svg.lighten

-- time_unit(opts, span) -> scale, label: seconds shown as s, ms or us;
-- simulated time in "time units"
local function time_unit(opts, span)
  if opts.unit == "s" then
    if span >= 1 then return 1, "s" elseif span >= 1e-3 then return 1e3, "ms" end
    return 1e6, "us"
  end
  return 1, opts.unit or "time units"
end

local function pct(x) return ("%.1f%%"):format(100 * x) end

-- drawn(events) -> lo, span: every action's time, not just the compute
-- window (span 1 when there is none, so the scale is defined)
local function drawn(events)
  local lo, hi = window(events)
  for _, list in ipairs(events) do
    for _, e in ipairs(list) do lo = math.min(lo, e.t0); hi = math.max(hi, e.t1) end
  end
  local span = hi - lo
  if span <= 0 then span = 1 end
  return lo, span
end

-- chunks(events) -> multi, chunk, nchunks. A rank with several stages
-- (interleaved): labels say the stage, and a rank's later chunks are drawn
-- lighter; chunk[rank + 1][stage] = its chunk on the rank, from 0.
local function chunks(events)
  local multi, chunk, nchunks = false, {}, 1
  for r, list in ipairs(events) do
    local st, set = {}, {}
    for _, e in ipairs(list) do
      if M.COMPUTE[e.op] and e.stage and not set[e.stage] then set[e.stage] = true; st[#st + 1] = e.stage end
    end
    table.sort(st)
    if #st > 1 then multi = true end
    nchunks = math.max(nchunks, #st)
    chunk[r] = {}
    for c, s in ipairs(st) do chunk[r][s] = c - 1 end
  end
  return multi, chunk, nchunks
end

-- canvas(events, opts) -> the drawing's geometry and state: sizes, the time
-- window and its x(t), the chunks, and add(line) collecting the SVG's lines.
local function canvas(events, opts)
  local R = #events
  local c = { R = R, lines = {} }
  c.lo, c.span = drawn(events)
  c.multi, c.chunk, c.nchunks = chunks(events)
  c.W = opts.width or 1100
  c.left, c.right, c.top, c.rowh, c.gap = 70, 20, 56, 30, 6
  c.plot = c.W - c.left - c.right
  c.axis_y = c.top + (R * (c.rowh + c.gap) - c.gap) + 8
  c.legend_y = c.axis_y + 44
  c.H = c.legend_y + 30
  function c.x(t) return c.left + (t - c.lo) / c.span * c.plot end
  function c.add(s) c.lines[#c.lines + 1] = s end
  return c
end

-- an action's colour: its op's, lighter for a rank's later chunks
local function fill(c, r, e)
  local k = M.COMPUTE[e.op] and e.stage and c.chunk[r][e.stage] or 0
  if k == 0 then return M.COLORS[e.op] end
  return lighten(M.COLORS[e.op], 0.45 * k / (c.nchunks - 1))
end

-- the title: opts.title, or the schedule's name and bubble (and the predicted one)
local function title_of(opts, b)
  local title = opts.title
  if not title then
    title = ("%sbubble %s"):format(opts.name and (opts.name .. ": ") or "", pct(b))
    if opts.predicted_bubble then title = title .. (" (predicted %s)"):format(pct(opts.predicted_bubble)) end
    title = title .. " of ranks x time"
  end
  return title
end

local function draw_header(c, opts, b)
  local add, W, H = c.add, c.W, c.H
  add('<?xml version="1.0" encoding="UTF-8"?>')
  add(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
       'font-family="Helvetica, Arial, sans-serif" font-size="11">'):format(W, H, W, H))
  add(('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>'):format(W, H))
  add(('<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>'):format(c.left, esc(title_of(opts, b))))
  if opts.subtitle then
    add(('<text x="%d" y="42" fill="#555555">%s</text>'):format(c.left, esc(opts.subtitle)))
  end
end

-- A compute action (or a REDUCE_GRAD or STEP that takes time): a full-height
-- rectangle with its label, "4F3" or "F3" when it fits, else the
-- micro-batch alone, else none.
local function draw_action(c, r, y, e, x0, w, label, tip)
  local rowh = c.rowh
  c.add(('<rect class="act %s" x="%s" y="%d" width="%s" height="%d" fill="%s" stroke="#ffffff" ' ..
         'stroke-width="0.5"><title>%s</title></rect>')
        :format(e.op, num(x0), y, num(math.max(w, 0)), rowh, fill(c, r, e), esc(tip)))
  local text = label
  if e.op == "REDUCE_GRAD" then text = "R" elseif e.op == "STEP" then text = "S" end
  if #text * 6.6 + 4 > w and M.COMPUTE[e.op] then text = e.op .. e.mb end
  if #text * 6.6 + 4 > w and M.COMPUTE[e.op] then text = tostring(e.mb) end
  if #text * 6.6 + 4 <= w then
    c.add(('<text x="%s" y="%s" text-anchor="middle" dominant-baseline="middle" fill="#ffffff">%s</text>')
          :format(num(x0 + w / 2), num(y + rowh / 2), esc(text)))
  end
end

-- one event of rank r (row top y): an action, a thin bar at the row's
-- foot for a SEND/RECV that takes time, or nothing
local function draw_event(c, r, y, e)
  local x0, x1 = c.x(e.t0), c.x(e.t1)
  local w = x1 - x0
  local label = M.COMPUTE[e.op] and ((c.multi and e.stage or "") .. e.op .. e.mb) or e.op
  local tip = ("rank %d %s%s: %s to %s"):format(r - 1, label,
    e.stage and (" (stage %d%s)"):format(e.stage, e.mb and (", mb %d"):format(e.mb) or "") or "",
    num(e.t0 - c.lo), num(e.t1 - c.lo))
  if M.COMPUTE[e.op] or e.op == "REDUCE_GRAD" or e.op == "STEP" then
    if w > 0 or M.COMPUTE[e.op] then draw_action(c, r, y, e, x0, w, label, tip) end
  elseif COMM[e.op] and w > 0 then
    c.add(('<rect class="comm %s" x="%s" y="%d" width="%s" height="4" fill="%s"><title>%s</title></rect>')
          :format(e.op, num(x0), y + c.rowh - 4, num(w), M.COLORS.COMM, esc(tip)))
  end
end

local function draw_rows(c, events)
  for r = 1, c.R do
    local y = c.top + (r - 1) * (c.rowh + c.gap)
    c.add(('<text x="%d" y="%s" text-anchor="end" dominant-baseline="middle">rank %d</text>')
          :format(c.left - 8, num(y + c.rowh / 2), r - 1))
    -- the row's background: what stays visible is idle time
    c.add(('<rect class="idle" x="%d" y="%d" width="%d" height="%d" fill="#f3f3f3" stroke="#d0d0d0"/>')
          :format(c.left, y, c.plot, c.rowh))
    for _, e in ipairs(events[r]) do draw_event(c, r, y, e) end
  end
end

-- the time axis: ticks at a round step, in the unit time_unit picks
local function draw_axis(c, opts)
  local add, left, plot, axis_y = c.add, c.left, c.plot, c.axis_y
  local scale, uname = time_unit(opts, c.span)
  add(('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>'):format(left, axis_y, left + plot, axis_y))
  local step = nice_step(c.span * scale, 10)
  local k = 0
  while k * step <= c.span * scale + 1e-9 do
    local tx = c.x(c.lo + k * step / scale)
    add(('<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#333333"/>'):format(num(tx), axis_y, num(tx), axis_y + 5))
    add(('<text x="%s" y="%d" text-anchor="middle">%s</text>'):format(num(tx), axis_y + 17, num(k * step)))
    k = k + 1
  end
  add(('<text x="%s" y="%d" text-anchor="middle" fill="#555555">time (%s)</text>')
      :format(num(left + plot / 2), axis_y + 32, esc(uname)))
end

local LEGEND = { F = "F forward", B = "B backward", I = "I input grad", W = "W weight grad",
                 COMM = "send/recv", REDUCE_GRAD = "REDUCE_GRAD", STEP = "STEP" }
local LEGEND_ORDER = { "F", "B", "I", "W", "COMM", "REDUCE_GRAD", "STEP" }

-- the legend: the ops present (drawn), idle, and how chunks are told apart
local function draw_legend(c, events)
  local add, legend_y = c.add, c.legend_y
  local present = {}
  for _, list in ipairs(events) do
    for _, e in ipairs(list) do
      if M.COMPUTE[e.op] or e.t1 > e.t0 then present[COMM[e.op] and "COMM" or e.op] = true end
    end
  end
  local lx = c.left
  for _, op in ipairs(LEGEND_ORDER) do
    if present[op] then
      add(('<rect class="legend" x="%d" y="%d" width="14" height="14" fill="%s"/>'):format(lx, legend_y, M.COLORS[op]))
      add(('<text x="%d" y="%d" dominant-baseline="middle">%s</text>'):format(lx + 19, legend_y + 7, LEGEND[op]))
      lx = lx + 32 + #LEGEND[op] * 7.2
    end
  end
  add(('<rect class="legend" x="%d" y="%d" width="14" height="14" fill="#f3f3f3" stroke="#d0d0d0"/>')
      :format(lx, legend_y))
  add(('<text x="%d" y="%d" dominant-baseline="middle">idle</text>'):format(lx + 19, legend_y + 7))
  if c.multi then
    add(('<text x="%d" y="%d" dominant-baseline="middle" fill="#555555">lighter: a later chunk; ' ..
         '4F3 = stage 4, micro-batch 3</text>'):format(lx + 60, legend_y + 7))
  end
end

-- svg(events, opts) -> string. opts (all optional): name (the schedule, in
-- the title), title (replaces the generated one), predicted_bubble (shown
-- beside the bubble of these events), unit ("s" for measured seconds;
-- default "time units"), width (pixels, default 1100).
-- One row per rank; a rectangle (class "act" and the op) per compute
-- action, micro-batch labels where they fit; REDUCE_GRAD and STEP full
-- height, SEND/RECV as a thin bar at the row's foot (when they take time);
-- idle time is the empty row background.
function M.svg(events, opts)
  opts = opts or {}
  check(events)
  local b = M.bubble(events)
  local c = canvas(events, opts)
  draw_header(c, opts, b)
  draw_rows(c, events)
  draw_axis(c, opts)
  draw_legend(c, events)
  c.add("</svg>")
  return table.concat(c.lines, "\n") .. "\n"
end

-- trace(events, opts) -> Chrome trace JSON (opens in Perfetto and
-- chrome://tracing). One "X" event per action that is compute or takes
-- time: pid 0, tid = rank, name "F3" (with the stage in front when a rank
-- holds several), cat "compute", "comm" or "optim", args { stage, mb },
-- ts and dur in microseconds from the first action. opts.us_per_unit:
-- microseconds per event time unit (1e6 for seconds, the default).
function M.trace(events, opts)
  opts = opts or {}
  check(events)
  local k = opts.us_per_unit or 1e6
  local lo = math.huge
  for _, list in ipairs(events) do for _, e in ipairs(list) do lo = math.min(lo, e.t0) end end
  if lo == math.huge then lo = 0 end
  local out = {
    { name = "process_name", ph = "M", pid = 0, tid = 0,
      args = { name = "ztrain pipeline" .. (opts.name and (" " .. opts.name) or "") } },
  }
  for r = 1, #events do
    out[#out + 1] = { name = "thread_name", ph = "M", pid = 0, tid = r - 1, args = { name = "rank " .. (r - 1) } }
    out[#out + 1] = { name = "thread_sort_index", ph = "M", pid = 0, tid = r - 1, args = { sort_index = r - 1 } }
  end
  for r, list in ipairs(events) do
    for _, e in ipairs(list) do
      if M.COMPUTE[e.op] or e.t1 > e.t0 then
        out[#out + 1] = {
          name = M.COMPUTE[e.op] and (e.op .. e.mb) or (e.mb and (e.op .. e.mb) or e.op),
          cat = M.COMPUTE[e.op] and "compute" or COMM[e.op] and "comm" or "optim",
          ph = "X", pid = 0, tid = r - 1,
          ts = (e.t0 - lo) * k, dur = (e.t1 - e.t0) * k,
          args = { stage = e.stage, mb = e.mb },
        }
      end
    end
  end
  local doc = { traceEvents = out, displayTimeUnit = "ms" }
  if opts.name or opts.predicted_bubble then
    doc.otherData = { schedule = opts.name, bubble = (M.bubble(events)), predicted_bubble = opts.predicted_bubble }
  end
  return json.encode(doc) .. "\n"
end

-- write_file(path, text): atomic and durable (svg.write: ztrain.util.durable).
-- Raises an I/O error naming the file.
M.write_file = svg.write

-- write_files(files): files = { { path, text }, ... }, each written with
-- write_file in order. All or nothing, as far as this call can make it:
-- when one fails, the files it had created before are removed (a file
-- that was there before stays, replaced) and the error is raised again,
-- so a failed command leaves no half of its output behind.
function M.write_files(files)
  local made = {}
  for _, f in ipairs(files) do
    local was = io.open(f[1], "rb")
    if was then was:close() end
    local ok, err = pcall(M.write_file, f[1], f[2])
    if not ok then
      for _, p in ipairs(made) do os.remove(p) end
      error(err, 0)
    end
    if not was then made[#made + 1] = f[1] end
  end
end

-- files(dir, events, opts) -> { { dir/BASE.svg, text }, { dir/BASE.json,
-- text } }: what write writes, for a caller that writes them with others
-- (write_files). opts as write's.
function M.files(dir, events, opts)
  opts = opts or {}
  local base = (dir:gsub("/+$", "")) .. "/" .. (opts.basename or "timeline")
  return { { base .. ".svg", M.svg(events, opts) }, { base .. ".json", M.trace(events, opts) } }
end

-- write(dir, events, opts) -> { svg = path, json = path, bubble = b }.
-- Writes dir/timeline.svg and dir/timeline.json (dir must exist); opts as
-- svg() and trace() take them (name, predicted_bubble, unit = "s" with
-- us_per_unit 1e6 for measured seconds), plus opts.basename (default
-- "timeline"). Raises a user error naming the file it could not write;
-- then neither file is left if it was not there before.
function M.write(dir, events, opts)
  local files = M.files(dir, events, opts)
  M.write_files(files)
  return { svg = files[1][1], json = files[2][1], bubble = (M.bubble(events)) }
end

local PALETTE = { "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1" }

-- compare_svg(rows, opts) -> string: a horizontal bar chart of the bubble
-- fraction per schedule. rows = { { name = "1f1b", bubble = 0.27, note =
-- "peak 4 3 2 1", color = "#rrggbb" (default: a palette) }, ... } (bubble
-- nil: drawn as "n/a" with the note).
-- opts.title.
function M.compare_svg(rows, opts)
  opts = opts or {}
  local W, left, right, top, barh, gap = 900, 190, 170, 56, 26, 10
  local plot = W - left - right
  local H = top + #rows * (barh + gap) + 40
  local o = {}
  local function add(s) o[#o + 1] = s end
  add('<?xml version="1.0" encoding="UTF-8"?>')
  add(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
       'font-family="Helvetica, Arial, sans-serif" font-size="12">'):format(W, H, W, H))
  add(('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>'):format(W, H))
  add(('<text x="%d" y="26" font-size="15" font-weight="bold">%s</text>')
      :format(left, esc(opts.title or "pipeline bubble per schedule")))
  add(('<text x="%d" y="44" fill="#555555">%s</text>')
      :format(left, esc(opts.subtitle or "idle / (ranks x makespan); utilisation = 1 - bubble")))
  local y_axis = top + #rows * (barh + gap)
  for t = 0, 10 do
    local tx = left + t / 10 * plot
    add(('<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="%s"/>')
        :format(num(tx), top - 4, num(tx), y_axis, t == 0 and "#333333" or "#e4e4e4"))
    if t % 2 == 0 then
      add(('<text x="%s" y="%d" text-anchor="middle">%d%%</text>'):format(num(tx), y_axis + 16, t * 10))
    end
  end
  for i, row in ipairs(rows) do
    local y = top + (i - 1) * (barh + gap)
    add(('<text x="%d" y="%s" text-anchor="end" dominant-baseline="middle">%s</text>')
        :format(left - 8, num(y + barh / 2), esc(row.name)))
    if row.bubble then
      local w = row.bubble * plot
      add(('<rect class="bar" x="%d" y="%d" width="%s" height="%d" fill="%s"><title>%s</title></rect>')
          :format(left, y, num(w), barh, row.color or PALETTE[(i - 1) % #PALETTE + 1],
                  esc(row.name .. " " .. pct(row.bubble))))
      add(('<text x="%s" y="%s" dominant-baseline="middle">%s%s</text>')
          :format(num(left + w + 6), num(y + barh / 2), pct(row.bubble), row.note and ("  " .. esc(row.note)) or ""))
    else
      add(('<text x="%d" y="%s" dominant-baseline="middle" fill="#555555">n/a%s</text>')
          :format(left + 6, num(y + barh / 2), row.note and (": " .. esc(row.note)) or ""))
    end
  end
  add("</svg>")
  return table.concat(o, "\n") .. "\n"
end

return M
