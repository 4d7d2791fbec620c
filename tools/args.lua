-- tools/args.lua -- the benchmark scripts' key=value arguments:
--   local args = dofile(zt.home .. "/tools/args.lua")(arg)   -- { model = "gpt2", T = "256", ... }
return function(argv)
  local args = {}
  for _, a in ipairs(argv or {}) do
    local k, v = a:match("^([%w_]+)=(.*)$")
    if k then args[k] = v end
  end
  return args
end
