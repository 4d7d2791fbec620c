-- The CPU and the CUDA build side by side (issue 25): `make` builds into
-- build/, `make CUDA=1` into build-cuda/ unless B= says otherwise, so
-- either order leaves both working (before, `make CUDA=1` after `make`
-- linked build/'s CPU objects with the CUDA ones, or failed to link and
-- left no build/libztrain.so). make test builds both before the specs run
-- (build-cuda/ through make test-cuda, where nvcc is present).
local u = require "spec.helpers.util"

-- the folders a dry run of `make ARGS` writes into: the -o targets' first parts
local function out_dirs(args)
  local out, rc = u.sh("make -n -B " .. args .. " all")
  assert.are.equal(0, rc, out)
  local dirs, n = {}, 0
  for path in out:gmatch(" %-o (%S+)") do
    dirs[path:match("^([^/]+)/") or path] = true
    n = n + 1
  end
  return dirs, n, out
end

local function cuda_symbols(lib)
  local out, rc = u.sh("nm -D --defined-only " .. lib .. " | grep -c ' T zt_cuda_'")
  return tonumber(out:match("^(%d+)")) or 0, rc, out
end

local NVCC = (os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/bin/nvcc"
local function have_nvcc() return select(2, u.sh("test -x " .. NVCC)) == 0 end

describe("make and make CUDA=1", function()
  it("write into build/ and build-cuda/, never each other's folder", function()
    local dirs, n, out = out_dirs("")
    assert.is_true(n > 10, out)
    assert.are.same({ build = true }, dirs)
    dirs, n, out = out_dirs("CUDA=1")
    assert.is_true(n > 10, out)
    assert.are.same({ ["build-cuda"] = true }, dirs)
    assert.is_truthy(out:find("-o build-cuda/libztrain.so", 1, true), out)
    assert.is_truthy(out:find("-DZT_CUDA", 1, true), out)
    -- B= still names the folder
    dirs = out_dirs("CUDA=1 B=build-x")
    assert.are.same({ ["build-x"] = true }, dirs)
  end)

  it("leave build/libztrain.so the CPU build, build-cuda/libztrain.so the CUDA one", function()
    local n, rc, out = cuda_symbols("build/libztrain.so")
    assert.are.equal(0, n, out)
    assert.is_falsy(u.sh("ldd build/libztrain.so"):find("libcudart", 1, true))
    if not have_nvcc() then
      print("\n  build-cuda/: no nvcc at " .. NVCC .. ", the CUDA build is not checked")
      return
    end
    n, rc, out = cuda_symbols("build-cuda/libztrain.so")
    assert.is_true(n > 0, "build-cuda/libztrain.so has no zt_cuda_ symbols (make test-cuda builds it)\n" .. out)
    -- both builds up to date after make test's `all` and test-cuda: nothing
    -- left for `make` or `make CUDA=1` to do, so neither undoes the other
    for _, args in ipairs({ "", "CUDA=1" }) do
      out, rc = u.sh("make -q " .. args .. " all")
      assert.are.equal(0, rc, "make -q " .. args .. ": not up to date\n" .. out)
    end
  end)
end)
