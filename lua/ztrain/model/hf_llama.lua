-- ztrain.model.hf_llama: Hugging Face checkpoints of the Llama family
-- (config.json model_type "llama", "qwen2" or "mistral", as
-- LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM.save_pretrained
-- write them) in and out of ztrain.model.llama models.
--
--   hf_llama.config(dir, j)   -> llama config (j: config.json decoded)
--   hf_llama.open(dir, j)     -> source, every tensor checked; source:fill_unit(model, u)
--   hf_llama.config_text(cfg)  -> the config.json hf.save writes for it
--
-- Names: ztrain's are transformers' (model.embed_tokens.weight,
-- model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight,
-- lm_head.weight), and nn.Linear's [out, in] is ztrain's: no transposes.
-- A tied checkpoint may still store lm_head.weight: it must equal the
-- embedding. Older checkpoints' rotary_emb.inv_freq buffers are ignored.
local ffi = require "ffi"
pcall(ffi.cdef, "int memcmp(const void *, const void *, size_t);")
local cjson = require "cjson.safe"
local llama = require "ztrain.model.llama"
local st = require "ztrain.model.safetensors"
local hff = require "ztrain.model.hf_files"

local M = {}

local function fail(msg) error(msg, 0) end

M.TYPES = { llama = true, qwen2 = true, mistral = true }

-- config(dir, j) -> a llama config from config.json's fields; raises naming
-- the file and the field for what ztrain's Llama does not compute
function M.config(dir, j)
  local path = dir .. "/config.json"
  local function bad(msg) fail(("%s: %s"):format(path, msg)) end
  local mt = j.model_type
  local function int(key, default)
    local v = j[key]
    if (v == nil or v == cjson.null) and default then v = default end
    local why = hff.whole_problem(key, v)
    if why then bad(why) end
    return v
  end
  local function unset_or(key, want, why)
    local v = j[key]
    if v ~= nil and v ~= cjson.null and v ~= want then bad(("%s = %s: %s"):format(key, tostring(v), why)) end
  end
  local NH = int("num_attention_heads")
  local spec = { name = "hf:" .. dir, L = int("num_hidden_layers"), C = int("hidden_size"), NH = NH,
                 NKV = int("num_key_value_heads", NH), F = int("intermediate_size"),
                 maxT = int("max_position_embeddings"), V = int("vocab_size") }
  if j.head_dim ~= nil and j.head_dim ~= cjson.null and j.head_dim * NH ~= spec.C then
    bad(("head_dim %s x %d heads is not hidden_size %d: ztrain's heads split the hidden size")
        :format(tostring(j.head_dim), NH, spec.C))
  end
  unset_or("hidden_act", "silu", "ztrain's Llama MLP is SwiGLU with silu")
  unset_or("mlp_bias", false, "ztrain's Llama MLP has no biases")
  unset_or("attention_bias", false, "ztrain's Llama attention has biases on q, k, v only (Qwen 2.5's)")
  unset_or("pretraining_tp", 1, "ztrain computes the exact projections (pretraining_tp 1)")
  unset_or("use_sliding_window", false, "Qwen 2's per-layer sliding window is not computed")
  spec.eps = type(j.rms_norm_eps) == "number" and j.rms_norm_eps or 1e-6
  -- RoPE: the Hub's rope_theta + rope_scaling, or transformers 5's rope_parameters
  local rp = type(j.rope_parameters) == "table" and j.rope_parameters or nil
  local theta = rp and rp.rope_theta or j.rope_theta
  spec.theta = type(theta) == "number" and theta or 10000
  spec.tied = j.tie_word_embeddings == true
  spec.qkv_bias = mt == "qwen2"
  if mt == "mistral" and type(j.sliding_window) == "number" and j.sliding_window < spec.maxT then
    spec.window = j.sliding_window
  end
  local rs = type(j.rope_scaling) == "table" and j.rope_scaling or rp
  if type(rs) == "table" then
    local kind = rs.rope_type or rs.type
    if kind ~= "llama3" and kind ~= "default" then
      bad(("rope_scaling type %q: ztrain computes Llama 3's (\"llama3\") or none"):format(tostring(kind)))
    end
    if kind == "llama3" then
      for _, k in ipairs({ "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" }) do
        if type(rs[k]) ~= "number" or not (rs[k] > 0) or rs[k] == math.huge then
          bad(("rope_scaling (llama3) needs %s, a number > 0; got %s"):format(k, tostring(rs[k])))
        end
      end
      if rs.high_freq_factor <= rs.low_freq_factor then
        bad(("rope_scaling: high_freq_factor %s must be above low_freq_factor %s")
            :format(tostring(rs.high_freq_factor), tostring(rs.low_freq_factor)))
      end
      spec.scaling = { factor = rs.factor, low_freq_factor = rs.low_freq_factor,
                       high_freq_factor = rs.high_freq_factor,
                       original_max_position_embeddings = rs.original_max_position_embeddings }
    end
  end
  local cfg = llama.custom(spec, path)
  cfg.hf_type = mt
  cfg.eos_token_id = type(j.eos_token_id) == "number" and j.eos_token_id or nil
  cfg.bos_token_id = type(j.bos_token_id) == "number" and j.bos_token_id or nil
  return cfg
end

local Source = {}
Source.__index = Source

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- whether tensor `name` of file f holds the values of entry e, read as
-- fp32 a slice at a time (any stored dtypes; never the whole tensor)
local function same_values(f, name, e)
  local t, u = f.tensors[name], e.file.tensors[e.name]
  if not same_shape(t.shape, u.shape) then return false end
  local a, b = ffi.new("float[?]", hff.SLICE), ffi.new("float[?]", hff.SLICE)
  for off = 0, t.numel - 1, hff.SLICE do
    local n = math.min(hff.SLICE, t.numel - off)
    f:read_f32(name, a, off, n)
    e.file:read_f32(e.name, b, off, n)
    if ffi.C.memcmp(a, b, n * 4) ~= 0 then return false end
  end
  return true
end

-- open(dir, j) -> source. Every tensor the config needs present, shaped
-- and typed, and nothing else stored (but the tied head and old buffers)
function M.open(dir, j)
  local cfg = M.config(dir, j)
  local fs = hff.open_files(dir)
  local self = setmetatable({ dir = dir, cfg = cfg, config_json = j, fs = fs, entries = {} }, Source)
  local model = llama.new(cfg, { alloc = false })
  local known = {}
  for u, t in model:each_tensor() do
    local f, e = fs.lookup(t.name)
    if not e then
      fail(("%s: missing tensor %s (unit %s; config.json says num_hidden_layers = %d%s)")
           :format(fs.what, t.name, u.name, cfg.L, cfg.tied and "" or ", untied embeddings"))
    end
    if not same_shape(e.shape, t.shape) then
      fail(("%s: tensor %s has shape %s, but config.json makes it %s"):format(f.path, t.name,
           st.shape_text(e.shape), st.shape_text(t.shape)))
    end
    if not st.READABLE[e.dtype] then
      fail(("%s: tensor %s has dtype %s; ztrain reads F32, F16 and BF16"):format(f.path, t.name, e.dtype))
    end
    self.entries[t.name] = { file = f, name = t.name }
    known[t.name] = true
  end
  for _, f in ipairs(fs.files) do
    for _, name in ipairs(f.names) do
      if known[name] or name:match("rotary_emb%.inv_freq$") then
        -- fine
      elseif name == "lm_head.weight" and cfg.tied then
        if not same_values(f, name, self.entries["model.embed_tokens.weight"]) then
          fail(("%s: lm_head.weight differs from model.embed_tokens.weight, but config.json ties them " ..
                "(tie_word_embeddings)"):format(f.path))
        end
      else
        fail(("%s: tensor %s is not part of this model (config.json: %d layers, %s embeddings)")
             :format(f.path, name, cfg.L, cfg.tied and "tied" or "untied"))
      end
    end
  end
  return self
end

local SLICE = hff.SLICE

-- fill_unit(model, u): unit u's parameters from the checkpoint through its
-- views (any tier); the model must have the checkpoint's shape
function Source:fill_unit(model, u)
  local c, m = self.cfg, model.cfg
  for _, k in ipairs({ "L", "C", "NH", "NKV", "F", "V" }) do
    if c[k] ~= m[k] then
      fail(("hf:%s has %s = %d; the model has %d"):format(self.dir, k, c[k], m[k]))
    end
  end
  if not u.params then fail(("hf_llama.fill_unit: unit %s has no parameter buffer"):format(u.name)) end
  self.scratch = self.scratch or ffi.new("float[?]", SLICE)
  for _, t in ipairs(u.tensors) do
    local e = self.entries[t.name]
    hff.fill_tensor(u.params, t, e.file, e.name, self.scratch)
  end
end

function Source:close() self.scratch = nil end

-- config_text(cfg, opts) -> config.json for a model of cfg (transformers
-- reads it back; hf.save writes it); opts.eot: bos/eos ids
function M.config_text(cfg, opts)
  local mt = cfg.hf_type or (cfg.qkv_bias and "qwen2" or (cfg.window or 0) > 0 and "mistral" or "llama")
  local arch = { llama = "LlamaForCausalLM", qwen2 = "Qwen2ForCausalLM", mistral = "MistralForCausalLM" }
  local j = { architectures = { arch[mt] }, model_type = mt, hidden_act = "silu",
              num_hidden_layers = cfg.L, hidden_size = cfg.C, num_attention_heads = cfg.NH,
              num_key_value_heads = cfg.NKV, intermediate_size = cfg.F,
              max_position_embeddings = cfg.maxT, vocab_size = cfg.V, rms_norm_eps = cfg.eps,
              rope_theta = cfg.theta, tie_word_embeddings = cfg.tied, torch_dtype = "float32",
              attention_dropout = 0.0, initializer_range = 0.02 }
  if mt == "llama" then j.attention_bias, j.mlp_bias = false, false end
  if mt == "mistral" then j.sliding_window = (cfg.window or 0) > 0 and cfg.window or cjson.null end
  if mt == "qwen2" then j.use_sliding_window = false end
  local eot = opts and opts.eot or cfg.eos_token_id
  if eot then j.bos_token_id, j.eos_token_id = cfg.bos_token_id or eot, eot end
  if cfg.scaling then
    local s = cfg.scaling
    j.rope_scaling = { rope_type = "llama3", factor = s.factor, low_freq_factor = s.low_freq_factor,
                       high_freq_factor = s.high_freq_factor,
                       original_max_position_embeddings = s.original_max_position_embeddings }
  end
  cjson.encode_sparse_array(true)
  return cjson.encode(j) .. "\n"
end

return M
