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
local comm = require "ztrain.comm"
local recipe_mod = require "ztrain.recipe"

local M = {}
local Trainer = {}
Trainer.__index = Trainer

local errors = require "ztrain.errors"
local function fail(msg) error(msg, 0) end
-- for errors that follow from the resolved recipe alone: every rank raises them
local function fail_all(msg) error(errors.all_ranks(msg), 0) end

local build

-- new(recipe, {rank=, world_size=, quiet=}) -> trainer (model built, data loaded).
-- On failure everything allocated so far is freed before the error is raised.
function M.new(r, env)
  env = env or {}
  local world = comm.world()
  local self = setmetatable({ recipe = r, world = world, rank = world.rank, world_size = world.size }, Trainer)
  local ok, err = pcall(build, self, r)
  if not ok then
    self:free()
    if errors.is_all_ranks(err) then error(err, 0) end
    err = errors.message(err)
    if err:match("memory limit exceeded") then
      err = err .. "; raise device.memory_limit, or lower batch.micro, data.seq_len or model.size"
    end
    error(err, 0)
  end
  return self
end

-- Ranks that resolved different recipes would deadlock in the first
-- collective that differs; compare hashes first and name the differing keys.
local function check_agreement(world, r)
  if world.size == 1 then return end
  local lines = {}
  for k, v in pairs(recipe_mod.flatten(r)) do lines[#lines + 1] = k .. "=" .. v end
  table.sort(lines)
  local text = table.concat(lines, "\n")
  local hashes = world:gather_strings(digest.string(text))
  local same = true
  for i = 2, #hashes do if hashes[i] ~= hashes[1] then same = false end end
  if same then return end
  local function parse(t)
    local kv = {}
    for line in t:gmatch("[^\n]+") do local k, v = line:match("^([^=]+)=(.*)$"); kv[k] = v end
    return kv
  end
  local texts = world:gather_strings(text)
  local ref = parse(texts[1])
  local diffs = {}
  for rk = 2, #texts do
    local other = parse(texts[rk])
    local keys = {}
    for k in pairs(ref) do keys[k] = true end
    for k in pairs(other) do keys[k] = true end
    for k in pairs(keys) do
      if ref[k] ~= other[k] then
        diffs[#diffs + 1] = ("%s (rank 0: %s, rank %d: %s)"):format(k, tostring(ref[k]), rk - 1, tostring(other[k]))
      end
    end
  end
  table.sort(diffs)
  fail_all("ranks disagree on the recipe: " .. table.concat(diffs, "; ") ..
       ". Every rank must resolve the same recipe (same file, same overrides, nothing rank-dependent)")
end

-- batch.global, when set, must split into ranks x batch.micro x accumulate.
local function resolve_accumulation(r, world_size)
  local B, accum, G = r.batch.micro, r.batch.accumulate, r.batch.global
  if G == 0 then return accum end
  local per = B * world_size
  if G % per ~= 0 then
    -- valid choices: the multiples of ranks x micro around G, and the
    -- micro-batch sizes that split G over the ranks
    local choices = {}
    local lo = G - G % per
    if lo >= per then choices[#choices + 1] = "batch.global=" .. lo end
    choices[#choices + 1] = "batch.global=" .. (lo + per)
    if G % world_size == 0 then
      local per_rank, micros = G / world_size, {}
      for d = math.min(per_rank, 2 * B), 1, -1 do
        if per_rank % d == 0 and #micros < 3 then micros[#micros + 1] = tostring(d) end
      end
      choices[#choices + 1] = "batch.micro=" .. table.concat(micros, " or ")
    end
    fail_all(("batch.global %d does not divide into %d rank(s) x batch.micro %d = %d sequences per micro-step; " ..
              "use %s"):format(G, world_size, B, per, table.concat(choices, ", or ")))
  end
  local a = G / per
  if accum ~= 1 and accum ~= a then
    fail_all(("batch.global %d = %d rank(s) x batch.micro %d x %d, but batch.accumulate is %d; " ..
          "set one of them"):format(G, world_size, B, a, accum))
  end
  return a
end

function build(self, r)
  check(C.zt_device_init(r.device.backend), "device.backend")
  local threads = r.device.threads
  if (not threads or threads == 0) and os.getenv("ZTRAIN_DEFAULT_THREADS") then
    threads = tonumber(os.getenv("ZTRAIN_DEFAULT_THREADS"))
  elseif (not threads or threads == 0) and self.world_size > 1 then
    -- under a plain mpirun/srun: share this machine's cores between its ranks
    local launch = require "ztrain.launch"
    threads = math.max(1, math.floor(launch.cores() / launch.local_ranks()))
  end
  if threads and threads > 0 then check(C.zt_set_threads(threads), "device.threads") end
  check_agreement(self.world, r)
  local limit, err = memory.parse_size(r.device.memory_limit)
  if not limit then fail("device.memory_limit: " .. err) end
  memory.set_limit("device", limit)

  if r.optim.name ~= "adamw" then fail(("unknown optim.name %q (known: adamw)"):format(r.optim.name)) end
  -- (ranges of every number were checked when the recipe was resolved)
  local B, Tlen = r.batch.micro, r.data.seq_len
  local accum = resolve_accumulation(r, self.world_size)
  self.accumulate = accum

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
  local V = r.model.vocab_size > 0 and r.model.vocab_size or self.tokenizer.vocab_size
  if V < self.tokenizer.vocab_size then
    fail(("model.vocab_size %d is smaller than the %s tokenizer's %d tokens; leave it 0 to use the tokenizer's")
         :format(V, self.tokenizer.name, self.tokenizer.vocab_size))
  end
  self.cfg = gpt2.config(r.model.size, { vocab_size = V })
  if Tlen > self.cfg.maxT then
    fail(("data.seq_len %d exceeds %s's context of %d; lower data.seq_len"):format(Tlen, self.cfg.name, self.cfg.maxT))
  end
  self.strategy = strategy.resolve(r.strategy)
  local pad = self.strategy.pad and self.strategy.pad(self.world_size) or gpt2.PAD
  self.model = gpt2.new(self.cfg, { alloc = false, pad = pad })
  self.optim = adamw.new { lr = r.optim.lr, betas = r.optim.betas, eps = r.optim.eps,
                           weight_decay = r.optim.weight_decay }
  self.schedule = lr.make(r.optim.lr, r.lr, r.train.steps)
  self:check_fits()
  self.ctx = { model = self.model, optim = self.optim, accumulate = accum, clip = r.optim.clip,
               world_size = self.world_size, rank = self.rank, recipe = r, seed = r.model.seed,
               world = self.world }
  self.strategy.setup(self.ctx)
  self.acts = self.model:activations(B, Tlen)
  self.xbuf = ffi.new("int32_t[?]", B * Tlen)
  self.ybuf = ffi.new("int32_t[?]", B * Tlen)
  self.step = 0
end

-- Refuse early (with numbers) a model whose state cannot fit in this
-- machine's available memory, instead of being killed by the OOM killer
-- half-way through allocating it.
function Trainer:check_fits()
  local S = self.strategy
  if not S.predicted then return end
  local p = S.predicted({ model = self.model, world_size = self.world_size, accumulate = self.accumulate })
  local need = p.params + p.grads + p.optim + (p.accumulator or 0)
  local f = io.open("/proc/meminfo")
  if not f then return end
  local avail
  for line in f:lines() do
    local kb = line:match("^MemAvailable:%s+(%d+) kB")
    if kb then avail = tonumber(kb) * 1024 end
  end
  f:close()
  local limit = memory.limit("device")
  local local_ranks = require("ztrain.launch").local_ranks()
  if avail and limit == 0 and need * local_ranks > avail then
    fail(("%s with %s needs %s of model state per rank (%d rank(s) on this machine), but only %s " ..
          "of memory is available: use a smaller model.size, zero3 with more ranks, or set " ..
          "device.memory_limit to try anyway"):format(self.cfg.name, S.name, memory.format(need),
          local_ranks, memory.format(avail)))
  end
end

-- One training step; returns { step, loss, lr, grad_norm, step_ms, tokens }.
-- Put batch idx of loader into the activations' token and target tensors.
function Trainer:load_batch(loader, idx)
  loader:batch(idx, self.xbuf, self.ybuf)
  self.acts.tokens:write(self.xbuf)
  self.acts.targets:write(self.ybuf)
end

-- Forward over the units with the strategy's hooks; the batch's mean loss.
function Trainer:forward(j)
  local S, ctx, m, a = self.strategy, self.ctx, self.model, self.acts
  local units = m.units
  for i = 1, #units do
    local u = units[i]
    S.pre_forward(ctx, u, j); m:forward_unit(u, a); S.post_forward(ctx, u, j)
  end
  return m:mean_loss(a)
end

function Trainer:train_step()
  local S, ctx, m, a = self.strategy, self.ctx, self.model, self.acts
  local accum, world = self.accumulate, self.world_size
  local units = m.units
  local t0 = C.zt_now()
  self.step = self.step + 1
  local step_lr = self.schedule(self.step)
  a.dscale = 1.0 / (a.B * a.T * accum * world)
  ctx.training = true
  local loss = 0.0
  for j = 0, accum - 1 do
    self:load_batch(self.loader, (self.step - 1) * accum * world + j * world + self.rank)
    loss = loss + self:forward(j)
    for i = #units, 1, -1 do
      local u = units[i]
      S.pre_backward(ctx, u, j); m:backward_unit(u, a); S.post_backward(ctx, u, j)
    end
  end
  local gnorm = S.step(ctx, step_lr)
  check(C.zt_device_sync(), "device sync")
  -- the mean over all micro-batches of all ranks, summed in (rank, micro) order
  if S.reduce_loss then loss = S.reduce_loss(ctx, loss) end
  loss = loss / (accum * world)
  return { step = self.step, loss = loss, lr = step_lr, grad_norm = gnorm,
           step_ms = (C.zt_now() - t0) * 1000, tokens = a.B * a.T * accum * world }
end

-- Mean validation loss over up to train.eval_batches batches (forward only;
-- every rank evaluates the same batches).
function Trainer:evaluate()
  local L = self.valid_loader
  if not L then return nil end
  local a = self.acts
  local n = math.min(self.recipe.train.eval_batches, math.floor(L.windows / a.B))
  if n < 1 then return nil end
  local saved = a.dscale
  a.dscale = nil
  self.ctx.training = false
  local total = 0.0
  for i = 0, n - 1 do
    self:load_batch(L, i)
    total = total + self:forward(0)
  end
  a.dscale = saved
  return total / n
end

function Trainer:param_digest()
  local S = self.strategy
  return digest.params(self.model, S.with_full_params and function(u, fn)
    return S.with_full_params(self.ctx, u, fn)
  end)
end

function Trainer:free()
  if self.acts then self.acts:free(); self.acts = nil end
  if self.strategy and self.strategy.free then self.strategy.free(self.ctx) end
  if self.optim then self.optim:free() end
  if self.model then self.model:free(); self.model = nil end
end

return M
