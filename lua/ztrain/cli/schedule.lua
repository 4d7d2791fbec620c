-- ztrain.cli.schedule: `ztrain schedule [show|simulate] NAME|compare|csv:PATH [p=4] [m=8] [v=2] [out=DIR]`:
-- draw a pipeline schedule without training -- its grid, bubble, peak
-- activations and timeline (SVG and Perfetto JSON), or every built-in
-- schedule side by side. Simulated only: no runtime is loaded.
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local usage = require "ztrain.cli.usage"
local schedules = require "ztrain.parallel.schedule.library"
local simulate = require "ztrain.parallel.schedule.simulate"
local sets = require "ztrain.parallel.schedule.sets"
local timeline = require "ztrain.record.timeline"
local csv = require "ztrain.parallel.schedule.csv"
local IR = require "ztrain.parallel.schedule"

local M = {}

local SCHEDULE_KEYS = { p = "pipeline ranks", m = "micro-batches", v = "chunks per rank (interleaved)",
                        out = "output directory" }

-- schedule_args(args) -> { p, m, v, out }. Raises a user error naming the
-- argument.
local function schedule_args(args, from)
  local o = {}
  for j = from, #args do
    local k, v = args[j]:match("^([%w_]+)=(.*)$")
    if not k then
      error(("cannot read argument %q: expected key=value (p=4 m=8 v=2 out=DIR)"):format(args[j]), 0)
    end
    if not SCHEDULE_KEYS[k] then
      error(("unknown key %q for ztrain schedule (known: p ranks, m micro-batches, v chunks, out DIR)")
            :format(k), 0)
    end
    if k == "out" then
      -- "" would write /timeline.svg (out .. "/timeline.svg")
      if v == "" then error("out= is empty: give the directory to write the timeline into, e.g. out=DIR", 0) end
      o.out = v
    else
      local n = tonumber(v)
      -- inf passes n == math.floor(n); a large finite number is left to the
      -- schedule's bounds (parallel/schedule/library.lua), which name them
      if not n or n ~= math.floor(n) or n < 1 or n == math.huge then
        error(("%s=%s: %s must be a whole number >= 1"):format(k, v, SCHEDULE_KEYS[k]), 0)
      end
      o[k] = n
    end
  end
  return o
end

-- fmt_peak(res, stages) -> "s0 2, s1 1"
local function fmt_peak(res, stages)
  local t = {}
  for s = 0, stages - 1 do t[#t + 1] = ("s%d %d"):format(s, res.peak[s] or 0) end
  return table.concat(t, ", ")
end

-- held(lists, stages) -> the line naming the gradients a stage keeps for
-- micro-batch order (driver/grad_order.lua), or nil where none
local function held(lists, stages)
  local h, t, any = IR.held_grads(lists), {}, false
  for s = 0, stages - 1 do
    t[#t + 1] = ("s%d %d"):format(s, h[s] or 0)
    if (h[s] or 0) > 0 then any = true end
  end
  if not any then return nil end
  return "gradients completed early, kept until their turn (micro-batch order) per stage: " .. table.concat(t, ", ")
end

-- the activation sets the driver keeps per stage (parallel/schedule/sets.lua):
-- what the memory plan counts
local function kept(lists, stages)
  local peak, t = sets.plan(lists, { tied = true }).peak, {}   -- GPT-2's tied embedding
  for s = 0, stages - 1 do t[#t + 1] = ("s%d %d"):format(s, peak[s] or 0) end
  return "activation sets the driver keeps per stage (a send still out included): " .. table.concat(t, ", ")
end

-- out_dir(o, what) -> the output directory, made; and whether it was
-- there before (a failed write removes one this command made)
local function out_dir(o, what)
  local dir = o.out or ("runs/schedule-%s-p%d-m%d%s-%s"):format(what, o.p, o.m,
    (o.v and o.v > 1) and ("-v" .. o.v) or "", os.date("%Y%m%d-%H%M%S"))
  local was = fs.exists(dir)
  local ok, err = fs.mkdirs(dir, "output directory")
  if not ok then error(err, 0) end
  return dir, was
end

-- write_out(o, what, files(dir) -> { { path, text }, ... }) -> dir: the
-- command's files written together (record/timeline.lua's write_files):
-- when one cannot be written, none it created is left, nor the output
-- directory it made.
local function write_out(o, what, files_in)
  local dir, was = out_dir(o, what)
  local ok, err = pcall(timeline.write_files, files_in(dir))
  if not ok then
    if not was then os.remove(dir) end              -- (removes only an empty directory)
    error(err, 0)
  end
  return dir
end

-- write_timeline(o, what, res, opts): one simulated schedule's timeline
-- (svg and json, together) in the output directory, and the line saying so
local function write_timeline(o, what, res, opts)
  local files
  write_out(o, what, function(dir)
    files = timeline.files(dir, timeline.from_simulation(res), opts)
    return files
  end)
  print(("wrote %s and %s (1 time unit = 1 ms in the trace)"):format(files[1][1], files[2][1]))
end

-- one schedule at p, m, v: its grid, bubble, peak activations, timeline
local function schedule_one(name, o, model)
  -- interleaving with one chunk is 1F1B: default to two
  o.v = o.v or ((name == "interleaved_1f1b" or schedules.placement(name) == "v") and 2 or 1)
  local lists, q = schedules.build(name, { ranks = o.p, microbatches = o.m, chunks = o.v })
  local res = simulate.check(lists)
  print(("%s: p=%d ranks, m=%d micro-batches, v=%d chunk(s) per rank, %d stages; %s")
        :format(name, q.ranks, q.microbatches, q.chunks, q.stages, model))
  io.stdout:write(simulate.grid(res))
  print(("bubble %.6f (%.1f%%) of ranks x makespan %g, idle / (ranks x makespan); %.6f of busy time " ..
         "(Megatron's normalisation)"):format(res.bubble, 100 * res.bubble, res.makespan, res.bubble_busy))
  print("peak activations per stage (micro-batches held): " .. fmt_peak(res, q.stages))
  print(kept(lists, q.stages))
  local hl = held(lists, q.stages)
  if hl then print(hl) end
  write_timeline(o, name, res, {
    name = ("%s p=%d m=%d%s"):format(name, q.ranks, q.microbatches, q.chunks > 1 and (" v=" .. q.chunks) or ""),
    subtitle = model .. "; the ideal timeline", us_per_unit = 1000 })
  return 0
end

-- a PyTorch pipelining CSV (parallel/schedule/csv.lua): what load made of
-- it, then its grid, bubble, peak activations and timeline
local function schedule_csv(spec, o, model)
  local path = spec:sub(5)
  -- the file sets the shape: a p, m or v given too would be ignored, and
  -- the timeline would not be of what was asked for
  local given = {}
  for _, k in ipairs({ "p", "m", "v" }) do
    if o[k] then given[#given + 1] = ("%s=%d"):format(k, o[k]) end
  end
  if #given > 0 then
    error(("%s: %s: the file sets the ranks (its rows), micro-batches and chunks (its stages); drop %s " ..
           "(out=DIR is the one key a csv: schedule takes)"):format(spec, table.concat(given, " "),
           #given > 1 and "them" or "it"), 0)
  end
  -- a file ztrain cannot read is the user's to mend: its message, no Lua location
  local ok, lists, info = pcall(csv.load, path)
  if not ok then error(errors.message(lists), 0) end
  -- receives posted, as the driver posts them: a file with PyTorch's own
  -- SEND/RECV receives early, which a blocking receive would turn into waits
  local res = simulate.check(lists, { posted = true })
  print(("%s: %d ranks, %d stages (%s), %d micro-batches, %s; %s"):format(path, info.ranks, info.stages,
        info.stages == 2 * info.ranks and info.stage_rank(info.ranks) == info.ranks - 1 and "V" or "looped",
        info.microbatches, info.compute_only and "compute only" or "with its communication", model))
  for _, n in ipairs(info.notes) do print("  " .. n) end
  io.stdout:write(simulate.grid(res))
  print(("bubble %.6f (%.1f%%) of ranks x makespan %g"):format(res.bubble, 100 * res.bubble, res.makespan))
  print("peak activations per stage (micro-batches held): " .. fmt_peak(res, info.stages))
  print(kept(lists, info.stages))
  local hl = held(lists, info.stages)
  if hl then print(hl) end
  o.p, o.m = info.ranks, info.microbatches
  local base = path:match("([^/]+)%.[^./]*$") or path:match("[^/]+$")
  write_timeline(o, "csv-" .. base:gsub("[^%w_]+", "-"), res, { name = base,
                 subtitle = model .. "; the ideal timeline", us_per_unit = 1000 })
  return 0
end

-- compare: every built-in schedule at the same p and m (interleaved with
-- v, default 2), and the naive pipeline (GPipe with one micro-batch)
local function schedule_compare(o, model)
  local T = simulate.TIMES
  local v = o.v or 2
  local rows, timelines = {}, {}
  print(("p=%d ranks, m=%d micro-batches (interleaved_1f1b: v=%d); %s"):format(o.p, o.m, v, model))
  print(("%-18s %-9s %-9s %s"):format("schedule", "bubble", "makespan", "peak activations per stage"))
  local cases = { { "naive (gpipe m=1)", "gpipe", 1, 1 }, { "gpipe", "gpipe", o.m, 1 },
                  { "1f1b", "1f1b", o.m, 1 }, { "interleaved_1f1b", "interleaved_1f1b", o.m, v },
                  { "looped_bfs", "looped_bfs", o.m, v }, { "zb_h1", "zb_h1", o.m, 1 }, { "zbv", "zbv", o.m, 2 },
                  { "dualpipev", "dualpipev", o.m, 2 } }
  for _, c in ipairs(cases) do
    local label, sname, m, chunks = c[1], c[2], c[3], c[4]
    local ok, lists, q = pcall(schedules.build, sname, { ranks = o.p, microbatches = m, chunks = chunks })
    local res
    if ok then ok, res = pcall(simulate.check, lists) end
    if ok then
      print(("%-18s %-9.6f %-9g %s"):format(label, res.bubble, res.makespan, fmt_peak(res, q.stages)))
      local maxpeak = 0
      for s = 0, q.stages - 1 do maxpeak = math.max(maxpeak, res.peak[s] or 0) end
      rows[#rows + 1] = { name = label, bubble = res.bubble, note = ("(peak activations: %d)"):format(maxpeak) }
      timelines[#timelines + 1] = { timeline.from_simulation(res), {
        name = ("%s p=%d m=%d%s"):format(sname, q.ranks, q.microbatches, q.chunks > 1 and (" v=" .. q.chunks) or ""),
        subtitle = model, us_per_unit = 1000, basename = "timeline-" .. label:gsub("[^%w_]+", "-"):gsub("-$", "") } }
    else
      local why = errors.message(lists or res)
      print(("%-18s n/a: %s"):format(label, why))
      rows[#rows + 1] = { name = label, note = why }
    end
  end
  local chart = timeline.compare_svg(rows, {
    title = ("pipeline bubble per schedule, p=%d m=%d"):format(o.p, o.m),
    subtitle = ("idle / (ranks x makespan), utilisation = 1 - bubble; F=%g B=%g (I=%g W=%g), no communication cost")
               :format(T.F, T.B, T.I, T.W) })
  -- every timeline and the chart at once: a failed write leaves none of them
  local dir = write_out(o, "compare", function(d)
    local files = {}
    for _, t in ipairs(timelines) do
      for _, f in ipairs(timeline.files(d, t[1], t[2])) do files[#files + 1] = f end
    end
    files[#files + 1] = { d .. "/compare.svg", chart }
    return files
  end)
  print(("wrote %s and each schedule's timeline-NAME.svg/.json in %s"):format(dir .. "/compare.svg", dir))
  return 0
end

-- schedule(args) -> exit code. args = { NAME, key=value ... }.
function M.main(args)
  local names = {}
  for k in pairs(schedules.builtin) do names[#names + 1] = k end
  table.sort(names)
  local known = table.concat(names, ", ") .. ", compare, or csv:PATH (a PyTorch pipelining CSV)"
  -- `ztrain schedule show NAME` and `ztrain schedule simulate NAME`: the same as `ztrain schedule NAME`
  if args[1] == "show" or args[1] == "simulate" then args = { select(2, unpack(args)) } end
  local name = args[1]
  if name == "-h" or name == "--help" then io.stdout:write(usage.command("schedule")); return 0 end
  if not name or name:find("=") then
    error(("schedule: give a schedule name (%s), e.g. ztrain schedule 1f1b p=4 m=8"):format(known), 0)
  end
  if name:match("^csv:") then
    local T = simulate.TIMES
    return schedule_csv(name, schedule_args(args, 2), ("simulated with F=%g B=%g (I=%g W=%g) time units, " ..
                        "communication free"):format(T.F, T.B, T.I, T.W))
  end
  if name ~= "compare" and not schedules.builtin[name] then
    error(("unknown pipeline schedule %q (known: %s)"):format(name, known), 0)
  end
  local o = schedule_args(args, 2)
  o.p, o.m = o.p or 4, o.m or 8
  local T = simulate.TIMES
  local model = ("simulated with F=%g B=%g (I=%g W=%g) time units, communication free")
                :format(T.F, T.B, T.I, T.W)
  if name ~= "compare" then return schedule_one(name, o, model) end
  -- a shape past the bounds even without chunks is refused, not drawn as n/a
  schedules.params({ ranks = o.p, microbatches = o.m, chunks = 1 }, "compare")
  return schedule_compare(o, model)
end

return M
