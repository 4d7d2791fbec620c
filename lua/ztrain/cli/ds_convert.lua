-- ztrain.cli.ds_convert: `ztrain ds-convert FILE [nproc=N]`: a DeepSpeed
-- config as a recipe on stdout.
local usage = require "ztrain.cli.usage"
local dsconfig = require "ztrain.train.dsconfig"

local M = {}

-- The world sizes nproc= takes: launch.nproc's (recipe.lua), less its 0
-- ("auto": here there is no launcher to ask)
local MAX_NPROC = 4096

-- world(arg) -> the world size of an "nproc=N" argument, refused naming
-- nproc and the range when N is not a whole number from 1 to MAX_NPROC
local function world(arg)
  local v = arg:match("^nproc=(.*)$")
  local n = v:match("^%d+$") and tonumber(v)      -- digits only: not 0x10, 1e3 or " 2"
  if not n or n < 1 or n > MAX_NPROC then
    error(("ds-convert: nproc=%s: give a world size >= 1 (the ranks the config's batch sizes are divided " ..
           "among): a whole number from 1 to %d"):format(v, MAX_NPROC), 0)
  end
  return n
end

-- `ztrain ds-convert FILE [nproc=N]`: a DeepSpeed config as a recipe on stdout
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" or not args[1] then
    if not args[1] then error("ds-convert: give a DeepSpeed config: ztrain ds-convert ds_config.json [nproc=N]", 0) end
    io.stdout:write(usage.command("ds-convert")); return 0
  end
  local extra = (args[2] and not args[2]:match("^nproc=")) and args[2] or args[3]
  if extra then
    error(("ds-convert: unexpected argument %s: expected ztrain ds-convert FILE [nproc=N]"):format(extra), 0)
  end
  local n = args[2] and world(args[2]) or 1
  io.stdout:write(dsconfig.recipe_text(args[1], n))
  return 0
end

return M
