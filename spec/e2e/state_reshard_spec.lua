-- state() saved by one strategy on N ranks, loaded by another strategy on
-- another number of ranks, with the same bits as an uninterrupted run.
-- Same global batch throughout: N ranks x 1 micro-batch = 1 rank x N.
local util = require "helpers.util"
local sh = util.sh

local H = "spec/helpers/state_roundtrip.lua"
local function ztrain(n, args)
  local launch = n > 1 and ("--nproc " .. n .. " ") or ""
  local out, rc = sh(("timeout 120 build/ztrain %s--script %s %s"):format(launch, H, args))
  return out, rc
end
local function digest(out) return out:match("digest (%x+)") end

describe("state across strategies and world sizes", function()
  local dir
  setup(function() dir = os.tmpname(); os.remove(dir); sh("mkdir -p " .. dir) end)
  teardown(function() sh("rm -rf " .. dir) end)

  -- { saver, N, loader, M }: accumulate so that N x accum = M x accum'
  for _, c in ipairs({ { "zero3", 2, "single", 1 }, { "zero3", 2, "zero1", 2 }, { "zero1", 2, "zero3", 1 },
                       { "dp", 2, "zero2", 2 }, { "zero2", 2, "dp", 1 } }) do
    it(("%s on %d ranks -> %s on %d rank(s)"):format(c[1], c[2], c[3], c[4]), function()
      local acc_save, acc_load = 1, c[2] / c[4]
      local ref, rc0 = ztrain(c[4], ("ref - %s 4 %d"):format(c[3], acc_load))
      assert.are.equal(0, rc0, ref)
      local out, rc = ztrain(c[2], ("save %s %s 2 %d"):format(dir, c[1], acc_save))
      assert.are.equal(0, rc, out)
      local got, rc2 = ztrain(c[4], ("load %s %s 2 %d %d"):format(dir, c[3], acc_load, c[2]))
      assert.are.equal(0, rc2, got)
      assert.is_string(digest(ref))
      assert.are.equal(digest(ref), digest(got))
    end)
  end

  it("refuses a state saved from another model size, naming the unit", function()
    local out, rc = ztrain(1, ("save %s single 1 1 gpt2-mini"):format(dir))
    assert.are.equal(0, rc, out)
    local got, rc2 = ztrain(1, ("load %s single 1 1 1 gpt2-tiny"):format(dir))
    assert.are.equal(1, rc2, got)
    assert.matches("unit embed has %d+ elements in the saved state but %d+ in this model", got)
  end)
end)
