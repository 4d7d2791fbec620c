-- spec/cuda/common.lua -- what the whole-step GPU tests (spec/cuda/*.lua, run
-- by `make test-cuda` under build-cuda/ztrain --script) share: the skip
-- probe, the program that runs their child trainings, the small settings.
local zt = require "ztrain"
local zffi = require "ztrain.core.ffi"

local M = {}

M.util = dofile(zt.home .. "/spec/helpers/util.lua")
M.cases = dofile(zt.home .. "/spec/fixtures/digest_cases.lua")

-- The oracle's small settings (seq_len 32, micro-batch 2, 3 steps, byte
-- tokens) on a corpus every machine has (the tree's docs: a GPU machine
-- need not have the fortunes package the recipes read).
M.DATA = ("'data.text=%s/docs/*.md'"):format(zt.home)

-- need_backend(name, what): returns when `name` can be selected here. A
-- CUDA backend that cannot be (a build without CUDA, or no visible GPU)
-- prints one line "<what>: no GPU here, skipped (<reason>)" and exits 0;
-- any other failure to select it is raised (the test fails).
function M.need_backend(name, what)
  local ok, err = pcall(zffi.check_key, zffi.C.zt_device_init(name), "device.backend=" .. name)
  if ok then
    zffi.check(zffi.C.zt_device_init("cpu"), "device.backend")  -- the children select their own
    return
  end
  if name == "cuda" and (err:find("no CUDA GPU is visible", 1, true) or err:find("built without CUDA", 1, true)) then
    print(("%s: no GPU here, skipped (%s)"):format(what, err))
    os.exit(0)
  end
  error(what .. ": " .. err, 0)
end

-- program(args) -> the ztrain program for the child runs: args.ztrain, else
-- the one running this script (the children inherit ZTRAIN_LIB, so a CUDA
-- build's library is theirs too).
function M.program(args)
  if args.ztrain then return args.ztrain end
  local out = M.util.sh("readlink /proc/$PPID/exe")
  local exe = out:match("^(%S+)")
  if not exe or not exe:match("/ztrain$") then
    error("cannot tell which ztrain program runs this script (got " .. tostring(exe) ..
          "); pass ztrain=PATH", 0)
  end
  return exe
end

-- run(cmd) -> output; raises with the output when the command fails.
function M.run(cmd, what)
  local out, rc = M.util.sh(cmd)
  if rc ~= 0 then error(("%s failed (exit %s): %s\n%s"):format(what, tostring(rc), cmd, out), 0) end
  return out
end

return M
