-- ztrain.util.fmt: numbers as people read them, for the banner, the summary
-- and the comparison tables.
local M = {}

-- thousands(1234567.8) -> "1,234,568"
function M.thousands(x)
  local s = ("%.0f"):format(x)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^(-?),", "%1"))
end

-- shortest(x) -> the shortest text that reads back as x (3e-4, not
-- 0.00029999...): a recipe's value, a CSV cell
function M.shortest(x)
  for digits = 6, 17 do
    local t = ("%." .. digits .. "g"):format(x)
    if tonumber(t) == x then return t end
  end
  return ("%.17g"):format(x)
end

return M
