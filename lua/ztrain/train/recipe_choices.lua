-- ztrain.train.recipe_choices: the resolved recipe's keys that take one of a
-- set of values (strategy, precision, backends, schedules, ...) and the
-- combinations that cannot run, each refused naming the key and what to do
-- (recipe.lua resolves, then asks this; ranges of numbers are recipe.lua's).
local strategy = require "ztrain.parallel.strategy"
local precision = require "ztrain.model.precision"
local registry = require "ztrain.parallel.schedule.registry"
local changes = require "ztrain.train.checkpoint.changes"

local M = {}

-- report.* and the environment's defaults
local function check_report(r)
  for _, k in ipairs({ "tensorboard", "csv" }) do
    local v = r.report[k]
    if type(v) ~= "string" and type(v) ~= "boolean" then
      return nil, ("report.%s must be a path, true (inside out=) or false, got %s"):format(k, tostring(v))
    end
  end
  -- comm.timeout's default comes from the environment: a value that is not
  -- one is refused, not read as "unset"
  local env_to = os.getenv("ZTRAIN_COMM_TIMEOUT")
  local to_n = env_to and tonumber(env_to)
  if env_to and env_to ~= "" and not (to_n and to_n >= 0 and to_n < math.huge) then
    return nil, ("ZTRAIN_COMM_TIMEOUT=%s: not a number of seconds >= 0 (0: no timeout); fix or unset it, " ..
                 "or set comm.timeout"):format(env_to)
  end
  local pk = r.report.peak_tflops
  if type(pk) ~= "number" or pk < 0 or pk ~= pk or pk == math.huge then
    return nil, ("report.peak_tflops must be a number of TFLOP/s >= 0 (0: the device's known peak), got %s")
                :format(tostring(pk))
  end
  return true
end

-- the schedule: a name, csv:PATH (a file that exists) or a function
local function check_schedule(r)
  if type(r.schedule) ~= "string" and type(r.schedule) ~= "function" then
    return nil, ("recipe key \"schedule\" must be a schedule name or a function, got %s"):format(type(r.schedule))
  end
  if type(r.schedule) == "string" and r.schedule:match("^csv:") then
    local path = r.schedule:sub(5)
    local f = io.open(path, "rb")
    if not f then
      return nil, ("schedule %q: cannot read %s (a PyTorch pipelining CSV: one row per rank)"):format(r.schedule, path)
    end
    f:close()
  elseif type(r.schedule) == "string" and r.schedule ~= "" then
    local names = registry.names()
    local known = false
    for _, n in ipairs(names) do if n == r.schedule then known = true end end
    if not known then
      return nil, ("unknown schedule %q (known: %s; csv:PATH, a PyTorch pipelining CSV; or a function " ..
                   "returning action lists)")
                  :format(r.schedule, table.concat(names, ", "))
    end
  end
  return true
end

-- check(r) -> true | nil, err: the keys that take one of a set of values,
-- and the combinations that cannot run, named with what to do
function M.check(r)
  -- the strategy (a name or an object) is checked now, not mid-step
  local sok, serr = pcall(strategy.resolve, r.strategy)
  if not sok then return nil, "strategy: " .. tostring(serr) end
  if r.model.from ~= "" and not r.model.from:match("^hf:.") then
    return nil, ('model.from must be "hf:DIR" (a Hugging Face GPT-2 directory: config.json + model.safetensors), ' ..
                 'got %q'):format(r.model.from)
  end
  for g in tostring(r.allow_changes):gmatch("[^,%s]+") do
    local known = g == "all"
    for _, n in ipairs(changes.GROUPS) do known = known or n == g end
    if not known then
      return nil, ("allow_changes: unknown group %q (known: %s, all)"):format(g, table.concat(changes.GROUPS, ", "))
    end
  end
  if not precision.NAMES[r.precision] then
    return nil, ('precision must be "fp32", "bf16" or "fp16", got %q'):format(tostring(r.precision))
  end
  if r.comm.backend ~= "mpi" and r.comm.backend ~= "nccl" then
    return nil, ('comm.backend must be "mpi" or "nccl", got %q'):format(tostring(r.comm.backend))
  end
  if r.comm.backend == "nccl" and r.device.backend ~= "cuda" then
    return nil, ('comm.backend = "nccl" needs device.backend = "cuda" (NCCL moves GPU memory), got %q')
                :format(tostring(r.device.backend))
  end
  local bg = r.device.bf16_gemm
  if bg ~= "auto" and bg ~= "on" and bg ~= "off" then
    return nil, ('device.bf16_gemm must be "auto", "on" or "off", got %q'):format(tostring(bg))
  end
  if bg == "on" and r.precision ~= "bf16" then
    return nil, ('device.bf16_gemm = "on" needs precision = "bf16" (the weights must be stored as bf16), got %q')
                :format(tostring(r.precision))
  end
  local at = r.device.attention
  if at ~= "auto" and at ~= "exact" and at ~= "bf16" then
    return nil, ('device.attention must be "auto", "exact" or "bf16", got %q'):format(tostring(at))
  end
  if at == "bf16" and r.device.backend ~= "cuda" then
    return nil, ('device.attention = "bf16" needs device.backend = "cuda" (a tensor-core kernel), got %q')
                :format(tostring(r.device.backend))
  end
  local ca = r.train.checkpoint_activations
  if not (type(ca) == "boolean" or (type(ca) == "number" and ca >= 0 and ca % 1 == 0)) then
    return nil, ("train.checkpoint_activations must be false, true (every block) or k (every k-th block), " ..
                 "got %s"):format(tostring(ca))
  end
  local ok, err = check_report(r)
  if not ok then return nil, err end
  local pl = r.pipeline.placement
  if pl ~= "" and pl ~= "loop" and pl ~= "v" then
    return nil, ('pipeline.placement must be "" (the schedule\'s), "loop" or "v", got %q'):format(tostring(pl))
  end
  return check_schedule(r)
end

return M
