-- AdamW and clipping against a plain Lua transcription of PyTorch's formulas.
local ffi = require "ffi"
local zt = require "ztrain"
local norm = require "ztrain.parallel.strategy.norm"

-- A fake unit: two tensors, one decayed (a matrix), one not (a bias).
local function unit(n1, n2)
  return { index = 1, numel = n1 + n2, tensors = {
    { name = "w", offset = 0, numel = n1, decay = true },
    { name = "b", offset = n1, numel = n2, decay = false } } }
end

local function tensor(vals)
  local t = zt.tensor.new({ #vals }, { category = "other" })
  local a = ffi.new("float[?]", #vals)
  for i, v in ipairs(vals) do a[i - 1] = v end
  t:write(a)
  return t
end

-- torch.optim.AdamW, in float32 steps as the kernel does them.
local function f32(x) return tonumber(ffi.new("float", x)) end
local function ref_adamw(p, g, m, v, lr, b1, b2, eps, wd, t, scale)
  for i = 1, #p do
    local gi = f32(g[i] * scale)
    p[i] = f32(p[i] * f32(1 - lr * wd))
    m[i] = f32(f32(b1 * m[i]) + f32((1 - b1) * gi))
    v[i] = f32(f32(b2 * v[i]) + f32(f32((1 - b2) * gi) * gi))
    local denom = f32(f32(math.sqrt(v[i]) / f32(math.sqrt(1 - b2 ^ t))) + eps)
    p[i] = f32(p[i] - f32(f32(lr / (1 - b1 ^ t)) * f32(m[i] / denom)))
  end
end

describe("AdamW", function()
  it("follows PyTorch's formula with decay on matrices only", function()
    local n1, n2 = 37, 11
    local u = unit(n1, n2)
    local p0, g = {}, {}
    for i = 1, n1 + n2 do p0[i] = math.sin(i) * 0.5; g[i] = math.cos(3 * i) * 0.1 end
    local P, G = tensor(p0), tensor(g)
    local opt = zt.adamw.new { lr = 0.01, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }
    opt:add_unit(u)
    local rp, rm, rv = {}, {}, {}
    for i = 1, n1 + n2 do rp[i], rm[i], rv[i] = f32(p0[i]), 0, 0 end
    for t = 1, 3 do
      opt:begin_step()
      opt:update_unit(u, P, G, 0.01, 0.5)
      local rw = { unpack(rp, 1, n1) }
      local rb = { unpack(rp, n1 + 1) }
      local mw, mb = { unpack(rm, 1, n1) }, { unpack(rm, n1 + 1) }
      local vw, vb = { unpack(rv, 1, n1) }, { unpack(rv, n1 + 1) }
      ref_adamw(rw, { unpack(g, 1, n1) }, mw, vw, 0.01, 0.9, 0.95, 1e-8, 0.1, t, 0.5)
      ref_adamw(rb, { unpack(g, n1 + 1) }, mb, vb, 0.01, 0.9, 0.95, 1e-8, 0.0, t, 0.5)
      for i = 1, n1 do rp[i], rm[i], rv[i] = rw[i], mw[i], vw[i] end
      for i = 1, n2 do rp[n1 + i], rm[n1 + i], rv[n1 + i] = rb[i], mb[i], vb[i] end
    end
    local got = P:totable()
    local worst = 0
    for i = 1, n1 + n2 do worst = math.max(worst, math.abs(got[i] - rp[i]) / math.abs(rp[i])) end
    assert.is_true(worst < 1e-6, "relative error " .. worst)
    opt:free(); P:free(); G:free()
  end)

  -- a unit of more tensors than one segments op takes (16) goes through
  -- several, and a stored bf16 gradient (mixed precision, no accumulation)
  -- is read as it is: the bits of one op a tensor on the widened fp32
  -- gradient (zt.ops.adamw per tensor, the reference)
  it("a unit of 37 tensors, a bf16 gradient: the bits of one op a tensor on the widened gradient", function()
    local u = { index = 1, numel = 0, tensors = {} }
    for k = 1, 37 do
      local n = 3 + (k * 7) % 11
      u.tensors[k] = { name = "t" .. k, offset = u.numel, numel = n, decay = k % 3 ~= 0 }
      u.numel = u.numel + n
    end
    local p0, g = {}, {}
    for i = 1, u.numel do p0[i] = math.sin(i) * 0.5; g[i] = math.cos(3 * i) * 0.1 end
    local G32 = tensor(g)
    local G16 = zt.tensor.new({ u.numel }, { dtype = "bf16", category = "other" })
    zt.ops.cast(G16, G32); zt.ops.cast(G32, G16)          -- g on the bf16 grid, both ways
    local P, Pref = tensor(p0), tensor(p0)
    local opt = zt.adamw.new { lr = 0.01, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }
    local st = opt:new_state(u.numel)
    local m = zt.tensor.new({ u.numel }, { category = "other" })
    local v = zt.tensor.new({ u.numel }, { category = "other" })
    for t = 1, 2 do
      opt:begin_step()
      opt:update_range(u, 0, u.numel, P, G16, st, 0.01, 0.5)
      for _, x in ipairs(u.tensors) do
        local pv, gv = Pref:view(x.offset, { x.numel }), G32:view(x.offset, { x.numel })
        local mv, vv = m:view(x.offset, { x.numel }), v:view(x.offset, { x.numel })
        zt.ops.adamw(pv, gv, mv, vv, 0.01, 0.9, 0.95, 1e-8, x.decay and 0.1 or 0, 0.5, t)
        pv:free(); gv:free(); mv:free(); vv:free()
      end
    end
    assert.are.same(Pref:totable(), P:totable())
    for _, k in ipairs({ "exp_avg", "exp_avg_sq" }) do st[k]:free() end
    P:free(); Pref:free(); G32:free(); G16:free(); m:free(); v:free()
  end)

  -- a batch (begin_batch ... flush: one zt_adamw_multi op for every range)
  -- gives the bits of the ranges one by one; a batch a failed step left
  -- unflushed is dropped at the next begin_step, and a later update_range
  -- outside a batch goes at once (it does not join the stale one)
  it("a batch of ranges: the bits of each range alone; a stale batch is dropped, not joined", function()
    local u1, u2 = unit(300, 17), unit(40, 9)
    u2.index = 2
    local function fresh(n, k)
      local p = {}
      for i = 1, n do p[i] = math.sin(i * k) * 0.5 end
      return tensor(p)
    end
    local opt_a = zt.adamw.new { lr = 0.01, weight_decay = 0.1 }
    local opt_b = zt.adamw.new { lr = 0.01, weight_decay = 0.1 }
    local Pa1, Pa2, Pb1, Pb2 = fresh(317, 1), fresh(49, 2), fresh(317, 1), fresh(49, 2)
    local G1, G2 = fresh(317, 3), fresh(49, 4)
    local sa1, sa2, sb1, sb2 = opt_a:new_state(317), opt_a:new_state(49), opt_b:new_state(317), opt_b:new_state(49)
    for _ = 1, 2 do
      opt_a:begin_step(); opt_a:begin_batch()
      opt_a:update_range(u1, 0, 317, Pa1, G1, sa1, 0.01, 0.5)
      opt_a:update_range(u2, 0, 49, Pa2, G2, sa2, 0.01, 0.5)
      opt_a:flush()
      opt_b:begin_step()
      opt_b:update_range(u1, 0, 317, Pb1, G1, sb1, 0.01, 0.5)
      opt_b:update_range(u2, 0, 49, Pb2, G2, sb2, 0.01, 0.5)
    end
    assert.are.same(Pb1:totable(), Pa1:totable())
    assert.are.same(Pb2:totable(), Pa2:totable())
    -- a stale batch: begun, a range queued, never flushed (the step failed)
    local before = Pa1:totable()
    opt_a:begin_step(); opt_a:begin_batch()
    opt_a:update_range(u1, 0, 317, Pa1, G1, sa1, 0.01, 0.5)
    assert.are.same(before, Pa1:totable(), "a batched range waits for the flush")
    opt_a:begin_step()                                  -- the next step: the stale batch is gone
    local p2 = Pa2:totable()
    opt_a:update_range(u2, 0, 49, Pa2, G2, sa2, 0.02, 1)   -- outside a batch: at once
    assert.are_not.same(p2, Pa2:totable(), "a range outside a batch is updated at once")
    assert.are.same(before, Pa1:totable(), "the stale batch's range was never updated")
    opt_a:flush()                                       -- nothing pending: a no-op
    assert.are.same(before, Pa1:totable())
    -- one batch is one step's: another lr or clip scale inside it is misuse
    opt_a:begin_batch()
    opt_a:update_range(u1, 0, 317, Pa1, G1, sa1, 0.01, 0.5)
    local ok, err = pcall(opt_a.update_range, opt_a, u2, 0, 49, Pa2, G2, sa2, 0.02, 0.5)
    assert.is_false(ok)
    assert.matches("one batch takes one lr and grad_scale", err)
    opt_a:begin_step()
    for _, st in ipairs({ sa1, sa2, sb1, sb2 }) do st.exp_avg:free(); st.exp_avg_sq:free() end
    for _, t in ipairs({ Pa1, Pa2, Pb1, Pb2, G1, G2 }) do t:free() end
  end)

  it("decays the matrix and leaves the bias alone when the gradient is zero", function()
    -- g = 0: the moments stay 0, the Adam term is 0 / (0 + eps) = 0, so only
    -- decoupled weight decay moves a parameter, and only a decayed one
    local n1, n2 = 5, 3
    local u = unit(n1, n2)
    local p0, g = {}, {}
    for i = 1, n1 + n2 do p0[i] = f32(0.25 * i); g[i] = 0 end
    local P, G = tensor(p0), tensor(g)
    local opt = zt.adamw.new { lr = 0.1, weight_decay = 0.5 }
    opt:add_unit(u)
    opt:begin_step(); opt:update_unit(u, P, G, 0.1, 1)
    local got = P:totable()
    for i = 1, n1 do assert.are.equal(f32(p0[i] * f32(1 - 0.1 * 0.5)), got[i], "w[" .. i .. "]") end
    for i = n1 + 1, n1 + n2 do assert.are.equal(p0[i], got[i], "b[" .. i - n1 .. "] moved") end
    opt:free(); P:free(); G:free()
  end)

  it("gives the same bits updated in shards as whole", function()
    local n = 4096
    local u = unit(3000, 1096)
    local p0, g = {}, {}
    for i = 1, n do p0[i] = math.sin(i); g[i] = math.cos(i) * 0.01 end
    local whole, Gw = tensor(p0), tensor(g)
    local ow = zt.adamw.new { lr = 1e-3 }
    ow:add_unit(u)
    ow:begin_step(); ow:update_unit(u, whole, Gw, 1e-3, 1)
    -- two shards [0, 2048) and [2048, 4096), each with its own optimizer state
    local parts = {}
    for k, rng in ipairs({ { 0, 2048 }, { 2048, 4096 } }) do
      local o = zt.adamw.new { lr = 1e-3 }
      o:add_unit(u, { lo = rng[1], hi = rng[2] })
      local ps, gs = {}, {}
      for i = rng[1] + 1, rng[2] do ps[#ps + 1] = p0[i]; gs[#gs + 1] = g[i] end
      local P, G = tensor(ps), tensor(gs)
      o:begin_step(); o:update_unit(u, P, G, 1e-3, 1)
      parts[k] = P:totable()
      o:free(); P:free(); G:free()
    end
    local w = whole:totable()
    for i = 1, 2048 do assert.are.equal(w[i], parts[1][i]) end
    for i = 1, 2048 do assert.are.equal(w[2048 + i], parts[2][i]) end
    ow:free(); whole:free(); Gw:free()
  end)

  it("rejects bad hyper-parameters up front, naming the setting", function()
    local function err_of(opts)
      local ok, err = pcall(zt.adamw.new, opts)
      assert.is_false(ok)
      return tostring(err)
    end
    assert.matches("optim.betas must be a pair of numbers in [0, 1)", err_of { betas = { 2, 3 } }, 1, true)
    assert.matches("optim.betas must be a pair", err_of { betas = { 0.9 } }, 1, true)
    assert.matches("optim.lr must be a finite number >= 0", err_of { lr = -1 }, 1, true)
    assert.matches("optim.lr must be a finite number >= 0", err_of { lr = 1 / 0 }, 1, true)
    assert.matches("optim.eps must be > 0", err_of { eps = 0 }, 1, true)
    assert.matches("optim.weight_decay must be >= 0", err_of { weight_decay = -0.1 }, 1, true)
  end)

  it("refuses NaN and the infinities up front, not in the kernel mid-run", function()
    local function err_of(opts)
      local ok, err = pcall(zt.adamw.new, opts)
      assert.is_false(ok, "accepted")
      return tostring(err)
    end
    local nan, inf = 0 / 0, 1 / 0
    for _, b in ipairs({ { nan, 0.9 }, { 0.9, nan }, { inf, 0.9 }, { -inf, 0.9 } }) do
      local e = err_of { betas = b }
      assert.matches("optim.betas must be a pair of numbers in [0, 1)", e, 1, true)
      assert.is_nil(e:find("zt_adamw", 1, true), e)
    end
    assert.matches("optim.lr must be a finite number >= 0", err_of { lr = nan }, 1, true)
    assert.matches("optim.eps must be > 0", err_of { eps = nan }, 1, true)
    assert.matches("optim.eps must be > 0", err_of { eps = inf }, 1, true)
    assert.matches("optim.weight_decay must be >= 0", err_of { weight_decay = nan }, 1, true)
    assert.matches("optim.weight_decay must be >= 0", err_of { weight_decay = inf }, 1, true)
    -- a string is refused naming the key, not a Lua comparison error
    assert.matches("optim.lr must be a finite number >= 0, got 1e-3", err_of { lr = "1e-3" }, 1, true)
    assert.are.same({ nil, "optim.betas must be a pair of numbers in [0, 1) like { 0.9, 0.95 }, got { nan, 0.9 }" },
                    { zt.adamw.check { betas = { nan, 0.9 } } })
  end)
end)

describe("clipping by global norm", function()
  it("computes the norm over fixed blocks and clips like PyTorch", function()
    local vals = {}
    for i = 1, 3000 do vals[i] = (i % 7) - 3 end
    local t = tensor(vals)
    local s = 0
    for _, v in ipairs(vals) do s = s + v * v end
    local gn = norm.global({ units = { { index = 1 } }, grad_of = function() return t end })
    assert.are.equal(math.sqrt(s), gn)
    assert.are.equal(1.0, norm.clip_scale(0.5, 1.0))
    assert.is_true(math.abs(norm.clip_scale(4.0, 1.0) - 1 / (4 + 1e-6)) < 1e-15)
    assert.are.equal(1.0, norm.clip_scale(100, 0))       -- 0 = off
    t:free()
  end)
end)
