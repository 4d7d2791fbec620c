-- Grouped-query attention with a sliding window through the runtime
-- (runtime/ops.c zt_attention_*_gqa; core/ops.lua's attention_* with
-- kv_heads and window): qkv rows q (nh heads) | k (kv_heads) | v (kv_heads),
-- query i seeing keys (i - window, i]. Against a plain Lua double
-- reference (forward, lse, backward), the CPU, fakegpu and fakegpu-async
-- devices giving the same bits (f32 and bf16 I/O, decode too), the extra
-- arguments optional (nil = nh, 0: the GPT-2 calls' bits), and refusals
-- naming what to fix. The kernels themselves: spec/c/test_attention_gqa.c,
-- spec/emu/test_attention_emu.c.
local C = require("ztrain.core.ffi").C
local ops = require "ztrain.core.ops"
local util = require "spec.helpers.util"

local tensor, rand = util.device_tensor, function(n, seed) return util.lcg(n, seed, -1.5, 1.5) end

-- shape of one case: B, T, nh, nkv, hs, W
local function dims(s) return (s.nh + 2 * s.nkv) * s.hs, s.nh * s.hs end

-- the Lua double reference: out, lse and dqkv of qkv (a flat table)
local function reference(s, qkv, dout)
  local R, Cc = dims(s)
  local out, lse, dq = {}, {}, {}
  for i = 1, s.B * s.T * R do dq[i] = 0 end
  local scale = 1 / math.sqrt(s.hs)
  local function at(b, t, which, h)         -- 1-based offset of a head's first element
    local o = (b * s.T + t) * R
    if which == 0 then return o + h * s.hs + 1 end
    return o + Cc + ((which - 1) * s.nkv + h) * s.hs + 1
  end
  for b = 0, s.B - 1 do
    for h = 0, s.nh - 1 do
      local g = math.floor(h / (s.nh / s.nkv))
      for t = 0, s.T - 1 do
        local lo = (s.W > 0) and math.max(0, t - s.W + 1) or 0
        local p, m, sum = {}, -math.huge, 0
        for j = lo, t do
          local d = 0
          for i = 0, s.hs - 1 do d = d + qkv[at(b, t, 0, h) + i] * qkv[at(b, j, 1, g) + i] end
          p[j] = d * scale
          m = math.max(m, p[j])
        end
        for j = lo, t do sum = sum + math.exp(p[j] - m) end
        lse[(b * s.nh + h) * s.T + t + 1] = m + math.log(sum)
        for j = lo, t do p[j] = math.exp(p[j] - m) / sum end
        local ob = (b * s.T + t) * Cc + h * s.hs + 1
        local dp, D = {}, 0
        for i = 0, s.hs - 1 do
          local o = 0
          for j = lo, t do o = o + p[j] * qkv[at(b, j, 2, g) + i] end
          out[ob + i] = o
        end
        for j = lo, t do
          dp[j] = 0
          for i = 0, s.hs - 1 do dp[j] = dp[j] + dout[ob + i] * qkv[at(b, j, 2, g) + i] end
          D = D + p[j] * dp[j]
        end
        for j = lo, t do
          local ds = p[j] * (dp[j] - D) * scale
          local qo, ko, vo = at(b, t, 0, h), at(b, j, 1, g), at(b, j, 2, g)
          for i = 0, s.hs - 1 do
            dq[qo + i] = dq[qo + i] + ds * qkv[ko + i]
            dq[ko + i] = dq[ko + i] + ds * qkv[qo + i]
            dq[vo + i] = dq[vo + i] + p[j] * dout[ob + i]
          end
        end
      end
    end
  end
  return out, lse, dq
end

-- forward, backward and a prefill + decode steps of one case on the active
-- device: every output as a Lua table
local function run(s, dtype)
  local R, Cc = dims(s)
  local qv, dv = rand(s.B * s.T * R, s.seed or 7), rand(s.B * s.T * Cc, 11)
  -- dout as qkv: bf16 with bf16 activations (the projection GEMM's bf16 input gradient)
  local qkv, dout = tensor({ s.B, s.T, R }, qv, dtype), tensor({ s.B, s.T, Cc }, dv, dtype)
  local out, lse = tensor({ s.B, s.T, Cc }, nil, dtype), tensor({ s.B, s.nh, s.T })
  local dqkv = tensor({ s.B, s.T, R }, rand(s.B * s.T * R, 3), dtype)   -- WRITTEN
  ops.attention_forward(out, lse, qkv, s.nh, s.nkv, s.W)
  ops.attention_backward(dqkv, dout, qkv, out, lse, s.nh, s.nkv, s.W)
  local r = { out = out:totable(), lse = lse:totable(), dqkv = dqkv:totable() }
  if dtype ~= "bf16" then                    -- decode: a prefill of T - 2, then two steps
    local kc, vc = tensor({ s.B, s.nkv, s.T, s.hs }), tensor({ s.B, s.nkv, s.T, s.hs })
    local rows, pos = {}, 0
    for _, n in ipairs({ s.T - 2, 1, 1 }) do
      local q, o, vals = tensor({ s.B, n, R }), tensor({ s.B, n, Cc }), {}
      for b = 0, s.B - 1 do
        for k = 1, n * R do vals[b * n * R + k] = qv[(b * s.T + pos) * R + k] end
      end
      q:free()
      q = tensor({ s.B, n, R }, vals)
      ops.attention_decode(o, kc, vc, q, s.nh, pos, s.nkv, s.W)
      local ot = o:totable()
      for b = 0, s.B - 1 do
        for k = 1, n * Cc do rows[(b * s.T + pos) * Cc + k] = ot[b * n * Cc + k] end
      end
      q:free(); o:free()
      pos = pos + n
    end
    r.decode = rows
    kc:free(); vc:free()
  end
  for _, t in ipairs({ qkv, dout, out, lse, dqkv }) do t:free() end
  return r, qv, dv
end

local function close(a, b, tol) return math.abs(a - b) <= tol * (1 + math.abs(b)) end

local CASES = {
  { B = 2, T = 7, nh = 4, nkv = 2, hs = 4, W = 3 },
  { B = 1, T = 9, nh = 3, nkv = 1, hs = 5, W = 0 },
  { B = 1, T = 6, nh = 2, nkv = 2, hs = 8, W = 2 },
  { B = 1, T = 5, nh = 4, nkv = 1, hs = 4, W = 50 },     -- window past T
}

describe("grouped-query attention with a sliding window", function()
  after_each(function() assert.are.equal(0, C.zt_device_init("cpu")) end)

  it("matches a plain double reference on the CPU (forward, lse, backward, decode)", function()
    for _, s in ipairs(CASES) do
      local r, qv, dv = run(s)
      local out, lse, dq = reference(s, qv, dv)
      for i, v in ipairs(out) do assert.is_true(close(r.out[i], v, 1e-5), "out " .. i) end
      for i, v in ipairs(lse) do assert.is_true(close(r.lse[i], v, 1e-5), "lse " .. i) end
      for i, v in ipairs(dq) do assert.is_true(close(r.dqkv[i], v, 1e-4), "dqkv " .. i) end
      assert.are.same(r.out, r.decode)          -- decode rows: the forward's bits
    end
  end)

  it("gives the CPU's bits on fakegpu and fakegpu-async, f32 and bf16", function()
    for _, dtype in ipairs({ "f32", "bf16" }) do
      local want = {}
      for k, s in ipairs(CASES) do want[k] = run(s, dtype) end
      for _, backend in ipairs({ "fakegpu", "fakegpu-async:3" }) do
        assert.are.equal(0, C.zt_device_init(backend))
        for k, s in ipairs(CASES) do
          local got = run(s, dtype)
          for name, v in pairs(want[k]) do
            assert.are.same(v, got[name], backend .. " " .. dtype .. " case " .. k .. " " .. name)
          end
        end
        assert.are.equal(0, C.zt_device_init("cpu"))
      end
    end
  end)

  it("takes kv_heads and window as optional: nil is nh and 0, the GPT-2 calls' bits", function()
    local s = { B = 2, T = 5, nh = 2, nkv = 2, hs = 4, W = 0 }
    local full = run(s)
    local R, Cc = dims(s)
    local qkv, dout = tensor({ 2, 5, R }, rand(2 * 5 * R, 7)), tensor({ 2, 5, Cc }, rand(2 * 5 * Cc, 11))
    local out, lse, dqkv = tensor({ 2, 5, Cc }), tensor({ 2, 2, 5 }), tensor({ 2, 5, R })
    ops.attention_forward(out, lse, qkv, 2)
    ops.attention_backward(dqkv, dout, qkv, out, lse, 2)
    assert.are.same(full.out, out:totable())
    assert.are.same(full.lse, lse:totable())
    assert.are.same(full.dqkv, dqkv:totable())
    for _, t in ipairs({ qkv, dout, out, lse, dqkv }) do t:free() end
  end)

  it("refuses heads that do not group and rows that do not split, saying what to fix", function()
    local qkv, out, lse = tensor({ 1, 3, 24 }), tensor({ 1, 3, 12 }), tensor({ 1, 3, 3 })
    local ok, err = pcall(ops.attention_forward, out, lse, qkv, 3, 2, 0)
    assert.is_false(ok)
    assert.matches("zt_attention_forward_gqa: 3 query heads are not a multiple of 2 kv heads", err, 1, true)
    assert.matches("num_key_value_heads", err, 1, true)
    ok, err = pcall(ops.attention_forward, out, lse, qkv, 4, 3, 0)
    assert.matches("4 query heads are not a multiple of 3 kv heads", err, 1, true)
    local odd = tensor({ 1, 3, 25 })                  -- 4 + 2*2 = 8 heads do not split 25
    ok, err = pcall(ops.attention_forward, out, lse, odd, 4, 2, 0)
    assert.matches("qkv must be (B,T,(NH+2*NKV)*hs)", err, 1, true)
    assert.matches("do not split into 8 heads of one size", err, 1, true)
    ok, err = pcall(ops.attention_forward, out, lse, qkv, 2, 1, -1)
    assert.matches("window -1; it must be >= 0", err, 1, true)
    local q8 = tensor({ 1, 3, 24 })                   -- nh 4, nkv 2, hs 3: out (1,3,12)
    local dq = tensor({ 1, 3, 36 })
    ok, err = pcall(ops.attention_backward, dq, out, q8, out, tensor({ 1, 4, 3 }), 4, 2, 0)
    assert.matches("zt_attention_backward_gqa: dqkv", err, 1, true)
    local kc, vc = tensor({ 1, 4, 8, 3 }), tensor({ 1, 4, 8, 3 })
    ok, err = pcall(ops.attention_decode, out, kc, vc, q8, 4, 0, 2, 0)
    assert.matches("kcache must be (B,NKV,maxT,hs) = (1,2,maxT,3)", err, 1, true)
    for _, t in ipairs({ qkv, out, lse, odd, q8, dq, kc, vc }) do t:free() end
  end)
end)
