-- Llama-family checkpoints in Hugging Face's layout (model/hf_llama.lua
-- through model/hf.lua): a model saved and loaded back has the same bits
-- and config; config.json's fields map to the config (GQA, Llama 3 RoPE
-- scaling, Qwen's biases, Mistral's window, tied embeddings) and what
-- ztrain does not compute is refused naming the field; a missing or
-- misshapen tensor is refused naming it. Against transformers' own files:
-- spec/unit/llama_fixture_spec.lua.
local cjson = require "cjson"
local util = require "helpers.util"
local hf = require "ztrain.model.hf"
local llama = require "ztrain.model.llama"
require "ztrain"

local function params(m)
  local t = {}
  for _, u in ipairs(m.units) do t[u.name] = u.params:totable() end
  return t
end

local function rewrite_config(dir, f)
  local j = cjson.decode(util.read(dir .. "/config.json"))
  f(j)
  util.write(dir .. "/config.json", cjson.encode(j))
end

describe("Llama-family Hugging Face checkpoints", function()
  for _, size in ipairs({ "llama-tiny", "qwen-tiny", "mistral-tiny" }) do
    it("save and load back with the same bits and shape: " .. size, function()
      local m = llama.new(size, { tier = "host" })
      m:init(3)
      local d = util.outdir()
      assert(hf.save(m, d))
      local j = cjson.decode(util.read(d .. "/config.json"))
      local want_type = size == "qwen-tiny" and "qwen2" or size == "mistral-tiny" and "mistral" or "llama"
      assert.are.equal(want_type, j.model_type)
      local back = hf.load(d, { tier = "host" })
      for _, k in ipairs({ "L", "C", "NH", "NKV", "F", "V", "tied", "qkv_bias", "window", "theta", "eps" }) do
        assert.are.equal(m.cfg[k], back.cfg[k], k)
      end
      assert.are.same(m.cfg.scaling, back.cfg.scaling)
      assert.are.same(params(m), params(back))
      back:free(); m:free()
      util.rm(d)
    end)
  end

  it("refuses what ztrain's Llama does not compute, naming the field", function()
    local m = llama.new("llama-tiny", { tier = "host" })
    m:init(1)
    local d = util.outdir()
    assert(hf.save(m, d))
    m:free()
    for field, case in pairs({
      hidden_act = { "gelu", "hidden_act = gelu: ztrain's Llama MLP is SwiGLU with silu" },
      attention_bias = { true, "attention_bias = true: ztrain's Llama attention has biases on q, k, v only" },
      rope_scaling = { { rope_type = "yarn", factor = 4 }, 'rope_scaling type "yarn": ztrain computes Llama 3' },
      num_key_value_heads = { 3, "4 query heads do not divide into 3 key/value heads" } }) do
      local saved = util.read(d .. "/config.json")
      rewrite_config(d, function(j) j[field] = case[1] end)
      local ok, err = pcall(hf.open, d)
      assert.is_false(ok, field)
      assert.matches(case[2], err, 1, true)
      util.write(d .. "/config.json", saved)
    end
    -- an untied checkpoint relabelled tied: its lm_head.weight must then equal the embedding
    local saved = util.read(d .. "/config.json")
    rewrite_config(d, function(j) j.tie_word_embeddings = true end)
    local okt, terr = pcall(hf.open, d)
    assert.is_false(okt)
    assert.matches("lm_head.weight differs from model.embed_tokens.weight, but config.json ties them", terr, 1, true)
    util.write(d .. "/config.json", saved)
    rewrite_config(d, function(j) j.rope_scaling = { rope_type = "llama3", factor = 8 } end)
    okt, terr = pcall(hf.open, d)
    assert.matches("rope_scaling (llama3) needs low_freq_factor, a number > 0; got nil", terr, 1, true)
    util.write(d .. "/config.json", saved)
    rewrite_config(d, function(j) j.num_hidden_layers = 3 end)
    local ok, err = pcall(hf.open, d)
    assert.is_false(ok)
    assert.matches("missing tensor model.layers.2.input_layernorm.weight", err, 1, true)
    rewrite_config(d, function(j) j.num_hidden_layers = 2; j.intermediate_size = 170 end)
    ok, err = pcall(hf.open, d)
    assert.matches("tensor model.layers.0.mlp.gate_proj.weight has shape [176, 64], but config.json makes it [170, 64]",
                   err, 1, true)
    util.rm(d)
  end)
end)
