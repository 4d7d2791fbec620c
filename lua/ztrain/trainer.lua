-- ztrain.trainer: drive training steps for a resolved recipe.
--
-- A step: for each micro-batch, forward over the units, the loss, backward
-- over the units in reverse; then the strategy's step (norm, clip, update).
-- The strategy attaches to that loop through its hooks. Micro-batch j of step
-- s on rank r reads global batch (s-1)*accumulate*world + j*world + r, so N
-- ranks with one micro-batch each see the same data as one rank accumulating N.
local ffi = require "ffi"
local zffi = require "ztrain.ffi"
local C, check = zffi.C, zffi.check
local memory = require "ztrain.memory"
local gpt2 = require "ztrain.nn.gpt2"
local adamw = require "ztrain.optim.adamw"
local lr = require "ztrain.lr"
local data = require "ztrain.data"
local strategy = require "ztrain.strategy"
local digest = require "ztrain.digest"

local M = {}
local Trainer = {}
Trainer.__index = Trainer

local function fail(msg) error(msg, 0) end

local build

-- new(recipe, {rank=, world_size=, quiet=}) -> trainer (model built, data loaded).
-- On failure everything allocated so far is freed before the error is raised.
function M.new(r, env)
  env = env or {}
  local self = setmetatable({ recipe = r, rank = env.rank or 0, world_size = env.world_size or 1 }, Trainer)
  local ok, err = pcall(build, self, r)
  if not ok then
    self:free()
    err = tostring(err)
    if err:match("memory limit exceeded") then
      err = err .. "; raise device.memory_limit, or lower batch.micro, data.seq_len or model.size"
    end
    error(err, 0)
  end
  return self
end

function build(self, r)
  check(C.zt_device_init(r.device.backend), "device.backend")
  if r.device.threads and r.device.threads > 0 then check(C.zt_set_threads(r.device.threads), "device.threads") end
  local limit, err = memory.parse_size(r.device.memory_limit)
  if not limit then fail("device.memory_limit: " .. err) end
  memory.set_limit("device", limit)

  if r.optim.name ~= "adamw" then fail(("unknown optim.name %q (known: adamw)"):format(r.optim.name)) end
  local B, Tlen, accum = r.batch.micro, r.data.seq_len, r.batch.accumulate
  if B < 1 or Tlen < 1 or accum < 1 then
    fail(("batch.micro (%d), data.seq_len (%d) and batch.accumulate (%d) must be >= 1"):format(B, Tlen, accum))
  end
  if r.train.steps < 1 then fail("train.steps must be >= 1") end

  -- data
  local t0 = C.zt_now()
  self.tokenizer = data.tokenizer(r.data.tokenizer)
  local ds, derr = data.text { text = r.data.text, exclude = r.data.exclude,
                               tokenizer = self.tokenizer, valid_fraction = r.data.valid_fraction }
  if not ds then fail("data: " .. derr) end
  self.dataset = ds
  local loader, lerr = data.loader { split = ds.train, B = B, T = Tlen, seed = r.data.seed, shuffle = true }
  if not loader then fail("data (train split): " .. lerr) end
  self.loader = loader
  if r.train.eval_batches > 0 and ds.valid.n > Tlen then
    self.valid_loader = data.loader { split = ds.valid, B = B, T = Tlen, seed = 0, shuffle = false }
  end
  self.data_seconds = C.zt_now() - t0

  -- model, optimizer, strategy
  self.cfg = gpt2.config(r.model.size, { vocab_size = self.tokenizer.vocab_size })
  if Tlen > self.cfg.maxT then
    fail(("data.seq_len %d exceeds %s's context of %d; lower data.seq_len"):format(Tlen, self.cfg.name, self.cfg.maxT))
  end
  self.model = gpt2.new(self.cfg)
  self.model:init(r.model.seed)
  self.optim = adamw.new { lr = r.optim.lr, betas = r.optim.betas, eps = r.optim.eps,
                           weight_decay = r.optim.weight_decay }
  self.schedule = lr.make(r.optim.lr, r.lr, r.train.steps)
  self.strategy = strategy.resolve(r.strategy)
  self.ctx = { model = self.model, optim = self.optim, accumulate = accum, clip = r.optim.clip,
               world_size = self.world_size, rank = self.rank, recipe = r }
  self.strategy.setup(self.ctx)
  self.acts = self.model:activations(B, Tlen)
  self.xbuf = ffi.new("int32_t[?]", B * Tlen)
  self.ybuf = ffi.new("int32_t[?]", B * Tlen)
  self.step = 0
end

-- One training step; returns { step, loss, lr, grad_norm, step_ms, tokens }.
function Trainer:train_step()
  local r, S, ctx, m, a = self.recipe, self.strategy, self.ctx, self.model, self.acts
  local accum, world = r.batch.accumulate, self.world_size
  local units = m.units
  local t0 = C.zt_now()
  self.step = self.step + 1
  local step_lr = self.schedule(self.step)
  a.dscale = 1.0 / (a.B * a.T * accum * world)
  local loss = 0.0
  for j = 0, accum - 1 do
    local idx = (self.step - 1) * accum * world + j * world + self.rank
    self.loader:batch(idx, self.xbuf, self.ybuf)
    a.tokens:write(self.xbuf)
    a.targets:write(self.ybuf)
    for i = 1, #units do
      local u = units[i]
      S.pre_forward(ctx, u); m:forward_unit(u, a); S.post_forward(ctx, u)
    end
    loss = loss + m:mean_loss(a)
    for i = #units, 1, -1 do
      local u = units[i]
      S.pre_backward(ctx, u); m:backward_unit(u, a); S.post_backward(ctx, u, j)
    end
  end
  local gnorm = S.step(ctx, step_lr)
  check(C.zt_device_sync(), "device sync")
  loss = loss / accum
  if S.reduce_loss then loss = S.reduce_loss(ctx, loss) end
  return { step = self.step, loss = loss, lr = step_lr, grad_norm = gnorm,
           step_ms = (C.zt_now() - t0) * 1000, tokens = a.B * a.T * accum * world }
end

-- Mean validation loss over up to train.eval_batches batches (forward only).
function Trainer:evaluate()
  local L = self.valid_loader
  if not L then return nil end
  local a, m = self.acts, self.model
  local n = math.min(self.recipe.train.eval_batches, math.floor(L.windows / a.B))
  if n < 1 then return nil end
  local saved = a.dscale
  a.dscale = nil
  local total = 0.0
  for i = 0, n - 1 do
    L:batch(i, self.xbuf, self.ybuf)
    a.tokens:write(self.xbuf)
    a.targets:write(self.ybuf)
    for _, u in ipairs(m.units) do
      self.strategy.pre_forward(self.ctx, u); m:forward_unit(u, a); self.strategy.post_forward(self.ctx, u)
    end
    total = total + m:mean_loss(a)
  end
  a.dscale = saved
  return total / n
end

function Trainer:param_digest() return digest.params(self.model) end

function Trainer:free()
  if self.acts then self.acts:free(); self.acts = nil end
  if self.strategy and self.strategy.free then self.strategy.free(self.ctx) end
  if self.optim then self.optim:free() end
  if self.model then self.model:free(); self.model = nil end
end

return M
