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

-- resolve("single") or a strategy object -> strategy object (checked:
-- required hooks present, hooks are functions, no misspelt hook names).
function M.resolve(s)
  if type(s) == "table" then return options.validate(s) end
  if type(s) == "string" then
    local ctor = M[s]
    if s == "zero1" or s == "zero2" or s == "zero3" then return M.zero { stage = tonumber(s:sub(5)) } end
    if s == "dp_deferred" then return M.dp { defer_reduction = true } end
    if s == "zero1_offload" or s == "zero2_offload" then
      return M.zero { stage = tonumber(s:sub(5, 5)), offload_optimizer = "host" }
    end
    if s == "zero3_offload" then
      return M.zero { stage = 3, offload_optimizer = "host", offload_params = "host" }
    end
    if s == "zero3_infinity" then
      return M.zero { stage = 3, offload_optimizer = "nvme", offload_params = "nvme" }
    end
    if type(ctor) == "function" and s ~= "resolve" and s ~= "zero" then return ctor() end
    error(("unknown strategy %q (known: single, dp, dp_deferred, zero1, zero2, zero3, zero1_offload, " ..
           "zero2_offload, zero3_offload, zero3_infinity; or an object such as " ..
           "zt.strategy.zero{stage=2})"):format(s), 0)
  end
  error("strategy must be a name or a strategy object (e.g. zt.strategy.single())", 0)
end

return M
