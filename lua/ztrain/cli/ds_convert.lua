-- ztrain.cli.ds_convert: `ztrain ds-convert FILE [nproc=N]`: a DeepSpeed
-- config as a recipe on stdout.
local usage = require "ztrain.cli.usage"
local dsconfig = require "ztrain.train.dsconfig"

local M = {}

-- `ztrain ds-convert FILE [nproc=N]`: a DeepSpeed config as a recipe on stdout
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" or not args[1] then
    if not args[1] then error("ds-convert: give a DeepSpeed config: ztrain ds-convert ds_config.json [nproc=N]", 0) end
    io.stdout:write(usage.command("ds-convert")); return 0
  end
  local n = args[2] and tonumber((args[2]:match("^nproc=(%d+)$")))
  if args[2] and not n or args[3] then error("ds-convert: expected ztrain ds-convert FILE [nproc=N]", 0) end
  if n and n < 1 then error(("ds-convert: nproc=%d: give a world size >= 1 (the ranks the config's batch " ..
                              "sizes are divided among)"):format(n), 0) end
  io.stdout:write(dsconfig.recipe_text(args[1], n or 1))
  return 0
end

return M
