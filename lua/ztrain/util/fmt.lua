-- ztrain.util.fmt: numbers as people read them, for the banner, the summary
-- and the comparison tables.
local M = {}

-- thousands(1234567.8) -> "1,234,568"
function M.thousands(x)
  local s = ("%.0f"):format(x)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^(-?),", "%1"))
end

return M
