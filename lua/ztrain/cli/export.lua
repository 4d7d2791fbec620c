-- ztrain.cli.export: `ztrain export CHECKPOINT DIR`: a checkpoint as a
-- Hugging Face GPT-2 directory (config.json, model.safetensors).
local usage = require "ztrain.cli.usage"
local checkpoint = require "ztrain.train.checkpoint"

local M = {}

-- export(args) -> exit code. args = { CHECKPOINT, DIR }.
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(usage.command("export")); return 0 end
  if not args[1] or not args[2] or args[3] then
    error("export: give a checkpoint and an output directory: ztrain export CHECKPOINT DIR", 0)
  end
  local dir = checkpoint.export(args[1], args[2])
  print(("wrote %s (config.json, model.safetensors)"):format(dir))
  return 0
end

return M
