-- ztrain.strategy: the built-in strategies. Each is a constructor returning
-- an object with the hooks setup / pre_forward / post_forward / pre_backward
-- / post_backward / step (docs/strategies.md).
local M = {}
M.single = require("ztrain.strategy.single").new

-- resolve("single") or a strategy object -> strategy object
function M.resolve(s)
  if type(s) == "table" and s.setup then return s end
  if type(s) == "string" then
    local ctor = M[s]
    if type(ctor) == "function" and s ~= "resolve" then return ctor() end
    error(("unknown strategy %q (known: single)"):format(s), 0)
  end
  error("strategy must be a name or a strategy object (e.g. zt.strategy.single())", 0)
end

return M
