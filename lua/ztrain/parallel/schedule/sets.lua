-- ztrain.parallel.schedule.sets: when each activation set is taken and
-- given back, decided from the action lists alone, so that how many sets a
-- stage holds at its peak is the same on every run (and the planner can say
-- it to the byte).
--
-- The driver (driver/schedule.lua) takes a stage's set for a micro-batch at
-- the first action of the rank that touches it, and is done with it when
-- the micro-batch's weight gradient is complete and, past the first stage,
-- its input gradient has been sent (the retire point). A set whose retire
-- left a send to another rank in flight cannot be reused until that send
-- has completed, and when that happens depends on when the peer posts its
-- receive and on both ranks' progress: given back "as soon as the send is
-- seen done", a last stage of 1F1B held 2 sets on most runs and 3 on a
-- loaded machine (CI measured it). So the driver gives such a set back at a
-- point fixed here instead: before an action where the rank would take a new
-- set of that stage, it waits for the retired set's sends and reuses it.
--
-- A wait there must not deadlock: the peer's receive must come without this
-- rank doing anything more. Each retired set's release point starts at the
-- first take of its stage after the retire; the lists are then run together
-- (untimed, every rank as far as it can go: an F, B or I that reads a
-- message needs its SEND issued, a release needs the matching RECVs posted,
-- STEP needs every send of the rank received, and with a tied embedding the
-- first stage's weight pass of a micro-batch needs the last stage's, whose
-- part of the gradient it takes); a release that leaves its rank blocked
-- moves to the stage's next take, then to STEP, and the run is repeated
-- until every rank finishes. Each wait depends only on other ranks having
-- got somewhere, and once met stays met, so if this run finishes every real
-- one does. Then, so that no wait costs time, the simulator (simulate.lua)
-- runs the lists with and without the waits (default times, latencies 0,
-- 0.25 and 1): a wait that starts an F, B, I or W later moves on too.
--
-- The trainer plans this once when it builds (trainer_build.lua; the
-- planner's pre-flight asks the same lists first: the answer is kept).
-- Measured with GPT-2's tie: 0.04 s for 1F1B at p = 8, m = 64 (0.12 s at
-- p = 16, m = 128); 0.22 s for interleaved 1F1B and 0.17 s for DualPipe-V
-- at p = 8, m = 64, 0.64 s at m = 128 -- one pass against the timing with
-- no waits, then a check (settle below). Moving one wait per simulator run
-- took 0.34 s, 2.6 s, 3.6 s, 2.8 s and 16-19 s.
--
-- plan(lists, opts) -> { release = { [rank + 1] = { [index] = { keys } } },
--                   waits = { [rank + 1] = { [index] = { messages } } },
--                   peak = { [stage] = sets }, remote = { [key] = true },
--                   part_order = { [rank + 1] = { [key] = n } } }
-- key(stage, mb) names a set; index is the action before which the rank
-- waits for those sets' sends and gives them back (a set retired without a
-- send to another rank is given back at its retire, and has no entry).
-- opts.tied: the model shares its embedding between the first and the last
-- stage (GPT-2), whose weight passes are then linked (simulate.lua's
-- tied_last); on two ranks the head's parts of its gradient are then keys
-- of stage PART (peak[PART] buffers; part_order: the n-th part the rank
-- sends in the step). Raises on lists that are not action lists (validate
-- them first).
local S = require "ztrain.parallel.schedule"
local simulate = require "ztrain.parallel.schedule.simulate"

local M = {}

function M.key(s, mb) return s * 1048576 + mb end
local key = M.key
-- The head's parts of a tied embedding's gradient (stages.lua's Tied) are
-- counted as sets of a stage of their own, PART: each buffer is taken at
-- the last stage's weight pass of a micro-batch (B, or W), its send to the
-- first stage issued there, and given back once that stage's weight pass of
-- the micro-batch has taken it.
M.PART = -1
local PART = M.PART

local msg = simulate.message

local COMPUTE = { F = true, B = true, I = true, W = true }
-- the latencies (in the simulator's units: F = 1) a release must not start late under
local DELAY_LATENCIES = { 0, 0.25, 1 }

-- the rank of each stage (simulate.stage_ranks), the lists checked first
local function stage_ranks(lists)
  for r, list in ipairs(lists) do
    if type(list) ~= "table" then error(("sets: rank %d's list is not a table"):format(r - 1), 0) end
    for k, a in ipairs(list) do
      if type(a) ~= "table" or not S.OPS[a.op] then
        error(("sets: rank %d action %d is not an action"):format(r - 1, k), 0)
      end
    end
  end
  return (simulate.stage_ranks(lists))
end

-- The sets one rank's list touches, in the driver's order (schedule.lua's
-- set_for, maybe_retire): per action index, the keys it takes (first
-- touch), and per key its retire index and the messages it leaves in
-- flight to other ranks.
local function walk(list, rank, at, tied_last)
  local takes, live, life, order = {}, {}, {}, {}
  local parts = tied_last and at[tied_last] == rank and at[0] ~= rank
  local done = {}
  local function touch(k, s, i)
    if not live[k] then
      live[k] = true
      takes[i] = takes[i] or {}
      takes[i][#takes[i] + 1] = { key = k, stage = s }
      life[k] = { stage = s, take = i, sends = {} }
    end
  end
  local function retire_check(k, s, i)
    local d = done[k]
    if d and d.weights and (s == 0 or d.sent) then
      done[k] = nil
      life[k].retire = i
      live[k] = nil
    end
  end
  for i, a in ipairs(list) do
    local op = a.op
    if a.mb then
      local k = key(a.stage, a.mb)
      touch(k, a.stage, i)
      if op == "SEND_F" then
        if at[a.stage + 1] == rank then touch(key(a.stage + 1, a.mb), a.stage + 1, i)
        else table.insert(life[k].sends, msg(a)) end
      elseif op == "SEND_B" then
        if at[a.stage - 1] == rank then touch(key(a.stage - 1, a.mb), a.stage - 1, i)
        else table.insert(life[k].sends, msg(a)) end
        done[k] = done[k] or {}
        done[k].sent = true
        retire_check(k, a.stage, i)
      elseif op == "B" or op == "W" then
        done[k] = done[k] or {}
        done[k].weights = true
        retire_check(k, a.stage, i)
        if parts and a.stage == tied_last then
          local pk = key(PART, a.mb)
          takes[i] = takes[i] or {}
          takes[i][#takes[i] + 1] = { key = pk, stage = PART }
          life[pk] = { stage = PART, take = i, retire = i, sends = { simulate.tied_key(a.mb) } }
          order[#order + 1] = pk
        end
      end
    end
  end
  return takes, life, order
end

-- candidates(takes, life, list) -> for each key retired with a send in
-- flight, the indices where it may be given back, in order: each later
-- take of its stage, then STEP (or past the list's end)
local function candidates(takes, life, list)
  local step = #list + 1
  for i, a in ipairs(list) do if a.op == "STEP" then step = i; break end end
  local out = {}
  for k, l in pairs(life) do
    if l.retire and #l.sends > 0 then
      local c = {}
      for i = l.retire + 1, #list do
        for _, t in ipairs(takes[i] or {}) do
          if t.stage == l.stage and c[#c] ~= i and i < step then c[#c + 1] = i end
        end
      end
      c[#c + 1] = step
      out[k] = c
    end
  end
  return out
end

-- starts(res) -> { [rank + 1] = { [index] = start } } of the compute actions
local function starts(res)
  local out = {}
  for r, tl in ipairs(res.timeline) do
    out[r] = {}
    for _, e in ipairs(tl) do if COMPUTE[e.action.op] then out[r][e.index] = e.start end end
  end
  return out
end

-- the compute action that starts late against base first: rank, index
local function first_late(res, base)
  local best
  for r, tl in ipairs(res.timeline) do
    for _, e in ipairs(tl) do
      if COMPUTE[e.action.op] and e.start > base[r][e.index] + 1e-9 and (not best or e.start < best[3]) then
        best = { r, e.index, e.start }
      end
    end
  end
  if best then return best[1], best[2] end
end

-- Run every list together, untimed, with the given release points (and,
-- tied_last given, the tied embedding's part: the first stage's weight pass
-- of a micro-batch waits for that of stage tied_last, simulate.lua).
-- Returns nil when every rank finished, else { [rank + 1] = { keys } }: for
-- each rank stopped at a release, the keys whose sends are not yet taken.
local function run(lists, ranks, release, tied_last)
  local R = #lists
  local pc, sent, posted = {}, {}, {}
  for r = 1, R do pc[r] = 1 end
  local function unposted(r, i)
    local bad
    for _, k in ipairs(release[r][i] or {}) do
      for _, m in ipairs(ranks[r].life[k].sends) do
        if not posted[m] then bad = bad or {}; bad[#bad + 1] = k; break end
      end
    end
    return bad
  end
  local progress = true
  while progress do
    progress = false
    for r = 1, R do
      local list = lists[r]
      while pc[r] <= #list do
        local i, a = pc[r], list[pc[r]]
        if unposted(r, i) then break end
        local reads
        if a.op == "F" then reads = ("F%d:%d"):format(a.stage - 1, a.mb)
        elseif a.op == "B" or a.op == "I" then reads = ("B%d:%d"):format(a.stage, a.mb) end
        if reads and ranks[r].recv[reads] and not sent[reads] then break end
        local weight = a.op == "B" or a.op == "W"
        if tied_last and weight and a.stage == 0 and not sent[simulate.tied_key(a.mb)] then break end
        if a.op == "STEP" then
          local all = true
          for _, m in ipairs(ranks[r].sends) do if not posted[m] then all = false; break end end
          if not all then break end
        end
        if a.op == "SEND_F" or a.op == "SEND_B" then sent[msg(a)] = true end
        if a.op == "RECV_F" or a.op == "RECV_B" then posted[msg(a)] = true end
        if tied_last and weight and a.stage == tied_last then sent[simulate.tied_key(a.mb)] = true end
        if tied_last and weight and a.stage == 0 then posted[simulate.tied_key(a.mb)] = true end
        pc[r] = i + 1
        progress = true
      end
    end
  end
  local stuck
  for r = 1, R do
    if pc[r] <= #lists[r] then
      stuck = stuck or {}
      stuck[r] = unposted(r, pc[r]) or {}
    end
  end
  return stuck
end

-- What each rank's list does with sets and messages: per rank { takes,
-- life, recv (the remote messages its F, B and I read), sends (every send
-- to another rank: STEP waits for them all), cand (candidates), order (the
-- tied parts' keys in the order the rank sends them) }.
local function facts(lists, tied_last)
  local at = stage_ranks(lists)
  local ranks = {}
  for r, list in ipairs(lists) do
    local takes, life, order = walk(list, r - 1, at, tied_last)
    local recv, sends = {}, {}
    for _, a in ipairs(list) do
      if (a.op == "RECV_F" and at[a.stage - 1] ~= r - 1) or (a.op == "RECV_B" and at[a.stage + 1] ~= r - 1) then
        recv[msg(a)] = true
      end
      if (a.op == "SEND_F" and at[a.stage + 1] ~= r - 1) or (a.op == "SEND_B" and at[a.stage - 1] ~= r - 1) then
        sends[#sends + 1] = msg(a)
      end
    end
    ranks[r] = { takes = takes, life = life, recv = recv, sends = sends, cand = candidates(takes, life, list),
                 order = order }
  end
  return ranks
end

-- The release points chosen so far: for each retired set with a send out,
-- which of its candidates (choice[r][k], from 1); release[r][index] = keys.
local Choice = {}
Choice.__index = Choice

local function new_choice(lists, ranks)
  local c = setmetatable({ lists = lists, ranks = ranks, choice = {}, release = {} }, Choice)
  for r = 1, #lists do
    c.choice[r] = {}
    for k in pairs(ranks[r].cand) do c.choice[r][k] = 1 end
  end
  c:points()
  return c
end

function Choice:points()
  for r = 1, #self.lists do
    local rel = {}
    for k, cand in pairs(self.ranks[r].cand) do
      local i = cand[self.choice[r][k]]
      rel[i] = rel[i] or {}
      table.insert(rel[i], k)
    end
    for _, ks in pairs(rel) do table.sort(ks) end
    self.release[r] = rel
  end
end

-- the messages each release waits for (simulate.lua's opts.waits)
function Choice:waits()
  local waits = {}
  for r = 1, #self.lists do
    waits[r] = {}
    for i, ks in pairs(self.release[r]) do
      local w = {}
      for _, k in ipairs(ks) do for _, m in ipairs(self.ranks[r].life[k].sends) do w[#w + 1] = m end end
      waits[r][i] = w
    end
  end
  return waits
end

-- move k's release on to its next candidate; false when it is at its last
function Choice:push(r, k)
  if self.choice[r][k] < #self.ranks[r].cand[k] then
    self.choice[r][k] = self.choice[r][k] + 1
    return true
  end
  return false
end

-- First no deadlock: the releases that leave a rank stuck move on. Stuck
-- with none to move, the lists deadlock by themselves (simulate.lua names
-- how); the sets then stay for STEP.
local function avoid_deadlock(c)
  while true do
    local stuck = run(c.lists, c.ranks, c.release, c.tied_last)
    if not stuck then return end
    local moved = false
    for r, keys in pairs(stuck) do
      for _, k in ipairs(keys) do moved = c:push(r, k) or moved end
    end
    if not moved then return end
    c:points()
  end
end

-- Then no wait that starts a compute action late in the simulator's timing
-- (its default times, at each of DELAY_LATENCIES): while some F, B, I or W
-- starts later than with no waits at all, the waits on its rank since its
-- previous compute action that held it move on (or, when the lateness came
-- from another rank, the wait that held an action first).
-- One pass first, against the timing with no waits (the baseline): each
-- release moves on until the baseline has its sends' receives posted (plus
-- the latency) by the start of the rank's next compute action. Were every
-- wait met so, the run with waits would be the baseline itself; one wait
-- can still hold a RECV another rank's wait needs, so the loop below checks
-- (and moves what a real run shows late: on the built-in schedules at
-- p 2-8, m 1-32 it never had to; kept for lists of one's own). Without the
-- pass, the loop alone moved one wait per simulator run: 422 runs for
-- interleaved 1F1B at p = 8, m = 64. On 452 built-in cases the plans are
-- the loop's own but for 5 (interleaved, untied), which keep one set fewer.
local function settle(c, res, latency)
  local lists, ranks = c.lists, c.ranks
  local base = starts(res)
  for r, list in ipairs(lists) do
    -- the next compute action at or after each index
    local nxt, after = {}, nil
    for i = #list, 1, -1 do
      if COMPUTE[list[i].op] then after = i end
      nxt[i] = after
    end
    for k, cand in pairs(ranks[r].cand) do
      while c.choice[r][k] < #cand do
        local i = cand[c.choice[r][k]]
        local met, nc = true, nxt[i]
        for _, m in ipairs(ranks[r].life[k].sends) do
          local at = res.recv_at[m]
          if not at or (nc and at + latency > base[r][nc] + 1e-9) then met = false; break end
        end
        if met then break end
        c:push(r, k)
      end
    end
  end
  c:points()
end

local function avoid_lateness(c)
  local lists, ranks = c.lists, c.ranks
  for _, latency in ipairs(DELAY_LATENCIES) do
    local baseline = simulate.run(lists, { posted = true, latency = latency, tied = c.tied })
    local base = starts(baseline)
    settle(c, baseline, latency)
    local release = c.release
    while true do
      local res = simulate.run(lists, { posted = true, latency = latency, tied = c.tied, waits = c:waits() })
      local r, j = first_late(res, base)
      if not r then break end
      local moved = false
      local function move(rr, i, d)
        for _, k in ipairs(release[rr][i]) do
          for _, m in ipairs(ranks[rr].life[k].sends) do
            if res.recv_at[m] + latency > d.from then moved = c:push(rr, k) or moved; break end
          end
        end
      end
      local i = j
      repeat
        if res.delayed[r][i] then move(r, i, res.delayed[r][i]) end
        i = i - 1
      until i < 1 or COMPUTE[lists[r][i].op]
      if not moved then
        local best
        for rr, late in pairs(res.delayed) do
          for ii, d in pairs(late) do
            if not best or d.from < best[3].from then best = { rr, ii, d } end
          end
        end
        if best then move(best[1], best[2], best[3]) end
      end
      if not moved then break end     -- nothing left to move: keep what there is
      c:points()
      release = c.release
    end
  end
end

-- the sets live at once per stage, walking each rank's list with the
-- chosen releases; and which sets retire with a send out
local function peaks(c)
  local peak, remote = {}, {}
  for r, list in ipairs(c.lists) do
    local ranks, live, gone = c.ranks[r], {}, {}   -- gone: index -> stages given back right after it
    for k, l in pairs(ranks.life) do
      if l.retire and #l.sends == 0 then
        gone[l.retire] = gone[l.retire] or {}
        table.insert(gone[l.retire], l.stage)
      elseif l.retire then
        remote[k] = true
      end
    end
    for i = 1, #list + 1 do
      for _, k in ipairs(c.release[r][i] or {}) do
        local s = ranks.life[k].stage
        live[s] = live[s] - 1
      end
      for _, t in ipairs(ranks.takes[i] or {}) do
        live[t.stage] = (live[t.stage] or 0) + 1
        peak[t.stage] = math.max(peak[t.stage] or 0, live[t.stage])
      end
      for _, s in ipairs(gone[i] or {}) do live[s] = live[s] - 1 end
    end
  end
  return peak, remote
end

-- The last answer, by the lists' contents (read-only to its callers): the
-- pre-flight check (plan/pipeline.lua) and the trainer's build ask it of
-- equal lists, and a long schedule's plan takes seconds.
local memo = {}
local plan
local function fingerprint(lists, tied)
  local parts = { tied and "tied" or "untied" }
  for r, list in ipairs(lists) do
    local row = {}
    -- (not validated yet: plan() names what is wrong)
    for i, a in ipairs(type(list) == "table" and list or {}) do
      row[i] = type(a) == "table" and ("%s,%s,%s"):format(tostring(a.op), tostring(a.stage), tostring(a.mb)) or "?"
    end
    parts[r + 1] = type(list) == "table" and table.concat(row, " ") or "?"
  end
  return table.concat(parts, "\n")
end

function M.plan(lists, opts)
  if type(lists) ~= "table" or #lists < 1 then error("sets: expected one action list per rank", 0) end
  local tied = opts and opts.tied
  local key = fingerprint(lists, tied)
  if memo.key == key then return memo.res end
  local res = plan(lists, tied)
  memo.key, memo.res = key, res
  return res
end

function plan(lists, tied)
  local tied_last = tied and simulate.tied_last(lists) or nil
  local c = new_choice(lists, facts(lists, tied_last))
  c.tied, c.tied_last = tied, tied_last
  avoid_deadlock(c)
  avoid_lateness(c)
  local peak, remote = peaks(c)
  local part_order = {}
  for r = 1, #lists do
    part_order[r] = {}
    for n, k in ipairs(c.ranks[r].order) do part_order[r][k] = n end
  end
  return { release = c.release, peak = peak, remote = remote, waits = c:waits(), part_order = part_order }
end

return M
