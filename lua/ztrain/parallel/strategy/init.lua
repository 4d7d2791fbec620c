-- ztrain.parallel.strategy: the built-in strategies. Each is a constructor returning
-- an object with the hooks setup / pre_forward / post_forward / pre_backward
-- / post_backward / step (docs/strategies.md); options.lua says which hooks
-- are required, state.lua how a strategy's state is made public.
local M = {}
M.single = require("ztrain.parallel.strategy.single").new
M.dp = require("ztrain.parallel.strategy.dp").new
M.zero = require("ztrain.parallel.strategy.zero").new

local options = require "ztrain.parallel.strategy.options"
M.options = options
M.state = require "ztrain.parallel.strategy.state"

-- The strategies by name, in the order error messages list them: each a
-- function making a fresh object. The one place a name is given meaning
-- (the planner and recipes resolve names here).
local NAMED = {
  { "single", function() return M.single() end },
  { "dp", function() return M.dp() end },
  { "dp_deferred", function() return M.dp { defer_reduction = true } end },
  { "zero1", function() return M.zero { stage = 1 } end },
  { "zero2", function() return M.zero { stage = 2 } end },
  { "zero3", function() return M.zero { stage = 3 } end },
  { "zero1_offload", function() return M.zero { stage = 1, offload_optimizer = "host" } end },
  { "zero2_offload", function() return M.zero { stage = 2, offload_optimizer = "host" } end },
  { "zero3_offload", function() return M.zero { stage = 3, offload_optimizer = "host", offload_params = "host" } end },
  { "zero3_infinity", function() return M.zero { stage = 3, offload_optimizer = "nvme", offload_params = "nvme" } end },
}
local BY_NAME, NAMES = {}, {}
for _, e in ipairs(NAMED) do BY_NAME[e[1]] = e[2]; NAMES[#NAMES + 1] = e[1] end

-- names() -> the built-in strategies' names
function M.names()
  local out = {}
  for i, n in ipairs(NAMES) do out[i] = n end
  return out
end

-- resolve("single") or a strategy object -> strategy object (checked:
-- required hooks present, hooks are functions, no misspelt hook names).
function M.resolve(s)
  if type(s) == "table" then return options.validate(s) end
  if type(s) == "string" then
    local make = BY_NAME[s]
    if make then return make() end
    error(("unknown strategy %q (known: %s; or an object such as zt.strategy.zero{stage=2})")
          :format(s, table.concat(NAMES, ", ")), 0)
  end
  error("strategy must be a name or a strategy object (e.g. zt.strategy.single())", 0)
end

return M
