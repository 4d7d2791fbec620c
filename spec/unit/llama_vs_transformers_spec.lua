-- ztrain's Llama-family model against transformers (issue 33's fidelity):
-- each fixture of spec/fixtures/llama/ (tools/llama_fixture.py: a random
-- tiny Llama 3 with its RoPE scaling, a Qwen 2.5 with q/k/v biases and tied
-- embeddings, a Mistral with a sliding window; README.md there) loaded
-- through model=hf:DIR's path, then: the logits and the mean loss of its
-- batch, the gradient of every parameter, and ten AdamW steps (clip 1.0,
-- lr 1e-3, betas 0.9/0.95, weight decay 0.1 on matrices) at fp32 noise;
-- greedy generation (the KV cache, RoPE at each position) continuing the
-- prompt with transformers' 8 tokens; the BF16 checkpoint read as its F32
-- twin's weights rounded.
local ffi = require "ffi"
local st = require "ztrain.model.safetensors"
local hf = require "ztrain.model.hf"
local adamw = require "ztrain.model.adamw"
local norm = require "ztrain.parallel.strategy.norm"
local T = require "ztrain.core.tensor"
local gen = require "ztrain.model.generate"
require "ztrain"

local DIR = "spec/fixtures/llama/"

local function read(f, name)
  local t = f.tensors[name]
  local n = t.numel
  local buf = ffi.new("float[?]", n)
  if t.dtype == "I32" then
    local raw = f:read_raw(name)
    local ib = ffi.cast("const int32_t *", raw)
    local out = ffi.new("int32_t[?]", n)
    for i = 0, n - 1 do out[i] = ib[i] end
    return out, n
  end
  f:read_f32(name, buf)
  return buf, n
end

-- the largest |a - b| over the largest |b| (tensors as cdata arrays)
local function rel(a, b, n)
  local d, m = 0, 1e-30
  for i = 0, n - 1 do
    d = math.max(d, math.abs(a[i] - b[i]))
    m = math.max(m, math.abs(b[i]))
  end
  return d / m
end

local function load(family)
  local model = hf.load(DIR .. family, { tier = "device" })
  for _, u in ipairs(model.units) do
    model:set_grads(u, T.new({ u.padded }, { tier = "device", category = "grads" }))
  end
  local ex = st.open(DIR .. family .. "/expected.safetensors")
  local tok = read(ex, "tokens")
  local tg = read(ex, "targets")
  local B, Tn = ex.tensors.tokens.shape[1], ex.tensors.tokens.shape[2]
  local a = model:activations(B, Tn)
  a.tokens:write(tok); a.targets:write(tg)
  return model, a, ex, B * Tn
end

local function step(model, a, N)
  a.dscale = 1 / N
  local loss = model:forward_all(a)
  model:backward_all(a)
  return loss
end

describe("the Llama family against transformers", function()
  for _, family in ipairs({ "llama", "qwen2", "mistral" }) do
    it(family .. ": logits, loss and every gradient", function()
      local model, a, ex, N = load(family)
      a.dscale = nil                      -- the logits stay (dscale: dlogits in their place)
      model:forward_all(a)
      local lg, n = a:read_logits()
      local wl = read(ex, "logits")
      local e = rel(lg, wl, n)
      assert.is_true(e < 1e-5, ("logits %.3g apart (of the largest)"):format(e))
      local loss = step(model, a, N)
      local want_loss = read(ex, "loss")[0]
      assert.is_true(math.abs(loss - want_loss) <= 1e-5 * math.abs(want_loss),
                     ("loss %.9g, transformers %.9g"):format(loss, want_loss))
      local checked = 0
      for u, t in model:each_tensor() do
        local g = ffi.new("float[?]", t.numel)
        u.g[t.name]:read(g)
        local want = read(ex, "grad/" .. t.name)
        local eg = rel(g, want, t.numel)
        assert.is_true(eg < 2e-5, ("%s: gradient %.3g apart (of its largest)"):format(t.name, eg))
        checked = checked + 1
      end
      assert.is_true(checked >= 20)
      a:free(); model:free()
    end)

    it(family .. ": ten AdamW steps, clipped at 1.0, give transformers' losses", function()
      local model, a, ex, N = load(family)
      local opt = adamw.new({ lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 })
      for _, u in ipairs(model.units) do opt:add_unit(u) end
      local want = read(ex, "losses")
      local got = {}
      for s = 1, 10 do
        got[s] = step(model, a, N)
        local gn = norm.global({ units = model.units, grad_of = function(u) return u.grads end })
        opt:begin_step()
        for _, u in ipairs(model.units) do
          opt:update_unit(u, u.params, u.grads, 1e-3, norm.clip_scale(gn, 1.0))
        end
      end
      a.dscale = nil
      got[11] = model:forward_all(a)
      for s = 1, 11 do
        assert.is_true(math.abs(got[s] - want[s - 1]) <= 2e-6 * math.abs(want[s - 1]),
                       ("loss %d: %.7g, transformers %.7g"):format(s - 1, got[s], want[s - 1]))
      end
      opt:free(); a:free(); model:free()
    end)
  end

  for _, family in ipairs({ "llama", "qwen2", "mistral" }) do
    it(family .. ": greedy generation gives transformers' tokens", function()
      local model = hf.load(DIR .. family, { tier = "device" })
      local ex = st.open(DIR .. family .. "/expected.safetensors")
      local p, np = read(ex, "prompt")
      local g, ng = read(ex, "generated")
      local prompt = {}
      for i = 0, np - 1 do prompt[i + 1] = p[i] end
      local out = gen.generate(model, prompt, { max_tokens = ng - np, temperature = 0, stop_at_eot = false })
      local want = {}
      for i = np, ng - 1 do want[#want + 1] = g[i] end
      assert.are.same(want, out)
      model:free()
    end)
  end

  it("turns by transformers' own frequencies, bit for bit, out to position 8191", function()
    local cjson = require "cjson"
    local ops = require "ztrain.core.ops"
    local fl = ffi.new("float[1]")
    local function f32(x) fl[0] = x; return fl[0] end
    for _, family in ipairs({ "llama", "qwen2", "mistral" }) do
      local src = hf.open(DIR .. family)
      local inv = cjson.decode(st.open(DIR .. family .. "/expected.safetensors").metadata.rope).inv_freq
      local P, h2 = 8192, #inv
      local c, sn = T.new({ P, h2 }, { tier = "host" }), T.new({ P, h2 }, { tier = "host" })
      ops.rope_table(c, sn, src.cfg.theta, src.cfg.scaling)
      local cp, sp = c:ptr(), sn:ptr()
      for _, p in ipairs({ 1, 100, 4095, 8191 }) do
        for i = 1, h2 do
          local a = f32(f32(inv[i]) * p)               -- the float angle, as transformers' matmul rounds it
          assert.are.equal(f32(math.cos(a)), cp[p * h2 + i - 1], ("%s position %d pair %d"):format(family, p, i))
          assert.are.equal(f32(math.sin(a)), sp[p * h2 + i - 1], ("%s position %d pair %d"):format(family, p, i))
        end
      end
      c:free(); sn:free()
    end
  end)

  it("reads a BF16 checkpoint as its F32 twin's weights rounded", function()
    local m16, m32 = hf.load(DIR .. "llama-bf16", { tier = "host" }), hf.load(DIR .. "llama", { tier = "host" })
    local u32 = ffi.new("uint32_t[1]")
    for i, u in ipairs(m16.units) do
      local a, b = u.params:totable(), m32.units[i].params:totable()
      for k = 1, u.numel do
        local f = ffi.new("float[1]", b[k])
        u32[0] = ffi.cast("uint32_t *", f)[0]
        local r = bit.band(u32[0] + 0x7fff + bit.band(bit.rshift(u32[0], 16), 1), 0xffff0000)
        u32[0] = r
        assert.are.equal(ffi.cast("float *", u32)[0], a[k])
      end
    end
    m16:free(); m32:free()
  end)
end)
