-- tools/gpu_kit.sh as on a bare GPU machine, checked on the CPU (issue 25:
-- on the GPU every ztrain run failed with "module 'cjson' not found", the
-- kit having been checked here only with the system's Lua modules in
-- reach). pack, then `run all` under tools/kit_bare.sh: a mount namespace
-- in which the system's Lua modules and its copies of every library and
-- program the kit carries are hidden, so whatever a run loads comes from
-- the kit or is missing. Without a GPU, check trains 2 MPI ranks on the CPU
-- and runs bench_gpu.lua there; test and bench load every carried binary
-- and script and skip with one line each; torch needs the machine's own
-- PyTorch. With a GPU visible only check runs (the rest is the GPU's job).
-- Skips with one line where there is no nvcc (no build-cuda/ to carry),
-- no apt-get (pack fetches the .debs) or no mount namespace (not root).
local u = require "spec.helpers.util"

local NVCC = (os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/bin/nvcc"

local function ok(cmd) return select(2, u.sh(cmd)) == 0 end

local function skip_reason()
  if not ok("test -x " .. NVCC) then return "no nvcc at " .. NVCC .. " (the kit carries build-cuda/)" end
  if not ok("command -v apt-get dpkg") then return "no apt-get/dpkg (pack fetches the runtime .debs)" end
  if not ok("unshare -m true") then return "no mount namespace here (unshare -m needs root)" end
  return nil
end

local function files(dir)
  local out = u.sh("ls -A " .. dir)
  local t = {}
  for name in out:gmatch("[^\n]+") do if not name:match("^rc=") then t[#t + 1] = name end end
  table.sort(t)
  return t
end

describe("tools/gpu_kit.sh", function()
  it("refuses a part it does not know, naming the ones it does", function()
    local out, rc = u.sh("sh tools/gpu_kit.sh run check bogus")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("gpu_kit: run takes all, check, test, bench or torch, not 'bogus'", 1, true), out)
  end)

  it("runs from the kit alone: pack, then run in a namespace without the system's Lua modules and libraries", function()
    local why = skip_reason()
    if why then print("\n  gpu_kit: skipped (" .. why .. ")"); return end
    local t0 = os.time()
    local out, rc = u.sh("sh tools/gpu_kit.sh pack")
    assert.are.equal(0, rc, out)
    local total = tonumber(out:match("with the tree (%d+) MiB of the 64 MiB a device call carries"))
    assert.is_truthy(total, out)
    assert.is_true(total <= 56, "the kit and the tree should leave room under the 64 MiB carry limit\n" .. out)

    -- the namespace hides for real: build-cuda/ztrain cannot start without
    -- the kit (LuaJIT hidden), and the system's cjson is gone
    out, rc = u.sh("sh tools/kit_bare.sh build-cuda/ztrain -e 'print(1)'")
    assert.are_not.equal(0, rc, out)
    assert.is_truthy(out:find("libluajit-5.1.so.2", 1, true), out)
    out, rc = u.sh("sh tools/kit_bare.sh sh -c 'find /usr/lib/x86_64-linux-gnu/lua /usr/share/lua -mindepth 1 | wc -l'")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:match("\n0\nrc=0\n$"), out)

    local gpu = ok("nvidia-smi -L")
    local z, logs = u.tmpdir(), u.tmpdir()
    out, rc = u.sh(("ZKIT_DIR=%s OUT=%s sh tools/kit_bare.sh sh tools/gpu_kit.sh run %s")
                   :format(z, logs, gpu and "check" or "all"))
    local summary = u.read(logs .. "/kit.log")
    local torch = ok("python3 -c 'import torch'")
    for _, part in ipairs(gpu and { "check" } or { "check", "test", "bench", "torch" }) do
      if part == "torch" and not torch then
        -- python3 without PyTorch here: the part ran and said so
        assert.is_truthy(summary:find("== gpu_kit torch: FAILED (exit 1)", 1, true), summary)
        assert.is_truthy(u.read(logs .. "/torch.log"):find("No module named 'torch'", 1, true))
      else
        assert.is_truthy(summary:find("== gpu_kit " .. part .. ": passed in ", 1, true), part .. "\n" .. out)
      end
    end
    assert.is_truthy(torch and rc == 0 or rc == 1, out)
    -- no plugin noise in any part, and nothing found outside the kit
    for _, pat in ipairs({ "unable to open", "dlopen", "cannot open shared", "not found", "Sorry!" }) do
      assert.is_falsy(out:find(pat, 1, true), pat .. "\n" .. out)
    end
    -- one log per part and the summary: at most 8 files
    local logged = files(logs)
    assert.are.same(gpu and { "check.log", "kit.log" } or
                    { "bench.log", "check.log", "kit.log", "test.log", "torch.log" }, logged)
    u.rm(z); u.rm(logs)
    print(("\n  gpu_kit: pack and run %s under kit_bare in %d s"):format(gpu and "check" or "all", os.time() - t0))
  end)

  it("ends a part that runs past its time, names it, and goes on", function()
    if skip_reason() then return end   -- said above
    local z, logs = u.tmpdir(), u.tmpdir()
    local out, rc = u.sh(("ZKIT_LIMITS='check=1' ZKIT_DIR=%s OUT=%s sh tools/gpu_kit.sh run check"):format(z, logs))
    assert.are.equal(1, rc, out)
    assert.is_truthy(out:find("== gpu_kit check: FAILED: out of time (1 s)", 1, true), out)
    assert.is_truthy(out:find("gpu_kit: FAILED: check", 1, true), out)
    u.rm(z); u.rm(logs)
  end)
end)
