-- The Llama family with bf16 GEMMs (precision=bf16, device.bf16_gemm on):
-- bf16 activations as GPT-2's (activations_spec.lua). What only a GEMM
-- reads is stored bf16 (ln1, ln2, lnf: the RMS norms' bf16 out; act: the
-- SwiGLU's), and so are the GEMM outputs qkv (turned by RoPE in bf16) and
-- gu, the attention's atty, and in the backward dqkv (turned back in bf16)
-- and dgu, and the residual stream and its gradient (x, resid2, out, d).
-- The independent account: the same block on fp32 activations
-- through the same bf16 GEMMs, with each of those tensors rounded to bf16
-- in place where the bf16 path stores it, by the f32 kernels -- the same
-- bits, the block's weight gradients and its input gradient; and without
-- the rounding the bits move (the test can fail).
local ffi = require "ffi"
local zt = require "ztrain"
local llama = require "ztrain.model.llama"
local Acts = require "ztrain.model.activations"
local precision = require "ztrain.model.precision"

local B, Tn = 2, 24

local util = require "helpers.util"
local round_in_place = util.round_bf16

-- the ops the bf16 path rounds around, wrapped to round the fp32 path the same way
local function rounding_ops()
  local o = zt.ops
  local saved = { rope_forward = o.rope_forward, rope_backward = o.rope_backward,
                  attention_forward = o.attention_forward, attention_backward = o.attention_backward,
                  swiglu_forward = o.swiglu_forward, crossentropy = o.crossentropy }
  o.rope_forward = function(x, ...)          -- qkv: the GEMM's bf16 out, then turned in bf16
    round_in_place(x); saved.rope_forward(x, ...); round_in_place(x)
  end
  o.rope_backward = function(x, ...) saved.rope_backward(x, ...); round_in_place(x) end
  o.attention_forward = function(out, ...) saved.attention_forward(out, ...); round_in_place(out) end
  o.attention_backward = function(dqkv, ...) saved.attention_backward(dqkv, ...); round_in_place(dqkv) end
  o.swiglu_forward = function(out, gu)
    round_in_place(gu); saved.swiglu_forward(out, gu); round_in_place(out)
  end
  -- the head's logits: the GEMM's bf16 out; dlogits written over them in bf16
  o.crossentropy = function(losses, dl, logits, ...)
    round_in_place(logits); saved.crossentropy(losses, dl, logits, ...); round_in_place(logits)
  end
  local stream = util.stream16_ops()     -- the residual stream and its gradient
  return function() stream(); for k, f in pairs(saved) do o[k] = f end end
end

local function bytes(t)
  local raw = ffi.new("uint8_t[?]", t:nbytes())
  t:read(raw)
  return ffi.string(raw, t:nbytes())
end

-- forward + backward of unit `ui` (a block, or the head) through bf16 GEMMs
-- on a set made with or without gemm16
local function unit_step(model, ui, gemm16, round_acts)
  model.gemm16 = gemm16
  local u = model.units[ui]
  local a = model:activations(B, Tn, { u })
  local C, n = model.cfg.C, B * Tn * model.cfg.C
  local x = zt.tensor.new({ B, Tn, C }, { dtype = a.grad:dtype() })
  local hx = ffi.new("float[?]", n)
  for i = 0, n - 1 do hx[i] = math.sin(i * 0.37) end
  util.write_stream(x, hx)
  if u.kind == "head" then
    local tg = ffi.new("int32_t[?]", B * Tn)
    for i = 0, B * Tn - 1 do tg[i] = (i * 7) % model.cfg.V end
    a.targets:write(tg)
    a.dscale = 1 / (B * Tn)
  end
  local mm = precision.bf16_matmuls(model.tier)
  a.mm = mm
  local restore = round_acts and rounding_ops() or function() end
  local ok, err = pcall(function()
    model:forward(u, a, x)
    if u.kind == "block" then
      for i = 0, n - 1 do hx[i] = math.cos(i * 0.11) * 0.01 end
      util.write_stream(a.grad, hx)
    end
    model:backward(u, a)
  end)
  restore()
  assert(ok, err)
  local out = { grads = bytes(u.grads), dx = util.read_stream(a.grad), dtypes = {} }
  for k, v in pairs(a.unit[u.index]) do out.dtypes[k] = v:dtype() end
  if u.kind == "head" and model.cfg.tied then out.grads = out.grads .. bytes(model.embed.grads) end
  mm.free(); a:free(); x:free()
  model.gemm16 = nil
  return out
end

-- the whole model (embed, blocks, head) forward and backward on one set:
-- the bf16 stream and its gradient handed from unit to unit
local function model_step(model, gemm16, round_acts)
  model.gemm16 = gemm16
  local a = model:activations(B, Tn)
  local tk, tg = ffi.new("int32_t[?]", B * Tn), ffi.new("int32_t[?]", B * Tn)
  for i = 0, B * Tn - 1 do tk[i] = (i * 13) % model.cfg.V; tg[i] = (i * 7) % model.cfg.V end
  a.tokens:write(tk); a.targets:write(tg)
  a.dscale = 1 / (B * Tn)
  local mm = precision.bf16_matmuls(model.tier)
  a.mm = mm
  local restore = round_acts and rounding_ops() or function() end
  local ok, err = pcall(function()
    local x = a.tokens
    for _, u in ipairs(model.units) do x = model:forward(u, a, x) end
    for i = #model.units, 1, -1 do model:backward(model.units[i], a) end
  end)
  restore()
  assert(ok, err)
  local g = {}
  for _, u in ipairs(model.units) do g[#g + 1] = bytes(u.grads) end
  mm.free(); a:free()
  model.gemm16 = nil
  return table.concat(g)
end

describe("Llama-family models with bf16 GEMMs", function()
  for _, size in ipairs({ "llama-tiny", "qwen-tiny", "mistral-tiny" }) do
    it(size .. ": a block gets the bits of fp32 activations rounded where bf16 stores them", function()
      local model = llama.new(size)
      model:init(11)
      local direct = unit_step(model, 2, true)
      local cast = unit_step(model, 2, nil, true)
      for _, k in ipairs({ "ln1", "qkv", "atty", "ln2", "gu", "act" }) do
        assert.are.equal("bf16", direct.dtypes[k], k)
        assert.are.equal("f32", cast.dtypes[k], k)
      end
      assert.are.equal("bf16", direct.dtypes.resid2)
      assert.are.equal("bf16", direct.dtypes.out)
      assert.is_true(cast.grads == direct.grads, "the block's weight gradients differ")
      assert.is_true(cast.dx == direct.dx, "the block's input gradient differs")
      local plain = unit_step(model, 2, nil)
      assert.is_false(plain.grads == direct.grads, "bf16 activations changed no gradient bit")
      model:free()
    end)
  end

  it("the head keeps lnf and the logits bf16, with the bits of the fp32 set rounded likewise", function()
    for _, size in ipairs({ "llama-tiny", "qwen-tiny" }) do     -- untied, tied
      local model = llama.new(size)
      model:init(5)
      local last = #model.units
      local direct, cast = unit_step(model, last, true), unit_step(model, last, nil, true)
      assert.are.equal("bf16", direct.dtypes.lnf, size)
      assert.are.equal("bf16", direct.dtypes.logits, size)
      assert.is_true(cast.grads == direct.grads, size .. ": the head's weight gradients differ")
      assert.is_true(cast.dx == direct.dx, size .. ": the head's input gradient differs")
      local plain = unit_step(model, last, nil)
      assert.is_false(plain.grads == direct.grads, size .. ": bf16 logits changed no gradient bit")
      model:free()
    end
  end)

  it("the whole model: every gradient's bits as the rounded fp32 path (the bf16 stream between units)", function()
    for _, size in ipairs({ "llama-tiny", "qwen-tiny" }) do
      local model = llama.new(size)
      model:init(3)
      local direct, cast = model_step(model, true), model_step(model, nil, true)
      assert.is_true(direct == cast, size .. ": the gradients differ")
      model:free()
    end
  end)

  it("stores what only GEMMs read as bf16, by the formula's bytes", function()
    local cfg = llama.config("llama-tiny")
    local units = llama.new(cfg, { alloc = false }).units
    local f32 = Acts.set_bytes(cfg, B, Tn, units, {})
    local b16 = Acts.set_bytes(cfg, B, Tn, units, {}, nil, true)
    local N, C, hs = B * Tn, cfg.C, cfg.C / cfg.NH
    -- per block ln1, atty, ln2, resid2, out (N,C), qkv (N,(NH+2NKV)hs), gu
    -- (N,2F), act (N,F); the embedding's out, the stream's gradient and the
    -- head's lnf (N,C), the logits (N,Vp), each at 2 bytes instead of 4
    local function al(n) return math.ceil(n * 2 / 256) * 256 end     -- each view 256-byte aligned
    local per = al(N * C) * 5 + al(N * (cfg.NH + 2 * cfg.NKV) * hs) + al(N * 2 * cfg.F) + al(N * cfg.F)
    local halved = cfg.L * per + 3 * al(N * C) + al(N * zt.ops.padded_cols(cfg.V))
    assert.are.equal(f32 - halved, b16)
  end)
end)
