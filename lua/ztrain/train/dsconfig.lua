-- ztrain.train.dsconfig: a DeepSpeed config (ds_config_*.json) read as ztrain
-- recipe keys. `ztrain RECIPE --ds-config FILE` applies them over the
-- recipe (key=value arguments still win); `ztrain ds-convert FILE` prints
-- them as a recipe.
--
-- Every key of the file is either mapped, or named on a line of its own:
--  * a key that would change the math (a static loss scale, a logarithmic
--    warm-up, an optimizer or scheduler ztrain does not have, reductions in
--    16 bits ...) refuses the file: training under it would not be the run
--    the file describes;
--  * a tuning knob (bucket sizes, pinned memory, monitors ...) is ignored
--    with a line saying so: ztrain decides those itself (per-unit buckets,
--    its own staging) and the numbers do not change.
-- The map is documented in docs/recipes.md ("DeepSpeed configs").
local recipe = require "ztrain.train.recipe"
local dsfile = require "ztrain.train.dsconfig_file"
local V = require "ztrain.train.dsconfig_value"
local refuse, typed, text, num, check = V.refuse, V.typed, V.text, V.num, V.check
local number, boolean, object, str = V.number, V.boolean, V.object, V.str

local M = {}

-- read(path) -> the decoded JSON table (dsconfig_file.lua: one line
-- naming the file for anything that is not a config's JSON object)
M.read = dsfile.read

-- The conversion's state: keys in order ({ key, value }), lines for
-- ignored keys.
local function new_out()
  local out = { keys = {}, notes = {}, set = {}, filled = {} }
  -- a key set twice (the optimizer's lr, then the scheduler's peak) keeps
  -- its first place and the last value, as DeepSpeed's scheduler wins.
  -- from: the file's key v came from, checked against k's range (nil: v is
  -- a constant of the conversion)
  function out.put(k, v, from)
    if from then check(k, v, from) end
    if out.set[k] == nil then out.keys[#out.keys + 1] = { k, v }
    else for _, kv in ipairs(out.keys) do if kv[1] == k then kv[2] = v end end end
    out.set[k] = v
  end
  function out.ignore(path, why)
    out.notes[#out.notes + 1] = ("ds-config: %s is not supported (ignored%s)"):format(path, why and ("; " .. why) or "")
  end
  return out
end

-- ignore every key of block t except those in `known`, each on its line
local function ignore_rest(out, t, prefix, known, why)
  local keys = {}
  for k in pairs(t) do if not known[k] then keys[#keys + 1] = k end end
  table.sort(keys)
  for _, k in ipairs(keys) do out.ignore(prefix .. k, why and why[k]) end
end

---------------------------------------------------------------------------
-- "auto" values, filled from the recipe where Hugging Face's Trainer fills them from its
-- TrainingArguments (transformers' HfTrainerDeepSpeedConfig.trainer_config_process/_finalize):
-- the key is left out, so the recipe's value stands, named on a line; others are refused.
local AUTO = {
  { "train_micro_batch_size_per_gpu", "batch.micro" }, { "gradient_accumulation_steps", "batch.accumulate" },
  { "train_batch_size", "batch.global (ranks x micro x accumulate)" }, { "gradient_clipping", "optim.clip" },
  { "optimizer.params.lr", "optim.lr" }, { "optimizer.params.betas", "optim.betas" },
  { "optimizer.params.eps", "optim.eps" }, { "optimizer.params.weight_decay", "optim.weight_decay" },
  { "scheduler.params.warmup_min_lr", "warm-up start, 0" }, { "scheduler.params.warmup_max_lr", "optim.lr" },
  { "scheduler.params.warmup_num_steps", "lr.warmup" }, { "scheduler.params.total_num_steps", "train.steps" },
  { "fp16.enabled", "precision" }, { "bf16.enabled", "precision" }, { "amp.enabled", "false: no apex amp" },
}

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = type(v) == "table" and copy(v) or v end
  return c
end

-- fill_auto(cfg, out) -> a copy of cfg without the "auto" values AUTO fills
-- (out.filled[path] = true for each)
local function fill_auto(cfg, out)
  cfg = copy(cfg)
  for _, pf in ipairs(AUTO) do
    local t, last = cfg, pf[1]:match("[^.]+$")
    for part in pf[1]:gmatch("([^.]+)%.") do t = type(t) == "table" and t[part] or nil end
    if type(t) == "table" and t[last] == "auto" then
      t[last], out.filled[pf[1]] = nil, true
      out.notes[#out.notes + 1] = ('ds-config: %s is "auto": the recipe\'s %s'):format(pf[1], pf[2])
    end
  end
  return cfg
end

---------------------------------------------------------------------------
-- zero_optimization: the strategy and where offloaded state lives.
local TIER = { none = "none", cpu = "host", nvme = "nvme" }
local ZERO_KNOBS = {   -- tuning knobs: ztrain buckets and gathers per unit, overlaps always
  reduce_bucket_size = "gradients are reduced per unit", allgather_bucket_size = "parameters are gathered per unit",
  stage3_prefetch_bucket_size = "zero3 prefetches the next unit (offload.prefetch with offloaded parameters)",
  stage3_param_persistence_threshold = "no parameter stays gathered", stage3_max_live_parameters = "units are freed after use",
  stage3_max_reuse_distance = "units are freed after use", sub_group_size = "the optimizer steps per unit in chunks of offload.staging",
  contiguous_gradients = "gradients live in one flat buffer per unit", allgather_partitions = nil, reduce_scatter = nil,
  stage3_gather_16bit_weights_on_model_save = "checkpoints hold fp32 weights", round_robin_gradients = nil,
  elastic_checkpoint = "checkpoints reshard to any world size", ignore_unused_parameters = nil, load_from_fp32_weights = nil,
}

local function offload_tier(out, z, key)
  local o = object(z, key, "zero_optimization." .. key)
  if o == nil then return "none" end
  local dev = str(o, "device", ("zero_optimization.%s.device"):format(key)) or "none"
  local tier = TIER[dev]
  if not tier then refuse('zero_optimization.%s.device must be "none", "cpu" or "nvme", got %q', key, tostring(dev)) end
  local p = ("zero_optimization.%s."):format(key)
  local path = str(o, "nvme_path", p .. "nvme_path")
  if path and tier == "nvme" then
    if out.set["offload.nvme_path"] and out.set["offload.nvme_path"] ~= path then
      out.ignore(p .. "nvme_path", "the optimizer's nvme_path " .. out.set["offload.nvme_path"] .. " serves both")
    else
      out.put("offload.nvme_path", path, p .. "nvme_path")
    end
  end
  ignore_rest(out, o, p, { device = true, nvme_path = true },
              { pin_memory = "host buffers are ztrain's staging (offload.staging)", buffer_count = "see offload.staging",
                buffer_size = "see offload.staging", max_in_cpu = nil, fast_init = nil, ratio = nil })
  return tier
end

-- strategy_name(stage, otier, ptier) -> a strategy name recipes know
local function strategy_name(stage, otier, ptier)
  if stage == 0 then return "dp" end
  if otier == "none" and ptier == "none" then return "zero" .. stage end
  if stage < 3 and ptier ~= "none" then
    refuse("zero_optimization.offload_param needs stage 3 (stages 1 and 2 keep full parameters on the device)")
  end
  if stage < 3 and otier == "host" then return "zero" .. stage .. "_offload" end
  if stage == 3 and otier == "host" and ptier == "host" then return "zero3_offload" end
  if stage == 3 and otier == "nvme" and ptier == "nvme" then return "zero3_infinity" end
  refuse("stage %d with offload_optimizer on %s and offload_param on %s has no strategy name: write a recipe " ..
         "(ztrain ds-convert FILE prints one with zt.strategy.zero{...})", stage, otier, ptier)
end

local function zero(out, cfg)
  local z = object(cfg, "zero_optimization", "zero_optimization")
  if z == nil then return end
  local stage = number(z, "stage", "zero_optimization.stage") or 0
  if stage ~= 0 and stage ~= 1 and stage ~= 2 and stage ~= 3 then
    refuse("zero_optimization.stage must be 0, 1, 2 or 3, got %s", tostring(stage))
  end
  local otier = offload_tier(out, z, "offload_optimizer")
  local ptier = offload_tier(out, z, "offload_param")
  out.zero = { stage = stage, offload_optimizer = otier, offload_params = ptier }
  local ok, name = pcall(strategy_name, stage, otier, ptier)
  if ok then out.put("strategy", name) elseif not out.lenient then error(name, 0) end
  if boolean(z, "overlap_comm", "zero_optimization.overlap_comm") == false then
    out.ignore("zero_optimization.overlap_comm = false", "ztrain always overlaps reductions with backward")
  end
  local known = { stage = true, offload_optimizer = true, offload_param = true, overlap_comm = true }
  ignore_rest(out, z, "zero_optimization.", known, ZERO_KNOBS)
end

---------------------------------------------------------------------------
-- fp16 / bf16: precision and the dynamic loss scale.
local function precision(out, cfg)
  local f, b = object(cfg, "fp16", "fp16"), object(cfg, "bf16", "bf16")
  local fon = f and boolean(f, "enabled", "fp16.enabled") == true
  local bon = b and boolean(b, "enabled", "bf16.enabled") == true
  if fon and bon then refuse("fp16.enabled and bf16.enabled are both true; choose one") end
  if bon then out.put("precision", "bf16") end
  if b then ignore_rest(out, b, "bf16.", { enabled = true }) end
  if not f then return end
  if fon then out.put("precision", "fp16") end
  local ls = number(f, "loss_scale", "fp16.loss_scale")
  if fon and ls and ls ~= 0 then
    refuse("fp16.loss_scale = %s is a static loss scale; ztrain scales dynamically (set it to 0)", tostring(ls))
  end
  for _, k in ipairs({ "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale" }) do
    local v = number(f, k, "fp16." .. k)
    if v then out.put("fp16." .. k, v, "fp16." .. k) end
  end
  for _, k in ipairs({ "consecutive_hysteresis", "auto_cast" }) do
    if boolean(f, k, "fp16." .. k) == true then
      refuse("fp16.%s = true changes the loss scaling or casts; ztrain does not have it (set it to false)", k)
    end
  end
  ignore_rest(out, f, "fp16.", { enabled = true, loss_scale = true, initial_scale_power = true,
                                 loss_scale_window = true, hysteresis = true, min_loss_scale = true,
                                 consecutive_hysteresis = true, auto_cast = true })
end

---------------------------------------------------------------------------
-- Batch sizes, completed and checked as DeepSpeed does
-- (train_batch_size = micro x accumulation x world size).
local function whole(n, what)
  if n ~= math.floor(n) or n < 1 then refuse("%s is not a whole number >= 1 (%s)", what, tostring(n)) end
  return n
end

local function batch(out, cfg, world)
  local tbs = number(cfg, "train_batch_size", "train_batch_size")
  local mb = number(cfg, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu")
  local gas = number(cfg, "gradient_accumulation_steps", "gradient_accumulation_steps")
  -- each in its recipe key's range before any arithmetic (1e300 has no %d)
  if tbs then check("batch.global", tbs, "train_batch_size") end
  if mb then check("batch.micro", mb, "train_micro_batch_size_per_gpu") end
  if gas then check("batch.accumulate", gas, "gradient_accumulation_steps") end
  if out.filled.train_micro_batch_size_per_gpu or out.filled.gradient_accumulation_steps then
    -- the recipe's micro-batch or accumulation stands; the run checks the global batch against it
    if mb then out.put("batch.micro", whole(mb, "train_micro_batch_size_per_gpu")) end
    if gas then out.put("batch.accumulate", whole(gas, "gradient_accumulation_steps")) end
    if tbs then out.put("batch.global", whole(tbs, "train_batch_size")) end
    return
  end
  if tbs and mb and gas then
    if tbs ~= mb * gas * world then
      refuse("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * " ..
             "gradient_acc_step * world_size: %d != %d * %d * %d (DeepSpeed's check; the world size is " ..
             "--nproc or launch.nproc)", tbs, mb, gas, world)
    end
  elseif tbs and mb then gas = whole(tbs / (mb * world), ("train_batch_size %d / (micro %d x world size %d)"):format(tbs, mb, world))
  elseif tbs and gas then mb = whole(tbs / (gas * world), ("train_batch_size %d / (accumulation %d x world size %d)"):format(tbs, gas, world))
  elseif mb and gas then tbs = mb * gas * world
  elseif tbs then gas, mb = 1, whole(tbs / world, ("train_batch_size %d / world size %d"):format(tbs, world))
  elseif mb then gas, tbs = 1, mb * world
  elseif gas then out.put("batch.accumulate", whole(gas, "gradient_accumulation_steps")); return
  else return end
  out.put("batch.micro", whole(mb, "train_micro_batch_size_per_gpu"))
  out.put("batch.accumulate", whole(gas, "gradient_accumulation_steps"))
  out.put("batch.global", tbs, "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size")
end

---------------------------------------------------------------------------
-- optimizer: AdamW (and Adam, which DeepSpeed runs as AdamW unless
-- adam_w_mode is false).
local function optimizer(out, cfg)
  local o = object(cfg, "optimizer", "optimizer")
  if o == nil then return end
  local kind = str(o, "type", "optimizer.type") or ""
  if kind:lower() ~= "adamw" and kind:lower() ~= "adam" then
    refuse("optimizer.type %q is not supported: ztrain trains with AdamW (type AdamW or Adam)", kind)
  end
  local p = object(o, "params", "optimizer.params") or {}
  if boolean(p, "adam_w_mode", "optimizer.params.adam_w_mode") == false then
    refuse("optimizer.params.adam_w_mode = false is Adam with L2 regularisation; ztrain has AdamW (decoupled decay)")
  end
  if boolean(p, "amsgrad", "optimizer.params.amsgrad") == true then refuse("optimizer.params.amsgrad = true is not supported") end
  local lr = number(p, "lr", "optimizer.params.lr")
  if lr then out.put("optim.lr", lr, "optimizer.params.lr") end
  local betas = typed(p, "betas", "optimizer.params.betas", "array")
  if betas then
    if #betas ~= 2 or type(betas[1]) ~= "number" or type(betas[2]) ~= "number" then
      refuse("optimizer.params.betas must be an array of two numbers, like [0.9, 0.999]")
    end
    out.put("optim.betas", { betas[1], betas[2] }, "optimizer.params.betas")
  end
  local eps = number(p, "eps", "optimizer.params.eps")
  if eps then out.put("optim.eps", eps, "optimizer.params.eps") end
  local wd = number(p, "weight_decay", "optimizer.params.weight_decay")
  if wd then out.put("optim.weight_decay", wd, "optimizer.params.weight_decay") end
  ignore_rest(out, o, "optimizer.", { type = true, params = true })
  ignore_rest(out, p, "optimizer.params.", { lr = true, betas = true, eps = true, weight_decay = true,
                                            adam_w_mode = true, amsgrad = true },
              { torch_adam = "one AdamW kernel", bias_correction = nil })
end

---------------------------------------------------------------------------
-- scheduler: WarmupLR, WarmupDecayLR, WarmupCosineLR onto lr.* (ztrain's
-- warm-up is linear from 0; its decay ends at the last step).
local function warmup(out, p, path)
  local wt = str(p, "warmup_type", path .. "warmup_type") or "log"
  if wt ~= "linear" then
    refuse('%swarmup_type is %q (DeepSpeed\'s default is "log"); ztrain warms up linearly: set "linear"', path, wt)
  end
  if out.filled[path .. "warmup_num_steps"] then return end
  out.put("lr.warmup", number(p, "warmup_num_steps", path .. "warmup_num_steps") or 1000, path .. "warmup_num_steps")
end

local function scheduler(out, cfg)
  local sch = object(cfg, "scheduler", "scheduler")
  if sch == nil then return end
  local kind = str(sch, "type", "scheduler.type") or ""
  local p, path = object(sch, "params", "scheduler.params") or {}, "scheduler.params."
  local known = { warmup_type = true, warmup_num_steps = true }
  if kind == "WarmupLR" or kind == "WarmupDecayLR" then
    local min = number(p, "warmup_min_lr", path .. "warmup_min_lr") or 0
    if min ~= 0 then refuse("%swarmup_min_lr = %s: ztrain's warm-up starts from 0", path, tostring(min)) end
    if not out.filled[path .. "warmup_max_lr"] then
      out.put("optim.lr", number(p, "warmup_max_lr", path .. "warmup_max_lr") or 0.001, path .. "warmup_max_lr")
    end
    warmup(out, p, path)
    known.warmup_min_lr, known.warmup_max_lr = true, true
    if kind == "WarmupLR" then out.put("lr.schedule", "constant")
    else
      local total = number(p, "total_num_steps", path .. "total_num_steps")
      if not (total or out.filled[path .. "total_num_steps"]) then refuse("%stotal_num_steps is needed by WarmupDecayLR", path) end
      out.put("lr.schedule", "linear"); out.put("lr.min_ratio", 0)
      if total then out.put("train.steps", total, path .. "total_num_steps") end
      known.total_num_steps = true
    end
  elseif kind == "WarmupCosineLR" then
    local wmin = number(p, "warmup_min_ratio", path .. "warmup_min_ratio") or 0
    if wmin ~= 0 then refuse("%swarmup_min_ratio = %s: ztrain's warm-up starts from 0", path, tostring(wmin)) end
    local total = number(p, "total_num_steps", path .. "total_num_steps")
    if not (total or out.filled[path .. "total_num_steps"]) then refuse("%stotal_num_steps is needed by WarmupCosineLR", path) end
    warmup(out, p, path)
    out.put("lr.schedule", "cosine")
    out.put("lr.min_ratio", number(p, "cos_min_ratio", path .. "cos_min_ratio") or 0.0001, path .. "cos_min_ratio")
    if total then out.put("train.steps", total, path .. "total_num_steps") end
    known.warmup_min_ratio, known.total_num_steps, known.cos_min_ratio = true, true, true
  else
    refuse("scheduler.type %q is not supported (WarmupLR, WarmupDecayLR, WarmupCosineLR)", kind)
  end
  ignore_rest(out, sch, "scheduler.", { type = true, params = true })
  ignore_rest(out, p, path, known, { last_batch_iteration = "resume restores the step" })
end

---------------------------------------------------------------------------
-- The rest of the top level.
local TOP_WHY = {
  activation_checkpointing = "ztrain checkpoints blocks with train.checkpoint_activations",
  wall_clock_breakdown = "summary.json and metrics.jsonl time every step",
  flops_profiler = nil, comms_logger = nil, memory_breakdown = "summary.json has memory by tier and category",
  zero_allow_untested_optimizer = nil, dump_state = nil, checkpoint = "train.ckpt_every",
}

-- keys that change the math when set: refused unless at their neutral value
local function refuse_math(cfg)
  local function enabled(k)
    local b = object(cfg, k, k)
    return b ~= nil and boolean(b, "enabled", k .. ".enabled") == true
  end
  for _, k in ipairs({ "amp", "curriculum_learning", "data_efficiency", "compression_training", "sparse_attention" }) do
    if enabled(k) or (k == "sparse_attention" or k == "compression_training") and cfg[k] ~= nil then
      refuse("%s changes what is trained; ztrain does not have it (remove the block)", k)
    end
  end
  if boolean(cfg, "prescale_gradients", "prescale_gradients") == true then
    refuse("prescale_gradients = true divides before the reduction; ztrain sums in rank order, then averages")
  end
  local f = number(cfg, "gradient_predivide_factor", "gradient_predivide_factor")
  if f and f ~= 1 then refuse("gradient_predivide_factor = %s is not supported (1)", tostring(f)) end
  local cdt = str(cfg, "communication_data_type", "communication_data_type")
  if cdt and cdt ~= "fp32" then
    refuse("communication_data_type = %q: ztrain reduces gradients in fp32 (remove the key)", tostring(cdt))
  end
end

local HANDLED = { zero_optimization = true, fp16 = true, bf16 = true, train_batch_size = true,
                  train_micro_batch_size_per_gpu = true, gradient_accumulation_steps = true, optimizer = true,
                  scheduler = true, gradient_clipping = true, steps_per_print = true, aio = true, amp = true,
                  curriculum_learning = true, data_efficiency = true, compression_training = true,
                  sparse_attention = true, prescale_gradients = true, gradient_predivide_factor = true,
                  communication_data_type = true, tensorboard = true, csv_monitor = true, wandb = true }

-- The monitors: tensorboard and csv_monitor onto report.tensorboard and report.csv
-- (under OUTPUT_PATH/JOB_NAME as DeepSpeed writes; no output_path: inside out=);
-- wandb refused, naming both (offline) alternatives.
local MONITORS = { { "tensorboard", "report.tensorboard", "" }, { "csv_monitor", "report.csv", "/metrics.csv" } }
local function monitors(out, cfg)
  local w = object(cfg, "wandb", "wandb")
  if w and boolean(w, "enabled", "wandb.enabled") == true then
    refuse("wandb.enabled = true: ztrain does not send runs to Weights & Biases; log offline instead with " ..
           "report.tensorboard=DIR (TensorBoard event files) or report.csv=PATH (a CSV file), and set " ..
           "wandb.enabled to false or remove the block")
  end
  for _, m in ipairs(MONITORS) do
    local b = object(cfg, m[1], m[1])
    if b and boolean(b, "enabled", m[1] .. ".enabled") == true then
      local dir = str(b, "output_path", m[1] .. ".output_path") or ""
      local job = str(b, "job_name", m[1] .. ".job_name") or "DeepSpeedJobName"
      out.put(m[2], dir == "" and true or (dir:gsub("/+$", "") .. "/" .. job .. m[3]))
    end
    if b then ignore_rest(out, b, m[1] .. ".", { enabled = true, output_path = true, job_name = true }) end
  end
end

local function aio(out, cfg)
  local a = object(cfg, "aio", "aio")
  if a == nil then return end
  local bs = number(a, "block_size", "aio.block_size")
  if bs then out.put("offload.block_size", bs, "aio.block_size") end
  local qd = number(a, "queue_depth", "aio.queue_depth")
  if qd then out.put("offload.queue_depth", qd, "aio.queue_depth") end
  ignore_rest(out, a, "aio.", { block_size = true, queue_depth = true },
              { thread_count = "libuv's thread pool", single_submit = nil, overlap_events = nil })
end

-- convert(cfg, opts) -> { keys = { { "recipe.key", value } ... }, notes =
-- { "ds-config: ... is not supported (ignored; ...)" ... }, zero = {...} }.
-- opts.world: the world size the batch sizes are checked against (1);
-- opts.lenient: a ZeRO combination without a strategy name is left in
-- .zero instead of refused (ds-convert writes it as an object).
function M.convert(cfg, opts)
  opts = opts or {}
  local out = new_out()
  out.lenient = opts.lenient
  cfg = fill_auto(cfg, out)
  refuse_math(cfg)
  zero(out, cfg)
  precision(out, cfg)
  batch(out, cfg, opts.world or 1)
  optimizer(out, cfg)
  scheduler(out, cfg)
  local clip = number(cfg, "gradient_clipping", "gradient_clipping")
  if clip then out.put("optim.clip", clip, "gradient_clipping") end
  local spp = number(cfg, "steps_per_print", "steps_per_print")
  if spp then out.put("train.log_every", spp, "steps_per_print") end
  aio(out, cfg)
  monitors(out, cfg)
  ignore_rest(out, cfg, "", HANDLED, TOP_WHY)
  return out
end

-- overrides(path, world) -> { "key=value" ... }, notes: what --ds-config
-- adds before the command line's own key=value arguments.
function M.overrides(path, world)
  local out = M.convert(M.read(path), { world = world })
  local list = {}
  for _, kv in ipairs(out.keys) do list[#list + 1] = kv[1] .. "=" .. text(kv[2]) end
  return list, out.notes
end

-- recipe_text(path, world) -> Lua source of a recipe with the file's keys
-- (ztrain ds-convert): the notes as comments at the top.
function M.recipe_text(path, world)
  local out = M.convert(M.read(path), { world = world, lenient = true })
  local lines = { ("-- converted from %s by ztrain ds-convert (world size %d)"):format(path, world or 1) }
  for _, n in ipairs(out.notes) do lines[#lines + 1] = "-- " .. n end
  lines[#lines + 1] = 'local zt = require "ztrain"'
  lines[#lines + 1] = "return {"
  local sections, order = {}, {}
  for _, kv in ipairs(out.keys) do
    local sec, key = kv[1]:match("^([^.]+)%.(.+)$")
    if sec then
      if not sections[sec] then sections[sec] = {}; order[#order + 1] = sec end
      local v = kv[2]
      local lit = type(v) == "table" and ("{ %s, %s }"):format(num(v[1]), num(v[2])) or
                  type(v) == "string" and ("%q"):format(v) or text(v)
      table.insert(sections[sec], ("%s = %s"):format(key, lit))
    elseif kv[1] == "strategy" then
      lines[#lines + 1] = ("  strategy = %q,"):format(kv[2])
    else
      lines[#lines + 1] = ("  %s = %q,"):format(kv[1], kv[2])
    end
  end
  if out.zero and not out.set.strategy then
    local z = out.zero
    lines[#lines + 1] = ('  strategy = zt.strategy.zero { stage = %d, offload_optimizer = %q, offload_params = %q },')
                        :format(z.stage, z.offload_optimizer, z.offload_params)
  end
  for _, sec in ipairs(order) do
    lines[#lines + 1] = ("  %s = { %s },"):format(sec, table.concat(sections[sec], ", "))
  end
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n") .. "\n"
end

-- world_size(nproc, recipe_path, overrides) -> the world a --ds-config's
-- batch sizes are checked against: --nproc, else the launcher's (under
-- mpirun or srun), else the recipe's launch.nproc, else 1.
function M.world_size(nproc, recipe_path, overrides)
  if nproc then return nproc end
  for _, v in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS" }) do
    local n = tonumber(os.getenv(v) or "")
    if n then return n end
  end
  local r = recipe_path and recipe.load(recipe_path, overrides)
  return r and r.launch.nproc > 0 and r.launch.nproc or 1
end

-- say_notes(notes): the ignored keys, once per job (the launching process,
-- or rank 0 under a launcher), on stderr.
function M.say_notes(notes)
  local rank = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMI_RANK") or os.getenv("SLURM_PROCID") or "")
  -- ranks that `ztrain --nproc` started (ZTRAIN_COMM=mpi): it said them
  if rank and (rank ~= 0 or os.getenv("ZTRAIN_COMM") == "mpi") then return end
  for _, n in ipairs(notes) do io.stderr:write(n, "\n") end
end

return M
