-- ztrain.record.comm: the run's communication per step (summary.json
-- `comm_per_step`, metrics.jsonl `comm`; docs/cli.md "Run outputs").
--
--   local acc = comm_report.new()
--   local before = comm.stats(); ...one training step...
--   local d = comm_report.step(acc, before, comm.stats(), first)  -- d for metrics.jsonl
--   local cps = comm_report.per_step(world, acc)   -- collective: every rank calls it
--
-- A step's traffic is what the ranks issued during tr:train_step(): the
-- gradient and parameter collectives, pipeline transfers, and the small
-- host exchanges of the step (loss, gradient norm: kind "host"). Evaluation,
-- checkpoints and the end-of-run gathers (this module's own included) are
-- outside it. The first step of a run is left out of the means when later
-- ones exist: it pays for setup (first gathers, buffers filled).
local comm = require "ztrain.core.comm"
local cjson_null = require("ztrain.util.json").null

local M = {}

function M.new()
  local by = {}
  for _, k in ipairs(comm.KINDS) do by[k] = { sent = 0, recv = 0, calls = 0 } end
  return { steps = 0, sent = 0, recv = 0, busy_ms = 0, exposed_ms = 0, by_kind = by,
           first = nil }
end

local function add(acc, d)
  acc.steps = acc.steps + 1
  acc.sent, acc.recv = acc.sent + d.sent, acc.recv + d.recv
  acc.busy_ms, acc.exposed_ms = acc.busy_ms + d.busy_ms, acc.exposed_ms + d.exposed_ms
  for k, v in pairs(d.by_kind) do
    local a = acc.by_kind[k]
    a.sent, a.recv, a.calls = a.sent + v.sent, a.recv + v.recv, a.calls + v.calls
  end
end

-- step(acc, before, after) -> the step's delta, as metrics.jsonl's `comm`
-- ({ sent=, recv=, busy_ms=, exposed_ms= }, this rank's). The run's first
-- step is kept aside and used only if no other step follows.
function M.step(acc, before, after)
  local d = comm.stats_delta(before, after)
  if acc.first == nil then acc.first = d else add(acc, d) end
  return { sent = d.sent, recv = d.recv, busy_ms = d.busy_ms, exposed_ms = d.exposed_ms }
end

local function hidden(busy, exposed)
  if busy <= 0 then return cjson_null end
  return math.max(0, math.min(1, 1 - exposed / busy))
end

-- per_step(world, acc) -> summary.json's comm_per_step (a collective over
-- world: every rank calls it, after its last step). Means per step over the
-- steps after the first (or the first alone when it was the only one).
function M.per_step(world, acc)
  -- the whole run's training steps, the first included (run_sent, run_recv:
  -- what a link's own counters must show at least)
  local f = acc.first or { sent = 0, recv = 0 }
  local run_sent, run_recv = acc.sent + f.sent, acc.recv + f.recv
  if acc.steps == 0 and acc.first then add(acc, acc.first) end
  local S = acc.steps
  local vals = { S, acc.sent, acc.recv, acc.busy_ms, acc.exposed_ms, run_sent, run_recv }
  for _, k in ipairs(comm.KINDS) do
    local v = acc.by_kind[k]
    vals[#vals + 1], vals[#vals + 2], vals[#vals + 3] = v.sent, v.recv, v.calls
  end
  local rows = world.size > 1 and world:gather_doubles(vals) or { vals }
  local ranks, mx, busy, exposed = {}, { sent = 0, recv = 0 }, 0, 0
  for r, row in ipairs(rows) do
    local s = math.max(row[1], 1)
    local e = { rank = r - 1, sent = row[2] / s, recv = row[3] / s, busy_ms = row[4] / s,
                exposed_ms = row[5] / s, run_sent = row[6], run_recv = row[7], by_kind = {} }
    e.hidden_share = hidden(e.busy_ms, e.exposed_ms)
    local i = 8
    for _, k in ipairs(comm.KINDS) do
      if row[i + 2] > 0 then   -- kinds this rank used
        e.by_kind[k] = { sent = row[i] / s, recv = row[i + 1] / s, calls = row[i + 2] / s }
      end
      i = i + 3
    end
    if next(e.by_kind) == nil then e.by_kind = cjson_null end
    mx.sent, mx.recv = math.max(mx.sent, e.sent), math.max(mx.recv, e.recv)
    busy, exposed = busy + e.busy_ms, exposed + e.exposed_ms
    ranks[r] = e
  end
  return { steps = S, ranks = ranks, max = mx, hidden_share = hidden(busy, exposed) }
end

-- Bytes for people: 1536 -> "1.5 KiB".
local function human(b)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local i = 1
  while b >= 1024 and i < #units do b, i = b / 1024, i + 1 end
  return i == 1 and ("%.0f B"):format(b) or ("%.1f %s"):format(b, units[i])
end

-- The printed summary's line(s) for comm_per_step (nil: nothing to say).
function M.lines(cps)
  if type(cps) ~= "table" or not cps.ranks or #cps.ranks == 0 then return nil end
  local r0 = cps.ranks[1]
  local out = { ("  comm        per step: rank 0 sent %s, received %s; most of any rank %s / %s")
                :format(human(r0.sent), human(r0.recv), human(cps.max.sent), human(cps.max.recv)) }
  if type(cps.hidden_share) == "number" then
    local b, x = 0, 0
    for _, e in ipairs(cps.ranks) do b, x = b + e.busy_ms, x + e.exposed_ms end
    out[2] = ("              in flight %.1f ms, compute waited %.1f ms (mean over ranks): " ..
              "%.0f%% hidden"):format(b / #cps.ranks, x / #cps.ranks, 100 * cps.hidden_share)
  end
  return out
end

return M
