-- The strategies under examples/ that leave the same-math rule on purpose
-- (local SGD / DiLoCo, top-k compression with error feedback), run on real
-- ranks (--nproc 2) and checked against identities that do not come from
-- their own code: dp's digest where they must equal it, dp's parameters up
-- to rounding where the arithmetic differs, per-rank digests, norms.
local util = require "helpers.util"
local cjson = require "cjson"
local ffi = require "ffi"

local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.log_every=1 train.eval_every=0 " ..
             "lr.warmup=1 data.tokenizer=bytes -q"

local dir
local function train(nproc, recipe_src, extra)
  local n = 0
  for _ in io.popen("ls " .. dir):lines() do n = n + 1 end
  local path = ("%s/recipe%d.lua"):format(dir, n)
  util.write(path, recipe_src)
  local out_dir = ("%s/out%d"):format(dir, n)
  local launch = nproc and ("--nproc " .. nproc .. " ") or ""
  local out, rc = util.sh(("timeout 120 build/ztrain %s%s %s %s out=%s"):format(launch, path, BASE, extra or "",
                                                                                 out_dir))
  assert(rc == 0, ("%s failed (rc %s):\n%s\n%s"):format(path, tostring(rc), recipe_src, out))
  local s = cjson.decode(util.read(out_dir .. "/summary.json"))
  local losses = {}
  for line in io.lines(out_dir .. "/metrics.jsonl") do
    local m = cjson.decode(line)
    losses[#losses + 1] = m
  end
  return s, losses, out_dir
end

local function loss_bits(losses)
  local t = {}
  for _, m in ipairs(losses) do t[#t + 1] = m.step .. ":" .. m.loss_hex end
  return table.concat(t, " ")
end

-- A recipe around strategy expression `expr` (Lua source; `ex` is the
-- example module at `module`). `dump = true`: rank 0 writes every
-- parameter (fp32, canonical order) to OUT/params.bin when the run ends:
-- the spec's own instrumentation, independent of the example.
local function recipe(module, expr, dump)
  return ([[
local zt = require "ztrain"
local ex = dofile(%q)
local S = %s
if %s then
  local free = S.free
  S.free = function(ctx)
    if ctx.state and ctx.dp.rank == 0 then
      local f = assert(io.open(ctx.out_dir .. "/params.bin", "wb"))
      for _, u in ipairs(ctx.model.units) do
        local buf = require("ffi").new("float[?]", u.numel)
        local v = u.params:view(0, { u.numel }); v:read(buf); v:free()
        f:write(require("ffi").string(buf, 4 * u.numel))
      end
      f:close()
    end
    return free(ctx)
  end
end
return { strategy = S }
]]):format(module, expr, tostring(dump == true))
end

local function params(out_dir)
  local s = util.read(out_dir .. "/params.bin")
  local n = #s / 4
  local p = ffi.new("float[?]", n)
  ffi.copy(p, s, #s)
  return p, n
end

-- max |a - b| / max |b| over two parameter dumps
local function rel_diff(a_dir, b_dir)
  local a, n = params(a_dir)
  local b, m = params(b_dir)
  assert(n == m, "dumps of different sizes")
  local d, scale = 0, 0
  for i = 0, n - 1 do
    d = math.max(d, math.abs(a[i] - b[i]))
    scale = math.max(scale, math.abs(b[i]))
  end
  return d / scale, d
end

local function trace(out_dir, rank)
  local t = {}
  for line in io.lines(("%s/local_sgd.rank%d.jsonl"):format(out_dir, rank)) do t[#t + 1] = cjson.decode(line) end
  return t
end

setup(function() dir = util.tmpdir() end)
teardown(function() util.rm(dir) end)

describe("examples/local_sgd.lua", function()
  local LS = "examples/local_sgd.lua"

  it("on one rank is dp: the same digest and loss bits (averaging one replica changes nothing)", function()
    for _, extra in ipairs({ "train.steps=4", "train.steps=2 batch.accumulate=2" }) do
      local want, wl = train(1, recipe(LS, "zt.strategy.dp()"), extra)
      local got, gl = train(1, recipe(LS, "ex.new { every = 2 }"), extra)
      assert.are.equal("local_sgd", got.strategy)
      assert.are.equal(want.param_digest, got.param_digest, extra)
      assert.are.equal(loss_bits(wl), loss_bits(gl), extra)
    end
  end)

  it("ranks differ between syncs and hold the same bits right after one", function()
    local s, _, out = train(2, recipe(LS, "ex.new { every = 3, trace = true }"), "train.steps=7")
    local r0, r1 = trace(out, 0), trace(out, 1)
    assert.are.equal(7, #r0); assert.are.equal(7, #r1)
    for i = 1, 7 do
      -- syncs every 3 steps, and at the last step so the run ends with one model
      local synced = i % 3 == 0 or i == 7
      assert.are.equal(synced, r0[i].synced, "step " .. i)
      if synced then
        assert.are.equal(r0[i].digest, r1[i].digest, "step " .. i .. ": ranks differ right after a sync")
      else
        assert.are_not.equal(r0[i].digest, r1[i].digest, "step " .. i .. ": ranks equal between syncs")
      end
    end
    -- the digest the run reports is the model every rank ended with
    assert.are.equal(r0[7].digest, s.param_digest)
  end)

  it("every = 1, plain averaging and SGD equal dp's averaged-gradient SGD step up to rounding", function()
    -- mean_r (p - lr g_r) = p - lr mean_r g_r in exact arithmetic (SGD is
    -- linear); in fp32 the two round differently, so the parameters agree
    -- to a few ulps and not bit for bit
    local sgd_dp = [[(function()
      local d = zt.strategy.dp()
      local setup = d.setup
      d.setup = function(ctx) ctx.optim = ex.sgd(); return setup(ctx) end
      return d
    end)()]]
    local extra = "train.steps=3 optim.clip=0 optim.lr=0.05"
    local _, wl, want = train(2, recipe(LS, sgd_dp, true), extra)
    local _, gl, got = train(2, recipe(LS, 'ex.new { every = 1, inner = "sgd" }', true), extra)
    local rel, abs = rel_diff(got, want)
    print(("local SGD (every=1) vs dp under SGD: max |diff| %.3g, relative to max |p| %.3g"):format(abs, rel))
    assert.is_true(rel < 2 ^ -20, ("relative difference %.3g"):format(rel))
    -- and a real difference in the method shows: every = 2 is far from dp
    local _, _, far = train(2, recipe(LS, 'ex.new { every = 2, inner = "sgd" }', true), extra)
    assert.is_true(rel_diff(far, want) > 100 * rel)
    -- the losses of the first step (same parameters, same data) are the same bits
    assert.are.equal(wl[1].loss_hex, gl[1].loss_hex)
  end)

  it("DiLoCo: outer lr 1 without momentum is averaging, its first Nesterov step is (1 + mu) delta, and it trains", function()
    -- start - mean_r (start - p_r) = mean_r p_r in exact arithmetic
    local extra = "train.steps=4 optim.lr=3e-3"
    local _, _, avg = train(2, recipe(LS, "ex.new { every = 2 }", true), extra)
    local _, _, outer1 = train(2, recipe(LS, 'ex.new { every = 2, outer = "nesterov", outer_lr = 1, ' ..
                                               'outer_momentum = 0 }', true), extra)
    local rel = rel_diff(outer1, avg)
    print(("DiLoCo (outer lr 1, momentum 0) vs averaging: relative difference %.3g"):format(rel))
    assert.is_true(rel < 2 ^ -20, ("relative difference %.3g"):format(rel))
    -- the first outer step by hand: momentum starts at 0, so m = delta and
    -- the update is (1 + mu) delta, with delta = start - mean_r p_r =
    -- start - (what averaging gives); start from a run that does not move
    -- (lr 0: AdamW leaves p exactly), averaging and DiLoCo from two steps
    local _, _, start = train(2, recipe(LS, "ex.new { every = 1 }", true), "train.steps=1 optim.lr=0")
    local _, _, outer = train(2, recipe(LS, 'ex.new { every = 2, outer = "nesterov", outer_lr = 0.7, ' ..
                                              'outer_momentum = 0.9 }', true), "train.steps=2 optim.lr=3e-3")
    local _, _, avg2 = train(2, recipe(LS, "ex.new { every = 2 }", true), "train.steps=2 optim.lr=3e-3")
    local p0, n = params(start)
    local a, d = params(avg2), params(outer)
    local worst, scale, moved = 0, 0, 0
    for i = 0, n - 1 do
      local want = p0[i] - 0.7 * 1.9 * (p0[i] - a[i])
      worst = math.max(worst, math.abs(d[i] - want))
      scale = math.max(scale, math.abs(p0[i]))
      moved = math.max(moved, math.abs(d[i] - a[i]))
    end
    print(("DiLoCo's first outer step vs by hand: %.3g of max |p|; it moved %.3g from averaging")
          :format(worst / scale, moved / scale))
    assert.is_true(worst < 2 ^ -20 * scale, ("first outer step off by %.3g"):format(worst))
    assert.is_true(moved > 100 * worst)
    local s, l, out = train(2, recipe(LS, 'ex.new { every = 4, outer = "nesterov", trace = true }'),
                            "train.steps=16 optim.lr=3e-3")
    assert.are.equal("diloco", s.strategy)
    assert.is_true(l[#l].loss < l[1].loss - 0.5, ("loss %g -> %g"):format(l[1].loss, l[#l].loss))
    local r0, r1 = trace(out, 0), trace(out, 1)
    assert.are.equal(r0[16].digest, r1[16].digest)
    assert.are_not.equal(r0[15].digest, r1[15].digest)
  end)
end)

describe("examples/topk_compression.lua", function()
  local TK = "examples/topk_compression.lua"

  local function topk_trace(out_dir, rank)
    local t = {}
    for line in io.lines(("%s/topk.rank%d.jsonl"):format(out_dir, rank)) do t[#t + 1] = cjson.decode(line) end
    return t
  end

  it("keep = 1 (everything sent) is dp, bit for bit, with and without accumulation, on 2 and 3 ranks", function()
    -- (3 ranks: at 2, g1 + g0 = g0 + g1 and a sum out of rank order would pass)
    for _, case in ipairs({ { 2, "train.steps=3" }, { 2, "train.steps=2 batch.accumulate=2" },
                            { 3, "train.steps=2" } }) do
      local nproc, extra = case[1], case[2]
      local want, wl = train(nproc, recipe(TK, "zt.strategy.dp()"), extra)
      local got, gl, out = train(nproc, recipe(TK, "ex.new { keep = 1, trace = true }"), extra)
      assert.are.equal("topk_ef", got.strategy)
      assert.are.equal(want.param_digest, got.param_digest, extra)
      assert.are.equal(loss_bits(wl), loss_bits(gl), extra)
      for _, line in ipairs(topk_trace(out, 1)) do assert.are.equal(0, line.residual_sq) end
    end
  end)

  it("keep = 1%: k pairs a unit, the residual is what was not sent, nothing is lost, the loss falls", function()
    local s, l, out = train(2, recipe(TK, "ex.new { keep = 0.01, trace = true, audit = true }"),
                            "train.steps=12 optim.lr=3e-3")
    -- bytes: ceil(1% of each unit's elements) (index, value) pairs of 4 + 4
    -- bytes, from the model's own unit sizes (which must add up to the
    -- parameter count the run reports)
    local gpt2 = require "ztrain.model.gpt2"
    local model = gpt2.new(gpt2.config("gpt2-tiny", { vocab_size = 256 }), { alloc = false })
    local pairs_, total = 0, 0
    for _, u in ipairs(model.units) do
      pairs_ = pairs_ + math.ceil(0.01 * u.numel)
      total = total + u.numel
    end
    assert.are.equal(s.model.params, total)
    for rank = 0, 1 do
      local t = topk_trace(out, rank)
      assert.are.equal(12, #t)
      for _, line in ipairs(t) do
        assert.are.equal(pairs_, line.sent_elements)
        assert.are.equal(8 * pairs_, line.sent_bytes)
        assert.are.equal(4 * total, line.dense_bytes)
        -- c = sent + e on disjoint elements: |c|^2 = |sent|^2 + |e|^2 (fp64
        -- sums of exact fp32 squares: equal up to the sums' rounding)
        assert.is_true(line.residual_sq > 0)
        assert.is_true(math.abs(line.c_sq - line.sent_sq - line.residual_sq) <= 1e-12 * line.c_sq,
                       ("step %d: %.17g vs %.17g + %.17g"):format(line.step, line.c_sq, line.sent_sq,
                                                                  line.residual_sq))
        -- summed over steps, sent + residual = the raw gradients (to fp32 rounding of c = g + e)
        assert.is_true(line.ledger <= 1e-5 * line.ledger_scale,
                       ("step %d: ledger %.3g of %.3g"):format(line.step, line.ledger, line.ledger_scale))
      end
    end
    assert.is_true(l[#l].loss < l[1].loss - 0.3, ("loss %g -> %g"):format(l[1].loss, l[#l].loss))
  end)
end)
