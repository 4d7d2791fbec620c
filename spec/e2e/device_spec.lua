-- The device keys as a user meets them: device.backend's refusals (a
-- build without CUDA, an unknown backend), and device.attention
-- (zt_device_attention in runtime/ztrain.h):
-- "exact" everywhere, "bf16" (the tensor-core kernels) on the CUDA device
-- only, "auto" (the default) bf16 where a run takes the bf16 GEMMs on the
-- CUDA device, else exact. The recipe refuses what the runtime would, before anything starts;
-- the runtime refuses it too, for programs that call it directly; a run's
-- summary.json says which attention it trained with. The bf16 kernels
-- themselves are checked by test_cuda (on a GPU), test_attention_tiles and
-- the emulator (here), and spec/cuda/whole_step.lua attention_b=bf16.
local ffi = require "ffi"
local cjson = require "cjson"
local recipe = require "ztrain.train.recipe"
local util = require "helpers.util"
local C = require("ztrain.core.ffi").C

local RUN = "build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 " ..
            "batch.micro=2 train.steps=1 train.eval_every=0 -q "

describe("device.backend", function()
  it("a build without CUDA refuses cuda, saying what to do; an unknown backend is named", function()
    local dir = util.outdir()
    for arg, msg in pairs({
      ["device.backend=cuda"] = "ztrain: device.backend=cuda: built without CUDA: rebuild with make CUDA=1 " ..
                                "(or use the cpu backend) [EINVAL]\n",
      ["device.backend=tpu"] = 'ztrain: device.backend=tpu: unknown device backend; known: cpu, cuda, fakegpu and ' ..
                               'fakegpu-async[:SEED] (test devices) [EINVAL]\n',
      ["device.backend=fakegpu-async:x"] = 'ztrain: device.backend=fakegpu-async:x: the seed after ' ..
                               '"fakegpu-async:" must be a whole number, e.g. fakegpu-async:7 [EINVAL]\n' }) do
      local out, rc = util.sh(RUN .. arg .. " out=" .. dir)
      assert.are.equal(1, rc, out)
      assert.are.equal(msg .. "rc=1\n", out)           -- util.sh appends the status
      assert.is_nil(io.open(dir .. "/summary.json"), "no summary for a run that never started")
    end
    util.rm(dir)
  end)

  it("the runtime's message names its call and C things; the run's names the key the user set", function()
    finally(function() C.zt_device_init("cpu") end)
    for value, rest in pairs({
      cuda = "built without CUDA: rebuild with make CUDA=1 (or use the cpu backend)",
      tpu = "unknown device backend; known: cpu, cuda, fakegpu and fakegpu-async[:SEED] (test devices)",
      ["fakegpu-async:x"] = 'the seed after "fakegpu-async:" must be a whole number, e.g. fakegpu-async:7' }) do
      assert.are_not.equal(0, C.zt_device_init(value))
      local msg = ffi.string(C.zt_last_error())
      assert.are.equal(('zt_device_init("%s"): %s'):format(value, rest), msg)
      assert.is_nil(msg:find("device.backend", 1, true), msg)
      -- the binding as the trainer calls it: the key in place of the call, no Lua location
      local ok, err = pcall(require("ztrain.core.ffi").check_key, C.zt_device_init(value), "device.backend=" .. value)
      assert.is_false(ok)
      assert.are.equal(("device.backend=%s: %s [EINVAL]"):format(value, rest), err)
    end
  end)
end)

describe("device.attention", function()
  it("the recipe knows auto, exact and bf16, and bf16 needs the CUDA device", function()
    local r = assert(recipe.resolve({}, {}))
    assert.are.equal("auto", r.device.attention)
    local bad, err = recipe.resolve({}, { "device.attention=fast" })
    assert.is_nil(bad)
    assert.are.equal('device.attention must be "auto", "exact" or "bf16", got "fast"', err)
    for _, backend in ipairs({ "cpu", "fakegpu" }) do
      bad, err = recipe.resolve({}, { "device.attention=bf16", "device.backend=" .. backend })
      assert.is_nil(bad)
      assert.are.equal(('device.attention = "bf16" needs device.backend = "cuda" (a tensor-core kernel), got %q')
                       :format(backend), err)
    end
  end)

  it("auto takes the tensor-core kernels where the run takes bf16 GEMMs on the CUDA device and a GPU " ..
     "has checked the heads, else exact", function()
    local precision = require "ztrain.model.precision"
    local GPT2 = { C = 768, NH = 12 }           -- head size 64
    local function mode(...)
      return precision.attention_mode(assert(recipe.resolve({}, { ... })), GPT2)
    end
    assert.are.equal("bf16", mode("device.backend=cuda", "precision=bf16"))
    -- the model's heads: 64 or 128 wide, one key/value head each, no window
    local cuda16 = assert(recipe.resolve({}, { "device.backend=cuda", "precision=bf16" }))
    assert.are.equal("bf16", precision.attention_mode(cuda16, { C = 2048, NH = 16, NKV = 16, window = 0 }))
    for _, cfg in ipairs({ { C = 64, NH = 4 },                         -- head size 16 (the tiny models)
                           { C = 2048, NH = 32, NKV = 8, window = 0 },  -- grouped-query (Llama 3.2 1B)
                           { C = 4096, NH = 32, NKV = 32, window = 4096 } }) do   -- a window
      assert.are.equal("exact", precision.attention_mode(cuda16, cfg))
      -- named, the tensor-core kernels are taken where they exist
      local forced = assert(recipe.resolve({}, { "device.backend=cuda", "precision=bf16", "device.attention=bf16" }))
      assert.are.equal("bf16", precision.attention_mode(forced, cfg))
    end
    assert.are.equal("bf16", mode("device.backend=cuda", "precision=bf16", "device.bf16_gemm=on"))
    -- bf16 stored, fp32 matmuls: the user asked for fp32 arithmetic
    assert.are.equal("exact", mode("device.backend=cuda", "precision=bf16", "device.bf16_gemm=off"))
    assert.are.equal("exact", mode("device.backend=cuda"))
    assert.are.equal("exact", mode("device.backend=cuda", "precision=fp16"))
    -- the test devices run the CPU kernels: their runs keep the CPU's bits
    for _, backend in ipairs({ "cpu", "fakegpu", "fakegpu-async" }) do
      assert.are.equal("exact", mode("device.backend=" .. backend, "precision=bf16", "device.bf16_gemm=on"))
    end
    -- a mode the user names is kept
    assert.are.equal("exact", mode("device.backend=cuda", "precision=bf16", "device.attention=exact"))
    assert.are.equal("bf16", mode("device.backend=cuda", "device.attention=bf16"))
  end)

  it("the runtime refuses bf16 on a device without it, naming the device and what to do", function()
    finally(function() C.zt_device_init("cpu") end)
    for _, backend in ipairs({ "cpu", "fakegpu" }) do
      assert.are.equal(0, C.zt_device_init(backend))
      assert.are.equal(0, C.zt_device_attention("exact"))
      local rc = C.zt_device_attention("bf16")
      assert.are_not.equal(0, rc)
      local msg = ffi.string(C.zt_last_error())
      assert.matches('zt_device_attention("bf16"): the tensor-core attention is a CUDA kernel and the active '
                     .. "device is " .. backend, msg, 1, true)
      assert.matches('use "exact"', msg, 1, true)
      rc = C.zt_device_attention("fp8")
      assert.are_not.equal(0, rc)
      assert.are.equal('zt_device_attention("fp8"): known: exact, bf16 (tensor cores, the cuda device)',
                       ffi.string(C.zt_last_error()))
    end
  end)

  it("a run's summary.json names the attention it trained with (auto resolved)", function()
    local dir = util.outdir()
    for _, extra in ipairs({ "", "precision=bf16 device.bf16_gemm=on device.backend=fakegpu " }) do
      local out, rc = util.sh(RUN .. extra .. "out=" .. dir .. " overwrite=true")
      assert.are.equal(0, rc, out)
      local s = cjson.decode(util.read(dir .. "/summary.json"))
      assert.are.equal("exact", s.attention)
    end
    util.rm(dir)
  end)
end)
