-- ztrain.cli.commands: the `ztrain` subcommands by name, each a module
-- under cli/ with main(args) -> exit code (args: the words after its name;
-- an error is raised as error(msg, 0), and cli/init.lua says it as one
-- `ztrain:` line). A command's module is required when it runs, not here:
-- the CLI loads this table on every start, and a recipe run or `ztrain
-- schedule` must not load the model, the planner or the HF reader a command
-- it does not run needs (a real load-time cost: the runtime's library among
-- them).
local M = {}

local MODULES = { compare = "ztrain.cli.compare", ["ds-convert"] = "ztrain.cli.ds_convert",
                  export = "ztrain.cli.export", generate = "ztrain.cli.generate",
                  plan = "ztrain.cli.plan", schedule = "ztrain.cli.schedule" }

-- name -> fn(args) -> exit code
M.SUBCOMMANDS = {}
for name, mod in pairs(MODULES) do
  M.SUBCOMMANDS[name] = function(args) return require(mod).main(args) end
end

return M
