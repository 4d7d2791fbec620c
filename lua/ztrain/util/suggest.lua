-- ztrain.util.suggest: "did you mean ...?" for names users mistype (recipe keys,
-- strategy options, hooks).
local M = {}

-- distance(a, b) -> Levenshtein edit distance.
function M.distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- nearest(word, list, bonus) -> best, distance. bonus(word, candidate) may
-- lower a candidate's distance (a strong hint such as a shared last part).
function M.nearest(word, list, bonus)
  local best, bd = nil, math.huge
  for _, w in ipairs(list) do
    local d = M.distance(word, w)
    if bonus then d = d - (bonus(word, w) or 0) end
    if d < bd then best, bd = w, d end
  end
  return best, bd
end

return M
