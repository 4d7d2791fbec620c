-- ztrain.parallel.schedule: a training step as data -- a list of actions per rank.
--
-- In the spirit of PyTorch's torch.distributed.pipelining action IR. An
-- action is { op = OP, stage = s, mb = i } (stage and micro-batch 0-based):
--   F        forward of stage s for micro-batch i (the loss where the head is)
--   B        full backward of stage s, micro-batch i (I and W fused)
--   I        input-gradient half of the backward
--   W        weight-gradient half (after I of the same stage and micro-batch)
--   SEND_F   send stage s's output of micro-batch i to stage s+1
--   RECV_F   receive stage s's input of micro-batch i from stage s-1
--   SEND_B   send the gradient of stage s's input to stage s-1
--   RECV_B   receive the gradient of stage s's output from stage s+1
--   REDUCE_GRAD  finish every gradient reduction of the step (strategy)
--   STEP     clip and update (strategy)
-- The schedule driver (driver/schedule.lua) executes any list that
-- validate() accepts; a schedule is a Lua function returning such lists:
--   fn({ stages = p, microbatches = m, ranks = p }) -> { [rank + 1] = { actions } }
-- The sequential step is one_stage(m): F0 B0 F1 B1 ... STEP on one rank.
local M = {}

-- The ops, in a fixed order (their codes: M.OP_LIST[code]), and as a set.
M.OP_LIST = { "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD", "STEP" }
M.OPS = {}
for _, op in ipairs(M.OP_LIST) do M.OPS[op] = true end

-- action(op, stage, mb) -> action
function M.action(op, stage, mb)
  if not M.OPS[op] then
    error(("unknown action %q (known: F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, STEP)")
          :format(tostring(op)), 2)
  end
  return { op = op, stage = stage, mb = mb }
end

-- "0F3", "1SEND_B2", "STEP": PyTorch's compact form.
function M.format(a)
  if a.op == "STEP" or a.op == "REDUCE_GRAD" then
    return a.stage and (a.stage .. a.op) or a.op
  end
  return ("%d%s%d"):format(a.stage, a.op, a.mb)
end

-- parse("0F3") -> action (the inverse of format).
function M.parse(s)
  if s == "STEP" or s == "REDUCE_GRAD" then return { op = s } end
  local st, op, mb = s:match("^(%d+)(%u[%u_]*)(%d+)$")
  if not st or not M.OPS[op] then
    local st2, op2 = s:match("^(%d+)(%u[%u_]*)$")
    if st2 and (op2 == "STEP" or op2 == "REDUCE_GRAD") then return { op = op2, stage = tonumber(st2) } end
    error(("cannot read action %q (expected e.g. 0F3, 1B0, 0SEND_F2, STEP)"):format(s), 0)
  end
  return { op = op, stage = tonumber(st), mb = tonumber(mb) }
end

-- one_stage(m, { split = bool }) -> lists: the sequential step as a schedule
-- on one rank and one stage: F B per micro-batch (or F I W), then STEP.
function M.one_stage(m, opts)
  opts = opts or {}
  local list = {}
  for i = 0, m - 1 do
    list[#list + 1] = M.action("F", 0, i)
    if opts.split then
      list[#list + 1] = M.action("I", 0, i)
      list[#list + 1] = M.action("W", 0, i)
    else
      list[#list + 1] = M.action("B", 0, i)
    end
  end
  list[#list + 1] = { op = "REDUCE_GRAD" }
  list[#list + 1] = { op = "STEP" }
  return { list }
end

-- A readable name for anything found in an action list (never raises).
local function show(a)
  if type(a) ~= "table" then return tostring(a) end
  local ok, s = pcall(M.format, a)
  if ok then return s end
  return ("{op=%s, stage=%s, mb=%s}"):format(tostring(a.op), tostring(a.stage), tostring(a.mb))
end

local function where(rank, k, a) return ("rank %d action %d (%s)"):format(rank, k, show(a)) end

local function whole(x, lo, hi)
  return type(x) == "number" and x == x and x % 1 == 0 and x >= lo and x <= hi
end

-- The per-(stage, micro-batch) order rules, as (earlier, later, when) on
-- one rank: "when" limits a rule to stages where both actions exist.
local ORDER = {
  { "RECV_F", "F", "the forward reads the received input" },
  { "F", "SEND_F", "the output exists only after the forward" },
  { "SEND_F", "B", "the output is sent before the backward releases it" },
  { "SEND_F", "I", "the output is sent before the backward releases it" },
  { "RECV_B", "B", "the backward reads the received output gradient" },
  { "RECV_B", "I", "the backward reads the received output gradient" },
  { "B", "SEND_B", "the input gradient exists only after the backward" },
  { "I", "SEND_B", "the input gradient exists only after the backward" },
}

-- validate(lists, { stages = p, microbatches = m, stage_rank = fn(s) -> rank,
-- tied = bool }) -> true | nil, err. Checks each action; that every stage runs every
-- micro-batch's forward once and its backward once (B, or I then W), after
-- the forward, on the rank that owns the stage (in any micro-batch order:
-- the driver keeps DESIGN.md's canonical accumulation order whatever the
-- order of the backwards); that activations cross every stage boundary both ways
-- (SEND_F/RECV_F, SEND_B/RECV_B, each once, in an order the driver can run:
-- received before use, sent after they exist and before the backward frees
-- them); and one STEP last on each rank. It does not simulate timing: a
-- schedule that passes can still deadlock across ranks (the Pipeline issue's
-- simulator finds those).
-- Check one action of rank `rank` (position k) against what this rank and
-- the ranks before it have done (seen[op][stage][mb]); nil, err if wrong.
local function done_grad(seen, s, i)
  return (seen.B[s] and seen.B[s][i]) or (seen.W[s] and seen.W[s][i])
end

local function check_action(a, rank, k, list, p, seen)
  local nst, m = p.stages, p.microbatches
  local stage_rank = p.stage_rank or function(s) return s end
  if type(a) ~= "table" or not M.OPS[a.op] then
    return nil, ("rank %d action %d is not an action (got %s; known: F, B, I, W, SEND_F, RECV_F, " ..
                 "SEND_B, RECV_B, REDUCE_GRAD, STEP)"):format(rank, k, show(a))
  end
  if a.op == "STEP" then
    if k ~= #list then return nil, where(rank, k, a) .. ": STEP must be the last action" end
    return true
  end
  if a.op == "REDUCE_GRAD" then return true end
  if not whole(a.stage, 0, nst - 1) then
    return nil, ("%s: stage must be a whole number in 0..%d, got %s"):format(where(rank, k, a), nst - 1,
                 show(a.stage))
  end
  if not whole(a.mb, 0, m - 1) then
    return nil, ("%s: micro-batch must be a whole number in 0..%d, got %s"):format(where(rank, k, a),
                 m - 1, show(a.mb))
  end
  if stage_rank(a.stage) ~= rank then
    return nil, ("%s: stage %d runs on rank %d"):format(where(rank, k, a), a.stage, stage_rank(a.stage))
  end
  local s, i = a.stage, a.mb
  if (a.op == "RECV_F" or a.op == "SEND_B") and s == 0 then
    return nil, where(rank, k, a) .. ": the first stage has no previous stage"
  end
  if (a.op == "SEND_F" or a.op == "RECV_B") and s == nst - 1 then
    return nil, where(rank, k, a) .. ": the last stage has no next stage"
  end
  local by = seen[a.op]
  by[s] = by[s] or {}
  if by[s][i] then return nil, where(rank, k, a) .. ": appears twice" end
  local function done(op) return seen[op][s] and seen[op][s][i] end
  if (a.op == "B" or a.op == "I") and not done("F") then
    return nil, where(rank, k, a) .. ": backward before the forward of the same micro-batch"
  end
  if a.op == "W" and not done("I") then return nil, where(rank, k, a) .. ": W before I" end
  if a.op == "B" and done("I") or a.op == "I" and done("B") then
    return nil, where(rank, k, a) .. ": both B and I for one micro-batch"
  end
  for _, rule in ipairs(ORDER) do
    if a.op == rule[1] and done(rule[2]) then
      return nil, ("%s: must come before %d%s%d (%s)"):format(where(rank, k, a), s, rule[2], i, rule[3])
    end
  end
  if a.op == "B" or a.op == "W" then
    -- tied weights on one rank (p.tied: the first and last stage share
    -- GPT-2's wte): the last stage's part of micro-batch i's gradient is
    -- written before the first stage adds its own. Any other order of the
    -- stages' gradients is run with the bits of micro-batch order (the
    -- driver holds an early gradient until its turn: driver/grad_order.lua)
    local L = nst - 1
    if p.tied and L > 0 and s == 0 and stage_rank(0) == stage_rank(L) and not done_grad(seen, L, i) then
      return nil, ("%s: stage %d's gradient of micro-batch %d must complete first (the tied weights: the " ..
                   "last stage writes their gradient, the first adds to it)"):format(where(rank, k, a), L, i)
    end
  end
  by[s][i] = true
  return true
end

-- Every stage ran every micro-batch's forward and backward, and every
-- boundary was crossed both ways.
local function check_complete(p, seen)
  local nst, m = p.stages, p.microbatches
  local function has(op, s, i) return seen[op][s] and seen[op][s][i] end
  for s = 0, nst - 1 do
    for i = 0, m - 1 do
      local f = has("F", s, i)
      local b = has("B", s, i) or has("W", s, i)
      if not f or not b then
        return nil, ("stage %d micro-batch %d: %s missing"):format(s, i, not f and "forward" or "backward")
      end
      local need = {}
      if s > 0 then need[#need + 1] = "RECV_F"; need[#need + 1] = "SEND_B" end
      if s < nst - 1 then need[#need + 1] = "SEND_F"; need[#need + 1] = "RECV_B" end
      for _, op in ipairs(need) do
        if not has(op, s, i) then return nil, ("stage %d micro-batch %d: no %s"):format(s, i, op) end
      end
    end
  end
  return true
end

function M.validate(lists, p)
  if type(p) ~= "table" or not whole(p.stages, 1, 4096) or not whole(p.microbatches, 1, 65535) then
    return nil, "schedule parameters need stages (1..4096) and microbatches (1..65535)"
  end
  if type(lists) ~= "table" or #lists < 1 then
    return nil, "a schedule must return a list of action lists, one per rank, got " ..
                (type(lists) == "table" and "an empty table" or show(lists))
  end
  local seen = {}             -- seen[op][stage][mb] = true
  for op in pairs(M.OPS) do seen[op] = {} end
  for r, list in ipairs(lists) do
    local rank = r - 1
    if type(list) ~= "table" then return nil, ("rank %d's list is not a table (got %s)"):format(rank, show(list)) end
    local steps = 0
    for k, a in ipairs(list) do
      local ok, err = check_action(a, rank, k, list, p, seen)
      if not ok then return nil, err end
      if a.op == "STEP" then steps = steps + 1 end
    end
    if steps ~= 1 then return nil, ("rank %d: needs exactly one STEP, as its last action"):format(rank) end
  end
  return check_complete(p, seen)
end

-- held_grads(lists) -> { [stage] = n }: the most micro-batch gradients a
-- stage completes ahead of its turn and holds at once (the canonical order
-- adds micro-batch i only after 0..i-1: driver/grad_order.lua keeps each
-- early one in a buffer of its own, one per unit, until its turn). 0 for
-- every stage of a schedule whose backwards complete in micro-batch order;
-- m - 1 for one that completes them in reverse (looped BFS).
function M.held_grads(lists)
  local peak = {}
  for _, list in ipairs(lists) do
    local nxt, early, cur = {}, {}, {}
    for _, a in ipairs(list) do
      if a.op == "B" or a.op == "W" then
        local s = a.stage
        nxt[s], early[s], cur[s] = nxt[s] or 0, early[s] or {}, cur[s] or 0
        peak[s] = peak[s] or 0
        if a.mb == nxt[s] then
          nxt[s] = nxt[s] + 1
          while early[s][nxt[s]] do early[s][nxt[s]] = nil; cur[s] = cur[s] - 1; nxt[s] = nxt[s] + 1 end
        else
          early[s][a.mb] = true
          cur[s] = cur[s] + 1
          if cur[s] > peak[s] then peak[s] = cur[s] end
        end
      end
    end
  end
  return peak
end

-- tied_parts(list, first, last) -> n: on a rank holding both the first and
-- the last stage (the tied embedding and head), the most head parts of the
-- wte gradient open at once (written by the last stage's backward, not yet
-- added to by the first's). Above 1, a head part would overwrite another:
-- the driver then keeps every part in a buffer of its own until the first
-- stage's backward of its micro-batch (stages.lua, Tied), n buffers.
function M.tied_parts(list, first, last)
  local cur, peak = 0, 0
  for _, a in ipairs(list) do
    if a.op == "B" or a.op == "W" then
      if a.stage == last and last ~= first then
        cur = cur + 1
        if cur > peak then peak = cur end
      elseif a.stage == first and last ~= first then
        cur = math.max(cur - 1, 0)
      end
    end
  end
  return peak
end

return M
