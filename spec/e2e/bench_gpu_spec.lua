-- tools/bench_gpu.lua, the GPU throughput figure, checked here on the CPU
-- (backend=cpu), so the first GPU session does not spend its device time
-- on the script: its arithmetic (tokens/s and MFU from the median step),
-- the profile table, the file it writes, its skip line and its refusals.
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local BENCH = ZT .. " --script " .. ROOT .. "/tools/bench_gpu.lua "

describe("tools/bench_gpu.lua", function()
  it("reports tokens/s and MFU from the median step, and where the time went", function()
    local out_file = os.tmpname()
    local out, rc = u.sh(BENCH .. "backend=cpu model=gpt2-tiny B=2 T=32 steps=3 profile=1 peak_tflops=0.001 out=" .. out_file)
    assert.are.equal(0, rc, out)
    local ms, tps, tf, mfu = out:match("step: median ([%d.]+) ms of 3 %b(), (%d+) tokens/s, ([%d.]+) TFLOP/s, MFU ([%d.]+)%% of 0.001 TFLOP/s")
    assert.is_truthy(ms, out)
    ms, tps, mfu = tonumber(ms), tonumber(tps), tonumber(mfu)
    -- tokens/s = B * T / median step, to the printed digits
    assert.is_true(math.abs(tps - 64 / (ms / 1e3)) <= 0.01 * tps + 1, out)
    -- MFU = tokens/s x (6 N + 12 L C T) / peak, with gpt2-tiny's N (as printed) and L, C
    local n = tonumber(out:match("model gpt2%-tiny %((%d+) parameters%)"))
    local cfg = require("ztrain").gpt2.config("gpt2-tiny")
    local want = 100 * tps * (6 * n + 12 * cfg.L * cfg.C * 32) / 1e9
    assert.is_true(math.abs(mfu - want) <= 0.02 * want, ("MFU %s, want %s\n%s"):format(mfu, want, out))
    assert.is_truthy(out:find("| ztrain | " .. tps .. " |", 1, true), out)
    -- the profile: every phase, the matmuls by role, the unaccounted rest
    for _, row in ipairs({ "| forward | matmul lm head | 1 |", "| forward | attention | 2 |",
                           "| backward | matmul qkv | 2 |", "| optimizer | AdamW |", "(unaccounted" }) do
      assert.is_truthy(out:find(row, 1, true), row .. "\n" .. out)
    end
    local f = assert(io.open(out_file))
    local written = f:read("*a")
    f:close()
    os.remove(out_file)
    assert.are.equal(out, written .. "rc=0\n")   -- u.sh appends the exit status
  end)

  it("splits the host's time into waiting for the device and its own (fakegpu-async: waits run the queue)",
     function()
    local out, rc = u.sh(BENCH .. "backend=fakegpu-async:3 model=gpt2-tiny B=2 T=32 steps=3 profile=0")
    assert.are.equal(0, rc, out)
    local w, own, step = out:match("host time: ([%d.]+) ms a step waiting for the device, (%-?[%d.]+) ms its own " ..
                                   "%(Lua, launches%), of ([%d.]+) ms %(the mean step%)")
    assert.is_truthy(w, out)
    w, own, step = tonumber(w), tonumber(own), tonumber(step)
    -- the queued kernels run inside the waits: a share of the step, not all of it
    assert.is_true(w > 0 and own > 0, out)
    assert.is_true(math.abs(w + own - step) <= 0.011, out)   -- printed to 0.01 ms
    -- on the CPU nothing waits: all the host's own
    out, rc = u.sh(BENCH .. "backend=cpu model=gpt2-tiny B=2 T=32 steps=2 profile=0")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:match("host time: 0%.00 ms a step waiting for the device"), out)
  end)

  it("without a GPU prints one skip line and exits 0", function()
    local out, rc = u.sh(BENCH)
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:match("^bench_gpu: no GPU here, skipped %(device.backend=cuda: built without CUDA[^\n]*\nrc=0\n$"), out)
  end)

  it("refuses bad arguments, naming them", function()
    for a, msg in pairs({ ["steps=0"] = "bench_gpu: steps=0 is not a whole number >= 1",
                          ["B=1.5"] = "bench_gpu: B=1.5 is not a whole number >= 1",
                          ["precision=fp16"] = 'bench_gpu: precision must be fp32 or bf16, got "fp16"',
                          ["backend=tpu"] = "bench_gpu: device.backend=tpu: ",
                          ["backend=cpu attention=bf16"] = 'device.attention = "bf16" needs device.backend = "cuda"' }) do
      local out, rc = u.sh(BENCH .. a)
      assert.are.equal(1, rc, out)
      assert.is_truthy(out:find("ztrain: " .. msg, 1, true), out)
    end
  end)
end)
