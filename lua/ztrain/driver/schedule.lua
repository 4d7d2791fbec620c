-- ztrain.driver.schedule: execute a step written as data (schedule/init.lua):
-- this rank's list of actions, in order. Activations live per (stage,
-- micro-batch) from F (or RECV_F) until the stage's backward of that
-- micro-batch is complete (B, or W) and its gradient has been sent.
--
-- Sends and receives go over the pipeline group (env.pp), tagged by stage
-- boundary, micro-batch and direction, and are asynchronous: a RECV's buffer
-- is waited on before the action that reads it; a set whose backward is
-- done is released once its sends have completed (polled between actions,
-- all waited for at STEP), so a send never blocks the next action. Stages
-- on other ranks are reached through env.stage_rank(s).
local stage_run = require "ztrain.driver.stage"

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

-- step(env, lr) -> loss_sum (nil where no stage holds the head), grad_norm.
-- env: as for the sequential driver, plus lists (one action list per
-- pipeline rank), pp (pipeline group or nil), stage_rank.
function M.step(env, lr)
  local ctx, S = env.ctx, env.strategy
  local rank = env.pp and env.pp.rank or 0
  local list = env.lists[rank + 1]
  local m = env.microbatches
  for _, pool in ipairs(env.pools) do pool:reset() end
  local loss, gnorm = nil, nil
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
  if events then now = require("ztrain.ffi").C.zt_now end
  for _, a in ipairs(list) do
    if #retiring > 0 then poll_retiring(false) end
    local t0 = events and now()
    local op = a.op
    local k = a.mb and key(a.stage, a.mb)
    if op == "F" then
      local stage, _, set = set_for(a)
      settle(recv_f, k)
      if events then t0 = now() end      -- waiting for the input is idle, not compute
      stage_run.forward(ctx, S, stage, set, a.mb)
      if stage.has_head then loss = (loss or 0.0) + ctx.model:mean_loss(set) end
    elseif op == "B" then
      local stage, pool, set = set_for(a)
      settle(recv_b, k)
      if events then t0 = now() end
      stage_run.backward(ctx, S, stage, set, a.mb)
      mark(a, "weights")
      maybe_retire(a, stage, pool)
    elseif op == "I" then
      local stage, pool, set = set_for(a)
      settle(recv_b, k)
      if events then t0 = now() end
      stage_run.backward_input(ctx, S, stage, set, a.mb, pool)
    elseif op == "W" then
      local stage, pool, set = set_for(a)
      stage_run.backward_weight(ctx, S, stage, set, a.mb, pool)
      mark(a, "weights")
      maybe_retire(a, stage, pool)
    elseif op == "SEND_F" then
      local stage, _, set = set_for(a)
      local out = set.unit[stage.units[#stage.units].index].out
      send_f[k] = env.pp:send(out, env.stage_rank(a.stage + 1), tag(m, a.stage, a.mb), true)
    elseif op == "RECV_F" then
      local _, _, set = set_for(a)
      recv_f[k] = env.pp:recv(set.input, env.stage_rank(a.stage - 1), tag(m, a.stage - 1, a.mb), true)
    elseif op == "SEND_B" then
      local stage, pool, set = set_for(a)
      send_b[k] = env.pp:send(set.grad, env.stage_rank(a.stage - 1), tag(m, a.stage - 1, a.mb, true), true)
      mark(a, "sent")
      maybe_retire(a, stage, pool)
    elseif op == "RECV_B" then
      local _, _, set = set_for(a)
      recv_b[k] = env.pp:recv(set.grad, env.stage_rank(a.stage + 1), tag(m, a.stage, a.mb, true), true)
    elseif op == "REDUCE_GRAD" then
      if S.finish_grads then S.finish_grads(ctx) end
    elseif op == "STEP" then
      poll_retiring(true)
      for kk in pairs(send_f) do settle(send_f, kk) end
      for kk in pairs(send_b) do settle(send_b, kk) end
      gnorm = S.step(ctx, lr)
    end
    if events then events[#events + 1] = { op = op, stage = a.stage, mb = a.mb, t0 = t0, t1 = now() } end
  end
  poll_retiring(true)
  for _, tbl in ipairs({ recv_f, recv_b, send_f, send_b }) do
    for kk in pairs(tbl) do settle(tbl, kk) end
  end
  return loss, gnorm
end

return M
