-- ztrain.parallel.driver.schedule: execute a step written as data (parallel/schedule/init.lua):
-- this rank's list of actions, in order. Activations live per (stage,
-- micro-batch) from F (or RECV_F) until the stage's backward of that
-- micro-batch is complete (B, or W) and its gradient has been sent.
--
-- Sends and receives go over a link per boundary and direction
-- (env.links, driver/links.lua: what NCCL, matching by order, needs), tagged
-- by stage boundary, micro-batch and direction, and are asynchronous: a RECV's buffer
-- is waited on before the action that reads it, and a send never blocks
-- the action after it. A set whose backward is done is given back at once
-- when it left no send in flight; one whose send is still out is given back
-- at a point parallel/schedule/sets.lua fixes from the lists (before an
-- action that would take a new set of its stage: the send is waited for
-- there), so how many sets a stage holds does not depend on when a peer
-- takes a message (all are waited for at STEP). Stages
-- on other ranks are reached through env.stage_rank(s); between two stages
-- of one rank a SEND copies into the next set and its RECV does nothing.
--
-- A stage's gradients may complete in any micro-batch order: the strategy
-- is handed them in micro-batch order, bit for bit (driver/grad_order.lua).
--
-- Asynchronous lists (lists.async, env.async: PipeDream's 1F1B with weight
-- stashing, parallel/schedule/library.lua) update the rank's stage as soon as a
-- micro-batch's weight gradient is complete (B, or W), each micro-batch on
-- its own (the strategy's hooks see micro-batch 0 every time), and a
-- micro-batch whose stage is updated between its forward and its backward
-- runs that backward on the weights its forward used: a copy taken at the
-- forward (the stash), swapped in for the B or I and out after. STEP then
-- only ends the step (the updates are done).
local stage_run = require "ztrain.parallel.driver.stage"
local losses = require "ztrain.parallel.driver.losses"
local grad_order = require "ztrain.parallel.driver.grad_order"
local links = require "ztrain.parallel.driver.links"
local sets = require "ztrain.parallel.schedule.sets"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local zffi = require "ztrain.core.ffi"

local M = { name = "schedule" }

local key = sets.key
-- Message tags: one per boundary (between stages b and b+1), direction and
-- micro-batch, so interleaved stages on one pair of ranks never mix. MPI
-- promises tags up to 32767 only: past p x 2 x m = 32768 tags repeat, and
-- MPI's in-order matching per tag keeps them apart as long as each
-- boundary's messages are received in the order they were sent.
local TAG_SPACE = 32768
local function tag(m, boundary, mb, backward)
  return ((boundary * 2 + (backward and 1 or 0)) * m + mb) % TAG_SPACE
end

-- For an asynchronous list: which (stage, micro-batch) forwards need a
-- stash, the stage being updated (a B or W of it) before their backward
-- (the memory planner counts them: plan/pipeline.lua).
function M.stash_plan(list)
  local need, open = {}, {}
  for _, a in ipairs(list) do
    if a.op == "F" then open[key(a.stage, a.mb)] = a.stage
    elseif a.op == "B" or a.op == "I" then open[key(a.stage, a.mb)] = nil end
    if a.op == "B" or a.op == "W" then
      -- an update of a.stage after this: every forward of it still open needs its weights kept
      for k, s in pairs(open) do if s == a.stage and k ~= key(a.stage, a.mb) then need[k] = true end end
    end
  end
  return need
end

-- The stash: copies of a stage's parameters taken at a forward, kept until
-- its backward; buffers reused across micro-batches and steps (env.stash).
local function stash_take(env, stage, k)
  local pool = env.stash
  local held = {}
  for _, u in ipairs(stage.units) do
    local spare = pool.spare[u.index]
    local buf = spare and table.remove(spare)
    if not buf then buf = T.new({ u.padded }, { tier = u.params:tier(), category = "params", dtype = u.params:dtype() }) end
    ops.copy(buf, u.params)
    held[u] = buf
  end
  pool.live[k] = held
end

-- Run fn with the stashed weights of k in place (when there are some);
-- the current weights are back afterwards, also when fn raises.
local function with_stash(env, ctx, k, fn)
  local held = env.stash and env.stash.live[k]
  if not held then return fn() end
  env.stash.live[k] = nil
  local model, cur = ctx.model, {}
  for u, buf in pairs(held) do cur[u] = model:set_params(u, buf) end
  local ok, err = pcall(fn)
  for u, c in pairs(cur) do
    local buf = model:set_params(u, c)
    local spare = env.stash.spare
    spare[u.index] = spare[u.index] or {}
    table.insert(spare[u.index], buf)
  end
  if not ok then error(err, 0) end
end

-- free_stash(env): give back the stash's buffers, and the kept early
-- gradients' (grad_order.lua) (the trainer, at the end).
function M.free_stash(env)
  grad_order.free(env)
  local pool = env.stash
  if not pool then return end
  for _, held in pairs(pool.live) do for _, b in pairs(held) do b:free() end end
  for _, list in pairs(pool.spare) do for _, b in ipairs(list) do b:free() end end
  env.stash = nil
end

-- One step's working state (the run): requests in flight by (stage,
-- micro-batch), the progress of each backward, the sets waiting to retire,
-- and the gradient norm once the optimizer has stepped.
local function new_run(env, lr)
  local rank = env.pp and env.pp.rank or 0
  local run = {
    env = env, ctx = env.ctx, S = env.strategy, lr = lr, rank = rank,
    list = env.lists[rank + 1], m = env.microbatches, async = env.async,
    recv_f = {}, recv_b = {}, send_f = {}, send_b = {},
    done = {},        -- key -> { weights, sent }: what of the backward is complete
    retiring = {},    -- key -> { pool, mb }: backward done, a send in flight
    release = env.sets.release[rank + 1],   -- action index -> keys given back before it
    -- gnorm: set when the optimizer steps
  }
  -- measured events for timelines: env.events[#+1] = { op, stage, mb, t0, t1 }
  if env.events then run.events, run.now = env.events, zffi.C.zt_now end
  return run
end

-- A step that failed part-way leaves stashes live: their buffers go back
-- to the spares, to be taken again (not lost).
local function reclaim_stash(pool)
  for kk, held in pairs(pool.live) do
    for u, b in pairs(held) do
      pool.spare[u.index] = pool.spare[u.index] or {}
      table.insert(pool.spare[u.index], b)
    end
    pool.live[kk] = nil
  end
end

-- the micro-batch the strategy's hooks see (async: each one is a step of its own)
local function hook_mb(run, mb) return run.async and 0 or mb end

-- async: the update right after a weight gradient completes, on this
-- rank's stage alone (no collective over the pipeline: the norm is local)
local function update(run)
  local ctx, S = run.ctx, run.S
  if S.finish_grads then S.finish_grads(ctx) end
  local pp = ctx.pp
  ctx.pp = nil
  local ok, g = pcall(S.step, ctx, run.lr)
  ctx.pp = pp
  if not ok then error(g, 0) end
  run.gnorm = g
end

local function settle(tbl, k) local r = tbl[k]; if r then tbl[k] = nil; r:wait() end end

-- The stage, its pool and the activation set of action a's (stage,
-- micro-batch), acquired (and its tokens loaded) on first use.
local function set_for(run, a)
  local env = run.env
  local stage, pool = env.stages[a.stage + 1], env.pools[a.stage + 1]
  local set = pool.live[a.mb]
  if not set then
    set = pool:acquire(a.mb)
    set.dscale = env.dscale
    if stage.has_embed or stage.has_head then env.load(set, a.mb) end
  end
  return stage, pool, set
end

-- Give back the retired sets of keys (nil: all of them), each once its
-- sends have completed (waited for); a key of sets.PART is a tied part's
-- buffer, given back by the tied embedding's handler (stages.lua).
local function give_back(run, keys)
  local retiring = run.retiring
  if not keys then
    keys = {}
    for k in pairs(retiring) do keys[#keys + 1] = k end
  end
  for _, k in ipairs(keys) do
    if k < 0 then
      local n = run.env.sets.part_order[run.rank + 1][k]
      if not run.ctx.tied or not n then error(("schedule driver: tied part %d has no handler or order"):format(k)) end
      run.ctx.tied:give_back(n)
    else
      local t = retiring[k]
      if not t then error(("schedule driver: set %d of stage %d is given back before it retired (sets.lua and " ..
                           "the driver disagree)"):format(k % 1048576, math.floor(k / 1048576))) end
      settle(run.send_f, k); settle(run.send_b, k)
      t.pool:release(t.mb)
      retiring[k] = nil
    end
  end
end

-- A micro-batch's activations go once its weight gradient is complete and
-- (past the first stage) its input gradient has been sent: at once, or,
-- with a send still out, where sets.lua placed it.
local function maybe_retire(run, a, stage, pool)
  local k = key(a.stage, a.mb)
  local d = run.done[k]
  if d and d.weights and (stage.index == 0 or d.sent) then
    run.done[k] = nil
    if run.send_f[k] or run.send_b[k] then
      if not run.env.sets.remote[k] then error(("schedule driver: set %d of stage %d has a send out, which " ..
                                               "sets.lua did not foresee"):format(a.mb, a.stage)) end
      run.retiring[k] = { pool = pool, mb = a.mb }
    else
      pool:release(a.mb)
    end
  end
end

local function mark(run, a, field)
  local k = key(a.stage, a.mb)
  run.done[k] = run.done[k] or {}
  run.done[k][field] = true
end

-- Waiting for an action's input is idle, not compute: its event starts
-- once the input is there.
local function started(run)
  if run.events then run.t0 = run.now() end
end

-- One handler per action kind: ACT[op](run, a, k), k the (stage,
-- micro-batch) key where the action has a micro-batch.
local ACT = {}

function ACT.F(run, a, k)
  local stage, _, set = set_for(run, a)
  settle(run.recv_f, k)
  started(run)
  if run.async and run.need_stash[k] then stash_take(run.env, stage, k) end
  stage_run.forward(run.ctx, run.S, stage, set, hook_mb(run, a.mb))
  if stage.has_head then run.env.ledger:keep(set) end     -- summed at the end: no host wait here
end

-- the weight gradient of a's micro-batch is complete (B or W)
local function weights_done(run, a, stage, pool)
  if run.async then update(run) end
  mark(run, a, "weights")
  maybe_retire(run, a, stage, pool)
end

function ACT.B(run, a, k)
  local stage, pool, set = set_for(run, a)
  settle(run.recv_b, k)
  started(run)
  with_stash(run.env, run.ctx, k, function()
    stage_run.backward(run.ctx, run.S, stage, set, hook_mb(run, a.mb))
  end)
  weights_done(run, a, stage, pool)
end

function ACT.I(run, a, k)
  local stage, pool, set = set_for(run, a)
  settle(run.recv_b, k)
  started(run)
  with_stash(run.env, run.ctx, k, function()
    stage_run.backward_input(run.ctx, run.S, stage, set, hook_mb(run, a.mb), pool)
  end)
end

function ACT.W(run, a)
  local stage, pool, set = set_for(run, a)
  stage_run.backward_weight(run.ctx, run.S, stage, set, hook_mb(run, a.mb), pool)
  weights_done(run, a, stage, pool)
end

-- The communicator a boundary's message goes over, and the peer's rank in
-- it: the boundary's link in that direction (driver/links.lua), or without
-- links (a driver some spec builds by hand, on MPI) the pipeline group.
local function channel(env, boundary, backward, peer)
  if not env.links then return env.pp, peer end
  local l = env.links[links.key(boundary, backward)]
  if not l then
    error(("schedule driver: no link for boundary %d %s (driver/links.lua built none)")
          :format(boundary, backward and "backward" or "forward"))
  end
  return l.comm, l.peer
end

function ACT.SEND_F(run, a, k)
  local env = run.env
  local stage, _, set = set_for(run, a)
  local out = set.unit[stage.units[#stage.units].index].out
  local dst = env.stage_rank(a.stage + 1)
  if dst == run.rank then        -- the next stage is this rank's too (ZB-V's V): hand it over
    local _, _, nset = set_for(run, { stage = a.stage + 1, mb = a.mb })
    ops.copy(nset.input, out)
  else
    local c, peer = channel(env, a.stage, false, dst)
    run.send_f[k] = c:send(out, peer, tag(run.m, a.stage, a.mb), true)
  end
end

function ACT.RECV_F(run, a, k)
  local env = run.env
  local _, _, set = set_for(run, a)
  local src = env.stage_rank(a.stage - 1)
  if src ~= run.rank then
    local c, peer = channel(env, a.stage - 1, false, src)
    run.recv_f[k] = c:recv(set.input, peer, tag(run.m, a.stage - 1, a.mb), true)
  end
end

function ACT.SEND_B(run, a, k)
  local env = run.env
  local stage, pool, set = set_for(run, a)
  local dst = env.stage_rank(a.stage - 1)
  if dst == run.rank then
    local _, _, pset = set_for(run, { stage = a.stage - 1, mb = a.mb })
    ops.copy(pset.grad, set.grad)
  else
    local c, peer = channel(env, a.stage - 1, true, dst)
    run.send_b[k] = c:send(set.grad, peer, tag(run.m, a.stage - 1, a.mb, true), true)
  end
  mark(run, a, "sent")
  maybe_retire(run, a, stage, pool)
end

function ACT.RECV_B(run, a, k)
  local env = run.env
  local _, _, set = set_for(run, a)
  local src = env.stage_rank(a.stage + 1)
  if src ~= run.rank then
    local c, peer = channel(env, a.stage, true, src)
    run.recv_b[k] = c:recv(set.grad, peer, tag(run.m, a.stage, a.mb, true), true)
  end
end

function ACT.REDUCE_GRAD(run)
  if run.S.finish_grads and not run.async then run.S.finish_grads(run.ctx) end
end

-- every send completes before the optimizer steps (async: the updates are done)
function ACT.STEP(run)
  give_back(run)
  for kk in pairs(run.send_f) do settle(run.send_f, kk) end
  for kk in pairs(run.send_b) do settle(run.send_b, kk) end
  if not run.async then run.gnorm = run.S.step(run.ctx, run.lr) end
end

-- the step's end: every set released, every request completed
local function drain(run)
  give_back(run)
  for _, tbl in ipairs({ run.recv_f, run.recv_b, run.send_f, run.send_b }) do
    for kk in pairs(tbl) do settle(tbl, kk) end
  end
end

-- step(env, lr) -> loss_sum (nil where no stage holds the head), grad_norm.
-- env: as for the sequential driver, plus lists (one action list per
-- pipeline rank), pp (pipeline group or nil), stage_rank.
function M.step(env, lr)
  for _, pool in pairs(env.pools) do pool:reset() end      -- (sparse: this rank's stages)
  -- (the trainer plans them when it builds: trainer_build.lua)
  if env.sets_of ~= env.lists then
    env.sets, env.sets_of = sets.plan(env.lists, { tied = env.ctx.tied ~= nil }), env.lists
  end
  env.ledger = env.ledger or losses.new(env.microbatches)
  env.ledger:reset()
  local run = new_run(env, lr)
  if run.ctx.tied then run.ctx.tied:begin_step() end
  -- gradients completed out of micro-batch order reach the strategy in it
  if not run.async then run.S = grad_order.wrap(env, env.strategy, run.list) end
  if run.async then
    run.need_stash = M.stash_plan(run.list)
    env.stash = env.stash or { spare = {}, live = {} }
    reclaim_stash(env.stash)
  end
  for i, a in ipairs(run.list) do
    if run.release[i] then give_back(run, run.release[i]) end
    run.t0 = run.events and run.now()
    local act = ACT[a.op]    -- validated lists hold only these ops
    if act then act(run, a, a.mb and key(a.stage, a.mb)) end
    if run.events then
      run.events[#run.events + 1] = { op = a.op, stage = a.stage, mb = a.mb, t0 = run.t0, t1 = run.now() }
    end
  end
  drain(run)
  return env.ledger:total(), run.gnorm
end

return M
