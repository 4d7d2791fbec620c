-- Tier discipline and streams from Lua: ops refuse operands on different
-- tiers, bytes move between tiers by stream.copy_async, Lua reaches raw
-- bytes of host tensors only, and token ids are checked where they are made
-- (the data loader), not by the ops.
local ffi = require "ffi"
local zt = require "ztrain"
local T, ops = zt.tensor, zt.ops
local stream = require "ztrain.core.stream"

local function values(n, f)
  local a = ffi.new("float[?]", n)
  for i = 0, n - 1 do a[i] = f(i) end
  return a
end

local function raises(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("tier discipline", function()
  it("ops.add(host, device) raises naming both tensors and tiers", function()
    local h = T.new({ 2, 3 }, { tier = "host" })
    local d = T.new({ 2, 3 }, { tier = "device" })
    d:fill(1)
    local err = raises(ops.add, h, d)
    assert.matches("y (f32 [2,3] on host) and x (f32 [2,3] on device)", err, 1, true)
    assert.matches("different tiers", err, 1, true)
    assert.matches("zt_copy_async", err, 1, true)
    assert.are.same({ 0, 0, 0, 0, 0, 0 }, h:totable())      -- nothing written
    assert.matches("different tiers", raises(ops.copy, h, d), 1, true)
    assert.matches("different tiers", raises(ops.matmul_forward, h, d, T.new({ 3, 3 }), nil), 1, true)
    h:free(); d:free()
  end)

  it("ops run when every operand is on the host tier", function()
    local a, b = T.new({ 4 }, { tier = "host" }), T.new({ 4 }, { tier = "host" })
    a:fill(2); b:fill(3)
    ops.add(a, b)
    assert.are.same({ 5, 5, 5, 5 }, a:totable())
    a:free(); b:free()
  end)

  it("the nvme tier has no allocator yet", function()
    local err = raises(T.new, { 4 }, { tier = "nvme" })
    assert.matches("nvme tier", err, 1, true)
    assert.matches("no allocator", err, 1, true)
    assert.are.equal(0, zt.memory.current("nvme"))
  end)

  it("ptr() works on host tensors and refuses device tensors", function()
    local h = T.new({ 3 }, { tier = "host" })
    local p = h:ptr()
    p[0], p[1], p[2] = 1, 2, 3
    assert.are.same({ 1, 2, 3 }, h:totable())
    local d = T.new({ 3 })
    local err = raises(d.ptr, d)
    assert.matches("on the device tier", err, 1, true)
    assert.matches("only host-tier tensors", err, 1, true)
    h:free(); d:free()
  end)
end)

describe("streams", function()
  it("copy_async moves bytes device -> host -> device on a copy stream", function()
    local n = 1048576
    local d = T.new({ n })
    d:write(values(n, function(i) return i % 977 end))
    local h, back = T.new({ n }, { tier = "host" }), T.new({ n })
    local cs = stream.new("copy")
    stream.copy_async(h, d, cs)
    cs:copy_async(back, h)
    local ev = cs:record()
    ev:sync()
    assert.is_true(ev:done())
    local hp, bp = h:ptr(), back:totable()
    for _, i in ipairs({ 0, 1, 976, 977, n - 1 }) do
      assert.are.equal(i % 977, hp[i])
      assert.are.equal(i % 977, bp[i + 1])
    end
    ev:free(); cs:free()
    assert.is_nil(cs.c)
    assert.matches("freed stream", raises(cs.sync, cs), 1, true)
    d:free(); h:free(); back:free()
  end)

  it("copy_async on the default (compute) stream is done on return", function()
    local d, h = T.new({ 5 }), T.new({ 5 }, { tier = "host" })
    d:fill(4)
    stream.copy_async(h, d)                  -- current stream: the default
    assert.are.same({ 4, 4, 4, 4, 4 }, h:totable())
    assert.are.equal(stream.default(), stream.current())
    local err = raises(stream.copy_async, T.new({ 4 }, { tier = "host" }), d)
    assert.matches("same dtype and numel", err, 1, true)
    d:free(); h:free()
  end)

  it("a stream waits on another stream's event and on a comm request", function()
    local n = 262144
    local src, mid, out = T.new({ n }, { tier = "host" }), T.new({ n }), T.new({ n }, { tier = "host" })
    src:fill(7)
    local a, b = stream.new("copy"), stream.new("comm")
    a:copy_async(mid, src)
    b:wait(a:record())
    b:copy_async(out, mid)
    b:sync()
    assert.are.equal(7, out:ptr()[n - 1])

    local world = zt.comm.world()
    local x = T.new({ 8 })
    x:fill(1)
    local req = world:all_reduce(x, true)
    b:wait(req)
    b:copy_async(out:view(0, { 8 }), x)
    b:sync()                                 -- the stream has passed the request ...
    req:wait()                               -- ... so it may be waited (and freed) now
    assert.are.equal(world.size, out:ptr()[0])
    assert.matches("already waited", raises(b.wait, b, req), 1, true)
    assert.matches("expected an event", raises(b.wait, b, 42), 1, true)
    a:free(); b:free()
    src:free(); mid:free(); out:free(); x:free()
  end)

  it("set_current sends ops to a stream, in its order", function()
    local cs = stream.new("copy")
    local src, y = T.new({ 1000 }), T.new({ 1000 })
    src:fill(3)
    stream.set_current(cs)
    assert.are.equal(cs, stream.current())
    stream.copy_async(y, src)                -- queued on cs
    ops.scale(y, 2)                          -- runs after the copy
    stream.set_current(nil)
    assert.are.equal(stream.default(), stream.current())
    assert.are.equal(6, y:totable()[1000])
    assert.matches("unknown kind", raises(stream.new, "dma"), 1, true)
    cs:free(); src:free(); y:free()
  end)
end)

describe("token ids", function()
  it("the data loader checks tokens against vocab_size", function()
    local n = 64
    local toks = ffi.new("int32_t[?]", n)
    for i = 0, n - 1 do toks[i] = i % 10 end
    local split = { tokens = toks, n = n }
    assert.is_truthy(zt.data.loader { split = split, B = 2, T = 8, vocab_size = 10 })
    toks[37] = 12
    local L, err = zt.data.loader { split = split, B = 2, T = 8, vocab_size = 10 }
    assert.is_nil(L)
    assert.matches("token 12 at position 37 of the split is outside the model's vocabulary [0,10)",
                   err, 1, true)
    -- without vocab_size nothing is checked (the trainer passes it)
    assert.is_truthy(zt.data.loader { split = split, B = 2, T = 8 })
    assert.matches("vocab_size must be an integer",
                   raises(zt.data.loader, { split = split, B = 2, T = 8, vocab_size = 0 }), 1, true)
  end)

  it("an op meeting a bad id fails clearly (the kernel skipped it)", function()
    local tok = T.new({ 1, 4 }, { dtype = "i32" })
    tok:write(ffi.new("int32_t[4]", { 1, 2, 300, 3 }))
    local wte, wpe, out = T.new({ 16, 8 }), T.new({ 4, 8 }), T.new({ 1, 4, 8 })
    local err = raises(ops.encoder_forward, out, tok, wte, wpe)
    assert.matches("1 of 4 tokens are outside the vocabulary [0,16)", err, 1, true)
    assert.matches("the tokenizer and the model's vocabulary size V disagree", err, 1, true)
    tok:free(); wte:free(); wpe:free(); out:free()
  end)

  it("a collective refuses tensors on two tiers, naming both", function()
    local w = zt.comm.world()
    local out, inp = T.new({ 4 }, { tier = "host" }), T.new({ 4 })
    local err = raises(function() w:reduce_scatter(out, inp) end)
    assert.matches("zt_reduce_scatter: out (f32 [4] on host) and in (f32 [4] on device) are on different tiers",
                   err, 1, true)
    err = raises(function() w:all_gather(out, inp) end)
    assert.matches("zt_all_gather: out (f32 [4] on host) and in (f32 [4] on device)", err, 1, true)
    out:free(); inp:free()
  end)
end)
