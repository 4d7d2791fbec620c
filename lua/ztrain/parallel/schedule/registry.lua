-- ztrain.parallel.schedule.registry: schedules by name -- the one-stage built-ins
-- and the pipeline library's (parallel/schedule/library.lua) -- and resolve(),
-- which turns a name or a function into validated action lists. Above both
-- the IR (ztrain.parallel.schedule) and the library, so neither requires the other
-- back (issue 28).
local S = require "ztrain.parallel.schedule"
local pipe = require "ztrain.parallel.schedule.library"
local csv = require "ztrain.parallel.schedule.csv"
local errors = require "ztrain.core.errors"

local M = {}

-- The one-stage built-ins (the pipeline ones are parallel/schedule/library.lua's builtin).
M.builtin = {
  one_stage = function(p) return S.one_stage(p.microbatches) end,
  one_stage_iw = function(p) return S.one_stage(p.microbatches, { split = true }) end,
}

-- names() -> every built-in schedule name (these and the pipeline ones), sorted.
function M.names()
  local names = {}
  for k in pairs(M.builtin) do names[#names + 1] = k end
  for k in pairs(pipe.builtin) do names[#names + 1] = k end
  table.sort(names)
  return names
end

-- layout(r) -> schedule, placement, chunks: what a recipe's pipeline runs
-- (pipeline.stages ranks x pipeline.chunks stages a rank): its schedule
-- (none given: 1f1b, interleaved_1f1b with chunks > 1; "" on one stage
-- without one), pipeline.placement or the schedule's own ("loop", "v").
-- The trainer, the planner and the launcher's checks ask it. Raises a user
-- error for a V without two chunks, or chunks on one rank without a schedule.
function M.layout(r)
  local P, V = r.pipeline.stages, r.pipeline.chunks
  local sched = r.schedule
  if (sched == nil or sched == "") and P > 1 then sched = V > 1 and "interleaved_1f1b" or "1f1b" end
  if (sched == nil or sched == "") and V > 1 then
    error(("pipeline.chunks = %d cuts the model into %d stages on one rank, which only a schedule runs: set " ..
           "pipeline.stages > 1, a schedule (e.g. interleaved_1f1b), or pipeline.chunks = 1"):format(V, V), 0)
  end
  local placement = r.pipeline.placement ~= "" and r.pipeline.placement or pipe.placement(sched)
  if placement == "v" and V ~= 2 then
    error(("%s places two stages on each rank in a V: set pipeline.chunks = 2 (it is %d)")
          :format(r.pipeline.placement ~= "" and 'pipeline.placement = "v"' or ("schedule " .. tostring(sched)), V), 0)
  end
  return sched, placement, V
end

-- lists(r, accumulate) -> lists, q, sched: a recipe's pipeline lists as
-- the trainer builds them (layout, library.params' q with stage_rank, then
-- resolve, GPT-2's tie assumed), for accumulate micro-batches a step; the
-- planner and the launcher's checks ask it. Raises the same user errors.
function M.lists(r, accumulate)
  local sched, placement, V = M.layout(r)
  local P = r.pipeline.stages
  local q = pipe.params({ ranks = P, chunks = V, microbatches = accumulate, placement = placement }, "pipeline")
  local lists = M.resolve(sched, { stages = P * V, microbatches = accumulate, ranks = P, chunks = V,
                                   placement = placement, stage_rank = q.stage_rank, tied = true })
  return lists, q, sched
end

-- resolve(name_or_fn, p) -> validated lists, or raises a user error.
-- "csv:PATH" reads PyTorch's pipelining CSV (any format it writes).
-- p: { stages, microbatches, ranks, stage_rank }. Names are the one-stage
-- built-ins above or the pipeline schedules (parallel/schedule/library.lua: gpipe,
-- 1f1b, interleaved_1f1b, zb_h1, zbv, pipedream), which also run on one stage.
function M.resolve(sched, p)
  local fn = sched
  if type(sched) == "string" and sched:match("^csv:") then
    -- PyTorch's pipelining CSV (parallel/schedule/csv.lua): its placement
    -- must be the run's (pipeline.chunks, pipeline.placement)
    local path = sched:sub(5)
    local ok, lists, info = pcall(csv.load, path, { stages = p.stages, microbatches = p.microbatches,
                                                     validate = false })
    if not ok then error(errors.message(lists), 0) end
    for st = 0, (p.stages or 0) - 1 do
      if p.stage_rank and info.stage_rank(st) ~= p.stage_rank(st) then
        error(("schedule %s places stage %d on rank %d, the run on rank %d: set pipeline.chunks = %d and " ..
               "pipeline.placement = %q to run it"):format(sched, st, info.stage_rank(st), p.stage_rank(st),
               info.stages / info.ranks, (info.stages == 2 * info.ranks and info.stage_rank(info.ranks) ==
               info.ranks - 1) and "v" or "loop"), 0)
      end
    end
    local okv, err = S.validate(lists, p)
    if not okv then error(("schedule %s: %s"):format(sched, err), 0) end
    return lists
  end
  if type(sched) == "string" then
    fn = M.builtin[sched]
    if not fn then
      if pipe.builtin[sched] then return (pipe.build(sched, p)) end
      error(("unknown schedule %q (known: %s; or a function returning action lists)")
            :format(sched, table.concat(M.names(), ", ")), 0)
    end
  end
  if type(fn) ~= "function" then
    error("schedule must be a name or a function returning one action list per rank", 0)
  end
  local lists = fn(p)
  local ok, err = S.validate(lists, p)
  if not ok then error("schedule: " .. err, 0) end
  return lists
end

return M
