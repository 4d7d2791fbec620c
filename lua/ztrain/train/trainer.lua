-- ztrain.train.trainer: build a run from a resolved recipe and drive its steps.
--
-- The trainer builds the model, the data, the groups (ctx.dp: the
-- data-parallel group every strategy works on; ctx.pp: the pipeline group),
-- the stages and their activation pools, and hands each step to a driver:
-- `sequential` (driver/sequential.lua: forward and backward per micro-batch,
-- then the strategy's step) or `schedule` (driver/schedule.lua: any valid
-- action list, parallel/schedule/init.lua). The strategy is the synchronisation
-- policy both drivers call. Micro-batch j of step s on data-parallel rank r
-- reads global batch (s-1)*accumulate*N + j*N + r (N = ctx.dp.size), so N
-- ranks with one micro-batch each see the same data as one rank
-- accumulating N.
--
-- Building is trainer_build.lua (its phases); this file is the trainer's
-- object: new, the pre-flight memory check the build calls, the step and
-- its data, the state for checkpoints, free. whole_model.lua adds what a
-- run does with the whole model (evaluation, samples, the digest).
local zffi = require "ztrain.core.ffi"
local C, check = zffi.C, zffi.check
local memory = require "ztrain.core.memory"
local groups = require "ztrain.parallel.groups"
local shard = require "ztrain.parallel.strategy.shard"
local comm = require "ztrain.core.comm"
local errors = require "ztrain.core.errors"
local activations = require "ztrain.model.activations"
local schedule_driver = require "ztrain.parallel.driver.schedule"
local build = require "ztrain.train.trainer_build"
local headroom = require "ztrain.plan.headroom"
local preflight = require "ztrain.plan.preflight"
local links = require "ztrain.parallel.driver.links"
local host = require "ztrain.util.host"
local whole_model = require "ztrain.train.whole_model"

local M = {}
local Trainer = {}
Trainer.__index = Trainer

-- the construction-time methods (trainer_build.lua)
Trainer.vocab_size, Trainer.open_checkpoint = build.vocab_size, build.open_checkpoint
Trainer.measure_units = build.measure_units

local function fail(msg) error(msg, 0) end
-- for errors that follow from the resolved recipe alone: every rank raises them
local function fail_all(msg) error(errors.all_ranks(msg), 0) end

-- new(recipe, {quiet=, out=}) -> trainer (model built, data loaded); out:
-- the run's output directory (offload puts its nvme swap files under it).
-- On failure everything allocated so far is freed before the error is raised.
function M.new(r, env)
  env = env or {}
  local world = comm.world()
  local self = setmetatable({ recipe = r, world = world, rank = world.rank, world_size = world.size,
                              env_opts = env }, Trainer)
  -- a failed build gives back the limit and threads it set (a REPL goes on)
  local limit0, threads0 = memory.limit("device"), C.zt_get_threads()
  local ok, err = pcall(build.build, self, r)
  if not ok then
    self:free()
    memory.set_limit("device", 0)
    pcall(memory.set_limit, "device", limit0)
    C.zt_set_threads(threads0)
    -- (errors.keeps_kind: every rank's, or with an exit status of its own)
    if errors.keeps_kind(err) then error(err, 0) end
    err = errors.message(err)
    -- (an [ELIMIT] from core.ffi's check carries its remedy already)
    if err:match("memory limit exceeded") and not err:find(zffi.ELIMIT_REMEDY, 1, true) then
      err = err .. "; " .. zffi.ELIMIT_REMEDY
    end
    error(err, 0)
  end
  return self
end

-- activation_report() -> { checkpointed_blocks, per_set, per_set_without }:
-- the bytes one micro-batch's activation set of this rank's stages holds,
-- with and without activation checkpointing (train.checkpoint_activations).
function Trainer:activation_report()
  local B, Tlen = self.recipe.batch.micro, self.recipe.data.seq_len
  local with, without, n = 0, 0, 0
  for i, st in ipairs(self.stages) do
    if self.pools and self.pools[i] then
      local l16 = self.model.gemm16
      with = with + activations.set_bytes(self.cfg, B, Tlen, st.units, self.ckpt_units,
                                          self.recipe.train.checkpoint_host, l16)
      without = without + activations.set_bytes(self.cfg, B, Tlen, st.units, {}, nil, l16)
      for _, u in ipairs(st.units) do if self.ckpt_units[u.index] then n = n + 1 end end
    end
  end
  return { checkpointed_blocks = n, per_set = with, per_set_without = without }
end

-- The model-state check, for strategies and drivers the planner does not
-- predict (a user's strategy, pipelines): state per rank vs available
-- memory. Returns the refusal's text, or nil.
function Trainer:check_model_state()
  local S = self.strategy
  if not S.predicted then return end
  local p = S.predicted({ model = self.model, dp = self.dp, world_size = self.world_size,
                          accumulate = self.accumulate, recipe = self.recipe, nparams = self.nparams })
  -- bytes in memory: the device and host tiers (on this machine both are
  -- RAM); what a strategy puts on nvme lives on disk
  local need = p.params + p.grads + p.optim + (p.accumulator or 0)
  if p.tiers then
    need = 0
    for _, tier in ipairs({ "device", "host" }) do
      local t = p.tiers[tier]
      if t then need = need + t.params + t.grads + t.optim end
    end
  end
  local avail = host.mem_available()
  if not avail then return end
  local limit = memory.limit("device")
  local local_ranks = host.local_ranks()
  -- the pre-flight's headroom (plan/headroom.lua): device.memory_fraction
  -- of MemAvailable per local rank, less this process's own overhead
  local share, over = headroom.share(self.recipe, avail, local_ranks)
  if limit == 0 and need > share then
    return (("%s with %s needs %s of model state per rank, but each rank has %s (%s): use a smaller model.size, " ..
          "zero3 with more ranks, raise device.memory_fraction (at most 1), or set device.memory_limit to try " ..
          "anyway"):format(self.cfg.name, S.name, memory.format(need), memory.format(share),
          headroom.describe(self.recipe, avail, local_ranks, over)))
  end
end

-- Refuse early (with numbers) a run that cannot fit in device.memory_limit
-- or this machine's available memory, instead of being killed by the OOM
-- killer half-way through: the memory planner's prediction (plan/preflight.lua) of
-- model state, activations and working buffers.
function Trainer:check_fits()
  local ok, msg = pcall(preflight.check, { recipe = self.recipe, strategy = self.strategy, cfg = self.cfg,
                                          nproc = self.dp.size, local_ranks = host.local_ranks() })
  -- a prediction that failed (a bug in the planner) must not stop a run
  -- that may fit: the model-state check below and the runtime's own limit
  -- still guard it
  if not ok then msg = false end
  if msg == false then msg = self:check_model_state() end
  -- ranks could read /proc/meminfo a moment apart: they stop together
  local err = errors.agree(self.world, msg or "")
  if err and err ~= "" then fail_all(err) end
end

-- Put batch idx of loader into an activation set's token and target tensors.
function Trainer:load_batch(a, loader, idx)
  loader:batch(idx, self.xbuf, self.ybuf)
  if a.tokens then a.tokens:upload(self.xbuf) end       -- no host wait (tensor.lua)
  if a.targets then a.targets:upload(self.ybuf) end
end

-- Micro-batch mb of the current step, on this data-parallel rank. The
-- global micro-batch index is data_base + (step - 1) x G + mb x N + rank
-- (G = accumulate x N, the global batch); data_base is 0 except after a
-- resume with another global batch (set_next_batch).
function Trainer:load_micro(a, mb)
  local N = self.dp.size
  self:load_batch(a, self.loader, (self.data_base or 0) + (self.step - 1) * self.accumulate * N + mb * N +
                  self.dp.rank)
end

-- The global micro-batch index the next step starts at.
function Trainer:next_batch() return (self.data_base or 0) + self.step * self.accumulate * self.dp.size end

-- Continue the data at global micro-batch index `nb` from the next step on.
function Trainer:set_next_batch(nb) self.data_base = nb - self.step * self.accumulate * self.dp.size end

-- One training step; returns { step, loss, lr, grad_norm, step_ms, tokens }.
function Trainer:train_step()
  local S, ctx, env = self.strategy, self.ctx, self.env
  local accum, N = self.accumulate, self.dp.size
  local B, Tlen = self.recipe.batch.micro, self.recipe.data.seq_len
  local t0 = C.zt_now()
  self.step = self.step + 1
  local step_lr = self.schedule(self.step)
  -- the loss is the mean over the step's micro-batches (asynchronous
  -- pipelines update after each one: the mean over one)
  env.dscale = 1.0 / (B * Tlen * (env.async and 1 or accum) * N)
  local LS = ctx.loss_scaler
  if LS then env.dscale = env.dscale * LS.scale end      -- fp16: the loss scaled, gradients unscaled at the step
  ctx.training = true
  local loss, gnorm = self.driver.step(env, step_lr)
  if self.tied then self.tied:sync_params() end
  check(C.zt_device_sync(), "device sync")
  -- the loss lives on the last stage: summed over the pipeline (0 + ... + L)
  loss = loss or 0.0
  if self.pp then loss = shard.sum_over_ranks(self.pp, loss) end
  -- the mean over all micro-batches of all ranks, summed in (rank, micro) order
  if S.reduce_loss then loss = S.reduce_loss(ctx, loss) end
  loss = loss / (accum * N)
  return { step = self.step, loss = loss, lr = step_lr, grad_norm = gnorm,
           step_ms = (C.zt_now() - t0) * 1000, tokens = B * Tlen * accum * N,
           loss_scale = LS and LS.scale or nil, skipped_steps = LS and LS.skipped or nil }
end

-- state() -> this rank's state in the strategy-independent form
-- (strategy/state.lua: entries { kind, unit, lo, hi, tensor }, step);
-- call :free() on it when done. A collective-free, per-rank export.
function Trainer:state()
  if not self.ctx.state then error("strategy " .. self.strategy.name .. " publishes no state (ctx.state)", 0) end
  local ex = self.strategy.state(self.ctx)
  ex.step = self.step
  return ex
end

-- load_state(read, step): fill this rank's state through read(kind, unit,
-- lo, hi, dst) (e.g. strategy.state.reader(exports)), and continue after
-- `step` steps (optimizer step count, learning rate and data position).
function Trainer:load_state(read, step)
  self:import_state(read, step)
  self:finish_load()
end

-- import_state(read, step): load_state's per-rank part (no collective), for
-- a caller that first agrees across ranks that every one succeeded.
function Trainer:import_state(read, step)
  if not self.ctx.state then error("strategy " .. self.strategy.name .. " publishes no state (ctx.state)", 0) end
  self.strategy.load_state(self.ctx, read)
  self.step = step
  self.optim.t = step
end

-- finish_load(): what follows from the loaded state (a collective): stored
-- low-precision parameters re-rounded from the fp32 master weights and
-- gathered (strategy after_load).
function Trainer:finish_load()
  if self.strategy.after_load then self.strategy.after_load(self.ctx) end
end

whole_model(Trainer)

-- Free everything the run allocated; safe after a build that failed
-- part-way (only what exists is freed), and twice.
function Trainer:free()
  if self.model then self.model.source = nil end
  if self.env then schedule_driver.free_stash(self.env) end
  if self.env and self.env.ledger then self.env.ledger:free(); self.env.ledger = nil end
  for _, p in pairs(self.pools or {}) do p:free() end
  self.pools = nil
  if self.setup_called and self.strategy and self.strategy.free then self.strategy.free(self.ctx) end
  if self.ctx and self.ctx.precision then self.ctx.precision:free(); self.ctx.precision = nil end
  if self.ctx and self.ctx.mm then self.ctx.mm.free(); self.ctx.mm = nil end
  self.setup_called = nil
  if self.tied then self.tied:free(); self.tied = nil end
  if self.env and self.env.links then links.free(self.env.links); self.env.links = nil end
  if self.model then self.model:free(); self.model = nil end
  if self.groups then groups.free(self.groups); self.groups = nil end
end

return M
