-- ztrain.plan.pipeline: the planner's prediction for a run the schedule
-- driver executes (plan/init.lua's predict): pipeline.stages ranks a replica
-- x pipeline.chunks stages a rank, data-parallel replicas under the run's
-- strategy, any schedule (a built-in, a function, a PyTorch CSV), and a
-- schedule on one stage. Everything follows from the same calls the trainer
-- makes (train/trainer_build.lua's plan_stages and build_driver): the
-- placement, the split, the action lists, and from the lists alone what
-- the driver keeps (parallel/schedule/sets.lua, schedule.held_grads and
-- tied_parts, PipeDream's stash), so each rank's bytes are exact where the
-- strategy's own footprint is.
--
-- Per pipeline rank (every data-parallel replica of it holds the same):
--  * model state: the strategy's footprint over the rank's units (all its
--    stages), on the data-parallel group; mixed precision's fp32 work
--    buffers once a rank;
--  * per stage: its activation sets (sets.plan's peak) and scratch
--    (plan/activations.lua), the gradients it completes ahead of their
--    turn (driver/grad_order.lua: one buffer a unit each) and, for an
--    asynchronous list, the stashed weights (driver/schedule.lua);
--  * the tied embedding: the head's replica of wte (parameters and
--    gradients) and its outgoing parts where the head and the embedding
--    are on two ranks; where one rank holds both, the head's parts kept
--    apart when two would be open at once (grad_order.lua).
-- The pipeline.split = "time" split measures the units at start-up; the
-- plan splits by parameters instead (stated where it prints).
local family = require "ztrain.model.family"
local fp = require "ztrain.parallel.strategy.footprint"
local schedules = require "ztrain.parallel.schedule.registry"
local IR = require "ztrain.parallel.schedule"
local sets = require "ztrain.parallel.schedule.sets"
local stage_cuts = require "ztrain.parallel.schedule.stages"
local stage = require "ztrain.parallel.driver.stage"
local schedule_driver = require "ztrain.parallel.driver.schedule"
local precision = require "ztrain.model.precision"
local acts = require "ztrain.plan.activations"
local Acts = require "ztrain.model.activations"

local M = {}
local add = fp.add

-- driven(r) -> true when the schedule driver runs r (a pipeline, or a
-- schedule on one stage); the sequential driver's runs are plan/init.lua's.
function M.driven(r)
  return r.pipeline.stages > 1 or (r.schedule ~= nil and r.schedule ~= "")
end

-- Stashed weights of an asynchronous list (PipeDream): per stage, the most
-- kept at once, each from its forward to its backward (which forwards need
-- one: driver/schedule.lua's stash_plan).
local function stashes(list)
  local need, live, peak = schedule_driver.stash_plan(list), {}, {}
  for _, a in ipairs(list) do
    local s = a.stage
    if (a.op == "F" or a.op == "B" or a.op == "I") and need[sets.key(s, a.mb)] then
      live[s] = (live[s] or 0) + (a.op == "F" and 1 or -1)
      peak[s] = math.max(peak[s] or 0, live[s])
    end
  end
  return peak
end

-- Split backwards (I, then W): per stage, the most micro-batches whose I
-- is done and W is not, each holding a W record a unit (driver/stage.lua's
-- pool keeps them by unit kind, across steps).
local function w_open(list)
  local live, peak = {}, {}
  for _, a in ipairs(list) do
    local s = a.stage
    if a.op == "I" then
      live[s] = (live[s] or 0) + 1
      peak[s] = math.max(peak[s] or 0, live[s])
    elseif a.op == "W" then
      live[s] = live[s] - 1
    end
  end
  return peak
end

-- the bytes of one W record of each of these units (the embedding keeps none)
local function w_bytes(cfg, r, units)
  local n, g16 = 0, precision.gemm16(r) and true or false
  for _, u in ipairs(units) do
    if u.kind ~= "embed" then n = n + Acts.wgrad_bytes(cfg, r.batch.micro, r.data.seq_len, u.kind, g16) end
  end
  return n
end

local function bytes_of(units, width)
  local n = 0
  for _, u in ipairs(units) do n = n + width * u.padded end
  return n
end

-- predict(cfg, r, o) -> ranks, lists: one prediction per pipeline rank
-- (ranks[pr + 1], each t[tier][category] as plan/init.lua keeps them).
-- o = { spec (the strategy's memory model: plan.spec_of), P (pipeline
-- ranks), N (data-parallel ranks), new_t (an empty t), pad (the
-- strategy's padding) }; r.batch.accumulate as the trainer divides it
-- (plan/init.lua's batch_of).
-- Raises the user errors the trainer would.
function M.predict(cfg, r, o)
  local P, N, m = o.P, o.N, r.batch.accumulate
  local lowp = r.precision ~= "fp32"
  local lists, q = schedules.lists(r, m)
  local model = family.new(cfg, { alloc = false, pad = o.pad })
  local split = type(r.pipeline.split) == "table" and r.pipeline.split or "params"
  local stages = stage.stages(model, stage_cuts.partition(model, q.stages, split))
  local tied = P > 1 and model:tied()
  local kept = sets.plan(lists, { tied = tied }).peak
  local early = IR.held_grads(lists)
  local ckpt = stage.checkpoint_units(model.units, r.train.checkpoint_activations)
  local gb = lowp and 2 or 4                              -- a stored gradient's width
  local first, last = q.stage_rank(0), q.stage_rank(#stages - 1)
  local ranks = {}
  for pr = 0, P - 1 do
    local t, units, mine = o.new_t(), {}, {}
    for _, st in ipairs(stages) do
      if q.stage_rank(st.index) == pr then
        mine[#mine + 1] = st
        for _, u in ipairs(st.units) do units[#units + 1] = u end
      end
    end
    -- the head writes the embedding's gradient where one rank holds both
    local both = model:tied() and q.stage_rank(0) == pr and q.stage_rank(#stages - 1) == pr
    local held = false                                    -- gradients completed ahead of their turn
    for _, st in ipairs(mine) do held = held or (early[st.index] or 0) > 0 end
    o.spec.footprint(t, { units = units, N = N, lowp = lowp, accumulate = m, recipe = r, tied = both,
                          held = held })
    local list = lists[pr + 1]
    local stash = lists.async and stashes(list) or {}
    local wrec = w_open(list)
    local once = {}
    acts.precision_work(t, r, model, units)
    for _, st in ipairs(mine) do
      local s = st.index
      acts.activations(t, cfg, r, st.units, math.max(kept[s] or 1, 1), ckpt, once)
      add(t, "device", "grads", (early[s] or 0) * bytes_of(st.units, gb))
      add(t, "device", "params", (stash[s] or 0) * bytes_of(st.units, gb))
      if wrec[s] then add(t, "device", "activations", wrec[s] * w_bytes(cfg, r, st.units)) end
    end
    if model:tied() then
      local e, holds_head, holds_embed = model.embed, pr == last, pr == first
      if tied and holds_head and not holds_embed then
        -- the replica, and its outgoing parts: as many buffers as sets.lua
        -- keeps (stage PART), fp32 or the stored bf16 the bf16 GEMMs write
        add(t, "device", "params", gb * e.padded)
        add(t, "device", "grads", gb * e.padded)
        -- mixed precision: initialised in fp32, then rounded (a moment at start-up)
        if lowp then add(t, "device", "other", 4 * e.padded) end
        local g16 = precision.gemm16(r)
        add(t, "device", "comm", (kept[sets.PART] or 0) * (g16 and 2 or 4) * cfg.V * cfg.C)
        -- an fp32 part rounded through the stored dtype before it leaves
        if lowp and not g16 then add(t, "device", "comm", 2 * cfg.V * cfg.C) end
      elseif holds_head and holds_embed and #stages > 1 then
        -- one rank holds both (the V placement): the head's parts kept
        -- apart when two would be open at once (driver/grad_order.lua)
        local n = IR.tied_parts(list, 0, #stages - 1)
        if n > 1 then add(t, "device", "grads", n * gb * cfg.V * cfg.C) end
      end
    end
    -- the first exchanges' 1-element buffer (driver/links.lua's connect, at
    -- build; freed before anything else of "comm" is made on a rank with
    -- none of its own): the category's peak where nothing else is
    if P > 1 and t.device.comm < 4 then t.device.comm = 4 end
    ranks[pr + 1] = t
  end
  -- rank 0's sample gathers the other ranks' units one at a time, each
  -- into an fp32 buffer of its own (train/whole_model.lua's each_full_unit)
  if r.sample.tokens > 0 and P > 1 then
    local big = 0
    for _, st in ipairs(stages) do
      if q.stage_rank(st.index) ~= 0 then
        for _, u in ipairs(st.units) do big = math.max(big, u.padded) end
      end
    end
    add(ranks[1], "device", "comm", 4 * big)
  end
  return ranks, lists
end

return M
