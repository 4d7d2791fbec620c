-- The Llama-family fidelity fixtures (spec/fixtures/llama/<family>/, made by
-- tools/llama_fixture.py with torch + transformers; README.md there) are
-- whole and self-consistent, read without torch through ztrain's safetensors
-- reader: the HF tensor names and shapes a Llama / Qwen2 / Mistral of that
-- config.json has (worked out here from the config, not from any model code),
-- a gradient for each, the loss equal to the cross-entropy of the stored
-- logits, the first step's gradient norm equal to the stored gradients',
-- ten finite and decreasing losses, the AdamW settings the README states,
-- the RoPE frequencies transformers used equal to the config's formula, and
-- the greedy generation continuing its prompt; llama-bf16's BF16 weights
-- the round-to-nearest-even of llama's F32 ones. The comparison of ztrain's
-- model against these numbers lives with the model.
local ffi = require "ffi"
local cjson = require "cjson"
local st = require "ztrain.model.safetensors"

local DIR = "spec/fixtures/llama/"
-- dir, model_type, the parameters' dtype, whether expected has grad/
local FIXTURES = {
  { dir = "llama", family = "llama", dtype = "F32", grads = true },
  { dir = "qwen2", family = "qwen2", dtype = "F32", grads = true },
  { dir = "mistral", family = "mistral", dtype = "F32", grads = true },
  { dir = "llama-bf16", family = "llama", dtype = "BF16", grads = false },
}

local function read_text(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function null(v) return v == nil or v == cjson.null end

local function config(family) return cjson.decode(read_text(DIR .. family .. "/config.json")) end

-- RoPE settings in either spelling: transformers 5's rope_parameters or the
-- Hub's rope_theta + rope_scaling
local function rope_of(cfg)
  if not null(cfg.rope_parameters) then return cfg.rope_parameters end
  local r = { rope_theta = cfg.rope_theta, rope_type = "default" }
  if not null(cfg.rope_scaling) then
    for k, v in pairs(cfg.rope_scaling) do r[k] = v end
    r.rope_type = r.rope_type or r.type
  end
  return r
end

local function shape_str(s) return st.shape_text(s) end

-- every tensor a model of this config has, name -> shape (HF's names, nn.Linear [out, in])
local function expected_params(cfg)
  local V, Cc, I, L = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
  local H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
  local D = null(cfg.head_dim) and Cc / H or cfg.head_dim
  local biases = cfg.model_type == "qwen2" or cfg.attention_bias == true
  local p = { ["model.embed_tokens.weight"] = { V, Cc }, ["model.norm.weight"] = { Cc } }
  if not cfg.tie_word_embeddings then p["lm_head.weight"] = { V, Cc } end
  for l = 0, L - 1 do
    local b = "model.layers." .. l .. "."
    p[b .. "input_layernorm.weight"] = { Cc }
    p[b .. "post_attention_layernorm.weight"] = { Cc }
    p[b .. "self_attn.q_proj.weight"] = { H * D, Cc }
    p[b .. "self_attn.k_proj.weight"] = { KV * D, Cc }
    p[b .. "self_attn.v_proj.weight"] = { KV * D, Cc }
    p[b .. "self_attn.o_proj.weight"] = { Cc, H * D }
    if biases then
      p[b .. "self_attn.q_proj.bias"] = { H * D }
      p[b .. "self_attn.k_proj.bias"] = { KV * D }
      p[b .. "self_attn.v_proj.bias"] = { KV * D }
    end
    p[b .. "mlp.gate_proj.weight"] = { I, Cc }
    p[b .. "mlp.up_proj.weight"] = { I, Cc }
    p[b .. "mlp.down_proj.weight"] = { Cc, I }
  end
  return p
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function f32(file, name, dtype)
  local t = assert(file.tensors[name], "no tensor " .. name)
  assert.are.equal(dtype or "F32", t.dtype, name)
  local buf = ffi.new("float[?]", math.max(t.numel, 1))
  file:read_f32(name, buf)
  return buf, t
end

-- I32 tensor as a Lua list
local function i32(file, name)
  local t = assert(file.tensors[name], "no tensor " .. name)
  assert.are.equal("I32", t.dtype, name)
  local raw = file:read_raw(name)
  local p = ffi.cast("const int32_t*", raw)
  local out = {}
  for i = 0, t.numel - 1 do out[i + 1] = p[i] end
  return out, t
end

local function finite(x) return x == x and x > -math.huge and x < math.huge end

for _, fx in ipairs(FIXTURES) do
  local family = fx.family
  describe("Llama-family fixture " .. fx.dir, function()
    local cfg = config(fx.dir)
    local model = st.open(DIR .. fx.dir .. "/model.safetensors")
    local exp = st.open(DIR .. fx.dir .. "/expected.safetensors")
    local meta = exp.metadata or {}
    local batch = cjson.decode(meta.batch)
    local B, T, V = batch.B, batch.T, cfg.vocab_size

    it("is the family the brief asks for", function()
      assert.are.equal(family, cfg.model_type)
      assert.are.equal(family, meta.family)
      assert.is_true(cfg.num_key_value_heads < cfg.num_attention_heads, "grouped-query attention")
      assert.are.equal(0, cfg.num_attention_heads % cfg.num_key_value_heads)
      assert.is_true(cfg.num_attention_heads / cfg.num_key_value_heads >= 2 and cfg.num_key_value_heads >= 2,
                     "two kv heads or more, each shared by two query heads or more")
      local rope = rope_of(cfg)
      assert.is_true(rope.rope_theta > 0)
      if family == "llama" then
        assert.are.equal("llama3", rope.rope_type)
        assert.is_false(cfg.tie_word_embeddings)
      elseif family == "qwen2" then
        assert.is_true(cfg.tie_word_embeddings)
        -- as Qwen2.5's files: a window that use_sliding_window=false switches off
        assert.is_false(cfg.use_sliding_window)
        assert.is_true(cfg.sliding_window < T)
        assert.are.equal("null", meta.sliding_window)
      else
        assert.is_true(cfg.sliding_window < T, "the window must be shorter than the batch's sequences")
        assert.are.equal(cfg.sliding_window, cjson.decode(meta.sliding_window))
      end
    end)

    it("holds every parameter of the config, " .. fx.dtype .. ", with its shape, and nothing else", function()
      local want = expected_params(cfg)
      local n = 0
      for name, shape in pairs(want) do
        local t = model.tensors[name]
        assert.is_not_nil(t, "model.safetensors lacks " .. name)
        assert.are.equal(fx.dtype, t.dtype, name)
        assert.is_true(same_shape(shape, t.shape), ("%s: %s, config.json says %s"):format(name, shape_str(t.shape),
                       shape_str(shape)))
        n = n + 1
      end
      assert.are.equal(n, #model.names, "model.safetensors holds tensors the config does not have")
    end)

    it("has a finite, nonzero gradient of the loss for every parameter, shaped as it", function()
      local want = expected_params(cfg)
      local grads = 0
      for _, name in ipairs(exp.names) do
        if name:sub(1, 5) == "grad/" then
          grads = grads + 1
          assert.is_not_nil(want[name:sub(6)], "a gradient of no parameter: " .. name)
        end
      end
      if not fx.grads then
        assert.are.equal(0, grads)
        return
      end
      local n = 0
      for name, shape in pairs(want) do
        local g, t = f32(exp, "grad/" .. name)
        assert.is_true(same_shape(shape, t.shape), name)
        local big = 0
        for i = 0, t.numel - 1 do
          assert.is_true(finite(g[i]), name)
          big = math.max(big, math.abs(g[i]))
        end
        assert.is_true(big > 0, name .. "'s gradient is all zero")
        n = n + 1
      end
      assert.are.equal(n, grads)
    end)

    it("has a batch of next-token targets and the loss of its logits", function()
      local tokens, tt = i32(exp, "tokens")
      local targets, tg = i32(exp, "targets")
      assert.is_true(same_shape({ B, T }, tt.shape) and same_shape({ B, T }, tg.shape))
      for b = 0, B - 1 do
        for t = 0, T - 1 do
          local k = b * T + t + 1
          assert.is_true(tokens[k] >= 0 and tokens[k] < V and targets[k] >= 0 and targets[k] < V)
          if t < T - 1 then assert.are.equal(tokens[k + 1], targets[k], "targets are the next tokens") end
        end
      end
      local logits, lt = f32(exp, "logits")
      assert.is_true(same_shape({ B, T, V }, lt.shape))
      -- mean cross-entropy over the B*T positions, in doubles
      local sum = 0
      for r = 0, B * T - 1 do
        local row, mx = logits + r * V, -math.huge
        for v = 0, V - 1 do assert.is_true(finite(row[v])); mx = math.max(mx, row[v]) end
        local z = 0
        for v = 0, V - 1 do z = z + math.exp(row[v] - mx) end
        sum = sum + (mx + math.log(z) - row[targets[r + 1]])
      end
      local loss = f32(exp, "loss")
      assert.is_true(finite(loss[0]))
      assert.is_true(math.abs(sum / (B * T) - loss[0]) < 1e-5,
                     ("loss %.7f, the logits' cross-entropy %.7f"):format(loss[0], sum / (B * T)))
      assert.are.equal(tonumber(meta.loss), loss[0])
    end)

    it("has ten AdamW steps with the stated settings, losses finite and falling", function()
      local optim = cjson.decode(meta.optim)
      assert.are.equal(1e-3, optim.lr)
      assert.are.same({ 0.9, 0.95 }, optim.betas)
      assert.are.equal(1e-8, optim.eps)
      assert.are.equal(0.1, optim.weight_decay)
      assert.are.equal(1.0, optim.clip)
      assert.are.equal("dim>=2", optim.decay)
      assert.are.equal("constant", optim.lr_schedule)
      assert.are.equal(10, optim.steps)
      local losses, lt = f32(exp, "losses")
      local norms, nt = f32(exp, "grad_norms")
      assert.is_true(same_shape({ optim.steps + 1 }, lt.shape) and same_shape({ optim.steps }, nt.shape))
      local loss = f32(exp, "loss")
      assert.is_true(math.abs(losses[0] - loss[0]) < 1e-6, "losses[0] is the loss at the initial weights")
      for i = 0, optim.steps do
        assert.is_true(finite(losses[i]), "loss " .. i)
        if i > 0 then
          assert.is_true(losses[i] < losses[i - 1], ("loss after step %d: %.6f, before: %.6f"):format(i, losses[i],
                         losses[i - 1]))
          assert.is_true(finite(norms[i - 1]) and norms[i - 1] > 0)
        end
      end
      assert.is_true(norms[0] > optim.clip, "the clip acts on the first step")
      if not fx.grads then return end
      -- step 1 clipped the stored gradient: its norm is theirs
      local ss = 0
      for _, name in ipairs(exp.names) do
        if name:sub(1, 5) == "grad/" then
          local g, t = f32(exp, name)
          for i = 0, t.numel - 1 do ss = ss + g[i] * g[i] end
        end
      end
      assert.is_true(math.abs(math.sqrt(ss) - norms[0]) < 1e-5 * norms[0],
                     ("grad_norms[0] %.7f, the gradients' norm %.7f"):format(norms[0], math.sqrt(ss)))
    end)

    it("used the RoPE frequencies the config's formula gives", function()
      local rope = rope_of(cfg)
      local D = null(cfg.head_dim) and cfg.hidden_size / cfg.num_attention_heads or cfg.head_dim
      local got = cjson.decode(meta.rope).inv_freq
      assert.are.equal(D / 2, #got)
      local regimes = {}
      for i = 0, D / 2 - 1 do
        local x = rope.rope_theta ^ (-2 * i / D)
        if rope.rope_type == "llama3" then
          local old, lo, hi = rope.original_max_position_embeddings, rope.low_freq_factor, rope.high_freq_factor
          local wl = 2 * math.pi / x
          if wl < old / hi then regimes.kept = true
          elseif wl > old / lo then x = x / rope.factor; regimes.scaled = true
          else
            local s = (old / wl - lo) / (hi - lo)
            x = (1 - s) * x / rope.factor + s * x
            regimes.smoothed = true
          end
        end
        assert.is_true(math.abs(got[i + 1] - x) <= 1e-6 * x, ("inv_freq[%d] %.9g, the formula %.9g"):format(i,
                       got[i + 1], x))
      end
      if rope.rope_type == "llama3" then
        assert.are.same({ kept = true, scaled = true, smoothed = true }, regimes)
      end
    end)

    it("has a greedy generation that continues its prompt", function()
      local prompt, pt = i32(exp, "prompt")
      local gen, gt = i32(exp, "generated")
      local g = cjson.decode(meta.generate)
      assert.is_false(g.do_sample)
      assert.is_true(same_shape({ 1, g.prompt_len }, pt.shape))
      assert.is_true(same_shape({ 1, g.prompt_len + g.max_new_tokens }, gt.shape))
      for i = 1, g.prompt_len do assert.are.equal(prompt[i], gen[i]) end
      for i = 1, #gen do assert.is_true(gen[i] >= 0 and gen[i] < V) end
      assert.is_true(g.min_margin > 1e-3, "the greedy path is far from a tie")
      if family == "mistral" then
        assert.is_true(#gen > cfg.sliding_window, "generation runs past the window")
      end
    end)
  end)
end

describe("Llama-family fixture llama-bf16", function()
  local f32file = st.open(DIR .. "llama/model.safetensors")
  local bf = st.open(DIR .. "llama-bf16/model.safetensors")
  local exp = st.open(DIR .. "llama-bf16/expected.safetensors")

  it("holds llama's weights rounded to bf16 (round to nearest, ties to even)", function()
    assert.are.equal("bfloat16", config("llama-bf16").torch_dtype)
    assert.are.equal(#f32file.names, #bf.names)
    local changed = 0
    for _, name in ipairs(f32file.names) do
      local t = bf.tensors[name]
      assert.is_not_nil(t, name)
      assert.are.equal("BF16", t.dtype, name)
      local raw32, raw16 = f32file:read_raw(name), bf:read_raw(name)
      local u32, u16 = ffi.cast("const uint32_t*", raw32), ffi.cast("const uint16_t*", raw16)
      for i = 0, t.numel - 1 do
        local u = tonumber(u32[i])
        local hi = math.floor(u / 65536)
        local want = math.floor((u + 0x7FFF + hi % 2) / 65536) % 65536   -- finite values only
        assert.is_true(want == u16[i], ("%s[%d]: bf16 %04x, rne of %08x is %04x"):format(name, i, u16[i], u, want))
        if u % 65536 ~= 0 then changed = changed + 1 end
      end
    end
    assert.is_true(changed > 0, "llama's weights are not already bf16 values")
  end)

  it("has transformers' bf16 run of it, near the fp32 numbers", function()
    local lf, t = f32(exp, "logits")
    local lb, tb = f32(exp, "bf16/logits")
    assert.is_true(same_shape(t.shape, tb.shape))
    local worst = 0
    for i = 0, t.numel - 1 do
      assert.is_true(finite(lb[i]))
      worst = math.max(worst, math.abs(lb[i] - lf[i]))
    end
    assert.is_true(worst > 0 and worst < 0.25, ("bf16 logits %.4f from fp32's"):format(worst))
    local loss, lossb = f32(exp, "loss"), f32(exp, "bf16/loss")
    assert.is_true(math.abs(loss[0] - lossb[0]) < 0.05)
  end)
end)
