-- ztrain.parallel.driver.grad_order: any backward order, the bits of
-- micro-batch order (issue 32, item 2).
--
-- DESIGN.md's canonical sum adds a unit's micro-batch gradients to its
-- accumulator in micro-batch order, and the strategies count on it (the
-- first one is copied, the last one ends the reduction). A schedule may
-- complete a stage's gradients in another order (looped BFS walks them in
-- reverse; a CSV may do anything): the schedule driver then hands the
-- strategy a wrapper (wrap below) that keeps the order for it. When a
-- unit's weight gradient of micro-batch i is complete before its turn (the
-- strategy has not yet been given 0..i-1), the wrapper copies it into a
-- buffer of its own (category grads, so the memory report counts it) and
-- does not call post_backward; when the turn comes, the strategy's
-- pre_weight_grad makes the unit's gradient buffer safe to write (its last
-- reduction done, ZeRO's bucket present), the kept gradient is copied back
-- into it, unchanged, and post_backward runs -- the calls the strategy sees
-- are those of micro-batch order, on the same bits.
--
-- The tied embedding on one rank (the V placement holds the first and the
-- last stage on rank 0): the head's backward writes its part of wte's
-- gradient into the embedding's gradient and the first stage adds to it. A
-- schedule that completes the head's gradients of two micro-batches before
-- the embedding's of the first (DualPipe-V) would overwrite a part: then
-- each part is copied into a buffer of its own after the head's weight
-- pass and back before the embedding's of the same micro-batch.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local IR = require "ztrain.parallel.schedule"

local M = {}

-- a buffer shaped and typed as t, from the pool's spares for key
local function take(pool, key, t, tier)
  local spare = pool.spare[key]
  local buf = spare and table.remove(spare)
  if not buf then
    buf = T.new(t:shape(), { tier = tier, category = "grads", dtype = t:dtype() })
    buf.held_key = key
    pool.all[#pool.all + 1] = buf
    pool.buffers, pool.bytes = pool.buffers + 1, pool.bytes + buf:nbytes()
  end
  pool.live = pool.live + 1
  if pool.live > pool.peak then pool.peak = pool.live end
  ops.copy(buf, t)
  return buf
end

local function give(pool, key, buf)
  pool.spare[key] = pool.spare[key] or {}
  table.insert(pool.spare[key], buf)
  pool.live = pool.live - 1
end

-- needs(env, list) -> held (any stage completes a gradient early), parts
-- (the tied parts must be kept apart on this rank)
local function needs(env, list)
  local held = false
  for _, n in pairs(IR.held_grads({ list })) do if n > 0 then held = true end end
  local L = #env.stages - 1
  local parts = L > 0 and env.stage_rank(0) == env.stage_rank(L) and IR.tied_parts(list, 0, L) > 1
                and env.ctx.model:tied()
  return held, parts
end

-- wrap(env, S, list) -> the strategy the stage runner is handed for this
-- step: S itself when list completes every stage's gradients in
-- micro-batch order and the tied parts never overlap, else a wrapper that
-- keeps the order (env.held: the buffers, kept across steps).
function M.wrap(env, S, list)
  local held, parts = needs(env, list)
  if not held and not parts then return S end
  local pool = env.held or { spare = {}, all = {}, buffers = 0, bytes = 0, live = 0, peak = 0 }
  env.held = pool
  -- a step that failed part-way left some out: every buffer is a spare again
  pool.spare, pool.live = {}, 0
  for _, b in ipairs(pool.all) do
    local key = b.held_key
    pool.spare[key] = pool.spare[key] or {}
    table.insert(pool.spare[key], b)
  end
  local model = env.ctx.model
  local tier = model.tier
  local nxt, early, part = {}, {}, {}
  local W = setmetatable({}, { __index = S })
  local embed, head = model.embed, model.head

  function W.pre_weight_grad(ctx, u, mb)
    S.pre_weight_grad(ctx, u, mb)
    if parts and u == embed then           -- the head's part of mb, written as the head wrote it
      local buf = part[mb]
      if not buf then error(("driver: no head part of wte's gradient for micro-batch %d"):format(mb), 0) end
      part[mb] = nil
      ops.copy(model:embedding_grad(), buf)
      give(pool, "wte", buf)
    end
  end

  function W.post_backward(ctx, u, mb)
    if parts and u == head then part[mb] = take(pool, "wte", model:embedding_grad(), tier) end
    local i = u.index
    local n = nxt[i] or 0
    if mb ~= n then                        -- early: kept until its turn
      early[i] = early[i] or {}
      early[i][mb] = take(pool, i, u.grads, tier)
      return
    end
    S.post_backward(ctx, u, mb)
    n = n + 1
    local e = early[i]
    while e and e[n] do
      local buf = e[n]
      e[n] = nil
      S.pre_weight_grad(ctx, u, n)
      ops.copy(u.grads, buf)
      give(pool, i, buf)
      S.post_backward(ctx, u, n)
      n = n + 1
    end
    nxt[i] = n
  end

  -- every kept gradient was given before the step's reduction
  function W.finish_grads(ctx)
    for i, e in pairs(early) do
      local mb = next(e)
      if mb then
        error(("driver: unit %d's gradient of micro-batch %d was never given to the strategy (micro-batch %d " ..
               "never completed)"):format(i, mb, nxt[i] or 0), 0)
      end
    end
    if S.finish_grads then return S.finish_grads(ctx) end
  end
  return W
end

-- stats(env) -> { buffers, bytes, peak } of the kept gradients (and tied
-- parts) on this rank, or nil when no step needed any.
function M.stats(env)
  local pool = env and env.held
  if not pool then return nil end
  return { buffers = pool.buffers, bytes = pool.bytes, peak = pool.peak }
end

-- free(env): the buffers back (the trainer, at the end).
function M.free(env)
  local pool = env and env.held
  if not pool then return end
  for _, b in ipairs(pool.all) do b:free() end
  env.held = nil
end

return M
