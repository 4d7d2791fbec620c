-- The fuzz corpora (spec/fuzz/TARGET/) replayed through the same checks as
-- the libFuzzer harnesses (tools/fuzz/targets.lua), without clang: every
-- seed and every regression input of a fixed finding must end in a return
-- or a clear user error. And the messages of the fixed findings, read as a
-- user would.
package.path = "tools/fuzz/?.lua;" .. package.path
local targets = require "targets"
local libc = require "ztrain.core.libc"
local ffi = require "ffi"

local slurp = require("helpers.util").read

local function list(dir)
  local out, g = {}, libc.glob_t()
  if libc.glob(dir .. "/*", 0, nil, g) == 0 then
    for i = 0, tonumber(g.gl_pathc) - 1 do out[#out + 1] = ffi.string(g.gl_pathv[i]) end
  end
  libc.globfree(g)
  return out
end

describe("fuzz corpora", function()
  local tmp
  setup(function()
    tmp = os.tmpname(); os.remove(tmp); libc.mkdir(tmp, 448)
  end)
  teardown(function() os.execute("rm -rf '" .. tmp .. "'") end)

  for _, name in ipairs { "safetensors", "tokbin", "bpe_vocab", "bpe_merges", "checkpoint", "recipe" } do
    it(name .. ": every input ends in a return or a user error", function()
      local run = targets.setup(name, tmp)
      local files = list("spec/fuzz/" .. name)
      assert.is_true(#files > 0)
      for _, path in ipairs(files) do
        local finding = run(slurp(path))
        assert(finding == nil, path .. ": " .. tostring(finding))
      end
    end)
  end

  -- the message a fixed finding now gives: one line naming the file and field
  local function message(target, file)
    local ck = require "ztrain.train.checkpoint"
    assert(target == "checkpoint")
    local dir = tmp .. "/ck-" .. file
    libc.mkdir(dir, 448)
    for n, body in pairs(targets.ck_split(slurp("spec/fuzz/checkpoint/" .. file))) do
      local f = assert(io.open(dir .. "/" .. n, "wb")); f:write(body); f:close()
    end
    local ok, err = pcall(ck.open, dir)
    assert.is_false(ok)
    assert.is_true(require("ztrain.core.errors").is_user(err))
    return err
  end

  it("safetensors: a shape that is a JSON object is refused, naming the tensor", function()
    local st = require "ztrain.model.safetensors"
    local path = "spec/fuzz/safetensors/crash-shape-is-object"
    local ok, err = pcall(st.open, path)
    assert.is_false(ok)
    assert.are.equal(path .. ': tensor x: "shape" must be a list of sizes, as [768, 3072]', err)
  end)

  it("checkpoint: a files[] entry without an index is named", function()
    local err = message("checkpoint", "crash-files-entry-without-index")
    assert.matches('manifest.json: files%[1%] %(rank 0%): "index" is not a file name in the checkpoint directory',
                   err)
    assert.is_nil(err:find("\n"))
  end)
end)
