-- ztrain.train.trainer_build: how the trainer builds a run from a resolved recipe,
-- in phases, each leaving on the trainer what the next needs: the device,
-- the groups and the recipe every rank agrees on (setup_device), the
-- tokenizer, dataset and loaders (build_data), the model, optimizer and
-- learning rate (build_model), the pipeline stages this rank holds
-- (plan_stages), the strategy's context, precision and setup
-- (build_strategy), the activation pools and the driver (build_driver).
-- trainer.new calls build and frees what it left when it fails;
-- vocab_size, open_checkpoint and measure_units are also the trainer's
-- methods.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local C, check, check_key = zffi.C, zffi.check, zffi.check_key
local memory = require "ztrain.core.memory"
local family = require "ztrain.model.family"
local hf = require "ztrain.model.hf"
local adamw = require "ztrain.model.adamw"
local lr = require "ztrain.model.lr"
local precision = require "ztrain.model.precision"
local data = require "ztrain.model.data"
local T = require "ztrain.core.tensor"
local strategy = require "ztrain.parallel.strategy"
local schedules = require "ztrain.parallel.schedule.registry"
local pipe = require "ztrain.parallel.schedule.library"
local simulate = require "ztrain.parallel.schedule.simulate"
local sets = require "ztrain.parallel.schedule.sets"
local nccl_order = require "ztrain.parallel.schedule.nccl_order"
local links = require "ztrain.parallel.driver.links"
local stage_run = require "ztrain.parallel.driver.stage"
local sequential = require "ztrain.parallel.driver.sequential"
local schedule_driver = require "ztrain.parallel.driver.schedule"
local groups = require "ztrain.parallel.groups"
local pipeline_stages = require "ztrain.parallel.schedule.stages"
local world_checks = require "ztrain.train.world_checks"
local errors = require "ztrain.core.errors"
local host = require "ztrain.util.host"
local digest = require "ztrain.core.digest"
local recipe_mod = require "ztrain.train.recipe"
local fs = require "ztrain.util.fs"

local M = {}

local function fail(msg) error(msg, 0) end
-- for errors that follow from the resolved recipe alone: every rank raises them
local function fail_all(msg) error(errors.all_ranks(msg), 0) end
local agree = errors.agree

-- The model's vocabulary: a checkpoint's, model.vocab_size, or the tokenizer's.
function M.vocab_size(self, r)
  if self.checkpoint then return self.checkpoint.cfg.V end
  return r.model.vocab_size > 0 and r.model.vocab_size or self.tokenizer.vocab_size
end

-- model.from = "hf:DIR": open and check the checkpoint on every rank
-- before anything is built (its config sets the model's shape).
function M.open_checkpoint(self, r)
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
    local ok, derr = hf.check_dir(dir)
    if not ok then err = "export.hf: " .. derr end
  end
  err = agree(self.world, err)
  if err ~= "" then fail_all(err) end
end

-- pipeline.split = "time": world rank 0 times each kind of unit at this
-- micro-batch and tells every rank (the split must be the same on all).
function M.measure_units(self, B, Tlen)
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

-- The phases of a build, in order; each leaves what the next needs on self
-- (or in b, the stage plan).
local setup_device, build_data, build_model, plan_stages, build_strategy, build_driver

function M.build(self, r)
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
  -- (the runtime's messages name the call; the errors name the key)
  check_key(C.zt_device_init(r.device.backend), "device.backend=" .. r.device.backend)
  -- before the groups: groups split from an NCCL world run NCCL too
  if r.comm.backend == "nccl" then self.world:use_nccl(r.comm.deterministic, "comm.backend=nccl") end
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
  local acc, aerr = world_checks.accumulation(r, self.dp.size)
  if not acc then fail_all(aerr) end
  self.accumulate = acc
end

-- choose_tokenizer(self, r) -> the run's tokenizer. A Hugging Face model
-- (model.from = hf:DIR) that carries its tokenizer (vocab.json +
-- merges.txt, or tokenizer.json) brings it: unless data.tokenizer is named on the command
-- line, or in a recipe file that names the model too (a recipe file's
-- tokenizer was chosen for its own model), the model's is used and the run
-- says so; a named one whose vocabulary differs from the model's is refused.
local function choose_tokenizer(self, r)
  local dir = self.checkpoint and hf.dir_of(r.model.from)
  local own = dir and ((fs.exists(dir .. "/vocab.json") and fs.exists(dir .. "/merges.txt"))
                       or fs.exists(dir .. "/tokenizer.json"))
  if not own or r.data.tokenizer == "hf:" .. dir or r.data.tokenizer == "bpe:" .. dir then
    return data.tokenizer(r.data.tokenizer)
  end
  local how = recipe_mod.given(r, "data.tokenizer")
  local named = how == "override" or (how == "recipe" and recipe_mod.given(r, "model.from") == "recipe")
  local model_tok = data.tokenizer("hf:" .. dir)
  if not named then
    self.tokenizer_name = "hf:" .. dir -- what the run's exports and checkpoints name (not the recipe's)
    self.tokenizer_note = ("data.tokenizer = hf:%s, the model's own (name data.tokenizer= on the command line " ..
                           "for another)"):format(dir)
    return model_tok
  end
  local tok = data.tokenizer(r.data.tokenizer)
  if tok.vocab_size ~= model_tok.vocab_size then
    fail(("data.tokenizer = %s has %d tokens but the model %s was trained with its own tokenizer of %d " ..
          "(%s/%s): its embedding rows stand for those; use data.tokenizer=hf:%s"):format(
          tostring(r.data.tokenizer), tok.vocab_size, r.model.from, model_tok.vocab_size, dir,
          model_tok.path and "tokenizer.json" or "vocab.json", dir))
  end
  return tok
end

-- The tokenizer, the dataset and its loaders (token ids checked against
-- the model's vocabulary by the loaders).
function build_data(self, r)
  local B, Tlen = r.batch.micro, r.data.seq_len
  if r.model.from ~= "" then self:open_checkpoint(r) end
  if r.export.hf ~= "" then check_export(self, r) end

  -- data (token ids checked against the model's vocabulary by the loaders)
  local t0 = C.zt_now()
  self.tokenizer = choose_tokenizer(self, r)
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
  self.warnings = { self.tokenizer_note }
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
  self.cfg = self.checkpoint and self.checkpoint.cfg or family.config(r.model.size, { vocab_size = V })
  if Tlen > self.cfg.maxT then
    fail(("data.seq_len %d exceeds %s's context of %d; lower data.seq_len"):format(Tlen, self.cfg.name, self.cfg.maxT))
  end
  self.strategy = strategy.resolve(r.strategy)
  local S, dp = self.strategy, self.dp
  local pad = S.pad and S.pad(dp.size) or family.PAD
  self.model = family.new(self.cfg, { alloc = false, pad = pad })
  -- the attention kernels, auto resolved for this model's heads
  self.attention = precision.attention_mode(r, self.cfg)
  check_key(C.zt_device_attention(self.attention), "device.attention=" .. r.device.attention)
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
  local okl, sched, placement = pcall(schedules.layout, r)
  if not okl then fail_all(errors.message(sched)) end
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
      self.model.gemm16 = true   -- what only GEMMs read is stored bf16 (model/activations.lua)
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
  if self.tied then self.tied:connect() end
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
  self.ckpt_units = stage_run.checkpoint_units(self.model.units, r.train.checkpoint_activations)
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
  self.driver = sequential
  if sched ~= "" then
    local okl, lists = pcall(schedules.resolve, sched, { stages = #self.stages, microbatches = accum,
                                                         ranks = P, chunks = V, placement = placement,
                                                         stage_rank = stage_rank, tied = true })
    if not okl then fail_all(errors.message(lists)) end
    if P > 1 and r.comm.backend == "nccl" then
      -- NCCL pairs messages by order, not tag (world_checks asked the
      -- launcher's copy already; a job mpirun started asks here)
      local okn, nerr = nccl_order.check(lists, { tied = self.tied ~= nil })
      if not okn then
        fail_all(("schedule %s: %s"):format(type(sched) == "string" and sched or "(a function)", nerr))
      end
    end
    if P > 1 then
      -- every rank's list simulated together before any rank blocks: a
      -- schedule whose sends and receives cross is refused, naming them
      local sim = simulate.run(lists, { posted = true, tied = self.tied ~= nil })
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
    -- a communicator per boundary and direction between two ranks
    if P > 1 then
      self.env.links = links.build(self.pp, stage_rank, #self.stages)
      local one = T.new({ 1 }, { tier = self.model.tier, category = "comm" })
      local okc, cerr = pcall(links.connect, self.env.links, one)
      one:free()
      if not okc then error(cerr, 0) end
    end
    -- where the driver gives activation sets back, fixed before any rank
    -- blocks (for a long list this takes a moment: not in the first step)
    self.env.sets, self.env.sets_of = sets.plan(lists, { tied = self.tied ~= nil }), lists
    self.driver = schedule_driver
  end
  self.xbuf = ffi.new("int32_t[?]", B * Tlen)
  self.ybuf = ffi.new("int32_t[?]", B * Tlen)
  self.step = 0
end

return M
