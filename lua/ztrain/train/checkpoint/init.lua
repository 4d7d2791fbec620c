-- ztrain.train.checkpoint: a run's state on disk, written by every rank at once,
-- read back by any strategy on any number of ranks.
--
-- The format (a directory ROOT/step-NNNNNNNN/ of manifest.json and one
-- rank-RRRRR.bin + rank-RRRRR.json per rank; ROOT/latest names the newest)
-- is described in checkpoint/format.lua; writing (save, collective, atomic:
-- a failure leaves the previous checkpoint and `latest` as they were) in
-- checkpoint/write.lua; reading (resolve, open: per rank, each rank reading
-- only the checksummed blocks of the ranges it holds, whatever strategy and
-- world size saved them) in checkpoint/read.lua. This module is their
-- interface and the trainer's side: save_run, resume_run, load_run, and
-- export (a checkpoint as a Hugging Face GPT-2 directory).
local errors = require "ztrain.core.errors"
local T = require "ztrain.core.tensor"
local gpt2 = require "ztrain.model.gpt2"
local llama = require "ztrain.model.llama"
local hf = require "ztrain.model.hf"
local tokenizers = require "ztrain.model.data.tokenizer"
local format = require "ztrain.train.checkpoint.format"
local write = require "ztrain.train.checkpoint.write"
local read = require "ztrain.train.checkpoint.read"
local changes = require "ztrain.train.checkpoint.changes"

local M = {}

M.FORMAT, M.VERSION, M.BLOCK = format.FORMAT, format.VERSION, format.BLOCK

-- save(args) -> path: every rank's export written (collective; checkpoint/write.lua)
M.save = write.save
-- resolve(path) -> a checkpoint's directory; open(path) -> ck (checkpoint/read.lua)
M.resolve, M.open = read.resolve, read.open

local function fail(msg) error(msg, 0) end

-- The model's units and shape, as the manifest records them.
local function model_meta(tr)
  local units = {}
  for _, u in ipairs(tr.model.units) do units[#units + 1] = { name = u.name, numel = u.numel } end
  local c = tr.cfg
  local m = { name = c.name, L = c.L, C = c.C, NH = c.NH, V = c.V, maxT = c.maxT, units = units }
  if c.family == "llama" then        -- what rebuilds a Llama-family model (export)
    m.family, m.NKV, m.F, m.eps, m.theta = c.family, c.NKV, c.F, c.eps, c.theta
    m.tied, m.qkv_bias, m.window, m.scaling, m.hf_type = c.tied, c.qkv_bias, c.window, c.scaling, c.hf_type
  end
  return m
end

-- the family of a manifest's model: recorded, or (a Llama checkpoint
-- written before the record had it) told by its size's name
local function family_of(m)
  return m.family or (llama.is_size(m.name) and "llama") or "gpt2"
end
local FAMILY_NAME = { gpt2 = "GPT-2", llama = "Llama-family" }

-- the Llama settings that change the math but not the shapes: a resume
-- that differs in one would compute another model on the same tensors
local LLAMA_MATH = { "NKV", "F", "eps", "theta", "window", "tied", "qkv_bias" }
local function llama_differences(saved, mine)
  local out = {}
  for _, k in ipairs(LLAMA_MATH) do
    if saved[k] ~= nil and saved[k] ~= mine[k] then
      out[#out + 1] = ("%s %s -> %s"):format(k, tostring(saved[k]), tostring(mine[k]))
    end
  end
  local a, b = saved.scaling or {}, mine.scaling or {}
  for _, k in ipairs({ "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" }) do
    if a[k] ~= b[k] then out[#out + 1] = ("rope scaling %s %s -> %s"):format(k, tostring(a[k]), tostring(b[k])) end
  end
  return out
end

-- the manifest's model -> a model of its shape, no buffers (export)
local function model_of(m, what)
  if family_of(m) == "llama" then
    if not m.NKV then
      fail(("%s: a Llama-family checkpoint written before its manifest recorded the model's settings (kv " ..
            "heads, MLP width, RoPE): resume it with this ztrain and save again, then export"):format(what))
    end
    local cfg = llama.custom({ name = m.name, L = m.L, C = m.C, NH = m.NH, NKV = m.NKV, F = m.F,
                               maxT = m.maxT, V = m.V, eps = m.eps, theta = m.theta, tied = m.tied,
                               qkv_bias = m.qkv_bias, window = m.window, scaling = m.scaling }, what)
    cfg.hf_type = m.hf_type
    return llama.new(cfg, { tier = "host", alloc = false })
  end
  local cfg = gpt2.custom({ name = m.name, L = m.L, C = m.C, NH = m.NH, maxT = m.maxT, V = m.V }, what)
  return gpt2.new(cfg, { tier = "host", alloc = false })
end

-- save_run(tr, root, keep[, run]) -> path: every rank's state at tr.step.
-- Collective over the world. run: the run's record up to this step, kept in
-- the manifest for the run that resumes from it ({ tokens = trained so
-- far, history = the run's segments: loop.lua }).
function M.save_run(tr, root, keep, run)
  local ex = tr:state()
  local G = tr.recipe.batch.micro * tr.accumulate * tr.dp.size
  local what = changes.of(tr)
  local ok, res = pcall(M.save, {
    world = tr.world, root = root, step = tr.step, export = ex, keep = keep,
    meta = { model = model_meta(tr), strategy = tr.strategy.name, dp = tr.dp.size,
             pp = tr.pp and tr.pp.size or 1,
             optim = { t = tr.optim.t },
             -- the next global micro-batch index of the training data, and
             -- the global batch that reached it
             data = { next_batch = tr:next_batch(), global_batch = G, seed = tr.recipe.data.seed,
                      tokenizer = tr.tokenizer_name or (type(tr.recipe.data.tokenizer) == "string" and tr.recipe.data.tokenizer or nil),
                      eot = tr.tokenizer and tr.tokenizer.eot },
             -- no random state to keep: initialisation and data order are
             -- functions of the seeds and the step
             rng = "none",
             precision = tr.recipe.precision,
             run = run,
             -- what a resume may not change (the math) and may (placement)
             math = what.math, placement = what.placement, kernels = what.kernels,
             loss_scaler = tr.ctx.loss_scaler and { scale = tr.ctx.loss_scaler.scale, good = tr.ctx.loss_scaler.good,
                                                    left = tr.ctx.loss_scaler.left,
                                                    skipped = tr.ctx.loss_scaler.skipped } or "none" },
  })
  ex.free()
  if not ok then error(res, 0) end
  return res
end

-- resume_run(tr, path): load the checkpoint at path (a checkpoint or a root
-- with `latest`) into this run, whatever strategy and world size saved it.
-- Every rank reads only its ranges. Raises a user error naming what does
-- not match (model shape, a missing shard, a corrupt block) -- on every
-- rank alike (a collective: the first failing rank's message).
function M.resume_run(tr, path)
  local ok, dir, man = pcall(M.load_run, tr, path)
  local msg = errors.agree(tr.world, ok and "" or ("rank %d: %s"):format(tr.rank, errors.message(dir)))
  if msg ~= "" then fail(errors.all_ranks(tr.world_size > 1 and msg or msg:gsub("^rank %d+: ", ""))) end
  -- the math the checkpoint's run computed (checked once every rank read
  -- its part: a damaged checkpoint says so first): another is refused
  -- unless allow_changes names it, on every rank alike (the same inputs);
  -- where things are placed may change
  local okc, notes, knotes = pcall(changes.check, man, changes.of(tr), changes.allowed(tr.recipe.allow_changes),
                                   man.step, dir)
  if not okc then fail(errors.all_ranks(errors.message(notes))) end
  man.placement_changes, man.kernel_changes = notes, knotes
  tr:finish_load()                               -- e.g. low-precision parameters from the master weights
  if tr.tied then tr.tied:sync_params() end      -- the head's replica of the embedding (a collective)
  return dir, man
end

-- load_run(tr, path) -> dir, manifest: this rank's part of resume_run.
function M.load_run(tr, path)
  local ck = M.open(path)
  local man = ck.manifest
  local ok, err = pcall(function()
    local mine = model_meta(tr)
    local saved = man.model or {}
    local sf, mf = family_of(saved), mine.family or "gpt2"
    if saved.C and sf ~= mf then
      fail(("checkpoint %s holds a %s model, this run's is %s (model.size or model=hf:DIR differ)")
           :format(ck.dir, FAMILY_NAME[sf], FAMILY_NAME[mf]))
    end
    local diff = mf == "llama" and llama_differences(saved, mine) or {}
    if #diff > 0 then
      fail(("checkpoint %s holds another Llama-family model than this run's: %s (model.size or " ..
            "model=hf:DIR differ; resume with the checkpoint's model)"):format(ck.dir, table.concat(diff, ", ")))
    end
    if saved.C and (saved.C ~= mine.C or saved.L ~= mine.L or saved.V ~= mine.V or saved.NH ~= mine.NH) then
      fail(("checkpoint %s holds a model of %s layers, %s channels, %s heads and %s tokens, but this run's " ..
            "model has %d, %d, %d and %d (model.size, model.vocab_size or data.tokenizer differ)"):format(ck.dir,
            tostring(saved.L), tostring(saved.C), tostring(saved.NH), tostring(saved.V), mine.L, mine.C, mine.NH,
            mine.V))
    end
    -- the same tokenizer: the embedding's rows mean the same tokens
    local tok = tr.tokenizer_name or (type(tr.recipe.data.tokenizer) == "string" and tr.recipe.data.tokenizer or nil)
    local saved_tok = man.data and man.data.tokenizer
    if tok and saved_tok and tok ~= saved_tok then
      fail(("checkpoint %s was trained with data.tokenizer = %q, this run uses %q: its embedding rows " ..
            "stand for other tokens; set data.tokenizer=%s"):format(ck.dir, saved_tok, tok, saved_tok))
    end
    if man.step >= tr.recipe.train.steps then
      fail(("checkpoint %s is at step %d and train.steps is %d: nothing is left to train; raise train.steps")
           :format(ck.dir, man.step, tr.recipe.train.steps))
    end
    tr:import_state(ck.read, man.step)
    tr.optim.t = man.optim and man.optim.t or man.step
    if man.data and man.data.next_batch then tr:set_next_batch(man.data.next_batch) end
    -- fp16's loss scaler goes on where it was (a run in another precision starts its own)
    local LS = tr.ctx.loss_scaler
    if LS and type(man.loss_scaler) == "table" then
      LS.scale, LS.good, LS.left, LS.skipped = man.loss_scaler.scale, man.loss_scaler.good, man.loss_scaler.left,
                                                man.loss_scaler.skipped
    end
  end)
  ck.close()
  if not ok then error(err, 0) end
  return ck.dir, man
end

-- export(path, dir) -> dir: the parameters of the checkpoint at path,
-- consolidated from every rank's shard, written as a Hugging Face GPT-2
-- (or Llama-family: the manifest says which)
-- directory (config.json + model.safetensors, F32; with vocab.json and
-- merges.txt of the run's tokenizer: a BPE vocabulary's, or the byte
-- tokenizer's as a BPE without merges). Needs no
-- ranks, no strategy: `ztrain export CKPT DIR`.
function M.export(path, dir)
  local ck = M.open(path)
  local man, model = ck.manifest, nil
  local ok, err = pcall(function()
    model = model_of(man.model or {}, "checkpoint " .. ck.dir .. " manifest")
    for _, u in ipairs(model.units) do
      local t = T.new({ u.padded }, { tier = "host", category = "params" })
      model:set_params(u, t)
      t:fill(0)
      local v = t:view(0, { u.numel })
      local okr, rerr = pcall(ck.read, "params", u.name, 0, u.numel, v, u.numel)
      v:free()
      if not okr then error(rerr, 0) end
    end
    local tok = man.data and man.data.tokenizer
    local tdir
    if tok == "bpe" then tdir = tokenizers.home .. "/" .. tokenizers.BPE_DEFAULT
    elseif type(tok) == "string" then tdir = tok:match("^hf:(.+)$") or tok:match("^bpe:(.+)$") end
    local files = tok == "bytes" and hf.byte_tokenizer_files() or nil
    local oks, serr = hf.save(model, dir, { eot = man.data and man.data.eot, tokenizer_dir = tdir,
                                            tokenizer_json = type(tok) == "string" and tok:match("^hf:") ~= nil,
                                            tokenizer_files = files })
    if not oks then error(serr, 0) end
  end)
  ck.close()
  if model then model:free() end
  if not ok then error(err, 0) end
  return dir
end

return M
