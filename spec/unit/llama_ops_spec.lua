-- Llama's ops through the runtime (runtime/ops.c zt_rmsnorm_*, zt_rope_*,
-- zt_swiglu_*; core/ops.lua): each against a plain Lua double reference,
-- the CPU, fakegpu and fakegpu-async devices giving the same bits (the CPU
-- kernels behind the device tables, fakegpu-async queueing them), and
-- bad shapes refused naming the operand and what to do. The kernels
-- themselves: spec/c/test_llama_kernels.c, spec/emu/test_{layernorm,rope,swiglu}_emu.c.
local C = require("ztrain.core.ffi").C
local ops = require "ztrain.core.ops"
local util = require "spec.helpers.util"

local tensor, rand = util.device_tensor, function(n, seed) return util.lcg(n, seed, -2, 2) end

-- every op once, on the active device: the outputs as Lua tables
local function run_all()
  local N, Cc, T, hs, F = 6, 8, 3, 4, 5
  local x, w = tensor({ N, Cc }, rand(N * Cc, 1)), tensor({ Cc }, rand(Cc, 2))
  local out, rstd, d = tensor({ N, Cc }), tensor({ N }), tensor({ N, Cc }, rand(N * Cc, 3))
  local dinp, dw = tensor({ N, Cc }), tensor({ Cc })
  ops.rmsnorm_forward(out, rstd, x, w, 1e-5)
  ops.rmsnorm_backward(dinp, dw, d, x, w, rstd)
  local cos, sin = tensor({ 8, hs / 2 }), tensor({ 8, hs / 2 })
  ops.rope_table(cos, sin, 10000)
  local q = tensor({ N, 3 * hs }, rand(N * 3 * hs, 4))          -- 2 heads turned, 1 left
  ops.rope_forward(q, 0, 2, hs, T, 1, cos, sin)
  local qb = tensor({ N, 3 * hs }, q:totable())
  ops.rope_backward(qb, 0, 2, hs, T, 1, cos, sin)
  local gu, so = tensor({ N, 2 * F }, rand(N * 2 * F, 5)), tensor({ N, F })
  local sd, dgu = tensor({ N, F }, rand(N * F, 6)), tensor({ N, 2 * F })
  ops.swiglu_forward(so, gu)
  ops.swiglu_backward(dgu, sd, gu)
  local r = {}
  for k, t in pairs({ out = out, rstd = rstd, dinp = dinp, dw = dw, q = q, qb = qb, so = so,
                      dgu = dgu, cos = cos }) do r[k] = t:totable() end
  for _, t in ipairs({ x, w, out, rstd, d, dinp, dw, cos, sin, q, qb, gu, so, sd, dgu }) do t:free() end
  return r
end

local function close(a, b, tol)
  return math.abs(a - b) <= tol * (1 + math.abs(b))
end

describe("Llama's ops", function()
  after_each(function() assert.are.equal(0, C.zt_device_init("cpu")) end)

  it("match plain double references on the CPU", function()
    local r = run_all()
    local x, w = rand(48, 1), rand(8, 2)
    for n = 0, 5 do                                   -- rmsnorm forward
      local ss = 0
      for c = 1, 8 do ss = ss + x[n * 8 + c] ^ 2 end
      local rs = 1 / math.sqrt(ss / 8 + 1e-5)
      assert.is_true(close(r.rstd[n + 1], rs, 1e-6))
      for c = 1, 8 do assert.is_true(close(r.out[n * 8 + c], w[c] * x[n * 8 + c] * rs, 1e-5)) end
    end
    local q0 = rand(72, 4)                            -- rope: row 4 (position 1 + 4 % 3 = 2)
    local row, pos = 4, 2
    for h = 0, 1 do
      for i = 0, 1 do
        local a = pos * 10000 ^ (-2 * i / 4)
        local x1, x2 = q0[row * 12 + h * 4 + i + 1], q0[row * 12 + h * 4 + i + 3]
        assert.is_true(close(r.q[row * 12 + h * 4 + i + 1], x1 * math.cos(a) - x2 * math.sin(a), 1e-5))
        assert.is_true(close(r.q[row * 12 + h * 4 + i + 3], x2 * math.cos(a) + x1 * math.sin(a), 1e-5))
      end
    end
    for k = 9, 12 do assert.are.equal(q0[row * 12 + k], r.q[row * 12 + k]) end   -- the third head
    for k = 1, 72 do assert.is_true(close(r.qb[k], q0[k], 1e-6)) end             -- turned back
    local gu = rand(60, 5)                            -- swiglu forward
    for n = 0, 5 do
      for i = 1, 5 do
        local g, u = gu[n * 10 + i], gu[n * 10 + 5 + i]
        assert.is_true(close(r.so[n * 5 + i], g / (1 + math.exp(-g)) * u, 1e-6))
      end
    end
  end)

  it("give the CPU's bits on fakegpu and fakegpu-async", function()
    local want = run_all()
    for _, backend in ipairs({ "fakegpu", "fakegpu-async:3" }) do
      assert.are.equal(0, C.zt_device_init(backend))
      local got = run_all()
      for k, v in pairs(want) do assert.are.same(v, got[k], backend .. " " .. k) end
    end
  end)

  it("refuse bad shapes naming the operand and what to do", function()
    local x, w, out, r = tensor({ 2, 8 }), tensor({ 6 }), tensor({ 2, 8 }), tensor({ 2 })
    local ok, err = pcall(ops.rmsnorm_forward, out, r, x, w, 1e-5)
    assert.is_false(ok)
    assert.matches("zt_rmsnorm_forward: inp's last dim must be C=6 (the weight's length)", err, 1, true)
    local w8 = tensor({ 8 })
    ok, err = pcall(ops.rmsnorm_forward, out, r, x, w8, 0)
    assert.matches("zt_rmsnorm_forward: eps must be in (0, 1), got 0 (config.json's rms_norm_eps", err, 1, true)
    local cos, sin = tensor({ 4, 2 }), tensor({ 4, 2 })
    ok, err = pcall(ops.rope_table, cos, sin, 1)
    assert.matches("theta must be a finite number > 1 (config.json's rope_theta), got 1", err, 1, true)
    ops.rope_table(cos, sin, 10000)
    ok, err = pcall(ops.rope_forward, x, 4, 2, 4, 2, 0, cos, sin)
    assert.matches("zt_rope_forward: 2 heads of 4 from column 4 do not fit x's rows of 8", err, 1, true)
    ok, err = pcall(ops.rope_forward, x, 0, 2, 4, 2, 3, cos, sin)
    assert.matches("zt_rope_forward: positions 3..4 are past the table's 4; make the table longer", err, 1, true)
    ok, err = pcall(ops.rope_forward, x, 0, 1, 3, 2, 0, cos, sin)
    assert.matches("head_size must be even and > 0", err, 1, true)
    -- outputs over their inputs: the CPU and a GPU would compute other things
    local r2 = tensor({ 2 })
    ops.rmsnorm_forward(out, r2, x, w8, 1e-5)
    ok, err = pcall(ops.rmsnorm_backward, out, nil, out, x, w8, r2)
    assert.matches("zt_rmsnorm_backward: dinp may not overlap dout, inp, weight or rstd", err, 1, true)
    ok, err = pcall(ops.rope_table, cos, cos, 10000)
    assert.matches("zt_rope_table: cos and sin must be two tensors", err, 1, true)
    r2:free()
    ok, err = pcall(ops.rope_table, cos, sin, 10000, { factor = 0 / 0, low_freq_factor = 1, high_freq_factor = 4,
                                                       original_max_position_embeddings = 8 })
    assert.matches("zt_rope_table: the Llama 3 scaling's numbers must be finite (config.json's rope_scaling)",
                   err, 1, true)
    ok, err = pcall(ops.rope_table, cos, sin, 10000, { factor = 8, low_freq_factor = 4, high_freq_factor = 1,
                                                       original_max_position_embeddings = 8 })
    assert.matches("high_freq_factor > low_freq_factor", err, 1, true)
    local gu, so = tensor({ 2, 7 }), tensor({ 2, 3 })
    ok, err = pcall(ops.swiglu_forward, so, gu)
    assert.matches("zt_swiglu_forward: gu's rows must be [gate | up], an even width", err, 1, true)
    -- bf16 activations: the dtypes go together
    local gu16 = tensor({ 2, 8 }, nil, "bf16")
    local so32 = tensor({ 2, 4 })
    ok, err = pcall(ops.swiglu_forward, so32, gu16)
    assert.matches("zt_swiglu_forward: out must be bf16", err, 1, true)
    local d16 = tensor({ 2, 8 }, nil, "bf16")
    ok, err = pcall(ops.rmsnorm_backward, out, nil, x, x, w8, r, d16)
    assert.is_true(ok, err)
    ok, err = pcall(ops.rmsnorm_backward, nil, w8, x, x, w8, r, d16)
    assert.matches("zt_rmsnorm_backward_b16: dinp16 is dinp rounded: pass dinp too", err, 1, true)
    local dg32, dd = tensor({ 2, 8 }), tensor({ 2, 4 })
    ok, err = pcall(ops.swiglu_backward, dg32, dd, gu16)
    assert.matches("zt_swiglu_backward: dgu must be bf16", err, 1, true)
    ok, err = pcall(ops.swiglu_backward, tensor({ 2, 8 }, nil, "bf16"), dd, gu16)
    assert.matches("zt_swiglu_backward: dout must be bf16", err, 1, true)
    local x16 = require("ztrain").tensor.new({ 2, 8 }, { tier = "device", dtype = "f16" })
    ok, err = pcall(ops.rope_forward, x16, 0, 2, 4, 2, 0, cos, sin)
    assert.matches("zt_rope_forward: x must be f32", err, 1, true)
    dg32:free(); dd:free(); x16:free()
    for _, t in ipairs({ x, w, out, r, w8, cos, sin, gu, so, gu16, so32, d16 }) do t:free() end
  end)
end)
