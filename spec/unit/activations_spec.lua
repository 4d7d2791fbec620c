-- The activation set's layout (lua/ztrain/model/activations.lua): logits in
-- rows padded to a multiple of 128, and with bf16 GEMMs what only a GEMM
-- reads (ln1, ln2, fch_gelu, lnf, the logits) stored bf16 -- written bf16
-- by its kernel, the same bits the GEMM's cast gave, so a step is the same
-- step at half those bytes -- and the GEMM outputs fch and qkv and the
-- attention's atty stored bf16 (bf16 activations), and the residual
-- stream and its gradient (x, resid2, the block's out, d): the step of
-- fp32 activations with fch rounded to bf16 before the GELU, qkv before
-- the attention, atty after it, and the stream rounded where it is stored
-- (helpers/util.lua, stream16_ops).
local ffi = require "ffi"
local zt = require "ztrain"
local Acts = require "ztrain.model.activations"
local precision = require "ztrain.model.precision"

local B, Tn = 2, 16

local function tiny(V)
  local cfg = zt.gpt2.config("gpt2-tiny", { vocab_size = V })
  local model = zt.gpt2.new(cfg)
  model:init(7)
  return cfg, model
end

-- forward + backward of block 0 alone through bf16 GEMMs, on a set made
-- with or without gemm16, from the same input and output gradient: the
-- block's gradients and its input gradient as host bytes, and the dtypes
-- round_acts: on the fp32 set, fch rounded to bf16 in place as the GELU
-- first reads it, qkv as the attention first reads it and atty as the
-- attention writes it (what bf16 fch, qkv and atty are), with the f32
-- kernels: an independent account of the bf16 kernels' arithmetic
local util = require "helpers.util"
local round_in_place = util.round_bf16

local function block_step(model, gemm16, round_acts)
  model.gemm16 = gemm16
  local gelu, attf = zt.ops.gelu_forward, zt.ops.attention_forward
  local restore = round_acts and util.stream16_ops() or function() end
  if round_acts then
    zt.ops.gelu_forward = function(out, inp) round_in_place(inp); return gelu(out, inp) end
    zt.ops.attention_forward = function(out, lse, qkv, NH)
      round_in_place(qkv); attf(out, lse, qkv, NH); round_in_place(out)
    end
  end
  local u = model.units[2]
  local a = model:activations(B, Tn, { u })
  local n = B * Tn * model.cfg.C
  -- the input x and the output gradient: bf16 values, stored as the set's stream is
  local x = zt.tensor.new({ B, Tn, model.cfg.C }, { dtype = a.grad:dtype() })
  local hx = ffi.new("float[?]", n)
  for i = 0, n - 1 do hx[i] = math.sin(i * 0.37) end
  util.write_stream(x, hx)
  for i = 0, n - 1 do hx[i] = math.cos(i * 0.11) * 0.01 end
  local mm = precision.bf16_matmuls(model.tier)
  a.mm = mm
  local ok, err = pcall(function()
    model:forward(u, a, x)
    util.write_stream(a.grad, hx)
    model:backward(u, a)
  end)
  zt.ops.gelu_forward, zt.ops.attention_forward = gelu, attf
  restore()
  assert(ok, err)
  local out = { dtypes = {} }
  local raw = ffi.new("uint8_t[?]", u.grads:nbytes())
  u.grads:read(raw)
  out.grads = ffi.string(raw, u.grads:nbytes())
  out.dx = util.read_stream(a.grad)
  local S = a.unit[u.index]
  for _, k in ipairs({ "ln1", "ln2", "fch_gelu", "qkv", "atty", "resid2", "fch", "out" }) do
    out.dtypes[k] = S[k]:dtype()
  end
  out.dtypes.grad = a.grad:dtype()
  mm.free(); a:free(); x:free()
  model.gemm16 = nil
  return out
end

describe("activation sets", function()
  it("keep the logits in rows padded to a multiple of 128 and read them back packed", function()
    local cfg, model = tiny(200)
    local a = model:activations(B, Tn)
    local lg = a.unit[model.head.index].logits
    assert.are.same({ B, Tn, 256 }, lg:shape())
    assert.are.equal(256, zt.ops.padded_cols(200))
    assert.are.equal(50304, zt.ops.padded_cols(50257))
    assert.are.equal(128, zt.ops.padded_cols(128))
    -- read_logits drops the pad: fill row n, column j with n * 1000 + j
    local raw = ffi.new("float[?]", B * Tn * 256)
    for n = 0, B * Tn - 1 do for j = 0, 255 do raw[n * 256 + j] = j < 200 and n * 1000 + j or -1 end end
    lg:write(raw)
    local packed, count = a:read_logits()
    assert.are.equal(B * Tn * 200, count)
    assert.are.equal(0, packed[0]); assert.are.equal(199, packed[199]); assert.are.equal(1000, packed[200])
    assert.are.equal((B * Tn - 1) * 1000 + 199, packed[count - 1])
    a:free(); model:free()
  end)

  it("with bf16 GEMMs store what only GEMMs read as bf16, by the formula's bytes", function()
    local cfg = zt.gpt2.config("gpt2-tiny", { vocab_size = 200 })
    local N, C, Vp = B * Tn, cfg.C, 256
    local f32 = Acts.set_bytes(cfg, B, Tn, zt.gpt2.new(cfg, { alloc = false }).units, {})
    local b16 = Acts.set_bytes(cfg, B, Tn, zt.gpt2.new(cfg, { alloc = false }).units, {}, nil, true)
    -- per block ln1, ln2, atty, resid2, out (N,C), qkv (N,3C), fch and
    -- fch_gelu (N,4C); the embedding's out, the stream's gradient and the
    -- head's lnf (N,C), the logits (N,Vp): each at 2 bytes instead of 4 (all
    -- multiples of 128 here)
    local halved = cfg.L * (5 * N * C + N * 3 * C + 2 * N * 4 * C) + 3 * N * C + N * Vp
    assert.are.equal(f32 - 2 * halved, b16)
  end)

  it("with bf16 GEMMs give a block the bits of fp32 activations cast, fch, qkv, atty and the stream rounded", function()
    local cfg, model = tiny(200)
    local cast, direct = block_step(model, nil, true), block_step(model, true)
    assert.are.equal("f32", cast.dtypes.ln1)
    for _, k in ipairs({ "ln1", "ln2", "fch_gelu", "fch", "qkv", "atty", "resid2", "out", "grad" }) do
      assert.are.equal("bf16", direct.dtypes[k], k)
    end
    assert.is_true(cast.grads == direct.grads, "the block's weight gradients differ")
    assert.is_true(cast.dx == direct.dx, "the block's input gradient differs")
    -- and the rounding is other math: without it the bits move
    local plain = block_step(model, nil)
    assert.is_false(plain.grads == direct.grads, "bf16 activations changed no gradient bit")
    model:free()
  end)

  it("with bf16 GEMMs keep the head's lnf and logits bf16", function()
    local cfg, model = tiny(200)
    model.gemm16 = true
    local a = model:activations(B, Tn)
    local H = a.unit[model.head.index]
    assert.are.equal("bf16", H.lnf:dtype())
    assert.are.equal("bf16", H.logits:dtype())
    assert.are.same({ B, Tn, 256 }, H.logits:shape())
    a:free(); model:free()
  end)
end)
