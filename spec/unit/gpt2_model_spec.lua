local ffi = require "ffi"
local zt = require "ztrain"
local C = require("ztrain.core.ffi").C

describe("GPT-2 model layout", function()
  it("has GPT-2's parameter counts", function()
    -- counts from the published checkpoints (vocabulary 50257, context 1024,
    -- head tied to the token embedding)
    local want = { gpt2 = 124439808, ["gpt2-medium"] = 354823168, ["gpt2-large"] = 774030080,
                   ["gpt2-xl"] = 1557611200 }
    for size, n in pairs(want) do
      local cfg = zt.gpt2.config(size)
      assert.are.equal(50257, cfg.V)
      -- the layout the trainer builds, without its buffers: every tensor of every unit
      local m = zt.gpt2.new(cfg, { alloc = false })
      local counted, names = 0, {}
      for _, u in ipairs(m.units) do
        assert.is_nil(u.params, "alloc=false allocated " .. u.name)
        for _, t in ipairs(u.tensors) do
          local k = 1
          for _, d in ipairs(t.shape) do k = k * d end
          assert.are.equal(k, t.numel, t.name)
          assert.is_nil(names[t.name], "tensor " .. t.name .. " appears twice")
          names[t.name] = true
          counted = counted + k
        end
      end
      assert.are.equal(n, counted, size .. " layout")
      assert.are.equal(n, m.nparams, size .. " nparams")
      -- and the closed formula: wte + wpe + ln_f + L blocks of 12 C^2 + 13 C
      local formula = cfg.V * cfg.C + cfg.maxT * cfg.C + 2 * cfg.C
                      + cfg.L * (12 * cfg.C * cfg.C + 13 * cfg.C)
      assert.are.equal(n, formula, size .. " formula")
      m:free()
    end
  end)

  it("keeps each unit in one flat buffer with views in canonical order", function()
    local m = zt.gpt2.new(zt.gpt2.config("gpt2-tiny", { vocab_size = 256 }))
    assert.are.equal(4, #m.units)                       -- embed, 2 blocks, head
    assert.are.same({ "embed", "block.0", "block.1", "head" },
                    { m.units[1].name, m.units[2].name, m.units[3].name, m.units[4].name })
    local total = 0
    for _, u in ipairs(m.units) do
      local off = 0
      for _, t in ipairs(u.tensors) do
        assert.are.equal(off, t.offset)
        -- the view points into the flat buffer at its offset
        assert.are.equal(ffi.cast("char*", C.zt_tensor_data(u.params.c)) + 4 * t.offset,
                         ffi.cast("char*", C.zt_tensor_data(u.p[t.name].c)))
        off = off + t.numel
      end
      assert.are.equal(off, u.numel)
      assert.is_true(u.padded >= u.numel and u.padded % zt.gpt2.PAD == 0)
      total = total + u.numel
    end
    assert.are.equal(m.nparams, total)
    assert.are.equal(124672, m.nparams)                -- matches the PyTorch fixture
    m:free()
  end)

  it("initialises deterministically from the seed, GPT-2 style", function()
    local cfg = zt.gpt2.config("gpt2-tiny", { vocab_size = 256 })
    local a, b, c = zt.gpt2.new(cfg), zt.gpt2.new(cfg), zt.gpt2.new(cfg)
    a:init(1); b:init(1); c:init(2)
    local da, db, dc = zt.digest.params(a), zt.digest.params(b), zt.digest.params(c)
    assert.are.equal(da, db)
    assert.are_not.equal(da, dc)
    local lnw = a.units[2].p["h.0.ln_1.weight"]:totable()
    local bias = a.units[2].p["h.0.attn.c_attn.bias"]:totable()
    assert.are.equal(1, lnw[1]); assert.are.equal(0, bias[7])
    local w = a.units[2].p["h.0.mlp.c_fc.weight"]:totable()
    local s = 0
    for _, x in ipairs(w) do s = s + x * x end
    local std = math.sqrt(s / #w)
    assert.is_true(math.abs(std - 0.02) < 0.001, "std " .. std)
    local pw = a.units[2].p["h.0.mlp.c_proj.weight"]:totable()
    s = 0
    for _, x in ipairs(pw) do s = s + x * x end
    assert.is_true(math.abs(math.sqrt(s / #pw) - 0.02 / math.sqrt(4)) < 0.001)
    a:free(); b:free(); c:free()
  end)

  it("rejects an unknown size with the known ones", function()
    assert.has_error(function() zt.gpt2.config("gpt3") end)
    local ok, err = pcall(zt.gpt2.config, "gpt3")
    assert.matches("known: gpt2, gpt2%-large", err)
  end)
end)

describe("tensors and memory from Lua", function()
  it("accounts bytes per category and frees explicitly", function()
    local before = zt.memory.current("device", "activations")
    local t = zt.tensor.new({ 256, 4 }, { category = "activations" })
    assert.are.equal(before + 4096, zt.memory.current("device", "activations"))
    t:free()
    assert.are.equal(before, zt.memory.current("device", "activations"))
    assert.has_error(function() t:numel() end, "use of a freed tensor")
  end)

  it("turns an over-limit allocation into an error naming the request and the use", function()
    zt.memory.set_limit("device", zt.memory.current("device") + 1024 * 1024)
    local ok, err = pcall(zt.tensor.new, { 1024, 1024 }, { category = "grads" })
    zt.memory.set_limit("device", 0)
    assert.is_false(ok)
    assert.matches("device memory limit exceeded: requested 4.00 MiB for grads", err, 1, true)
    assert.matches("params", err, 1, true)
  end)

  it("parses sizes", function()
    assert.are.equal(2 * 2 ^ 30, zt.memory.parse_size("2GiB"))
    assert.are.equal(1500000, zt.memory.parse_size("1.5MB"))
    assert.is_nil(zt.memory.parse_size("lots"))
  end)
end)
