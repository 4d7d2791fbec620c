-- ztrain.parallel.schedule.simulate: run every rank's action list together in
-- simulated time, with no ranks: the timeline, the makespan, the bubble,
-- peak activations per stage, and deadlocks named.
--
-- Model. Each rank runs its list in order, one action at a time, each as
-- soon as it can: compute actions take times.F/B/I/W (default 1, 2, 1, 1;
-- B = I + W), communication and REDUCE_GRAD/STEP take 0 unless given. A
-- SEND never waits (the driver posts it asynchronously) and is issued when
-- the rank reaches it, which is after its producer finished (validate
-- checks that order). A RECV completes once its matching SEND has been
-- issued, plus `latency`: SEND_F(s, i) feeds RECV_F(s + 1, i), SEND_B(s, i)
-- feeds RECV_B(s - 1, i). With posted = true a RECV only posts (the
-- driver's behaviour) and the F, B or I reading it waits instead; the
-- default, a blocking RECV, is the stricter model and equal to the posted
-- one when each RECV sits right before its reader, as schedules.lua places
-- them. Start and end times are exact (ASAP list scheduling), so with
-- whole-number times this is the discrete clock of the seeds' table.
--
-- A deadlock is a state where some ranks have actions left and none can
-- start: each such rank is named with its first blocked action and the
-- SEND it waits for (on which rank, at which position, or sent by none).
local S = require "ztrain.parallel.schedule"

local M = {}

M.TIMES = { F = 1, B = 2, I = 1, W = 1, SEND_F = 0, RECV_F = 0, SEND_B = 0, RECV_B = 0,
            REDUCE_GRAD = 0, STEP = 0 }
local COMPUTE = { F = true, B = true, I = true, W = true }

-- message(a) -> the key of the message an action sends or receives
-- (boundary, direction, micro-batch): "F0:3" leaves stage 0 for stage 1,
-- "B1:3" leaves stage 1 for stage 0; nil for other actions
function M.message(a)
  if a.op == "SEND_F" then return ("F%d:%d"):format(a.stage, a.mb)
  elseif a.op == "RECV_F" then return ("F%d:%d"):format(a.stage - 1, a.mb)
  elseif a.op == "SEND_B" then return ("B%d:%d"):format(a.stage - 1, a.mb)
  elseif a.op == "RECV_B" then return ("B%d:%d"):format(a.stage, a.mb) end
end
local msg = M.message

-- stage_ranks(lists) -> at, last: the rank (0-based) each stage's compute
-- runs on, and the last stage (-1 for none). The one stage -> rank map of
-- the lists (sets.lua, nccl_order.lua and tied_last below ask it; csv.lua
-- keeps its own, which tolerates a malformed list while it reports it).
function M.stage_ranks(lists)
  local at, last = {}, -1
  for r, list in ipairs(lists) do
    for _, a in ipairs(list) do
      if COMPUTE[a.op] then at[a.stage] = r - 1; if a.stage > last then last = a.stage end end
    end
  end
  return at, last
end

-- tied_last(lists) -> the last stage L where the first and the last stage
-- share the embedding (GPT-2) from two ranks, else nil. The first stage's
-- weight pass of a micro-batch (its B, or W) then takes the head's part of
-- the embedding gradient, which L's weight pass of that micro-batch sends
-- (parallel/schedule/stages.lua's Tied: a blocking receive), the message
-- tied_key(mb) here.
function M.tied_last(lists)
  local at, last = M.stage_ranks(lists)
  if last > 0 and at[0] ~= at[last] then return last end
end
function M.tied_key(mb) return "T:" .. mb end
-- a is a weight pass (the one that writes or takes the tied part)
local function weight_pass(a) return a.op == "B" or a.op == "W" end

-- the SEND a RECV waits for, as an action
local function sender(a)
  if a.op == "RECV_F" then return { op = "SEND_F", stage = a.stage - 1, mb = a.mb } end
  return { op = "SEND_B", stage = a.stage + 1, mb = a.mb }
end

-- the actions' durations: M.TIMES, overridden by opts.times
local function durations(opts)
  local times = setmetatable({}, { __index = M.TIMES })
  for k, v in pairs(opts.times or {}) do
    if M.TIMES[k] == nil or type(v) ~= "number" or v < 0 then
      error(("simulate: times.%s must be an action's duration (>= 0), got %s"):format(tostring(k), tostring(v)), 0)
    end
    times[k] = v
  end
  return times
end

-- origins(lists) -> where each message is sent from ({ rank, index } by
-- msg), for naming what a blocked RECV waits on. Raises on a list that is
-- not an action list.
local function origins(lists)
  if type(lists) ~= "table" or #lists < 1 then error("simulate: expected one action list per rank", 0) end
  local origin = {}
  for r = 1, #lists do
    if type(lists[r]) ~= "table" then error(("simulate: rank %d's list is not a table"):format(r - 1), 0) end
    for k, a in ipairs(lists[r]) do
      if type(a) ~= "table" or not S.OPS[a.op] then
        error(("simulate: rank %d action %d is not an action"):format(r - 1, k), 0)
      end
      if a.op == "SEND_F" or a.op == "SEND_B" then origin[msg(a)] = origin[msg(a)] or { rank = r - 1, index = k } end
    end
  end
  return origin
end

-- the key of a posted RECV by the action that reads it (with opts.posted):
-- direction (forward or not), stage, micro-batch
local function reader_key(forward, a) return (forward and "F" or "B") .. a.stage .. ":" .. a.mb end

-- ready(sim, r, a) -> earliest start allowed by messages, or nil (not yet
-- sent, or a receive the action waits for not yet posted)
local function ready(sim, r, a)
  local t = sim.clock[r]
  local key
  if a.op == "RECV_F" or a.op == "RECV_B" then
    if sim.posted_mode then
      sim.posted[r][reader_key(a.op == "RECV_F", a)] = msg(a)
    else
      key = msg(a)
    end
  elseif sim.posted_mode and COMPUTE[a.op] and a.op ~= "W" then
    key = sim.posted[r][reader_key(a.op == "F", a)]
  end
  if key then
    if not sim.sent[key] then return nil end
    t = math.max(t, sim.sent[key] + sim.latency)
  end
  if sim.tied_last and a.stage == 0 and weight_pass(a) then
    local tk = M.tied_key(a.mb)
    if not sim.sent[tk] then return nil end
    t = math.max(t, sim.sent[tk] + sim.latency)
  end
  -- the sets given back before this action wait for their sends' receives
  local waits = sim.waits and sim.waits[r][sim.pc[r]]
  if waits then
    local t0 = t
    for _, m in ipairs(waits) do
      if not sim.recv_at[m] then return nil end
      t = math.max(t, sim.recv_at[m] + sim.latency)
    end
    if t > t0 then sim.delayed[r][sim.pc[r]] = { by = t - t0, from = t0 } end
  end
  return t
end

-- Run every rank's list as far as it goes: each rank in turn runs its
-- actions until one cannot start yet, round after round, until a round
-- runs nothing (all done, or a deadlock).
local function advance(sim, lists)
  local pc, clock, busy, timeline = sim.pc, sim.clock, sim.busy, sim.timeline
  local progress = true
  while progress do
    progress = false
    for r = 1, #lists do
      local list = lists[r]
      while pc[r] <= #list do
        local a = list[pc[r]]
        local t0 = ready(sim, r, a)
        if not t0 then break end
        local t1 = t0 + sim.times[a.op]
        timeline[r][#timeline[r] + 1] = { action = a, index = pc[r], start = t0, finish = t1 }
        if COMPUTE[a.op] then busy[r] = busy[r] + (t1 - t0); sim.stage_rank[a.stage] = r - 1 end
        if a.op == "SEND_F" or a.op == "SEND_B" then sim.sent[msg(a)] = sim.sent[msg(a)] or t1 end
        if a.op == "RECV_F" or a.op == "RECV_B" then sim.recv_at[msg(a)] = sim.recv_at[msg(a)] or t0 end
        -- the head's part goes out as its weight pass starts (the head is a
        -- stage's last unit: its backward comes first), and the first
        -- stage takes it as its weight pass ends (the embedding's, last)
        if a.stage == sim.tied_last and weight_pass(a) then sim.sent[M.tied_key(a.mb)] = t0 end
        if sim.tied_last and a.stage == 0 and weight_pass(a) then sim.recv_at[M.tied_key(a.mb)] = t1 end
        clock[r] = t1
        pc[r] = pc[r] + 1
        progress = true
      end
    end
  end
end

-- stuck(sim, lists, origin) -> blocked, parts: each rank that could not
-- finish, with the SEND its first blocked action waits for, and the
-- deadlock message's part for it.
local function stuck(sim, lists, origin)
  local blocked, parts = {}, {}
  for r = 1, #lists do
    local pc = sim.pc[r]
    local a = lists[r][pc]
    local unposted = {}
    for _, m in ipairs(a and sim.waits and sim.waits[r][pc] or {}) do
      if not sim.recv_at[m] then unposted[#unposted + 1] = m end
    end
    local L = sim.tied_last
    if L and a and a.stage == 0 and weight_pass(a) and not sim.sent[M.tied_key(a.mb)] then
      blocked[r] = { index = pc, action = a, tied = L }
      parts[#parts + 1] = ("rank %d blocked at action %d (%s) waiting for the tied embedding's gradient part " ..
                           "of stage %d's weight pass of micro-batch %d"):format(r - 1, pc, S.format(a), L, a.mb)
    elseif #unposted > 0 then
      -- held by opts.waits: the sets' sends whose receives were never posted
      blocked[r] = { index = pc, action = a, unposted = unposted }
      parts[#parts + 1] = ("rank %d blocked at action %d (%s) waiting for the receive of %s to be posted " ..
                           "(sets given back)"):format(r - 1, pc, S.format(a), table.concat(unposted, ", "))
    elseif a then
      local w = sender(a)
      if sim.posted_mode and COMPUTE[a.op] then
        -- the reader waits on a posted RECV: name the send it waits for
        local key = sim.posted[r][reader_key(a.op == "F", a)]
        w = (a.op == "F") and { op = "SEND_F", stage = a.stage - 1, mb = a.mb }
                           or { op = "SEND_B", stage = a.stage + 1, mb = a.mb }
        assert(key)
      end
      local o = origin[msg(w)]
      blocked[r] = { index = pc, action = a, waits = w, on = o and o.rank, at = o and o.index }
      parts[#parts + 1] = ("rank %d blocked at action %d (%s) waiting for %s%s"):format(r - 1, pc,
        S.format(a), S.format(w), o and (" (rank %d action %d, not reached)"):format(o.rank, o.index)
                                     or ", which no rank sends")
    end
  end
  return blocked, parts
end

-- peak activations per stage: a rank runs its list in order, so walking
-- the list is walking time (F done: +1; B or W done: -1)
local function peak_activations(timeline)
  local live, peak = {}, {}
  for r = 1, #timeline do
    for _, e in ipairs(timeline[r]) do
      local a = e.action
      if a.op == "F" then
        live[a.stage] = (live[a.stage] or 0) + 1
        peak[a.stage] = math.max(peak[a.stage] or 0, live[a.stage])
      elseif a.op == "B" or a.op == "W" then
        live[a.stage] = (live[a.stage] or 0) - 1
      end
    end
  end
  return peak
end

-- run(lists, opts) -> result. opts (all optional): times = { op = t }
-- overriding M.TIMES; latency (0); posted (false); waits (none: sets.lua's
-- plan().waits, the receives a rank waits for before giving sets back,
-- each posted plus latency); tied (false: the model shares its embedding
-- between the first and the last stage, tied_last). Raises only on lists
-- that are not action lists (run validate first for the rest). result:
--   ok          false on deadlock
--   deadlock    nil, or "deadlock: rank 0 blocked at action 5 (0RECV_B0) ..."
--   blocked     [rank + 1] = { index, action, waits = SEND action, on = rank
--               or nil, at = index or nil } for each rank that could not finish
--               (or { index, action, unposted = { message } }, held by opts.waits;
--               or { index, action, tied = L }, waiting for the tied part)
--   timeline    [rank + 1] = { { action, index, start, finish }, ... } (what ran)
--   makespan    when the last rank finishes
--   busy        [rank + 1] = compute time (F, B, I, W) of that rank
--   bubble      idle / (ranks x makespan): the fraction of all rank-time
--               spent idle. GPipe and 1F1B give exactly (p-1)/(m+p-1) with
--               uniform stages, for any F and B.
--   bubble_busy idle / busy, Megatron's normalisation (bubble time over
--               ideal compute time): interleaved gives (p-1)/(v*m), GPipe
--               (p-1)/m.
--   peak        [stage] (0-based) = most micro-batches whose F is done and
--               whose backward (B, or W) is not, at any moment
--   stage_rank  [stage] = rank holding it
--   delayed     [rank + 1] = { [index] = { by, from } }: the actions opts.waits
--               started late, by how much, and when they would have started
--   recv_at     [message] = when its RECV was posted
--   held        [stage] = most gradients completed ahead of their turn and
--               kept at once (schedule.held_grads: the list order's, not timing's)
function M.run(lists, opts)
  opts = opts or {}
  local times = durations(opts)
  local latency = opts.latency or 0
  local origin = origins(lists)
  local R = #lists
  local sim = {
    times = times, latency = latency, posted_mode = opts.posted,
    sent = {},          -- msg -> time the SEND was issued
    recv_at = {},       -- msg -> time the RECV was posted
    waits = opts.waits, -- [rank + 1][index] = { msg }: posted RECVs the action waits for (sets.lua)
    tied_last = opts.tied and M.tied_last(lists) or nil,
    delayed = {},       -- [rank + 1][index] = { by = time those waits added, from = start without them }
    posted = {},        -- [rank][reader key] = msg, with opts.posted
    pc = {}, clock = {}, busy = {}, timeline = {}, stage_rank = {},
  }
  for r = 1, R do
    sim.pc[r], sim.clock[r], sim.busy[r], sim.timeline[r], sim.posted[r], sim.delayed[r] = 1, 0, 0, {}, {}, {}
  end
  advance(sim, lists)

  local busy, timeline = sim.busy, sim.timeline
  local res = { timeline = timeline, busy = busy, ok = true, stage_rank = sim.stage_rank, delayed = sim.delayed,
                recv_at = sim.recv_at }
  local makespan = 0
  for r = 1, R do makespan = math.max(makespan, sim.clock[r]) end
  res.makespan = makespan

  local blocked, parts = stuck(sim, lists, origin)
  if #parts > 0 then
    res.ok = false
    res.blocked = blocked
    res.deadlock = "deadlock: " .. table.concat(parts, "; ")
  end

  local total_busy = 0
  for r = 1, R do total_busy = total_busy + busy[r] end
  local idle = R * makespan - total_busy
  res.bubble = makespan > 0 and idle / (R * makespan) or 0
  res.bubble_busy = total_busy > 0 and idle / total_busy or 0
  res.peak = peak_activations(timeline)
  res.held = S.held_grads(lists)
  return res
end

-- check(lists, opts) -> result; raises the deadlock message instead of
-- returning it.
function M.check(lists, opts)
  local res = M.run(lists, opts)
  if not res.ok then error(res.deadlock, 0) end
  return res
end

-- grid(result, opts) -> string: ranks x time, one column per unit of time
-- (opts.unit, default 1), a cell holding the compute action running then,
-- "F3", "B1", "I0", "W2" (with the stage in front, "4F3", when a rank holds
-- more than one stage), "." for idle. A header row numbers the columns.
function M.grid(res, opts)
  opts = opts or {}
  local unit = opts.unit or 1
  local cols = math.ceil(res.makespan / unit - 1e-9)
  local multi = {}
  for r, tl in ipairs(res.timeline) do
    local seen
    for _, e in ipairs(tl) do
      if COMPUTE[e.action.op] then
        if seen and seen ~= e.action.stage then multi[r] = true end
        seen = e.action.stage
      end
    end
  end
  local any_multi = next(multi) ~= nil
  local cells, width = {}, 1
  for r, tl in ipairs(res.timeline) do
    local row = {}
    for c = 1, cols do row[c] = "." end
    for _, e in ipairs(tl) do
      local a = e.action
      if COMPUTE[a.op] and e.finish > e.start then
        local label = (any_multi and a.stage or "") .. a.op .. a.mb
        width = math.max(width, #label)
        for c = math.floor(e.start / unit + 1e-9) + 1, math.ceil(e.finish / unit - 1e-9) do row[c] = label end
      end
    end
    cells[r] = row
  end
  width = math.max(width, #tostring(cols - 1))
  local fmt = "%-" .. width .. "s"
  local head = "       "
  local out = {}
  local h = {}
  for c = 1, cols do h[c] = fmt:format(tostring(c - 1)) end
  out[1] = head .. table.concat(h, " ")
  for r, row in ipairs(cells) do
    local t = {}
    for c = 1, cols do t[c] = fmt:format(row[c]) end
    out[#out + 1] = ("rank %-2d"):format(r - 1) .. table.concat(t, " ")
  end
  return table.concat(out, "\n") .. "\n"
end

return M
