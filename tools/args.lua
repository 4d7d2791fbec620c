-- tools/args.lua -- the benchmark scripts' key=value arguments:
--   local args = dofile(zt.home .. "/tools/args.lua")(arg)   -- { model = "gpt2", T = "256", ... }
-- and their comma-separated lists:
--   local A = dofile(zt.home .. "/tools/args.lua")
--   A.list(args.hosts, "2,4")             -- { "2", "4" }
--   A.list(args.gpus, "8,64", tonumber)   -- { 8, 64 }
local M = {}

-- list(s, default, conv) -> the items of s (else default) split at commas
-- and spaces, each through conv where given
function M.list(s, default, conv)
  local out = {}
  for v in (s or default):gmatch("[^,%s]+") do
    if conv then v = conv(v) end
    out[#out + 1] = v
  end
  return out
end

return setmetatable(M, { __call = function(_, argv)
  local args = {}
  for _, a in ipairs(argv or {}) do
    local k, v = a:match("^([%w_]+)=(.*)$")
    if k then args[k] = v end
  end
  return args
end })
