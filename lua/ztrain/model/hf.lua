-- ztrain.model.hf: Hugging Face GPT-2 checkpoints (config.json +
-- model.safetensors, as GPT2LMHeadModel.save_pretrained writes them) in and
-- out of ztrain.model.gpt2 models.
--
--   local hf = require "ztrain.model.hf"
--   hf.config(dir)              -> gpt2 config { name, L, C, NH, maxT, V } (raises if not GPT-2)
--   hf.open(dir)                -> source: the checkpoint checked against its config
--                                  (every tensor present, shaped and typed as GPT-2 needs);
--                                  source:fill_unit(model, u) writes unit u's parameters
--   hf.load(dir, {tier=})       -> model, every unit's parameters allocated and loaded
--   hf.load_into(model, dir, units)   fill existing parameter buffers of `units`
--   hf.save(model, dir, opts)   write config.json + model.safetensors (F32)
--
-- Names: HF's transformer.wte.weight / wpe.weight / h.N.{ln_1, attn.c_attn,
-- attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias} / ln_f.{weight,
-- bias} are ztrain's wte / wpe / h.N.... / ln_f... (the "transformer."
-- prefix may be absent, as in openai-community/gpt2's file). The LM head is
-- tied to wte: a stored lm_head.weight must equal it. The attention-mask
-- buffers (attn.bias, attn.masked_bias) older transformers saved are
-- ignored. HF's Conv1D keeps weights as [in, out] (y = x W + b); ztrain's
-- matmuls take [out, in] (y = x W^T + b, as nn.Linear and llm.c): the four
-- Conv1D weights are transposed on the way in and out.
local ffi = require "ffi"
local cjson = require "cjson.safe"
local T = require "ztrain.core.tensor"
local gpt2 = require "ztrain.model.gpt2"
local st = require "ztrain.model.safetensors"
local hff = require "ztrain.model.hf_files"
local hf_llama = require "ztrain.model.hf_llama"
local family = require "ztrain.model.family"
local files = require "ztrain.util.fs"
local errors = require "ztrain.core.errors"
local bpe = require "ztrain.model.data.bpe"
local bpe_vocab = require "ztrain.model.data.bpe_vocab"

local M = {}

local function fail(msg) error(msg, 0) end

-- dir_of("hf:DIR") -> DIR, or nil for anything else
function M.dir_of(spec)
  if type(spec) ~= "string" then return nil end
  local d = spec:match("^hf:(.+)$")
  return d and (d:gsub("/+$", "")) or nil
end

-- ztrain's tensor name -> HF's, without the prefix
local function hf_name(name)
  if name == "wte" or name == "wpe" then return name .. ".weight" end
  return name
end

-- HF Conv1D weights ([in, out] in the file)
local function is_conv1d(name)
  return name:match("%.attn%.c_attn%.weight$") or name:match("%.attn%.c_proj%.weight$") or
         name:match("%.mlp%.c_fc%.weight$") or name:match("%.mlp%.c_proj%.weight$")
end

-- the tensor's shape in the file
local function hf_shape(t)
  if is_conv1d(t.name) then return { t.shape[2], t.shape[1] } end
  return t.shape
end

-- buffers GPT2Model registers that carry no parameters
local function ignored(name)
  return name:match("^h%.%d+%.attn%.bias$") or name:match("^h%.%d+%.attn%.masked_bias$")
end

---------------------------------------------------------------------------
-- config.json

-- config(dir) -> cfg. Only what ztrain computes may load: GPT-2's
-- architecture with the tanh GELU, LayerNorm eps 1e-5, scaled attention,
-- a tied head; anything else is refused naming the key.
function M.config(dir)
  local path = dir .. "/config.json"
  if not files.exists(path) then
    local what = files.exists(dir) and "holds no config.json" or "does not exist"
    fail(("hf:%s: the directory %s; a Hugging Face model directory holds config.json and model.safetensors " ..
          "(GPT2LMHeadModel.save_pretrained writes both)"):format(dir, what))
  end
  local j = hff.read_json(path, "the model's config")
  local function bad(msg) fail(("%s: %s"):format(path, msg)) end
  local mt = j.model_type
  if mt == nil then
    local arch = type(j.architectures) == "table" and j.architectures[1]
    if not (type(arch) == "string" and arch:match("^GPT2")) then
      bad('no "model_type" (and no GPT2 architecture); ztrain loads GPT-2 checkpoints (model_type "gpt2")')
    end
  elseif hf_llama.TYPES[mt] then
    return hf_llama.config(dir, j), j              -- the Llama family
  elseif mt ~= "gpt2" then
    bad(('model_type is %q; ztrain loads GPT-2 ("gpt2") and the Llama family ("llama", "qwen2", ' ..
         '"mistral")'):format(tostring(mt)))
  end
  local function int(key, alt)
    local v = j[key]
    if v == nil and alt then v = j[alt] end
    local why = hff.whole_problem(key, v)
    if why then bad(why) end
    return v
  end
  local cfg = { name = "hf:" .. dir, L = int("n_layer"), C = int("n_embd"), NH = int("n_head"),
                maxT = int("n_positions", "n_ctx"), V = int("vocab_size") }
  if cfg.C % cfg.NH ~= 0 then bad(("n_embd %d does not divide into n_head %d heads"):format(cfg.C, cfg.NH)) end
  local act = j.activation_function
  if act ~= nil and act ~= "gelu_new" and act ~= "gelu_pytorch_tanh" then
    bad(("activation_function %q: ztrain's GPT-2 computes the tanh GELU (\"gelu_new\")"):format(tostring(act)))
  end
  local eps = j.layer_norm_epsilon
  if eps ~= nil and (type(eps) ~= "number" or math.abs(eps - 1e-5) > 1e-12) then
    bad(("layer_norm_epsilon %s: ztrain's LayerNorm uses 1e-5"):format(tostring(eps)))
  end
  if j.n_inner ~= nil and j.n_inner ~= cjson.null and j.n_inner ~= 4 * cfg.C then
    bad(("n_inner %s: ztrain's MLP is 4 x n_embd = %d wide"):format(tostring(j.n_inner), 4 * cfg.C))
  end
  local function flag(key, want, why)
    if j[key] ~= nil and j[key] ~= want then bad(("%s = %s: %s"):format(key, tostring(j[key]), why)) end
  end
  flag("scale_attn_weights", true, "ztrain always scales attention scores by 1/sqrt(head size)")
  flag("scale_attn_by_inverse_layer_idx", false, "ztrain does not scale attention by layer")
  flag("add_cross_attention", false, "ztrain's GPT-2 has no cross-attention")
  flag("tie_word_embeddings", true, "ztrain's LM head is tied to the token embedding")
  cfg.eos_token_id = type(j.eos_token_id) == "number" and j.eos_token_id or nil
  cfg.bos_token_id = type(j.bos_token_id) == "number" and j.bos_token_id or nil
  gpt2.custom(cfg, path)
  return cfg, j
end

---------------------------------------------------------------------------
-- Reading the weights

local Source = {}
Source.__index = Source

-- open(dir) -> source. Everything is checked before any value is read:
-- a missing, misshapen or unreadable tensor is an error naming the file,
-- the tensor and what was expected.
function M.open(dir)
  local cfg, raw = M.config(dir)
  if cfg.family == "llama" then return hf_llama.open(dir, raw) end
  local fs = hff.open_files(dir)
  local prefix
  for _, p in ipairs({ "transformer.", "" }) do
    if not prefix and select(2, fs.lookup(p .. "wte.weight")) then prefix = p end
  end
  if not prefix then
    fail(("%s: missing tensor transformer.wte.weight (the token embedding; nor wte.weight without the prefix)")
         :format(fs.what))
  end
  local self = setmetatable({ dir = dir, cfg = cfg, config_json = raw, prefix = prefix, fs = fs, entries = {} }, Source)
  local model = gpt2.new(cfg, { alloc = false })      -- the layout only
  local known = {}
  for u, t in model:each_tensor() do
    local name = prefix .. hf_name(t.name)
    local f, e = fs.lookup(name)
    if not e then
      fail(("%s: missing tensor %s (%s of unit %s; config.json says n_layer = %d)")
           :format(fs.what, name, t.name, u.name, cfg.L))
    end
    local want = hf_shape(t)
    local same = #e.shape == #want
    for i = 1, #want do same = same and e.shape[i] == want[i] end
    if not same then
      fail(("%s: tensor %s has shape %s, but config.json (n_embd %d, n_positions %d, vocab_size %d) makes it %s")
           :format(f.path, name, st.shape_text(e.shape), cfg.C, cfg.maxT, cfg.V, st.shape_text(want)))
    end
    if not st.READABLE[e.dtype] then
      fail(("%s: tensor %s has dtype %s; ztrain reads F32, F16 and BF16 (convert the checkpoint, e.g. " ..
            "model.float().save_pretrained(DIR))"):format(f.path, name, e.dtype))
    end
    self.entries[t.name] = { file = f, name = name, transpose = is_conv1d(t.name) and true or false }
    known[name] = true
  end
  -- what else is in the file: the tied head (must equal wte), mask
  -- buffers (ignored), anything else (refused: not this architecture)
  for _, f in ipairs(fs.files) do
    for _, name in ipairs(f.names) do
      local bare = name:sub(1, #prefix) == prefix and name:sub(#prefix + 1) or name
      if known[name] or ignored(bare) then
        -- fine
      elseif name == "lm_head.weight" then
        local w = self.entries.wte
        local e = f.tensors[name]
        local we = w.file.tensors[w.name]
        if e.dtype ~= we.dtype or st.shape_text(e.shape) ~= st.shape_text(we.shape) or
           f:read_raw(name) ~= w.file:read_raw(w.name) then
          fail(("%s: lm_head.weight differs from %s: an untied LM head, but GPT-2 (and ztrain) ties it to " ..
                "the token embedding"):format(f.path, w.name))
        end
      else
        fail(("%s: tensor %s is not part of a GPT-2 with config.json's n_layer = %d (an extra layer, or " ..
              "another architecture's weights)"):format(f.path, name, cfg.L))
      end
    end
  end
  return self
end

-- Transpose HF's [rows = in, cols = out] into ztrain's [out, in], in
-- 32 x 32 tiles (both sides stay in cache).
local function transpose(dst, src, rows, cols)
  local B = 32
  for r0 = 0, rows - 1, B do
    local r1 = math.min(r0 + B, rows) - 1
    for c0 = 0, cols - 1, B do
      local c1 = math.min(c0 + B, cols) - 1
      for r = r0, r1 do
        local s = r * cols
        for c = c0, c1 do dst[c * rows + r] = src[s + c] end
      end
    end
  end
end

local SLICE = 1024 * 1024   -- elements per read of an untransposed tensor

-- fill_unit(model, u): unit u's parameters from the checkpoint, through
-- u.p's views (any tier). The model must have the checkpoint's shape.
function Source:fill_unit(model, u)
  local c, m = self.cfg, model.cfg
  if c.L ~= m.L or c.C ~= m.C or c.NH ~= m.NH or c.maxT ~= m.maxT or c.V ~= m.V then
    fail(("hf:%s is L=%d C=%d NH=%d maxT=%d V=%d; the model is L=%d C=%d NH=%d maxT=%d V=%d")
         :format(self.dir, c.L, c.C, c.NH, c.maxT, c.V, m.L, m.C, m.NH, m.maxT, m.V))
  end
  if not u.params then fail(("hf.fill_unit: unit %s has no parameter buffer"):format(u.name)) end
  for _, t in ipairs(u.tensors) do
    local e = self.entries[t.name]
    if e.transpose then
      local a, b = ffi.new("float[?]", t.numel), ffi.new("float[?]", t.numel)
      e.file:read_f32(e.name, a)
      transpose(b, a, t.shape[2], t.shape[1])
      u.p[t.name]:write(b)
    else
      self.scratch = self.scratch or ffi.new("float[?]", SLICE)
      hff.fill_tensor(u.params, t, e.file, e.name, self.scratch)
    end
  end
end

-- close(): drop the buffers (no file is held open between reads).
function Source:close() self.scratch = nil end

-- load(dir, {tier=}) -> model: parameters only (no gradients), each unit's
-- flat buffer on opts.tier (default "device"). Free it with model:free().
function M.load(dir, opts)
  opts = opts or {}
  local src = M.open(dir)
  local model = family.new(src.cfg, { alloc = false, tier = opts.tier })
  local ok, err = pcall(function()
    for _, u in ipairs(model.units) do
      model:set_params(u, T.new({ u.padded }, { tier = model.tier, category = "params" }))
      src:fill_unit(model, u)
    end
  end)
  src:close()
  if not ok then model:free(); error(err, 0) end
  model.hf_dir = dir
  return model
end

-- load_into(model, dir, units): fill the parameter buffers `units` (default
-- all) already have, e.g. where a strategy placed them.
function M.load_into(model, dir, units)
  local src = M.open(dir)
  local ok, err = pcall(function()
    for _, u in ipairs(units or model.units) do src:fill_unit(model, u) end
  end)
  src:close()
  if not ok then error(err, 0) end
end

---------------------------------------------------------------------------
-- Writing

-- config.json text for a model of cfg: transformers' GPT2Config fields, in
-- sorted order. opts.eot: the tokenizer's end-of-text id (bos/eos). The
-- dropouts are 0: ztrain trains without dropout, and a model fine-tuned from
-- this directory should go on as it was trained (transformers' defaults of
-- 0.1 would turn dropout on).
local function config_text(cfg, opts)
  local eot = opts.eot or cfg.eos_token_id
  local j = {
    activation_function = '"gelu_new"', architectures = '["GPT2LMHeadModel"]', attn_pdrop = "0.0",
    bos_token_id = eot and ("%d"):format(eot) or "null", embd_pdrop = "0.0",
    eos_token_id = eot and ("%d"):format(eot) or "null", initializer_range = "0.02",
    layer_norm_epsilon = "1e-05", model_type = '"gpt2"', n_ctx = ("%d"):format(cfg.maxT),
    n_embd = ("%d"):format(cfg.C), n_head = ("%d"):format(cfg.NH), n_inner = "null",
    n_layer = ("%d"):format(cfg.L), n_positions = ("%d"):format(cfg.maxT), reorder_and_upcast_attn = "false",
    resid_pdrop = "0.0", scale_attn_by_inverse_layer_idx = "false", scale_attn_weights = "true",
    tie_word_embeddings = "true", torch_dtype = '"float32"', use_cache = "true",
    vocab_size = ("%d"):format(cfg.V),
  }
  local keys = {}
  for k in pairs(j) do keys[#keys + 1] = k end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do lines[#lines + 1] = ('  "%s": %s'):format(k, j[k]) end
  return "{\n" .. table.concat(lines, ",\n") .. "\n}\n"
end
M.config_text = config_text

-- byte_tokenizer_files() -> { ["vocab.json"] = text, ["merges.txt"] = text }:
-- ztrain's byte tokenizer (id = byte value, 256 ids, no end-of-text) as a
-- GPT-2 byte-level BPE without merges: each byte's bytes_to_unicode symbol
-- has the byte's value as id, so transformers' GPT2Tokenizer and ztrain's
-- hf:DIR give every text the ids the byte tokenizer gives it.
function M.byte_tokenizer_files()
  local entries = {}
  for b = 0, 255 do entries[b + 1] = ("%s: %d"):format(bpe_vocab.quote(bpe.byte_to_unicode(b)), b) end
  return { ["vocab.json"] = "{" .. table.concat(entries, ", ") .. "}\n", ["merges.txt"] = "#version: 0.2\n" }
end

-- check_dir(dir) -> true | nil, err: can an export be written there?
-- (made if missing; a file of that name, or no write access, fails)
function M.check_dir(dir)
  -- "" would put config.json and model.safetensors in / (dir .. "/config.json")
  if type(dir) ~= "string" or dir == "" then
    return nil, "the export directory is empty; name a new directory to write the model into"
  end
  -- an export replaces nothing: a directory that holds anything is refused
  -- (stale vocab.json or config.json of another model would mix with ours)
  local found = {}
  for _, path in ipairs(files.entries(dir)) do
    local name = path:match("[^/]*$")
    if not name:match("^%.ztrain%-probe") and #found < 3 then found[#found + 1] = name end
  end
  if #found > 0 then
    return nil, ("%s is not empty (it holds %s); export into a new directory, or empty it first: an export " ..
                 "replaces nothing"):format(dir, table.concat(found, ", "))
  end
  local made, merr = files.mkdirs(dir, "export directory")
  if not made then return nil, ("cannot write into %s: %s"):format(dir, merr:match(":%s*([^:]+)$") or merr) end
  local probe = ("%s/.ztrain-probe-%d"):format(dir, ffi.C.ztrain_st_getpid())
  local f, err = io.open(probe, "wb")
  if not f then return nil, ("cannot write into %s: %s"):format(dir, err) end
  f:close()
  os.remove(probe)
  return true
end

-- copy_tokenizer(from, dir, json) -> nil, or a note saying why dir got no
-- usable tokenizer: vocab.json + merges.txt (and tokenizer.json where json)
-- copied from the directory the run's tokenizer came from. A file that is
-- not there is skipped (an hf: model may carry only tokenizer.json); the
-- note names what is missing, so an export without its tokenizer is not
-- mistaken for a complete one.
local function copy_tokenizer(from, dir, json)
  local names, got, why = { "vocab.json", "merges.txt", json and "tokenizer.json" or nil }, {}, nil
  for _, name in ipairs(names) do
    local text, rerr = files.read_file(from .. "/" .. name)
    if text then
      st.write_file_atomic(dir .. "/" .. name, text)
      got[name] = true
    else
      why = why or rerr
    end
  end
  if (got["vocab.json"] and got["merges.txt"]) or got["tokenizer.json"] then return nil end
  local missing = {}
  for _, name in ipairs(names) do if not got[name] then missing[#missing + 1] = name end end
  return ("%s: tokenizer files not written (%s): the run's tokenizer came from %s, and %s; the weights and " ..
          "config.json are written: copy that tokenizer's vocab.json and merges.txt into %s to use the model " ..
          "with it"):format(dir, table.concat(missing, ", "), from, why or "it holds none", dir)
end

-- save(model, dir, opts): write dir/model.safetensors (F32, keys with the
-- "transformer." prefix, Conv1D weights as [in, out], no lm_head: tied) and
-- dir/config.json, each atomically (model first). opts:
--   each(visit)  calls visit(u, flat) for every unit in canonical order with
--                its full flat parameter buffer (default: the model's own
--                buffers). A strategy's gathers go here; each() is run in full
--                even when writing fails (the gathers are collectives).
--   write        false on ranks that only take part in each() (default true)
--   eot          the end-of-text id for config.json's bos/eos
--   tokenizer_dir  a directory whose vocab.json and merges.txt are copied in
--   tokenizer_json  true: its tokenizer.json too (the run named it hf:DIR, which
--                reads tokenizer.json where there is one that is not GPT-2's pipeline)
--   tokenizer_files  or their texts: { ["vocab.json"] =, ["merges.txt"] = }
-- Returns true, or nil and a message (nothing half-written is left behind).
function M.save(model, dir, opts)
  opts = opts or {}
  local write = opts.write ~= false
  -- the Llama family: transformers' names are ztrain's, nn.Linear's layout
  -- is ztrain's (no transposes), its own config.json (model/hf_llama.lua)
  local llama = model.cfg.family == "llama"
  local conv1d = llama and function() return false end or is_conv1d
  local each = opts.each or function(visit)
    for _, u in ipairs(model.units) do
      if not u.params then fail(("hf.save: unit %s has no parameters here (pass opts.each to gather them)"):format(u.name)) end
      visit(u, u.params)
    end
  end
  if not write then
    each(function() end)
    return true
  end
  local entries = {}
  for _, t in model:each_tensor() do
    entries[#entries + 1] = llama and { name = t.name, shape = t.shape }
                            or { name = "transformer." .. hf_name(t.name), shape = hf_shape(t) }
  end
  -- set up; a failure still runs each() below (other ranks are in its gathers)
  local werr, w
  local scratch = ffi.new("float[?]", SLICE)
  local oks, serr = pcall(function()
    local okd, derr = M.check_dir(dir)
    if not okd then fail(derr) end
    w = st.writer(dir .. "/model.safetensors", entries, { metadata = { format = "pt" } })
  end)
  if not oks then werr = serr end
  local function put(u, flat)
    for _, t in ipairs(u.tensors) do
      if conv1d(t.name) then
        local a, b = ffi.new("float[?]", t.numel), ffi.new("float[?]", t.numel)
        local v = flat:view(t.offset, t.shape)
        local okr, rerr = pcall(v.read, v, a)
        v:free()
        if not okr then error(rerr, 0) end
        transpose(b, a, t.shape[1], t.shape[2])    -- [out, in] -> [in, out]
        w:write(b, t.numel * 4)
      else
        for off = 0, t.numel - 1, SLICE do
          local n = math.min(SLICE, t.numel - off)
          local v = flat:view(t.offset + off, { n })
          local okr, rerr = pcall(v.read, v, scratch)
          v:free()
          if not okr then error(rerr, 0) end
          w:write(scratch, n * 4)
        end
      end
    end
  end
  local okv, verr = pcall(each, function(u, flat)
    if werr then return end                        -- keep the gathers going, write nothing
    local okw, e = pcall(put, u, flat)
    if not okw then werr = e end
  end)
  if not okv and not werr then werr = verr end
  local tokenizer_note
  local ok, err = pcall(function()
    if werr then error(werr, 0) end
    w:commit()
    st.write_file_atomic(dir .. "/config.json", llama and hf_llama.config_text(model.cfg, opts)
                                                 or config_text(model.cfg, opts))
    for name, text in pairs(opts.tokenizer_files or {}) do st.write_file_atomic(dir .. "/" .. name, text) end
    if opts.tokenizer_dir then tokenizer_note = copy_tokenizer(opts.tokenizer_dir, dir, opts.tokenizer_json) end
  end)
  if not ok then
    if w then w:abort() end
    return nil, errors.message(err)
  end
  -- the weights are fine without a tokenizer: say so, don't fail the export
  if tokenizer_note then io.stderr:write("ztrain: warning: ", tokenizer_note, "\n") end
  return true
end

return M
