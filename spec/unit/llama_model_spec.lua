-- The Llama family's model (model/llama.lua): its layout against the
-- published parameter counts, the fused q|k|v and gate|up views over the
-- separate tensors, every parameter's gradient against directional finite
-- differences of the mean loss (tied and untied heads, Qwen's q/k/v
-- biases), the split backward (I then W) with the fused backward's bits,
-- and model/family.lua's choice by size name. Against transformers
-- itself: spec/unit/llama_fixture_spec.lua.
local ffi = require "ffi"
local C = require("ztrain.core.ffi").C
local llama = require "ztrain.model.llama"
local family = require "ztrain.model.family"
require "ztrain"

local function params_of(m)
  local n = 0
  for _, u in ipairs(m.units) do for _, t in ipairs(u.tensors) do n = n + t.numel end end
  return n
end

-- a model, an activation set of B x T with fixed tokens and targets
local function setup(spec, B, Tn)
  local cfg = llama.custom(spec, "spec")
  local m = llama.new(cfg)
  m:init(7)
  local a = m:activations(B, Tn)
  local tok, tg = ffi.new("int32_t[?]", B * Tn), ffi.new("int32_t[?]", B * Tn)
  for i = 0, B * Tn - 1 do tok[i] = (i * 7 + 3) % cfg.V; tg[i] = (i * 5 + 1) % cfg.V end
  a.tokens:write(tok); a.targets:write(tg)
  return m, a
end

local function grads(m)
  local g = {}
  for _, u in ipairs(m.units) do g[u.name] = u.grads:totable() end
  return g
end

-- MHA shapes until GQA's attention lands in the op (kv heads = heads)
local SMALL = { L = 2, C = 16, NH = 2, NKV = 2, F = 24, maxT = 16, V = 32, eps = 1e-5, theta = 10000 }
local function small(over)
  local s = {}
  for k, v in pairs(SMALL) do s[k] = v end
  for k, v in pairs(over or {}) do s[k] = v end
  return s
end

describe("the Llama model", function()
  it("has the published parameter counts", function()
    local want = { ["llama-3.2-1b"] = 1235814400, ["llama-3.2-3b"] = 3212749824,
                   ["llama-3.1-8b"] = 8030261248, ["qwen2.5-0.5b"] = 494032768,
                   ["mistral-7b"] = 7241732096, ["smollm-135m"] = 134515008 }
    for size, n in pairs(want) do
      local m = llama.new(size, { alloc = false })
      assert.are.equal(n, params_of(m), size)
      assert.are.equal(n, m.nparams, size)
      assert.is_nil(m.rope_cos, "a layout-only model makes no RoPE table")
      m:free()
    end
  end)

  it("reads q|k|v and gate|up as one GEMM's weight, views over the separate tensors", function()
    local m = llama.new(llama.custom(small({ NKV = 1, qkv_bias = true }), "spec"))
    local u = m.units[2]
    local q = u.p["model.layers.0.self_attn.q_proj.weight"]
    assert.are.same({ 16 + 2 * 8, 16 }, u.p.qkv_w:shape())
    assert.are.equal(C.zt_tensor_data(q.c), C.zt_tensor_data(u.p.qkv_w.c))
    assert.are.equal(C.zt_tensor_data(u.p["model.layers.0.self_attn.q_proj.bias"].c), C.zt_tensor_data(u.p.qkv_b.c))
    assert.are.same({ 48, 16 }, u.g.gu_w:shape())
    assert.are.equal(C.zt_tensor_data(u.g["model.layers.0.mlp.gate_proj.weight"].c), C.zt_tensor_data(u.g.gu_w.c))
    m:free()
  end)

  for _, case in ipairs({ { "untied", {} }, { "tied, with q/k/v biases", { tied = true, qkv_bias = true } } }) do
    it("gives every parameter the mean loss's gradient (directional differences), " .. case[1], function()
      local m, a = setup(small(case[2]), 2, 8)
      for _ = 1, 2 do         -- twice: gradients are WRITTEN, a second pass adds nothing
        a.dscale = 1 / 16
        m:forward_all(a)
        m:backward_all(a)
      end
      local function loss() a.dscale = nil; return m:forward_all(a) end
      local checked = 0
      for _, u in ipairs(m.units) do
        for _, t in ipairs(u.tensors) do
          local p, gv, pv = u.p[t.name], u.g[t.name]:totable(), u.p[t.name]:totable()
          local R, dot, buf = {}, 0, ffi.new("float[?]", t.numel)
          for i = 1, t.numel do R[i] = math.sin(i * 1.7 + #t.name); dot = dot + gv[i] * R[i] end
          local eps, fd = 2e-3, 0
          for sgn = 1, -1, -2 do
            for i = 1, t.numel do buf[i - 1] = pv[i] + sgn * eps * R[i] end
            p:write(buf)
            fd = fd + sgn * loss() / (2 * eps)
          end
          for i = 1, t.numel do buf[i - 1] = pv[i] end
          p:write(buf)
          if math.abs(dot) > 1e-3 then        -- fp32 differences resolve ~1e-5 of the loss
            assert.is_true(math.abs(fd - dot) <= 1e-2 * math.abs(dot),
                           ("%s: differences %.6g, gradient %.6g"):format(t.name, fd, dot))
            checked = checked + 1
          end
        end
      end
      assert.is_true(checked >= 12, "checked " .. checked)
      a:free(); m:free()
    end)
  end

  it("gives the fused backward's bits through the split backward (I, then W)", function()
    local m, a = setup(small({ tied = true }), 2, 8)
    a.dscale = 1 / 16
    m:forward_all(a)
    m:backward_all(a)
    local fused = grads(m)
    for _, u in ipairs(m.units) do u.grads:fill(0) end
    m:forward_all(a)
    local ws = {}
    for i = #m.units, 1, -1 do
      local u = m.units[i]
      ws[i] = m:wgrad(u, 2, 8)
      m:backward_input(u, a, ws[i])
    end
    for i = #m.units, 1, -1 do m:backward_weight(m.units[i], a, ws[i]) end
    for i, w in pairs(ws) do if w then w.free() end end
    assert.are.same(fused, grads(m))
    a:free(); m:free()
  end)

  it("is picked by its size's name, GPT-2 by its own", function()
    assert.are.equal("llama", family.config("qwen-tiny").family)
    assert.is_nil(family.config("gpt2-tiny").family)
    assert.are.equal(llama, family.module(family.config("mistral-tiny")))
    local ok, err = pcall(family.config, "llama-99b")
    assert.is_false(ok)
    assert.matches('unknown model size "llama-99b" (known: gpt2, gpt2-large', err, 1, true)
    assert.matches("llama-tiny", err, 1, true)
  end)
end)
