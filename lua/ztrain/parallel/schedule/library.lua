-- ztrain.parallel.schedule.library: pipeline schedules as Lua functions returning
-- one action list per rank (the IR of ztrain.parallel.schedule).
--
--   fn({ stages = S, microbatches = m, ranks = r, chunks = v })
--     -> { [rank + 1] = { actions } }
--
-- stages counts every model chunk: S = r x v. Placement "loop" (the
-- default): stage s runs on rank s % r, so with v > 1 rank r holds stages
-- r, r + p, r + 2p, ... (Megatron's interleaving). Placement "v" (v = 2):
-- rank r holds stages r and 2r' - 1 - r, so the first and the last stage
-- share rank 0 (ZB-V's V shape). Any two of stages/ranks/chunks determine
-- the third (chunks defaults to 1).
--
-- Every schedule is first a compute order per rank (F, B or I/W); with_comms
-- then places the communication the way the executor needs it never to
-- deadlock: a RECV right before the action that reads it (not front-loaded,
-- which only adds warm-up bubbles), a SEND right after the action that
-- produced it, and REDUCE_GRAD then STEP last. Sends never block (the driver
-- posts them asynchronously), so a compute order that some real execution
-- can follow never deadlocks; simulate.lua checks that for a given list.
--
-- Gradients may complete in any micro-batch order on a stage: the schedule
-- driver hands them to the strategy in micro-batch order, the same bits
-- (driver/grad_order.lua); schedule.held_grads counts what that holds.
local S = require "ztrain.parallel.schedule"
local dualpipev = require "ztrain.parallel.schedule.dualpipev"

local M = {}
local A = S.action

local function whole(x) return type(x) == "number" and x == x and x % 1 == 0 end

M.PLACEMENTS = { loop = true, v = true }

-- The bounds on a schedule's shape: its action lists hold about six
-- actions per (stage, micro-batch) pair, and `ztrain schedule` simulates
-- them on a grid of ranks x makespan; at the bounds (p=m=256, or p=1024 with
-- m=64) drawing 1F1B takes about 6 s and 0.5 GB.
M.MAX_STAGES = 1024
M.MAX_PAIRS = 65536

-- params(p, name) -> { stages, microbatches, ranks, chunks, placement,
-- stage_rank }. Checks the numbers and raises a user error naming them.
function M.params(p, name)
  name = name or "schedule"
  if type(p) ~= "table" then error(name .. ": parameters must be a table { stages, microbatches, ranks, chunks }", 0) end
  local v = p.chunks == nil and (p.placement == "v" and 2 or 1) or p.chunks
  if not whole(v) or v < 1 then
    error(("%s: chunks (v) must be a whole number >= 1, got %s"):format(name, tostring(p.chunks)), 0)
  end
  local r, st = p.ranks, p.stages
  if r == nil and st ~= nil and whole(st) then r = st / v end
  if st == nil and r ~= nil and whole(r) then st = r * v end
  if not whole(r) or r < 1 then
    -- (the stages it came from, when it came from them)
    local from = p.ranks == nil and p.stages ~= nil and (" (stages %s / chunks %d)"):format(tostring(p.stages), v) or ""
    error(("%s: ranks must be a whole number >= 1%s, got %s"):format(name, from, tostring(r)), 0)
  end
  if not whole(st) or st ~= r * v then
    error(("%s: stages (%s) must equal ranks (%d) x chunks (%d) = %d: stages counts every model chunk")
          :format(name, tostring(p.stages), r, v, r * v), 0)
  end
  local m = p.microbatches
  if not whole(m) or m < 1 then
    error(("%s: microbatches must be a whole number >= 1, got %s"):format(name, tostring(m)), 0)
  end
  if st > M.MAX_STAGES then
    error(("%s: stages (ranks %.15g x chunks %.15g = %.15g) exceed the bound of %d pipeline stages a schedule may have; " ..
           "lower the ranks (p) or the chunks (v)"):format(name, r, v, st, M.MAX_STAGES), 0)
  end
  if st * m > M.MAX_PAIRS then
    error(("%s: stages (%.15g) x microbatches (%.15g) = %.15g exceeds the bound of %d (stage, micro-batch) pairs a " ..
           "schedule's action lists may hold; lower the microbatches (m), ranks (p) or chunks (v)")
          :format(name, st, m, st * m, M.MAX_PAIRS), 0)
  end
  local placement = p.placement or "loop"
  if not M.PLACEMENTS[placement] then
    error(('%s: placement must be "loop" (stage s on rank s %% ranks) or "v" (ranks r and 2 x ranks - 1 - r), ' ..
           'got %s'):format(name, tostring(placement)), 0)
  end
  local stage_rank = function(s) return s % r end
  if placement == "v" then
    if v ~= 2 then
      error(("%s: the V placement holds two stages per rank (chunks = 2), got chunks = %d"):format(name, v), 0)
    end
    stage_rank = function(s) return s < r and s or st - 1 - s end
  end
  return { stages = st, microbatches = m, ranks = r, chunks = v, placement = placement,
           stage_rank = stage_rank }
end

-- stage_rank(p) -> fn(s) -> rank: the placement every schedule here uses.
function M.stage_rank(p) return M.params(p).stage_rank end

local function one_chunk(q, name)
  if q.chunks ~= 1 then
    error(("%s runs one stage per rank (chunks = 1), got chunks = %d; use interleaved_1f1b for v > 1")
          :format(name, q.chunks), 0)
  end
end

-- with_comms(orders, q) -> lists. orders[rank + 1] is that rank's compute
-- order, a list of { op, stage, mb } with op F, B, I or W; q from params().
-- Adds RECV_F before each F past the first stage, SEND_F after each F before
-- the last, RECV_B before each B or I before the last stage, SEND_B after
-- each B or I past the first, then REDUCE_GRAD and STEP.
function M.with_comms(orders, q)
  local last = q.stages - 1
  local lists = {}
  for r, order in ipairs(orders) do
    local l = {}
    local function add(op, s, i) l[#l + 1] = A(op, s, i) end
    for _, a in ipairs(order) do
      local s, i = a.stage, a.mb
      if a.op == "F" then
        if s > 0 then add("RECV_F", s, i) end
        add("F", s, i)
        if s < last then add("SEND_F", s, i) end
      elseif a.op == "B" or a.op == "I" then
        if s < last then add("RECV_B", s, i) end
        add(a.op, s, i)
        if s > 0 then add("SEND_B", s, i) end
      else
        add(a.op, s, i)
      end
    end
    l[#l + 1] = { op = "REDUCE_GRAD" }
    l[#l + 1] = { op = "STEP" }
    lists[r] = l
  end
  return lists
end

local function C(op, s, i) return { op = op, stage = s, mb = i } end

-- GPipe (Huang et al. 2019): every forward, then every backward. Any m;
-- every stage holds all m micro-batches' activations at the peak.
function M.gpipe(p)
  local q = M.params(p, "gpipe")
  one_chunk(q, "gpipe")
  local orders = {}
  for s = 0, q.stages - 1 do
    local o = {}
    for i = 0, q.microbatches - 1 do o[#o + 1] = C("F", s, i) end
    for i = 0, q.microbatches - 1 do o[#o + 1] = C("B", s, i) end
    orders[s + 1] = o
  end
  return M.with_comms(orders, q)
end

-- 1F1B, PipeDream-Flush (Narayanan et al. 2021): stage s runs
-- min(p - s - 1, m) warm-up forwards, then alternates one forward and one
-- backward, then drains the remaining backwards. Same bubble as GPipe,
-- (p-1)/(m+p-1) of the rank-time, but stage s holds at most min(p - s, m)
-- micro-batches' activations. Any m (m < p leaves stages idle, still valid).
function M.one_f_one_b(p)
  local q = M.params(p, "1f1b")
  one_chunk(q, "1f1b")
  local P, m = q.stages, q.microbatches
  local orders = {}
  for s = 0, P - 1 do
    local o = {}
    local warm = math.min(P - s - 1, m)
    for i = 0, warm - 1 do o[#o + 1] = C("F", s, i) end
    for i = 0, m - warm - 1 do
      o[#o + 1] = C("F", s, warm + i)
      o[#o + 1] = C("B", s, i)
    end
    for i = m - warm, m - 1 do o[#o + 1] = C("B", s, i) end
    orders[s + 1] = o
  end
  return M.with_comms(orders, q)
end

-- Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's order): v chunks
-- per rank, stage c*p + r on rank r. Micro-batches go in groups of p
-- through chunk 0, then chunk 1, ...; backwards walk the chunks in reverse.
-- Rank r runs (p - r - 1) * 2 + (v - 1) * p warm-up forwards (capped at
-- v*m), then one forward and one backward, then the remaining backwards.
-- Needs m a multiple of p (Megatron's rule: the groups of p must be whole).
-- Bubble (p-1)/(v*m) of the busy time.
function M.interleaved_1f1b(p)
  local q = M.params(p, "interleaved_1f1b")
  local P, v, m = q.ranks, q.chunks, q.microbatches
  if m % P ~= 0 then
    local lo = math.floor(m / P) * P
    error(("interleaved_1f1b: microbatches (%d) must be a multiple of the pipeline ranks (%d): " ..
           "micro-batches go through each chunk in groups of %d; try %s%d"):format(m, P, P,
           lo > 0 and (lo .. " or ") or "", lo + P), 0)
  end
  local total = m * v
  -- the k-th forward (or backward) on a rank: its chunk and micro-batch
  local function unit(k, forward)
    local in_group = k % (P * v)
    local chunk = math.floor(in_group / P)
    if not forward then chunk = v - 1 - chunk end
    local mb = math.floor(k / (P * v)) * P + in_group % P
    return chunk, mb
  end
  local orders = {}
  for r = 0, P - 1 do
    local o = {}
    local function f(k) local c, i = unit(k, true); o[#o + 1] = C("F", c * P + r, i) end
    local function b(k) local c, i = unit(k, false); o[#o + 1] = C("B", c * P + r, i) end
    local warm = math.min((P - r - 1) * 2 + (v - 1) * P, total)
    for k = 0, warm - 1 do f(k) end
    for k = 0, total - warm - 1 do f(k + warm); b(k) end
    for k = total - warm, total - 1 do b(k) end
    orders[r + 1] = o
  end
  return M.with_comms(orders, q)
end

-- Looped BFS (Lamy-Poirier 2021, "Breadth-First Pipeline Parallelism";
-- PyTorch's ScheduleLoopedBFS): v chunks per rank, stage c*p + r on rank r.
-- Each rank runs every micro-batch's forward through its first chunk, then
-- its second, ...; then the backwards, last chunk first, each chunk's in
-- reverse micro-batch order (the last forward is the first whose gradient
-- comes back). Its gradients complete in reverse micro-batch order: the
-- driver keeps m - 1 of them per stage until their turn (driver/grad_order.lua),
-- and every stage holds all m micro-batches' activations. Any m.
function M.looped_bfs(p)
  local q = M.params(p, "looped_bfs")
  local P, v, m = q.ranks, q.chunks, q.microbatches
  local orders = {}
  for r = 0, P - 1 do
    local o = {}
    for c = 0, v - 1 do for i = 0, m - 1 do o[#o + 1] = C("F", c * P + r, i) end end
    for c = v - 1, 0, -1 do for i = m - 1, 0, -1 do o[#o + 1] = C("B", c * P + r, i) end end
    orders[r + 1] = o
  end
  return M.with_comms(orders, q)
end

-- ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism", their
-- handcrafted schedule): 1F1B with the backward split into I (input
-- gradient, on the critical path) and W (weight gradient, free to move).
-- Stage s runs 1F1B's warm-up and its F, I pairs, but its W's trail by s
-- micro-batches (stage 0 does W(i) right after I(i); the last stage after
-- I(i + p - 1)); the W's left at the end fill the cool-down that 1F1B
-- spends waiting. With F = I = W each stage idles (p-1)(F + I - W), a third
-- of 1F1B's (p-1)(F + I + W). Every stage holds at most min(p, m)
-- activations until their W: 1F1B's peak (its first stage), though later
-- stages hold more than under 1F1B. W's stay in micro-batch order. Any m.
function M.zb_h1(p)
  local q = M.params(p, "zb_h1")
  one_chunk(q, "zb_h1")
  local P, m = q.stages, q.microbatches
  local orders = {}
  for s = 0, P - 1 do
    local o = {}
    local warm = math.min(P - s - 1, m)
    local w = 0                  -- next micro-batch whose W is due
    for i = 0, warm - 1 do o[#o + 1] = C("F", s, i) end
    for i = 0, m - 1 do
      if warm + i < m then o[#o + 1] = C("F", s, warm + i) end
      o[#o + 1] = C("I", s, i)
      if i - w >= s then o[#o + 1] = C("W", s, w); w = w + 1 end
    end
    for i = w, m - 1 do o[#o + 1] = C("W", s, i) end
    orders[s + 1] = o
  end
  return M.with_comms(orders, q)
end

-- ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6):
-- two chunks per rank in a V (rank r holds stages r and 2p - 1 - r, so a
-- micro-batch goes down the ranks and back up, and the first and last
-- stage -- the tied embedding and head -- share rank 0), the backward split
-- into I and W. The order is built as the paper builds its schedules: a
-- list scheduler at F = I = W = 1 where each free rank runs, in this order
-- of preference, an I that is ready (the critical path; the later chunk
-- first), an F that is ready (the later chunk first, and only while the
-- rank holds fewer than 2p chunks' activations: p full stages', 1F1B's
-- peak), else the oldest W, which fills what would be idle.
-- W's stay in micro-batch order on each stage, and on rank 0 the head's W
-- of micro-batch i comes before the embedding's, which comes before the
-- head's of i + 1 (the tied wte gradient's order on one rank). Any m; the
-- bubble falls to near zero for m >= 2p (simulate to see it).
function M.zbv(p)
  local q = M.params({ stages = p.stages, microbatches = p.microbatches, ranks = p.ranks,
                       chunks = p.chunks or 2, placement = "v" }, "zbv")
  local R, NS, m = q.ranks, q.stages, q.microbatches
  local fin = {}                                    -- fin[op][s][i] = finish time
  for _, op in ipairs({ "F", "I", "W" }) do fin[op] = {}; for s = 0, NS - 1 do fin[op][s] = {} end end
  local nxt = { F = {}, I = {}, W = {} }             -- next micro-batch per op and stage
  for _, op in ipairs({ "F", "I", "W" }) do for s = 0, NS - 1 do nxt[op][s] = 0 end end
  local held = {}                                   -- per rank: chunk activations F'd, not yet W'd
  local free_at, orders = {}, {}
  for r = 0, R - 1 do held[r] = 0; free_at[r] = 0; orders[r + 1] = {} end
  local function by(op, s, i, t) local f = fin[op][s][i]; return f ~= nil and f <= t end
  local function ready(op, s, t)
    local i = nxt[op][s]
    if i >= m then return nil end
    if op == "F" then
      if s > 0 and not by("F", s - 1, i, t) then return nil end
    elseif op == "I" then
      if not by("F", s, i, t) or (s < NS - 1 and not by("I", s + 1, i, t)) then return nil end
    else
      if not by("I", s, i, t) then return nil end
      if s == 0 and NS > 1 and not by("W", NS - 1, i, t) then return nil end           -- head first
      if s == NS - 1 and NS > 1 and i > 0 and not by("W", 0, i - 1, t) then return nil end
    end
    return i
  end
  local left, t = 3 * NS * m, 0
  while left > 0 do
    for r = 0, R - 1 do
      if free_at[r] <= t then
        local hi, lo = NS - 1 - r, r                 -- the rank's later and earlier chunk
        local pick
        for _, c in ipairs({ { "I", hi }, { "I", lo }, { "F", hi }, { "F", lo }, { "W", hi }, { "W", lo } }) do
          local op, s = c[1], c[2]
          local i = ready(op, s, t)
          if i and op == "F" and held[r] >= 2 * R then i = nil end
          if i then pick = { op, s, i }; break end
        end
        if pick then
          local op, s, i = pick[1], pick[2], pick[3]
          fin[op][s][i] = t + 1
          nxt[op][s] = i + 1
          if op == "F" then held[r] = held[r] + 1 elseif op == "W" then held[r] = held[r] - 1 end
          free_at[r] = t + 1
          left = left - 1
          orders[r + 1][#orders[r + 1] + 1] = C(op, s, i)
        end
      end
    end
    t = t + 1
    assert(t < 100 * NS * m + 100, "zbv: the list scheduler made no progress")
  end
  return M.with_comms(orders, q)
end

-- DualPipe-V (DeepSeek-V3; PyTorch's ScheduleDualPipeV): placement V, two
-- chunks per rank, a forward of one chunk overlapped with a backward of the
-- other in the main phase, zero-bubble I/W splits in warm-up and
-- cool-down. The order is dualpipev.lua's. Needs m >= 2p.
function M.dualpipev(p)
  local q = M.params({ stages = p.stages, microbatches = p.microbatches, ranks = p.ranks,
                       chunks = p.chunks or 2, placement = "v" }, "dualpipev")
  return dualpipev.build(q, M.with_comms)
end

-- PipeDream's asynchronous 1F1B (Narayanan et al., SOSP 2019) with weight
-- stashing: 1F1B's order, but each stage updates its weights after every
-- micro-batch's backward instead of once per step, and a micro-batch's
-- backward uses the weights its forward used (stashed at the forward).
-- The driver sees lists.async. Stage s of p runs micro-batch i's forward
-- and backward on weights min(i, p - s - 1) updates old (the last stage's
-- are never stale; PipeDream without vertical sync: stages of one
-- micro-batch use different versions). Every step ends with a flush, so
-- staleness never crosses steps. Not the same math as one rank: opt-in.
function M.pipedream(p)
  local q = M.params(p, "pipedream")
  one_chunk(q, "pipedream")
  local lists = M.one_f_one_b(p)
  lists.async = true
  return lists
end

-- By name, for recipes and the CLI (ztrain.parallel.schedule.registry holds the
-- one-stage ones and resolves a name to lists).
M.builtin = {
  gpipe = M.gpipe,
  ["1f1b"] = M.one_f_one_b,
  interleaved_1f1b = M.interleaved_1f1b,
  looped_bfs = M.looped_bfs,
  zb_h1 = M.zb_h1,
  zbv = M.zbv,
  dualpipev = M.dualpipev,
  pipedream = M.pipedream,
}

-- The placement a built-in schedule needs ("loop" where it has none).
M.PLACEMENT = { zbv = "v", dualpipev = "v" }
function M.placement(name) return type(name) == "string" and M.PLACEMENT[name] or "loop" end

-- build(name_or_fn, p) -> lists, vp. Runs the schedule and validates its
-- lists (raises a user error naming what is wrong); vp is what
-- ztrain.parallel.schedule.validate and simulate take: { stages, microbatches,
-- ranks, chunks, stage_rank }.
function M.build(sched, p)
  local fn = sched
  if type(sched) == "string" then
    fn = M.builtin[sched]
    if not fn then
      local names = {}
      for k in pairs(M.builtin) do names[#names + 1] = k end
      table.sort(names)
      error(("unknown pipeline schedule %q (known: %s; or a function returning action lists)")
            :format(sched, table.concat(names, ", ")), 0)
    end
  end
  if type(fn) ~= "function" then error("a pipeline schedule is a name or a function returning action lists", 0) end
  local p2 = setmetatable({ placement = p.placement or M.placement(sched) }, { __index = p })
  local q = M.params(p2, type(sched) == "string" and sched or "schedule")
  local lists = fn(q)
  if type(lists) == "table" and #lists ~= q.ranks then
    error(("schedule returned %d action lists for %d ranks"):format(#lists, q.ranks), 0)
  end
  local ok, err = S.validate(lists, q)
  if not ok then error("schedule: " .. err, 0) end
  return lists, q
end

return M
