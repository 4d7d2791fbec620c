-- ztrain.parallel.driver.schedule: execute a step written as data (parallel/schedule/init.lua):
-- this rank's list of actions, in order. Activations live per (stage,
-- micro-batch) from F (or RECV_F) until the stage's backward of that
-- micro-batch is complete (B, or W) and its gradient has been sent.
--
-- Sends and receives go over the pipeline group (env.pp), tagged by stage
-- boundary, micro-batch and direction, and are asynchronous: a RECV's buffer
-- is waited on before the action that reads it; a set whose backward is
-- done is released once its sends have completed (polled between actions,
-- all waited for at STEP), so a send never blocks the next action. Stages
-- on other ranks are reached through env.stage_rank(s); between two stages
-- of one rank a SEND copies into the next set and its RECV does nothing.
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
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local zffi = require "ztrain.core.ffi"

local M = { name = "schedule" }

local function key(s, mb) return s * 1048576 + mb end
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
-- stash, the stage being updated (a B or W of it) before their backward.
local function stash_plan(list)
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

-- free_stash(env): give back the stash's buffers (the trainer, at the end).
function M.free_stash(env)
  local pool = env.stash
  if not pool then return end
  for _, held in pairs(pool.live) do for _, b in pairs(held) do b:free() end end
  for _, list in pairs(pool.spare) do for _, b in ipairs(list) do b:free() end end
  env.stash = nil
end

-- step(env, lr) -> loss_sum (nil where no stage holds the head), grad_norm.
-- env: as for the sequential driver, plus lists (one action list per
-- pipeline rank), pp (pipeline group or nil), stage_rank.
function M.step(env, lr)
  local ctx, S = env.ctx, env.strategy
  local rank = env.pp and env.pp.rank or 0
  local list = env.lists[rank + 1]
  local m = env.microbatches
  for _, pool in ipairs(env.pools) do pool:reset() end
  local gnorm = nil
  env.ledger = env.ledger or losses.new(env.microbatches)
  env.ledger:reset()
  local async = env.async
  local need_stash
  if async then
    need_stash = stash_plan(list)
    env.stash = env.stash or { spare = {}, live = {} }
    for kk, held in pairs(env.stash.live) do       -- a step that failed part-way
      for u, b in pairs(held) do
        env.stash.spare[u.index] = env.stash.spare[u.index] or {}
        table.insert(env.stash.spare[u.index], b)
      end
      env.stash.live[kk] = nil
    end
  end
  -- the micro-batch the strategy's hooks see (async: each one is a step of its own)
  local function hmb(mb) return async and 0 or mb end
  -- async: the update right after a weight gradient completes, on this
  -- rank's stage alone (no collective over the pipeline: the norm is local)
  local function update()
    if S.finish_grads then S.finish_grads(ctx) end
    local pp = ctx.pp
    ctx.pp = nil
    local ok, g = pcall(S.step, ctx, lr)
    ctx.pp = pp
    if not ok then error(g, 0) end
    gnorm = g
  end
  -- requests in flight by (stage, micro-batch); progress of each backward
  local recv_f, recv_b, send_f, send_b, done = {}, {}, {}, {}, {}

  local function settle(tbl, k) local r = tbl[k]; if r then tbl[k] = nil; r:wait() end end
  local function set_for(a)
    local stage, pool = env.stages[a.stage + 1], env.pools[a.stage + 1]
    local set = pool.live[a.mb]
    if not set then
      set = pool:acquire(a.mb)
      set.dscale = env.dscale
      if stage.has_embed or stage.has_head then env.load(set, a.mb) end
    end
    return stage, pool, set
  end
  -- A micro-batch's activations go once its weight gradient is complete and
  -- (past the first stage) its input gradient has been sent.
  local retiring = {}    -- { pool, mb, k }: backward done, sends maybe in flight
  local function sends_done(k)
    for _, tbl in ipairs({ send_f, send_b }) do
      local r = tbl[k]
      if r then
        if not r:test() then return false end
        tbl[k] = nil; r:wait()
      end
    end
    return true
  end
  local function poll_retiring(block)
    for i = #retiring, 1, -1 do
      local t = retiring[i]
      if block then settle(send_f, t.k); settle(send_b, t.k) end
      if block or sends_done(t.k) then
        t.pool:release(t.mb)
        table.remove(retiring, i)
      end
    end
  end
  -- A micro-batch's activations go once its weight gradient is complete and
  -- (past the first stage) its input gradient has been sent.
  local function maybe_retire(a, stage, pool)
    local k = key(a.stage, a.mb)
    local d = done[k]
    if d and d.weights and (stage.index == 0 or d.sent) then
      done[k] = nil
      retiring[#retiring + 1] = { pool = pool, mb = a.mb, k = k }
      poll_retiring(false)
    end
  end
  local function mark(a, field)
    local k = key(a.stage, a.mb)
    done[k] = done[k] or {}
    done[k][field] = true
  end

  -- measured events for timelines: env.events[#+1] = { op, stage, mb, t0, t1 }
  local events, now = env.events, nil
  if events then now = zffi.C.zt_now end
  for _, a in ipairs(list) do
    if #retiring > 0 then poll_retiring(false) end
    local t0 = events and now()
    local op = a.op
    local k = a.mb and key(a.stage, a.mb)
    if op == "F" then
      local stage, _, set = set_for(a)
      settle(recv_f, k)
      if events then t0 = now() end      -- waiting for the input is idle, not compute
      if async and need_stash[k] then stash_take(env, stage, k) end
      stage_run.forward(ctx, S, stage, set, hmb(a.mb))
      if stage.has_head then env.ledger:keep(set) end     -- summed at the end: no host wait here
    elseif op == "B" then
      local stage, pool, set = set_for(a)
      settle(recv_b, k)
      if events then t0 = now() end
      with_stash(env, ctx, k, function() stage_run.backward(ctx, S, stage, set, hmb(a.mb)) end)
      if async then update() end
      mark(a, "weights")
      maybe_retire(a, stage, pool)
    elseif op == "I" then
      local stage, pool, set = set_for(a)
      settle(recv_b, k)
      if events then t0 = now() end
      with_stash(env, ctx, k, function() stage_run.backward_input(ctx, S, stage, set, hmb(a.mb), pool) end)
    elseif op == "W" then
      local stage, pool, set = set_for(a)
      stage_run.backward_weight(ctx, S, stage, set, hmb(a.mb), pool)
      if async then update() end
      mark(a, "weights")
      maybe_retire(a, stage, pool)
    elseif op == "SEND_F" then
      local stage, _, set = set_for(a)
      local out = set.unit[stage.units[#stage.units].index].out
      local dst = env.stage_rank(a.stage + 1)
      if dst == rank then        -- the next stage is this rank's too (ZB-V's V): hand it over
        local _, _, nset = set_for({ stage = a.stage + 1, mb = a.mb })
        ops.copy(nset.input, out)
      else
        send_f[k] = env.pp:send(out, dst, tag(m, a.stage, a.mb), true)
      end
    elseif op == "RECV_F" then
      local _, _, set = set_for(a)
      local src = env.stage_rank(a.stage - 1)
      if src ~= rank then recv_f[k] = env.pp:recv(set.input, src, tag(m, a.stage - 1, a.mb), true) end
    elseif op == "SEND_B" then
      local stage, pool, set = set_for(a)
      local dst = env.stage_rank(a.stage - 1)
      if dst == rank then
        local _, _, pset = set_for({ stage = a.stage - 1, mb = a.mb })
        ops.copy(pset.grad, set.grad)
      else
        send_b[k] = env.pp:send(set.grad, dst, tag(m, a.stage - 1, a.mb, true), true)
      end
      mark(a, "sent")
      maybe_retire(a, stage, pool)
    elseif op == "RECV_B" then
      local _, _, set = set_for(a)
      local src = env.stage_rank(a.stage + 1)
      if src ~= rank then recv_b[k] = env.pp:recv(set.grad, src, tag(m, a.stage, a.mb, true), true) end
    elseif op == "REDUCE_GRAD" then
      if S.finish_grads and not async then S.finish_grads(ctx) end
    elseif op == "STEP" then
      poll_retiring(true)
      for kk in pairs(send_f) do settle(send_f, kk) end
      for kk in pairs(send_b) do settle(send_b, kk) end
      if not async then gnorm = S.step(ctx, lr) end
    end
    if events then events[#events + 1] = { op = op, stage = a.stage, mb = a.mb, t0 = t0, t1 = now() } end
  end
  poll_retiring(true)
  for _, tbl in ipairs({ recv_f, recv_b, send_f, send_b }) do
    for kk in pairs(tbl) do settle(tbl, kk) end
  end
  return env.ledger:total(), gnorm
end

return M
