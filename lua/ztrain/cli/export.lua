-- ztrain.cli.export: `ztrain export CHECKPOINT DIR`: a checkpoint as a
-- Hugging Face GPT-2 directory (config.json, model.safetensors).
local errors = require "ztrain.core.errors"
local usage = require "ztrain.cli.usage"
local checkpoint = require "ztrain.train.checkpoint"

local M = {}

-- The checkpoint reader's messages end in a training run's remedy (resume=,
-- out=, train.ckpt_every): export's is another checkpoint. Each pair: a
-- remedy as checkpoint/read.lua words it, the one for export.
local REMEDIES = {
  { "resume=latest reads OUT/checkpoints (or train.ckpt_dir) of the run to continue: give that run's out=, and " ..
    "train.ckpt_every > 0 writes checkpoints",
    "give export a checkpoint step directory (OUT/checkpoints/step-NNNNNNNN, holding manifest.json) or the " ..
    "checkpoints directory holding `latest` (a run writes them with train.ckpt_every > 0)" },
  { "(resume from an older one)",
    "(export another step directory of the run, e.g. an older OUT/checkpoints/step-NNNNNNNN)" },
  { "; resume from an older checkpoint", "; export another step directory of the run, e.g. an older " ..
    "OUT/checkpoints/step-NNNNNNNN" },
}

-- for_export(msg) -> msg with export's remedy in place of a training run's
local function for_export(msg)
  for _, r in ipairs(REMEDIES) do
    local i, j = msg:find(r[1], 1, true)
    if i then msg = msg:sub(1, i - 1) .. r[2] .. msg:sub(j + 1) end
  end
  return msg
end

-- export(args) -> exit code. args = { CHECKPOINT, DIR }.
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(usage.command("export")); return 0 end
  if not args[1] or not args[2] or args[3] then
    error("export: give a checkpoint and an output directory: ztrain export CHECKPOINT DIR", 0)
  end
  -- "" is a path to nothing: CHECKPOINT would read ./, DIR write into /
  if args[1] == "" then
    error("export: CHECKPOINT is empty (''); give a checkpoint step directory or OUT/checkpoints: " ..
          "ztrain export CHECKPOINT DIR", 0)
  end
  if args[2] == "" then
    error("export: DIR is empty (''); give a new directory to write the model into: ztrain export CHECKPOINT DIR", 0)
  end
  local ok, dir = pcall(checkpoint.export, args[1], args[2])
  if not ok then
    local e = dir
    if not errors.is_user(e) then error(e, 0) end          -- a bug: as it was, location kept
    if type(e) == "table" then e.msg = for_export(e.msg) else e = for_export(e) end   -- (keeps e.status)
    error(e, 0)
  end
  print(("wrote %s (config.json, model.safetensors)"):format(dir))
  return 0
end

return M
