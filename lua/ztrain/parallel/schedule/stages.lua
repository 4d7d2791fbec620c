-- ztrain.parallel.schedule.stages: GPT-2's units cut into pipeline stages, and what
-- crossing stages asks of the model: the tied embedding/head weights and a
-- parameter digest chained through the stages.
--
-- Stage s runs on pipeline rank stage_rank(s) (schedules.lua: s % p, or
-- the V of ZB-V). The embedding lives
-- on the first stage and the head, which reads the embedding's wte (tied),
-- on the last. The last stage keeps a replica of the embedding unit: its
-- parameters are refreshed from the first stage after every step, and the
-- head's wte gradient of each micro-batch is sent to the first stage, which
-- writes it before the embedding adds its own -- the order of one rank
-- (gpt2.lua: the head's part first, written; the embedding's added), so a
-- pipeline gives the bits of one rank accumulating its micro-batches.
local ffi = require "ffi"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local zffi = require "ztrain.core.ffi"
local family = require "ztrain.model.family"
local C = zffi.C

local M = {}

-- Contiguous split of costs[1..n] into p parts, each non-empty, that
-- minimises the largest part's sum (the slowest stage sets the pace).
local function minmax_split(costs, p)
  local n = #costs
  local pre = { [0] = 0 }
  for i = 1, n do pre[i] = pre[i - 1] + costs[i] end
  -- best[k][i]: the least largest sum of units 1..i in k parts; cut[k][i]: the last part's start
  local best, cut = { [0] = { [0] = 0 } }, {}
  for k = 1, p do
    best[k], cut[k] = {}, {}
    for i = k, n - (p - k) do
      local b, c = math.huge, nil
      for j = k, i do          -- the k-th part is units j..i
        local prev = best[k - 1][j - 1]
        if prev then
          local v = math.max(prev, pre[i] - pre[j - 1])
          if v < b then b, c = v, j end
        end
      end
      best[k][i], cut[k][i] = b, c
    end
  end
  local counts, i = {}, n
  for k = p, 1, -1 do
    local j = cut[k][i]
    counts[k] = i - j + 1
    i = j - 1
  end
  return counts
end

-- measure(cfg, B, T) -> { embed = s, block = s, head = s }: the seconds of a
-- forward and a fused backward of each kind of unit at this micro-batch
-- (the best of 3 runs, after a warm-up), on a one-block copy of the model.
function M.measure(cfg, B, Tlen)
  local c1 = {}
  for k, v in pairs(cfg) do c1[k] = v end
  c1.L = 1
  local model = family.new(c1, {})
  local a
  local ok, res = pcall(function()
    model:init(1)
    a = model:activations(B, Tlen)
    local tok = ffi.new("int32_t[?]", B * Tlen)
    for i = 0, B * Tlen - 1 do tok[i] = (i * 7919) % c1.V end
    a.tokens:write(tok); a.targets:write(tok)
    a.dscale = 1 / (B * Tlen)
    local best = {}
    for rep = 0, 3 do
      local x = a.tokens
      for _, u in ipairs(model.units) do
        local t0 = C.zt_now()
        x = model:forward(u, a, x)
        local dt = C.zt_now() - t0
        if rep > 0 then best[u.kind] = math.min(best[u.kind] or math.huge, dt) end
        u.fwd_s = dt
      end
      for i = #model.units, 1, -1 do
        local u = model.units[i]
        local t0 = C.zt_now()
        model:backward(u, a)
        local dt = C.zt_now() - t0 + u.fwd_s
        if rep > 0 then best[u.kind .. ".fb"] = math.min(best[u.kind .. ".fb"] or math.huge, dt) end
      end
    end
    return { embed = best["embed.fb"], block = best["block.fb"], head = best["head.fb"] }
  end)
  if a then a:free() end
  model:free()
  if not ok then error(res, 0) end
  return res
end

-- partition(model, p, split, times) -> unit counts per stage. split:
-- "params" (contiguous, balanced by parameter count), "time" (contiguous,
-- the slowest stage as fast as can be by times = measure()'s seconds per
-- unit kind), or a list of counts.
function M.partition(model, p, split, times)
  local units = model.units
  if p > #units then
    error(("%d pipeline stages (pipeline.stages x pipeline.chunks) are more than %s's %d units (embedding, " ..
           "%d blocks, head); use at most %d, or a larger model.size"):format(p, model.cfg.name, #units,
           #units - 2, #units), 0)
  end
  if type(split) == "table" then
    local sum = 0
    for i, c in ipairs(split) do
      if type(c) ~= "number" or c < 1 or c % 1 ~= 0 then
        error(("pipeline.split[%d] must be a whole number of units >= 1, got %s"):format(i, tostring(c)), 0)
      end
      sum = sum + c
    end
    if #split ~= p or sum ~= #units then
      error(("pipeline.split must give %d stage sizes adding up to the model's %d units, got %d sizes adding " ..
             "up to %d"):format(p, #units, #split, sum), 0)
    end
    return split
  end
  if split == "time" then
    if p == 1 then return { #units } end
    local costs = {}
    for i, u in ipairs(units) do costs[i] = times[u.kind] end
    return minmax_split(costs, p)
  end
  if split ~= "params" then
    error(('pipeline.split must be "params", "time" or a list of unit counts per stage, got %s')
          :format(tostring(split)), 0)
  end
  -- boundaries nearest to k/p of the cumulative parameter count
  local total, cum = 0, {}
  for i, u in ipairs(units) do total = total + u.numel; cum[i] = total end
  local counts, start = {}, 1
  for s = 1, p - 1 do
    local target, best, bd = total * s / p, nil, math.huge
    -- leave at least one unit for each stage still to come
    for i = start, #units - (p - s) do
      local d = math.abs(cum[i] - target)
      if d < bd then best, bd = i, d end
    end
    counts[s] = best - start + 1
    start = best + 1
  end
  counts[p] = #units - start + 1
  return counts
end

---------------------------------------------------------------------------
-- The tied embedding across the first and last stage.
local Tied = {}
Tied.__index = Tied

-- tied(model, pp, holds, first, last) -> handler or nil (one rank: no pipeline).
-- holds[u.index] = true for this rank's units. Collective over pp.
-- first, last: the pipeline ranks of the first and the last stage.
-- dtype: the stored parameters' (mixed precision: "bf16" or "f16"; the
-- replica is stored like the first stage's embedding, and the head's part
-- of the wte gradient goes out rounded to it, as one rank rounds it).
function M.tied(model, pp, holds, first, last, dtype)
  if not pp or pp.size == 1 or not model:tied() then return nil end   -- untied: nothing shared
  local self = setmetatable({ model = model, comm = pp:split(0, pp.rank), first = first, last = last,
                              embed = model.embed, head = model.head }, Tied)
  self.rank = pp.rank
  self.dtype = dtype ~= "f32" and dtype or nil
  if holds[model.head.index] and not holds[model.embed.index] then
    -- the replica: initialised from the same seed as the first stage's
    local e = model.embed
    model:set_params(e, T.new({ e.padded }, { tier = model.tier, category = "params", dtype = self.dtype }))
    model:set_grads(e, T.new({ e.padded }, { tier = model.tier, category = "grads", dtype = self.dtype }))
    self.replica = true
  end
  self.receiver = holds[model.embed.index] and not holds[model.head.index]
  return self
end

-- connect(): one message each way between the first and the last stage's
-- ranks over this communicator, waited for (a no-op elsewhere): NCCL
-- connects two ranks at their first exchange, blocking the communication
-- thread until the peer does too, so no first exchange may fall inside a
-- step, where the pipeline's links make theirs in another order
-- (driver/links.lua's connect, after this one on every rank).
function Tied:connect()
  if not (self.replica or self.receiver) then return end
  local one = T.new({ 1 }, { tier = self.model.tier, category = "comm" })
  local ok, err = pcall(function()
    if self.receiver then
      self.comm:send(one, self.last, 32766); self.comm:recv(one, self.last, 32766)
    else
      self.comm:recv(one, self.first, 32766); self.comm:send(one, self.first, 32766)
    end
  end)
  one:free()
  if not ok then error(err, 0) end
end

-- The replica's parameters start as the first stage's (same seed; mixed
-- precision: initialised in fp32, then rounded).
function Tied:init(seed)
  if not self.replica then return end
  local model, e = self.model, self.embed
  if not self.dtype then return model:init_unit(e, seed) end
  local full = T.new({ e.padded }, { tier = model.tier, category = "other" })
  local lp = model:set_params(e, full)
  local ok, err = pcall(model.init_unit, model, e, seed)
  model:set_params(e, lp)
  if ok then ops.cast(lp, full) end
  full:free()
  if not ok then error(err, 0) end
end

-- Hooks the stage runner calls around a unit's weight-gradient pass. The
-- head's part goes out from a buffer of its own, so the head can go on to
-- the next micro-batch while the first stage has not taken it yet (it takes
-- them in micro-batch order, when it reaches the embedding's backward). A
-- buffer is reused only once the schedule driver gives it back
-- (give_back(n), at a point parallel/schedule/sets.lua fixed from the
-- lists), never when its send is seen done: how many there are does not
-- depend on timing.
function Tied:before_weight(u, mb)
  if u == self.embed and self.receiver then
    self.comm:recv(self.model:embedding_grad(), self.last, mb % 32768)   -- the head's part, written
  end
end

function Tied:after_weight(u, mb)
  if u == self.head and self.replica then
    self.pending, self.spare = self.pending or {}, self.spare or {}
    self.nparts = (self.nparts or 0) + 1
    -- an fp32 work buffer's view, or (the bf16 GEMMs: precision.lua's
    -- writes) the stored bf16 gradient, sent as it is
    local wte = self.model:embedding_grad()
    local buf = table.remove(self.spare)
    if not buf then
      buf = T.new(wte:shape(), { tier = self.model.tier, category = "comm", dtype = wte:dtype() })
      self.made = (self.made or 0) + 1      -- buffers made (the plan's count: sets.lua's peak[PART])
    end
    ops.copy(buf, wte)
    if self.dtype and wte:dtype() == "f32" then   -- rounded as one rank stores it between the head and the embedding
      self.round = self.round or T.new(wte:shape(), { tier = self.model.tier, category = "comm", dtype = self.dtype })
      ops.cast(self.round, buf)
      ops.cast(buf, self.round)
    end
    self.pending[self.nparts] = { req = self.comm:send(buf, self.first, mb % 32768, true), buf = buf }
  end
end

-- give_back(n): the step's n-th part (in the order sent) has been taken:
-- its buffer is reused (waits for the send; the first stage has posted its
-- receive, or is about to without waiting on this rank)
function Tied:give_back(n)
  local p = self.pending and self.pending[n]
  if not p then error(("tied embedding: part %d given back, but it was not sent this step"):format(n)) end
  self.pending[n] = nil
  p.req:wait()
  table.insert(self.spare, p.buf)
end

-- A step begins: parts are numbered from 1 again. Any left by a step that
-- failed part-way are kept aside for the drain (a failed pipeline step ends
-- the run: the trainer does not go on after one, and free() waits for them).
function Tied:begin_step()
  self.orphans = self.orphans or {}
  for _, p in pairs(self.pending or {}) do self.orphans[#self.orphans + 1] = p end
  self.pending, self.nparts = {}, 0
end

local function drain(self)
  self.spare = self.spare or {}
  for _, list in ipairs({ self.pending or {}, self.orphans or {} }) do
    for _, p in pairs(list) do
      pcall(p.req.wait, p.req)
      table.insert(self.spare, p.buf)
    end
  end
  self.pending, self.orphans = {}, {}
end

-- After the step: the first stage's updated embedding to the replica.
function Tied:sync_params()
  drain(self)
  if self.receiver then
    self.comm:send(self.embed.params, self.last, 32767)
  elseif self.replica then
    self.comm:recv(self.embed.params, self.first, 32767)
  end
end

function Tied:free()
  drain(self)
  for _, b in ipairs(self.spare or {}) do b:free() end
  self.spare = {}
  if self.round then self.round:free(); self.round = nil end
  if self.comm then self.comm:free(); self.comm = nil end
end

---------------------------------------------------------------------------
-- digest(pp, nstages, update, stage_rank) -> hex: SHA-256 chained through
-- the stages in order: stage s (on pipeline rank stage_rank(s)) receives the
-- running state from stage s-1's rank, update(state, s) hashes its units,
-- and passes it on; the last stage's digest is broadcast.
function M.digest(pp, nstages, update, stage_rank)
  local nb = ffi.sizeof("zt_sha256")
  local st = ffi.new("zt_sha256")
  local box = T.new({ math.ceil(nb / 4) }, { dtype = "i32", tier = "host", category = "other" })
  local hexbox = T.new({ 16 }, { dtype = "i32", tier = "host", category = "other" })
  local at = stage_rank
  local ok, res = pcall(function()
    for s = 0, nstages - 1 do
      if at(s) == pp.rank then
        if s == 0 then C.zt_sha256_init(st)
        elseif at(s - 1) ~= pp.rank then pp:recv(box, at(s - 1), 1); ffi.copy(st, box:ptr(), nb) end
        update(st, s)
        if s < nstages - 1 then
          if at(s + 1) ~= pp.rank then    -- (the next stage on this rank: st goes on as it is)
            ffi.copy(box:ptr(), st, nb)
            pp:send(box, at(s + 1), 1)
          end
        else
          local hex = ffi.new("char[65]")
          C.zt_sha256_hex(st, hex)
          ffi.copy(hexbox:ptr(), hex, 64)
        end
      end
    end
    pp:broadcast(hexbox, at(nstages - 1))
    return ffi.string(hexbox:ptr(), 64)
  end)
  box:free(); hexbox:free()
  if not ok then error(res, 0) end
  return res
end

return M
