-- tools/args.lua -- the benchmark scripts' key=value arguments:
--   local args = dofile(zt.home .. "/tools/args.lua")(arg)   -- { model = "gpt2", T = "256", ... }
-- and their comma-separated lists:
--   local A = dofile(zt.home .. "/tools/args.lua")
--   A.list(args.hosts, "2,4")             -- { "2", "4" }
--   A.list(args.gpus, "8,64", tonumber)   -- { 8, 64 }
-- and their whole-number arguments, checked:
--   A.whole(args, "steps", 3, 1, "bench")  -- 3, or args.steps if a whole number >= 1
local M = {}

-- whole(args, key, default, least, who, why) -> args[key] (else default) as
-- a whole number >= least; else raises "who: key=V is not a whole number
-- >= least" (with " (why)" when given)
function M.whole(args, key, default, least, who, why)
  local v = tonumber(args[key] or default)
  if not v or v < least or v % 1 ~= 0 then
    error(("%s: %s=%s is not a whole number >= %d%s"):format(who, key, tostring(args[key]), least,
          why and (" (" .. why .. ")") or ""), 0)
  end
  return v
end

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
