-- ztrain.train.recipe: load a recipe file, apply key=value overrides, validate.
--
-- A recipe is a Lua file returning a table. Every key must be one of the
-- schema's (the defaults below); an unknown key is an error that names it and
-- the nearest valid key. Overrides are dotted paths: train.steps=20.
local suggest = require "ztrain.util.suggest"
local digest = require "ztrain.core.digest"
local memory = require "ztrain.core.memory"
local choices = require "ztrain.train.recipe_choices"
local fs = require "ztrain.util.fs"
local fntext = require "ztrain.train.recipe_functions"
local M = {}

-- The schema: every valid key with its default. `strategy` may also be a
-- strategy object; `out` defaults to runs/<recipe>-<time>.
M.defaults = {
  name     = "",
  -- model.from = "hf:DIR": a Hugging Face GPT-2 directory (config.json +
  -- model.safetensors) whose shape and weights replace size and seed;
  -- `model = "hf:DIR"` is short for it
  model    = { size = "gpt2-tiny", seed = 1337, vocab_size = 0, from = "" },
  -- data.tokenizer: "bpe" (the vocabulary trained on the default corpus,
  -- data/bpe/fortunes), "bytes", "bpe:DIR" or "hf:DIR" (vocab.json +
  -- merges.txt); data.cache: where tokenised corpora are kept ("" = the
  -- default, $ZTRAIN_CACHE or ~/.cache/ztrain; "off")
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat", tokenizer = "bpe",
               seq_len = 128, valid_fraction = 0.05, seed = 1337, cache = "" },
  strategy = "single",
  -- "fp32", or mixed: "bf16" / "fp16" parameters and gradients, fp32 master
  -- weights and optimizer state (fp16 with dynamic loss scaling)
  precision = "fp32",
  -- fp16's dynamic loss scaling, DeepSpeed's keys and defaults
  fp16     = { initial_scale_power = 16, loss_scale_window = 1000, hysteresis = 2, min_loss_scale = 1 },
  schedule = "",         -- "" = the sequential driver; a schedule name or function = the schedule driver
  optim    = { name = "adamw", lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8,
               weight_decay = 0.1, clip = 1.0 },
  lr       = { warmup = 20, schedule = "cosine", min_ratio = 0.1 },
  batch    = { micro = 4, accumulate = 1, global = 0 },
  -- train.ckpt_every: a checkpoint every N steps and at the end (0 = none),
  -- in train.ckpt_dir ("" = OUT/checkpoints), the newest ckpt_keep kept;
  -- train.checkpoint_activations: false, true (every block) or k (every
  -- k-th block): recompute their activations in backward, from their inputs
  -- kept on the host tier with train.checkpoint_host
  train    = { steps = 200, log_every = 10, eval_every = 50, eval_batches = 20, ckpt_every = 0,
               ckpt_keep = 2, ckpt_dir = "", checkpoint_activations = false, checkpoint_host = false },
  -- resume = "latest" (train.ckpt_dir, or OUT/checkpoints) or a checkpoint
  -- directory: continue that run's state, under any strategy and world size
  resume   = "",
  -- allow_changes: what a resume may change of the math its checkpoint's
  -- run computed ("batch", "lr", "optim", "data", "precision", "all";
  -- comma-separated): otherwise such a resume is refused, naming each change
  allow_changes = "",
  -- a sample printed at each evaluation and at the end (sample.tokens > 0)
  sample   = { prompt = "", tokens = 0, temperature = 0.8, top_k = 40, top_p = 1.0, seed = 1337 },
  -- device.bf16_gemm: with precision = "bf16", the matmuls in bf16 with fp32
  -- accumulation ("on"), or in fp32 on the stored values ("off"); "auto":
  -- on with device.backend = "cuda" (tensor cores) and where the CPU's bf16
  -- path outruns its fp32 GEMMs (AMX), else off (precision.gemm16).
  -- device.backend: "cpu", "cuda" (make CUDA=1), "fakegpu" (a test device:
  -- the CPU kernels behind memory the host cannot address, docs/gpu.md),
  -- "fakegpu-async[:SEED]" (the same, its streams run later in a seeded order)
  -- device.attention: "exact" (the fp32 kernels), "bf16" (backend cuda:
  -- tensor cores, head sizes 64 and 128; docs/gpu.md "Tensor-core
  -- attention") or "auto": bf16 where the run takes the bf16 GEMMs on the
  -- cuda device, else exact (precision.attention_mode)
  device   = { backend = "cpu", memory_limit = "0", threads = 0, bf16_gemm = "auto", attention = "auto",
               memory_fraction = 0.9 },
  -- comm.backend: "mpi" (MPI under a launcher, one local rank otherwise) or
  -- "nccl" (device.backend = "cuda": device tensors over NCCL, one GPU per
  -- rank); comm.deterministic: reductions in rank order (NCCL too), the same
  -- bits as one rank; false: NCCL's own all-reduce. comm.timeout: seconds a
  -- collective may wait for its peers before the job ends naming the ranks
  -- that did not arrive (0 = never; default $ZTRAIN_COMM_TIMEOUT or 300);
  -- comm.check: compare the ranks' collectives (operation, dtype, count,
  -- call site) before each one (default $ZTRAIN_COMM_CHECK=1, on in the test suite)
  comm     = { backend = "mpi", deterministic = true,
               timeout = tonumber(os.getenv("ZTRAIN_COMM_TIMEOUT") or "") or 300,
               check = os.getenv("ZTRAIN_COMM_CHECK") == "1" },
  -- launch.nproc: ranks `ztrain RECIPE` starts (0: the launcher's, or one;
  -- with a hostfile, one per slot); launch.hostfile: start them across the
  -- hosts of this Open MPI hostfile ("" = this machine; as --hostfile)
  launch   = { nproc = 0, hostfile = "" },
  -- pipeline: ranks per replica (stages), model chunks per rank; units split
  -- "params" (by parameter count), "time" (by measured time) or as listed;
  -- placement "" (the schedule's), "loop" (stage s on rank s % stages) or "v"
  pipeline = { stages = 1, chunks = 1, split = "params", placement = "" },
  -- where offloaded state is staged and swapped (zt.strategy.zero{offload_*})
  -- (aio_engine: "auto" = io_uring where it works, else libuv's thread pool;
  -- "uring" (an error without it) or "threads"; $ZTRAIN_AIO_ENGINE decides under auto)
  -- (block_size, queue_depth, stripes -- files a storage is striped over --: "auto" = from a
  -- short probe of nvme_path's disk, kept per device)
  offload  = { staging = "16MiB", prefetch = 2, nvme_path = "", block_size = "auto", queue_depth = "auto",
               stripes = "auto", checksum = false, aio_engine = "auto" },
  -- written at the end of a run: export.hf = DIR, the trained model as a
  -- Hugging Face GPT-2 directory ("" = none)
  export   = { hf = "" },
  -- each logged step also to tracking tools' files (rank 0; kept across
  -- resumes): report.tensorboard = DIR (TensorBoard events; true =
  -- OUT/tensorboard), report.csv = PATH (true = OUT/metrics.csv); "" = off;
  -- report.peak_tflops = the peak MFU divides by (0: the device's known
  -- peak where there is one, a CUDA card; record/throughput.lua)
  report   = { tensorboard = "", csv = "", peak_tflops = 0 },
  out      = "",
  -- replace an earlier run's outputs in `out` (--overwrite); without it
  -- such a directory is refused (resume = ... continues one instead)
  overwrite = false,
}

-- Keys whose value is a list or an opaque object, not a sub-table of keys.
local LEAF = { ["train.checkpoint_activations"] = true, ["pipeline.split"] = true, ["optim.betas"] = true, ["strategy"] = true, ["schedule"] = true, ["data.text"] = true,
               ["data.exclude"] = true, ["device.memory_limit"] = true,
               ["report.tensorboard"] = true, ["report.csv"] = true }   -- a path, true or false

local function deepcopy(t)
  if type(t) ~= "table" or getmetatable(t) or t.setup then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = deepcopy(v) end
  return c
end

-- All dotted leaf paths of the schema.
local function schema_paths()
  local out = {}
  local function walk(t, prefix)
    for k, v in pairs(t) do
      local p = prefix == "" and k or (prefix .. "." .. k)
      if type(v) == "table" and not LEAF[p] then walk(v, p) else out[#out + 1] = p end
    end
  end
  walk(M.defaults, "")
  table.sort(out)
  return out
end

-- Names users bring from other tools (PyTorch, Hugging Face, DeepSpeed,
-- nanoGPT), by section: a key in a known section is matched inside that
-- section first ("batch.size" -> batch.micro, not model.size); a bare key
-- by its last part ("lr", "max_steps" -> optim.lr, train.steps).
local SYNONYMS = {
  batch = { size = "micro", batch_size = "micro", micro_batch = "micro", micro_batch_size = "micro",
            train_micro_batch_size_per_gpu = "micro", grad_accum = "accumulate",
            gradient_accumulation_steps = "accumulate", accumulation = "accumulate",
            train_batch_size = "global", global_batch = "global" },
  optim = { learning_rate = "lr", optimizer = "name", type = "name", wd = "weight_decay",
            beta = "betas", epsilon = "eps", grad_clip = "clip", gradient_clipping = "clip",
            max_grad_norm = "clip", clip_grad_norm = "clip" },
  train = { max_steps = "steps", epochs = "steps", num_epochs = "steps", iters = "steps",
            max_iters = "steps", num_steps = "steps", train_steps = "steps",
            eval_interval = "eval_every", log_interval = "log_every", save_every = "ckpt_every",
            save_interval = "ckpt_every", gradient_checkpointing = "checkpoint_activations" },
  lr = { warmup_steps = "warmup", warmup_iters = "warmup", scheduler = "schedule", decay = "schedule",
         lr_scheduler_type = "schedule" },
  model = { name = "size", model_size = "size", type = "size", model_name_or_path = "from",
            pretrained = "from" },
  data = { block_size = "seq_len", seq_length = "seq_len", max_seq_len = "seq_len", context = "seq_len",
           context_length = "seq_len", n_ctx = "seq_len", dataset = "text", path = "text", files = "text" },
}

-- synonym(name) -> "section.key" for a bare name: a section's own key
-- first, then a synonym; sections in the order users reach for them
local SECTION_ORDER = { "optim", "train", "batch", "lr", "data", "model", "sample", "device" }
local function synonym(name)
  for _, section in ipairs(SECTION_ORDER) do
    if M.defaults[section][name] ~= nil then return section .. "." .. name end
  end
  for _, section in ipairs(SECTION_ORDER) do
    local names = SYNONYMS[section]
    if names and names[name] then return section .. "." .. names[name] end
  end
end

-- nearest("train.step") -> "train.steps"; nearest("batch.size") ->
-- "batch.micro"; nearest("lr") -> "optim.lr"
function M.nearest(path)
  local section, last = path:match("^([^.]+)%.(.+)$")
  if section and type(M.defaults[section]) == "table" and not LEAF[section] then
    -- the same section first: its synonyms, then its nearest key
    local syn = SYNONYMS[section] and SYNONYMS[section][last]
    if syn then return section .. "." .. syn end
    local keys = {}
    for _, p in ipairs(schema_paths()) do
      if p:sub(1, #section + 1) == section .. "." then keys[#keys + 1] = p:sub(#section + 2) end
    end
    local best, d = suggest.nearest(last, keys)
    -- a far match inside the section is no hint: fall through to the rest
    if best and d <= math.max(2, #last / 2) then return section .. "." .. best end
  end
  local syn = synonym(path:match("[^.]+$"))
  if syn and (not section or M.defaults[section] == nil) then return syn end
  -- a matching last component is a strong hint (e.g. "steps" -> train.steps)
  return (suggest.nearest(path, schema_paths(), function(w, p)
    return p:match("[^.]+$") == w:match("[^.]+$") and 3 or 0
  end))
end

local function unknown(path)
  return ("unknown recipe key %q; did you mean %q?"):format(path, M.nearest(path))
end

-- Check every key of r against the schema; returns nil, err on the first unknown.
-- Numeric keys whose default is "auto": a number is welcome too (an
-- override's number arrives as a string, the default being one)
local AUTO = { ["offload.queue_depth"] = true, ["offload.stripes"] = true }

local function validate(r, schema, prefix)
  for k, v in pairs(r) do
    local p = prefix == "" and tostring(k) or (prefix .. "." .. tostring(k))
    local s = schema[k]
    if s == nil then return nil, unknown(p) end
    if type(s) == "table" and not LEAF[p] then
      if type(v) ~= "table" then
        return nil, ("recipe key %q must be a table of keys, got %s"):format(p, type(v))
      end
      local ok, err = validate(v, s, p)
      if not ok then return nil, err end
    elseif not LEAF[p] and type(v) ~= type(s) and not (AUTO[p] and type(v) == "number") then
      -- the value shown when it says something (a table's address does not)
      local shown = (type(v) == "table" or type(v) == "function") and "" or (" (%s)"):format(tostring(v))
      return nil, ("recipe key %q must be a %s, got %s%s"):format(p, type(s), type(v), shown)
    end
  end
  return true
end

local function merge(dst, src, prefix)
  for k, v in pairs(src) do
    local p = prefix == "" and k or (prefix .. "." .. k)
    if type(v) == "table" and type(dst[k]) == "table" and not LEAF[p] and not getmetatable(v) then
      merge(dst[k], v, p)
    else
      dst[k] = v
    end
  end
end

local OVERRIDE_STEPS = 10000000
local OVERRIDE_SLOW = ("runs past %d Lua instructions: an override's table literal is data, not a program")
                      :format(OVERRIDE_STEPS)

-- Parse an override value: numbers, true/false, Lua table literals, else
-- string; nil, err for a literal that would not end
local function parse_value(s)
  if s == "true" then return true elseif s == "false" then return false end
  local n = tonumber(s)
  if n then return n end
  if s:match("^%s*{") then
    local f = loadstring("return " .. s)
    if f then
      -- a literal is data: read with no globals, interpreted (no JIT, so the
      -- count hook runs) and stopped after OVERRIDE_STEPS VM instructions
      -- (a value like {(function() while true do end end)()} hung the run)
      setfenv(f, {})
      jit.off(f, true)
      -- a Lua hook already set (the REPL's Ctrl-C) is put back after; a
      -- hook set from C ("external hook": a harness's own bound) cannot be,
      -- so it stays and bounds the literal itself
      local hook, mask, count = debug.gethook()
      local ours = hook == nil or type(hook) == "function"
      if ours then debug.sethook(function() error(OVERRIDE_SLOW, 0) end, "", OVERRIDE_STEPS) end
      local ok, v = pcall(f)
      if ours then
        if hook then debug.sethook(hook, mask, count) else debug.sethook() end
      end
      if ok then return v end
      if v == OVERRIDE_SLOW then return nil, OVERRIDE_SLOW end
    end
  end
  return s
end

-- apply_override(recipe, "train.steps=20") -> true | nil, err
function M.apply_override(r, arg)
  local path, value = arg:match("^([%w_%.]+)=(.*)$")
  if not path then
    return nil, ("cannot read argument %q: overrides look like key=value (e.g. train.steps=20)"):format(arg)
  end
  if path == "model" and value:match("^hf:") then path = "model.from" end   -- model=hf:DIR
  local keys = {}
  for k in path:gmatch("[^.]+") do keys[#keys + 1] = k end
  local schema, t = M.defaults, r
  for i = 1, #keys - 1 do
    local k = keys[i]
    local sub = table.concat(keys, ".", 1, i)
    if type(schema[k]) ~= "table" or LEAF[sub] then return nil, unknown(path) end
    schema = schema[k]
    if type(t[k]) ~= "table" then t[k] = {} end
    t = t[k]
  end
  local last = keys[#keys]
  if schema[last] == nil then return nil, unknown(path) end
  if type(schema[last]) == "table" and not LEAF[path] then
    local sub = {}
    for k in pairs(schema[last]) do
      if not (path == "model" and k == "from") then sub[#sub + 1] = path .. "." .. k end
    end
    table.sort(sub)
    -- model's other form: model=hf:DIR (model.from) loads a checkpoint
    local also = path == "model" and "; or model=hf:DIR to load a Hugging Face GPT-2 checkpoint" or ""
    -- lr=3e-4 is the learning rate in every other tool
    if path == "lr" then also = "; the learning rate itself is optim.lr" end
    return nil, ("%s is a table of keys; set one of them (%s)%s"):format(path, table.concat(sub, ", "), also)
  end
  local v, verr = parse_value(value)
  if verr then return nil, ("%s: %s"):format(path, verr) end
  if type(schema[last]) == "number" and type(v) ~= "number" then
    return nil, ("%s must be a number, got %q"):format(path, value)
  end
  if type(schema[last]) == "string" and type(v) == "number" then v = value end
  t[last] = v
  return true
end

-- Numeric keys: { min, max, integer }. A value outside is an error naming
-- the key, so nothing downstream sees NaN, infinities or fractional counts.
local RANGES = {
  ["model.seed"] = { 0, 2 ^ 53, true }, ["model.vocab_size"] = { 0, 2 ^ 24, true }, ["data.seq_len"] = { 1, 2 ^ 31, true },
  ["data.valid_fraction"] = { 0, 0.9 }, ["data.seed"] = { 0, 2 ^ 53, true },
  ["optim.lr"] = { 0, 1e3 }, ["optim.eps"] = { 1e-30, 1 }, ["optim.weight_decay"] = { 0, 1e3 },
  ["optim.clip"] = { 0, 1e30 }, ["lr.warmup"] = { 0, 2 ^ 31, true }, ["lr.min_ratio"] = { 0, 1 },
  ["batch.micro"] = { 1, 2 ^ 31, true }, ["batch.accumulate"] = { 1, 2 ^ 31, true },
  ["batch.global"] = { 0, 2 ^ 31, true }, ["train.steps"] = { 1, 2 ^ 40, true },
  ["train.log_every"] = { 0, 2 ^ 40, true }, ["train.eval_every"] = { 0, 2 ^ 40, true },
  ["train.eval_batches"] = { 0, 2 ^ 31, true }, ["device.threads"] = { 0, 1024, true },
  ["launch.nproc"] = { 0, 4096, true }, ["pipeline.stages"] = { 1, 4096, true },
  ["pipeline.chunks"] = { 1, 64, true }, ["offload.prefetch"] = { 1, 64, true },
  ["offload.queue_depth"] = { 1, 256, true }, ["offload.stripes"] = { 1, 8, true }, ["train.ckpt_every"] = { 0, 2 ^ 40, true },
  ["train.ckpt_keep"] = { 0, 2 ^ 20, true }, ["sample.tokens"] = { 0, 2 ^ 20, true },
  ["sample.temperature"] = { 0, 1e3 }, ["sample.top_k"] = { 0, 2 ^ 24, true }, ["sample.top_p"] = { 1e-9, 1 },
  ["comm.timeout"] = { 0, 1e9 },
  ["sample.seed"] = { 0, 2 ^ 53, true }, ["fp16.initial_scale_power"] = { 0, 127, true },
  ["fp16.loss_scale_window"] = { 1, 2 ^ 40, true }, ["fp16.hysteresis"] = { 1, 2 ^ 20, true },
  ["fp16.min_loss_scale"] = { 2 ^ -126, 2 ^ 127 },
  ["device.memory_fraction"] = { 1e-6, 1 },
}


local function check_values(r)
  for path, rng in pairs(RANGES) do
    local a, b = path:match("^([^.]+)%.(.+)$")
    local v = r[a][b]
    if AUTO[path] and type(v) == "string" and tonumber(v) then v = tonumber(v); r[a][b] = v end
    local ok = (AUTO[path] and v == "auto") or type(v) == "number" and v == v and v >= rng[1] and v <= rng[2] and
               (not rng[3] or v == math.floor(v))
    if not ok then
      return nil, ("%s must be %s in [%s, %s]%s, got %s"):format(path, rng[3] and "an integer" or "a number",
                   tostring(rng[1]), tostring(rng[2]), AUTO[path] and ' or "auto"' or "", tostring(v))
    end
  end
  return true
end

-- Where a resolved recipe's keys came from: GIVEN[r] = { [path] = "override"
-- | "recipe" } for the keys the command line or the recipe file set (not
-- the defaults). Weak: it goes with the recipe table.
local GIVEN = setmetatable({}, { __mode = "k" })

-- given(r, path) -> "override", "recipe" or nil (a default, or a copy of a
-- resolved recipe)
function M.given(r, path)
  local g = GIVEN[r]
  return g and g[path]
end

-- the dotted paths of the leaves a table sets
local function leaves(t, prefix, out)
  for k, v in pairs(t) do
    local p = prefix == "" and tostring(k) or (prefix .. "." .. tostring(k))
    if type(v) == "table" and not LEAF[p] and not getmetatable(v) then leaves(v, p, out) else out[p] = "recipe" end
  end
  return out
end

-- resolve(user_table, overrides) -> full recipe (defaults filled) | nil, err
function M.resolve(user, overrides)
  user = user or {}
  if type(user.model) == "string" then      -- model = "hf:DIR"
    local u = {}
    for k, v in pairs(user) do u[k] = v end
    u.model = { from = user.model }
    user = u
  end
  local ok, err = validate(user, M.defaults, "")
  if not ok then return nil, err end
  local r = deepcopy(M.defaults)
  merge(r, user, "")
  local given = leaves(user, "", {})
  for _, o in ipairs(overrides or {}) do
    ok, err = M.apply_override(r, o)
    if not ok then return nil, err end
    local path = o:match("^([%w_%.]+)=")
    given[(path == "model" and o:match("^model=hf:")) and "model.from" or path] = "override"
  end
  GIVEN[r] = given
  ok, err = validate(r, M.defaults, "")
  if not ok then return nil, err end
  ok, err = check_values(r)
  if not ok then return nil, err end
  -- a limit under one page is refused, not rounded down to 0 ("no limit")
  ok, err = memory.parse_limit(r.device.memory_limit)
  if not ok then return nil, "device.memory_limit: " .. err end
  ok, err = choices.check(r)
  if not ok then return nil, err end
  return r
end

-- load(path, overrides) -> recipe | nil, err
function M.load(path, overrides)
  local chunk, err = loadfile(path)
  if not chunk then
    -- a misspelt name: the nearest recipe beside it, or in recipes/
    local dir, base = path:match("^(.-)([^/]*)$")
    local hint = ""
    if not fs.exists(path) then
      local names, full = {}, {}
      for _, d in ipairs({ dir, "recipes/" }) do
        for _, p in ipairs(fs.glob(d .. "*.lua") or {}) do
          local f = p:match("[^/]*$")
          if not full[f] then names[#names + 1], full[f] = f, p end
        end
      end
      local best, d = suggest.nearest(base, names)
      if best and d <= math.max(2, #base / 4) then hint = ("; did you mean %s?"):format(full[best]) end
    end
    return nil, ("cannot load recipe %s: %s%s"):format(path, err, hint)
  end
  local ok, user = pcall(chunk)
  if not ok then return nil, ("recipe %s failed: %s"):format(path, tostring(user)) end
  if type(user) ~= "table" then
    return nil, ("recipe %s must return a table, it returned %s"):format(path, type(user))
  end
  -- reading the table runs the recipe's metamethods: what they raise is
  -- the recipe's error, said as one line
  local okr, r, rerr = pcall(M.resolve, user, overrides)
  if not okr then return nil, ("recipe %s: reading the table it returned raised: %s"):format(path, tostring(r)) end
  if not r then return nil, ("%s: %s"):format(path, rerr) end
  if r.name == "" then r.name = path:match("([^/]+)%.lua$") or path end
  r.path = path
  return r
end

-- flatten(r) -> { ["train.steps"] = "20", ... }: every leaf as text, for
-- comparing recipes key by key (strategy objects by name).
function M.flatten(r)
  local out = {}
  local function walk(t, prefix)
    for k, v in pairs(t) do
      local p = prefix == "" and tostring(k) or (prefix .. "." .. tostring(k))
      if type(v) == "table" and not LEAF[p] and not getmetatable(v) and not v.setup then walk(v, p)
      else out[p] = M.serialize(v) end
    end
  end
  walk(r, "")
  out.path = nil
  return out
end

-- A stable text form of the resolved recipe (sorted keys), for logs and hashes.
-- plain(r) -> the resolved recipe as plain data for JSON (summary.json):
-- tables as objects or arrays, a strategy object as { name, options }, a
-- function as "function at FILE:LINE", numbers that JSON cannot hold
-- (inf, nan) as strings
function M.plain(r)
  local function plain(v)
    if type(v) == "table" then
      if getmetatable(v) or v.setup then
        return { name = tostring(v.name or "object"), options = type(rawget(v, "opts")) == "table" and plain(v.opts) or nil }
      end
      local out = {}
      for k, x in pairs(v) do out[type(k) == "number" and k or tostring(k)] = plain(x) end
      return out
    elseif type(v) == "function" then
      local info = debug.getinfo(v, "S")
      return ("function at %s:%d"):format((info.source or "?"):gsub("^@", ""), info.linedefined or 0)
    elseif type(v) == "number" and (v ~= v or math.abs(v) == math.huge) then return tostring(v)
    end
    return v
  end
  return plain(r)
end

-- function_text(f) -> a function as ranks compare it (recipe_functions.lua:
-- its source location, source text and plain upvalues; never string.dump)
M.function_text = fntext.text

function M.serialize(r)
  local function ser(v)
    if type(v) == "table" then
      if getmetatable(v) or v.setup then
        -- a strategy object: its name and options (ranks must agree on both)
        local opts = type(rawget(v, "opts")) == "table" and ser(v.opts) or ""
        return ("%q"):format(tostring(v.name or "object")) .. opts
      end
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      local parts = {}
      for _, k in ipairs(keys) do parts[#parts + 1] = tostring(k) .. "=" .. ser(v[k]) end
      return "{" .. table.concat(parts, ",") .. "}"
    elseif type(v) == "string" then return ("%q"):format(v)
    elseif type(v) == "number" then return ("%.17g"):format(v)
    elseif type(v) == "function" then return M.function_text(v)
    else return tostring(v) end
  end
  return ser(r)
end

return M
