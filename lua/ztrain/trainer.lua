-- ztrain.trainer: build a run from a resolved recipe and drive its steps.
--
-- The trainer builds the model, the data, the groups (ctx.dp: the
-- data-parallel group every strategy works on; ctx.pp: the pipeline group),
-- the stages and their activation pools, and hands each step to a driver:
-- `sequential` (driver/sequential.lua: forward and backward per micro-batch,
-- then the strategy's step) or `schedule` (driver/schedule.lua: any valid
-- action list, schedule/init.lua). The strategy is the synchronisation
-- policy both drivers call. Micro-batch j of step s on data-parallel rank r
-- reads global batch (s-1)*accumulate*N + j*N + r (N = ctx.dp.size), so N
-- ranks with one micro-batch each see the same data as one rank
-- accumulating N.
local ffi = require "ffi"
local zffi = require "ztrain.ffi"
local C, check = zffi.C, zffi.check
local memory = require "ztrain.memory"
local gpt2 = require "ztrain.nn.gpt2"
local adamw = require "ztrain.optim.adamw"
local lr = require "ztrain.lr"
local data = require "ztrain.data"
local strategy = require "ztrain.strategy"
local schedules = require "ztrain.schedule.registry"
local stage_run = require "ztrain.driver.stage"
local digest = require "ztrain.digest"
local groups = require "ztrain.groups"
local pipeline_stages = require "ztrain.pipeline.stages"
local shard = require "ztrain.strategy.shard"
local comm = require "ztrain.comm"
local recipe_mod = require "ztrain.recipe"

local M = {}
local Trainer = {}
Trainer.__index = Trainer

local errors = require "ztrain.errors"
local host = require "ztrain.util.host"
local function fail(msg) error(msg, 0) end
-- for errors that follow from the resolved recipe alone: every rank raises them
local function fail_all(msg) error(errors.all_ranks(msg), 0) end

local build

-- The model's vocabulary: a checkpoint's, model.vocab_size, or the tokenizer's.
function Trainer:vocab_size(r)
  if self.checkpoint then return self.checkpoint.cfg.V end
  return r.model.vocab_size > 0 and r.model.vocab_size or self.tokenizer.vocab_size
end

local agree = errors.agree

-- model.from = "hf:DIR": open and check the checkpoint on every rank
-- before anything is built (its config sets the model's shape).
function Trainer:open_checkpoint(r)
  local hf = require "ztrain.nn.hf"
  local dir = hf.dir_of(r.model.from)
  local ok, src = pcall(hf.open, dir)
  local err = agree(self.world, ok and "" or errors.message(src))
  if err ~= "" then fail_all(err) end
  if r.model.vocab_size > 0 and r.model.vocab_size ~= src.cfg.V then
    fail_all(("model.vocab_size %d differs from the checkpoint's vocab_size %d (%s/config.json); leave it 0")
             :format(r.model.vocab_size, src.cfg.V, dir))
  end
  self.checkpoint = src
end

-- export.hf = DIR: rank 0 makes sure it can write there before training
-- (not after hours of it).
local function check_export(self, r)
  local dir = r.export.hf
  local err = ""
  if self.rank == 0 then
    local ok, derr = require("ztrain.nn.hf").check_dir(dir)
    if not ok then err = "export.hf: " .. derr end
  end
  err = agree(self.world, err)
  if err ~= "" then fail_all(err) end
end

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
  local ok, err = pcall(build, self, r)
  if not ok then
    self:free()
    memory.set_limit("device", 0)
    pcall(memory.set_limit, "device", limit0)
    C.zt_set_threads(threads0)
    if errors.is_all_ranks(err) then error(err, 0) end
    err = errors.message(err)
    if err:match("memory limit exceeded") then
      err = err .. "; raise device.memory_limit, lower batch.micro, data.seq_len or model.size, or move " ..
            "model state off the device (strategy=zero3_offload: optimizer state and parameter shards on " ..
            "the host; zero2_offload: optimizer state)"
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

-- The phases of a build, in order; each leaves what the next needs on self
-- (or in b, the stage plan).
local setup_device, build_data, build_model, plan_stages, build_strategy, build_driver

function build(self, r)
  setup_device(self, r)
  build_data(self, r)
  build_model(self, r)
  local b = plan_stages(self, r)
  build_strategy(self, r, b)
  build_driver(self, r, b)
end

-- The device, its threads, the recipe agreed on by every rank, the groups,
-- the memory limit and the accumulation.
function setup_device(self, r)
  -- (the runtime's messages name the key: no prefix)
  check(C.zt_device_init(r.device.backend))
  check(C.zt_device_attention(r.device.attention))
  -- before the groups: groups split from an NCCL world run NCCL too
  if r.comm.backend == "nccl" then self.world:use_nccl(r.comm.deterministic) end
  local threads = r.device.threads
  if (not threads or threads == 0) and os.getenv("ZTRAIN_DEFAULT_THREADS") then
    threads = tonumber(os.getenv("ZTRAIN_DEFAULT_THREADS"))
  elseif (not threads or threads == 0) and self.world_size > 1 then
    -- under a plain mpirun/srun: share this machine's cores between its ranks
    threads = host.rank_threads()
  end
  if threads and threads > 0 then check(C.zt_set_threads(threads), "device.threads") end
  check_agreement(self.world, r)
  -- groups: pipeline.stages ranks per replica, the rest data-parallel
  local okg, g = pcall(groups.build, self.world, { pp = r.pipeline.stages })
  if not okg then fail_all(errors.message(g)) end      -- the same on every rank
  self.groups = g
  self.dp, self.pp = self.groups.dp, self.groups.pp
  local limit, err = memory.parse_size(r.device.memory_limit)
  if not limit then fail("device.memory_limit: " .. err) end
  memory.set_limit("device", limit)

  if r.optim.name ~= "adamw" then fail(("unknown optim.name %q (known: adamw)"):format(r.optim.name)) end
  -- (ranges of every number were checked when the recipe was resolved)
  local B, Tlen = r.batch.micro, r.data.seq_len
  local accum = resolve_accumulation(r, self.dp.size)
  self.accumulate = accum
end

-- The tokenizer, the dataset and its loaders (token ids checked against
-- the model's vocabulary by the loaders).
function build_data(self, r)
  local B, Tlen = r.batch.micro, r.data.seq_len
  if r.model.from ~= "" then self:open_checkpoint(r) end
  if r.export.hf ~= "" then check_export(self, r) end

  -- data (token ids checked against the model's vocabulary by the loaders)
  local t0 = C.zt_now()
  self.tokenizer = data.tokenizer(r.data.tokenizer)
  local V = self:vocab_size(r)
  if V < self.tokenizer.vocab_size then
    if self.checkpoint then
      fail(("the checkpoint %s has a vocabulary of %d tokens, fewer than the %s tokenizer's %d (its embedding " ..
            "has no row for the rest); use the checkpoint's own tokenizer (data.tokenizer = %q)")
           :format(r.model.from, V, self.tokenizer.name, self.tokenizer.vocab_size, r.model.from))
    end
    fail(("model.vocab_size %d is smaller than the %s tokenizer's %d tokens; leave it 0 to use the tokenizer's")
         :format(V, self.tokenizer.name, self.tokenizer.vocab_size))
  end
  local ds, derr = data.open { text = r.data.text, exclude = r.data.exclude, tokenizer = self.tokenizer,
                               valid_fraction = r.data.valid_fraction, cache = r.data.cache, seq_len = Tlen }
  if not ds then fail(derr) end
  self.dataset = ds
  self.warnings = {}
  for _, w in ipairs(ds.warnings or {}) do self.warnings[#self.warnings + 1] = "data: " .. w end
  local loader, lerr = data.loader { split = ds.train, B = B, T = Tlen, seed = r.data.seed, shuffle = true,
                                     vocab_size = V }
  if not loader then fail("data (train split): " .. lerr) end
  self.loader = loader
  if r.train.eval_batches > 0 and ds.valid and ds.valid.n > Tlen then
    local vl, verr = data.loader { split = ds.valid, B = B, T = Tlen, seed = 0, shuffle = false, vocab_size = V }
    if not vl then fail("data (validation split): " .. verr) end
    self.valid_loader = vl
  end
  if ds.test and ds.test.n > Tlen then
    local tl, terr = data.loader { split = ds.test, B = B, T = Tlen, seed = 0, shuffle = false, vocab_size = V }
    if not tl then fail("data (test split): " .. terr) end
    self.test_loader = tl
  end
  self.data_seconds = C.zt_now() - t0
end

-- The model (no buffers yet: the strategy places them), optimizer, lr.
function build_model(self, r)
  local Tlen, V = r.data.seq_len, self:vocab_size(r)
  self.cfg = self.checkpoint and self.checkpoint.cfg or gpt2.config(r.model.size, { vocab_size = V })
  if Tlen > self.cfg.maxT then
    fail(("data.seq_len %d exceeds %s's context of %d; lower data.seq_len"):format(Tlen, self.cfg.name, self.cfg.maxT))
  end
  self.strategy = strategy.resolve(r.strategy)
  local S, dp = self.strategy, self.dp
  local pad = S.pad and S.pad(dp.size) or gpt2.PAD
  self.model = gpt2.new(self.cfg, { alloc = false, pad = pad })
  self.optim = adamw.new { lr = r.optim.lr, betas = r.optim.betas, eps = r.optim.eps,
                           weight_decay = r.optim.weight_decay }
  self.schedule = lr.make(r.optim.lr, r.lr, r.train.steps)
end

-- stages: P pipeline ranks x V chunks each, placed as the schedule needs;
-- returns the plan the later phases use.
function plan_stages(self, r)
  local S, accum = self.strategy, self.accumulate
  local B, Tlen = r.batch.micro, r.data.seq_len
  local P, V = r.pipeline.stages, r.pipeline.chunks
  -- (errors that follow from the recipe alone: every rank stops alike)
  if P > 1 and S.stage == 3 then
    fail_all("pipeline.stages > 1 composes with single, dp, zero1 and zero2; zero3 across pipeline stages " ..
             "is not supported yet")
  end
  local sched = r.schedule
  if sched == "" and P > 1 then sched = V > 1 and "interleaved_1f1b" or "1f1b" end
  local pipe = require "ztrain.pipeline.schedules"
  local placement = r.pipeline.placement ~= "" and r.pipeline.placement or pipe.placement(sched)
  if placement == "v" and V ~= 2 then
    fail_all(("%s places two stages on each rank in a V: set pipeline.chunks = 2 (it is %d)")
             :format(r.pipeline.placement ~= "" and 'pipeline.placement = "v"' or ("schedule " .. tostring(sched)), V))
  end
  local okq, q = pcall(pipe.params, { ranks = P, chunks = V, microbatches = accum, placement = placement }, "pipeline")
  if not okq then fail_all(errors.message(q)) end
  local stage_rank = q.stage_rank
  self.stage_rank = stage_rank
  local times
  if r.pipeline.split == "time" and P * V > 1 then
    times = self:measure_units(B, Tlen)
  end
  local okp, counts = pcall(pipeline_stages.partition, self.model, P * V, r.pipeline.split, times)
  if not okp then fail_all(errors.message(counts)) end
  self.stages = stage_run.stages(self.model, counts)
  self.unit_times = times
  local prank = self.pp and self.pp.rank or 0
  local units, holds, nparams = {}, {}, 0
  for _, st in ipairs(self.stages) do
    if stage_rank(st.index) == prank then
      for _, u in ipairs(st.units) do units[#units + 1] = u; holds[u.index] = true; nparams = nparams + u.numel end
    end
  end
  self.units, self.nparams = units, nparams
  return { P = P, V = V, sched = sched, placement = placement, stage_rank = stage_rank, units = units,
           holds = holds, nparams = nparams, prank = prank }
end

-- The strategy context, mixed precision, the tied embedding, and the
-- strategy's setup (parameters placed and initialised).
function build_strategy(self, r, b)
  local S, dp, accum = self.strategy, self.dp, self.accumulate
  local P, units, holds, nparams, stage_rank = b.P, b.units, b.holds, b.nparams, b.stage_rank
  self:check_fits()
  self.ctx = { model = self.model, optim = self.optim, accumulate = accum, clip = r.optim.clip,
               recipe = r, seed = r.model.seed, dp = dp, pp = self.pp, world = self.world,
               units = P > 1 and units or nil, nparams = nparams,
               out_dir = self.env_opts.out, quiet = self.env_opts.quiet,
               rank = self.rank, world_size = self.world_size }
  -- mixed precision: low-precision storage, fp32 compute (precision.lua)
  local precision = require "ztrain.precision"
  local prec = precision.new(r.precision, self.model)
  if prec.lp then
    if not (S.name == "single" or S.name == "dp" or S.name:match("^zero%d")) then
      fail_all(("precision %s runs with single, dp and the zero strategies (not %s); use precision=fp32 with %s")
               :format(r.precision, S.name, S.name))
    end
    self.ctx.precision = prec
    -- bf16 GEMMs: "on", or "auto" where they pay (precision.gemm16)
    local g16, path = precision.gemm16(r)
    if g16 then
      self.ctx.mm = precision.bf16_matmuls(self.model.tier, prec)
      self.model.gemm16 = true   -- what only GEMMs read is stored bf16 (nn/activations.lua)
      self.gemm = "bf16 (" .. path .. ")"
    end
    if r.precision == "fp16" then
      self.ctx.loss_scaler = precision.loss_scaler { initial = 2 ^ r.fp16.initial_scale_power,
        window = r.fp16.loss_scale_window, hysteresis = r.fp16.hysteresis, min_scale = r.fp16.min_loss_scale }
    end
  end
  self.tied = pipeline_stages.tied(self.model, self.pp, holds, stage_rank(0), stage_rank(#self.stages - 1),
                                   prec.dtype)
  self.ctx.tied = self.tied
  self.setup_called = true
  -- every unit a strategy initialises (whole, or one at a time before it
  -- keeps its shard) takes the checkpoint's values instead of the seed's
  self.model.source = self.checkpoint
  S.setup(self.ctx)
  if self.tied then self.tied:init(r.model.seed) end
  self.model.source = nil
  if self.checkpoint then self.checkpoint:close() end
  for _, u in ipairs(units) do
    if not u.params and not S.with_full_params then
      fail(("strategy %s: setup left unit %s without parameters, and the strategy has no " ..
            "with_full_params hook to gather them"):format(S.name or "?", u.name))
    end
  end
end

-- Activation pools for this rank's stages, and the driver: sequential, or
-- a schedule's action lists (validated and simulated before any rank blocks).
function build_driver(self, r, b)
  local S, accum = self.strategy, self.accumulate
  local B, Tlen = r.batch.micro, r.data.seq_len
  local P, V, sched, placement, stage_rank, prank = b.P, b.V, b.sched, b.placement, b.stage_rank, b.prank
  -- activations (for this rank's stages), driver; checkpointed blocks keep
  -- only their output and are recomputed in backward (driver/stage.lua)
  self.ckpt_units = stage_run.checkpoint_units(self.model, r.train.checkpoint_activations)
  if next(self.ckpt_units) and type(sched) ~= "function" and (sched == "zb_h1" or sched == "zbv" or
      sched == "one_stage_iw") then
    fail_all(("train.checkpoint_activations needs the fused backward, and schedule %s splits it into I and W; " ..
              "use 1f1b, gpipe or interleaved_1f1b, or turn checkpointing off"):format(sched))
  end
  self.pools = {}
  for i, st in ipairs(self.stages) do
    if stage_rank(st.index) == prank then
      self.pools[i] = stage_run.pool(self.model, st, B, Tlen, { checkpoint = self.ckpt_units,
                                                                host = r.train.checkpoint_host })
      -- one activation set made now: a batch that does not fit fails here,
      -- with the hint below, not in the middle of the first step
      self.pools[i]:acquire(0); self.pools[i]:release(0)
    end
  end
  self.env = { ctx = self.ctx, strategy = S, stages = self.stages, pools = self.pools,
               microbatches = accum, pp = self.pp, stage_rank = stage_rank,
               load = function(a, mb) self:load_micro(a, mb) end }
  self.driver = require "ztrain.driver.sequential"
  if sched ~= "" then
    local okl, lists = pcall(schedules.resolve, sched, { stages = #self.stages, microbatches = accum,
                                                         ranks = P, chunks = V, placement = placement,
                                                         stage_rank = stage_rank, tied = true })
    if not okl then fail_all(errors.message(lists)) end
    if P > 1 then
      -- every rank's list simulated together before any rank blocks: a
      -- schedule whose sends and receives cross is refused, naming them
      local sim = require("ztrain.pipeline.simulate").run(lists, { posted = true })
      if not sim.ok then
        local what = type(sched) == "string" and ("schedule " .. sched) or "the recipe's schedule"
        fail_all(what .. " would " .. tostring(sim.deadlock) .. "; reorder its sends and receives")
      end
    end
    if lists.async then
      -- PipeDream: each stage updates on its own, after every micro-batch
      if r.optim.clip > 0 then
        fail_all(("schedule %s updates each stage after every micro-batch, on its own: clipping by the " ..
                  "global norm needs every stage's gradient at once; set optim.clip = 0")
                 :format(type(sched) == "string" and sched or "(async)"))
      end
      if V > 1 then fail_all("an asynchronous schedule updates a rank's one stage after each micro-batch: " ..
                             "set pipeline.chunks = 1") end
      self.env.async = true
    end
    self.env.lists = lists
    self.driver = require "ztrain.driver.schedule"
  end
  self.xbuf = ffi.new("int32_t[?]", B * Tlen)
  self.ybuf = ffi.new("int32_t[?]", B * Tlen)
  self.step = 0
end

-- activation_report() -> { checkpointed_blocks, per_set, per_set_without }:
-- the bytes one micro-batch's activation set of this rank's stages holds,
-- with and without activation checkpointing (train.checkpoint_activations).
function Trainer:activation_report()
  local Acts = require "ztrain.nn.activations"
  local B, Tlen = self.recipe.batch.micro, self.recipe.data.seq_len
  local with, without, n = 0, 0, 0
  for i, st in ipairs(self.stages) do
    if self.pools and self.pools[i] then
      local l16 = self.model.gemm16
      with = with + Acts.set_bytes(self.cfg, B, Tlen, st.units, self.ckpt_units,
                                   self.recipe.train.checkpoint_host, l16)
      without = without + Acts.set_bytes(self.cfg, B, Tlen, st.units, {}, nil, l16)
      for _, u in ipairs(st.units) do if self.ckpt_units[u.index] then n = n + 1 end end
    end
  end
  return { checkpointed_blocks = n, per_set = with, per_set_without = without }
end

-- pipeline.split = "time": world rank 0 times each kind of unit at this
-- micro-batch and tells every rank (the split must be the same on all).
function Trainer:measure_units(B, Tlen)
  local T = require "ztrain.tensor"
  local box = T.new({ 3 }, { dtype = "f32", tier = "host", category = "other" })
  local ok, err = pcall(function()
    if self.rank == 0 then
      local t = pipeline_stages.measure(self.cfg, B, Tlen)
      box:write(ffi.new("float[3]", { t.embed, t.block, t.head }))
    end
    if self.world_size > 1 then self.world:broadcast(box, 0) end
  end)
  local v = ok and box:totable() or nil
  box:free()
  if not ok then error(err, 0) end
  return { embed = v[1], block = v[2], head = v[3] }
end

-- The model-state check, for strategies and drivers the planner does not
-- predict (a user's strategy, pipelines): state per rank vs available memory.
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
  if avail and limit == 0 and need * local_ranks > avail then
    fail(("%s with %s needs %s of model state per rank (%d rank(s) on this machine), but only %s " ..
          "of memory is available: use a smaller model.size, zero3 with more ranks, or set " ..
          "device.memory_limit to try anyway"):format(self.cfg.name, S.name, memory.format(need),
          local_ranks, memory.format(avail)))
  end
end

-- Refuse early (with numbers) a run that cannot fit in device.memory_limit
-- or this machine's available memory, instead of being killed by the OOM
-- killer half-way through: the memory planner's prediction (plan.lua) of
-- model state, activations and working buffers.
function Trainer:check_fits()
  local plan = require "ztrain.plan"
  local ok, msg = pcall(plan.preflight, { recipe = self.recipe, strategy = self.strategy, cfg = self.cfg,
                                          nproc = self.dp.size, local_ranks = host.local_ranks() })
  -- a prediction that failed (a bug in the planner) must not stop a run
  -- that may fit: the runtime's own limit still guards it
  if not ok then msg = nil end
  if msg == false then return self:check_model_state() end
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

require("ztrain.whole_model")(Trainer)

-- Free everything the run allocated; safe after a build that failed
-- part-way (only what exists is freed), and twice.
function Trainer:free()
  if self.model then self.model.source = nil end
  if self.env then require("ztrain.driver.schedule").free_stash(self.env) end
  if self.env and self.env.ledger then self.env.ledger:free(); self.env.ledger = nil end
  for _, p in pairs(self.pools or {}) do p:free() end
  self.pools = nil
  if self.setup_called and self.strategy and self.strategy.free then self.strategy.free(self.ctx) end
  if self.ctx and self.ctx.precision then self.ctx.precision:free(); self.ctx.precision = nil end
  if self.ctx and self.ctx.mm then self.ctx.mm.free(); self.ctx.mm = nil end
  self.setup_called = nil
  if self.tied then self.tied:free(); self.tied = nil end
  if self.model then self.model:free(); self.model = nil end
  if self.groups then groups.free(self.groups); self.groups = nil end
end

return M
