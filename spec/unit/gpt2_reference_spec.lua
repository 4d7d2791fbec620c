-- Checks ztrain's GPT-2 against an outside reference: a PyTorch model built by
-- tools/make_reference.py with our parameter layout (spec/fixtures/README.md).
local ffi = require "ffi"
local cjson = require "cjson"
local zt = require "ztrain"
local ops = zt.ops

local FIX = "spec/fixtures/gpt2_tiny_ref"

local function load_fixture()
  local meta = cjson.decode(assert(io.open(FIX .. ".json")):read("*a"))
  local bin = assert(io.open(FIX .. ".bin", "rb")):read("*a")
  local byname = {}
  for _, t in ipairs(meta.tensors) do byname[t.name] = t end
  local function get(name)
    local t = assert(byname[name], "fixture has no tensor " .. name)
    local ct = t.dtype == "i32" and "int32_t[?]" or "float[?]"
    local a = ffi.new(ct, t.numel)
    ffi.copy(a, ffi.cast("const char*", bin) + t.offset, t.numel * 4)
    return a, t
  end
  return meta, get
end

-- ||a - b|| / ||b|| over n floats (b the reference).
local function rel_err(a, b, n)
  local d, r = 0, 0
  for i = 0, n - 1 do d = d + (a[i] - b[i]) ^ 2; r = r + b[i] ^ 2 end
  return math.sqrt(d) / math.sqrt(r)
end

describe("GPT-2 against the PyTorch reference", function()
  local meta, get, model, acts, cfg, B, Tn

  setup(function()
    meta, get = load_fixture()
    local c = meta.config
    B, Tn = c.B, c.T
    cfg = zt.gpt2.config("gpt2-tiny", { vocab_size = c.V })
    assert.are.same({ c.L, c.C, c.NH, c.maxT }, { cfg.L, cfg.C, cfg.NH, cfg.maxT })
    model = zt.gpt2.new(cfg)
    for u, t in model:each_tensor() do
      u.p[t.name]:write((get("param/" .. t.name)))
    end
    acts = model:activations(B, Tn)
    acts.tokens:write((get("tokens")))
    acts.targets:write((get("targets")))
  end)

  teardown(function()
    acts:free(); model:free()
  end)

  local function forward(dscale)
    acts.dscale = dscale
    return model:forward_all(acts)
  end

  local function backward()
    model:backward_all(acts)
  end

  it("matches logits and loss within 1e-5 relative", function()
    local loss = forward(nil)
    local ref_logits, t = get("logits")
    local logits = ffi.new("float[?]", t.numel)
    acts.unit[model.head.index].logits:read(logits)
    assert.is_true(rel_err(logits, ref_logits, t.numel) < 1e-5)
    assert.is_true(math.abs(loss - meta.loss) / meta.loss < 1e-5,
                   ("loss %.9g vs reference %.9g"):format(loss, meta.loss))
  end)

  it("matches every gradient within 1e-4 relative (norm of difference / norm)", function()
    forward(1.0 / (B * Tn))
    backward()
    local worst, wname = 0, nil
    for u, t in model:each_tensor() do
      local ref = get("grad/" .. t.name)
      local g = ffi.new("float[?]", t.numel)
      u.g[t.name]:read(g)
      local e = rel_err(g, ref, t.numel)
      if e > worst then worst, wname = e, t.name end
      assert.is_true(e < 1e-4, ("gradient of %s: relative error %.3g"):format(t.name, e))
    end
    print(("\n  worst gradient relative error %.2e (%s)"):format(worst, wname))
  end)

  it("matches the losses and grad norms of 10 AdamW steps with clipping", function()
    -- fresh parameters
    for u, t in model:each_tensor() do u.p[t.name]:write((get("param/" .. t.name))) end
    local o = meta.optim
    local optim = zt.adamw.new { lr = o.lr, betas = o.betas, eps = o.eps, weight_decay = o.weight_decay }
    local S = zt.strategy.single()
    local ctx = { model = model, optim = optim, accumulate = 1, world_size = 1, rank = 0, clip = o.clip }
    S.setup(ctx)
    for i = 1, 10 do
      local loss = forward(1.0 / (B * Tn))
      backward()
      for j = #model.units, 1, -1 do S.post_backward(ctx, model.units[j], 0) end
      local gn = S.step(ctx, o.lr)
      local rl, rn = meta.losses[i], meta.grad_norms[i]
      assert.is_true(math.abs(loss - rl) / rl < 1e-5, ("step %d loss %.9g vs %.9g"):format(i, loss, rl))
      assert.is_true(math.abs(gn - rn) / rn < 1e-4, ("step %d grad norm %.9g vs %.9g"):format(i, gn, rn))
    end
    -- and the parameters after the 10 updates, norm-relative. Adam divides by
    -- sqrt(v): where a gradient is near zero (the k slice of c_attn.bias is
    -- exactly zero in exact arithmetic, softmax cancels it) each side's
    -- rounding noise is amplified to ~1e-6..1e-5 absolute (fixture README).
    for u, t in model:each_tensor() do
      local ref = get("final/" .. t.name)
      local p = ffi.new("float[?]", t.numel)
      u.p[t.name]:read(p)
      local e = rel_err(p, ref, t.numel)
      assert.is_true(e < 1e-4, ("final %s: relative error %.3g"):format(t.name, e))
    end
    S.free(ctx); optim:free()
  end)
end)
