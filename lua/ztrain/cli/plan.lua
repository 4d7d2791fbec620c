-- ztrain.cli.plan: `ztrain plan [RECIPE.lua] [nproc=N] [--hosts N ...] [key=value ...]`:
-- the memory planner's table (insight/plan_report.lua) for a recipe, or for
-- GPT-2's sizes without one, with the step-time model's hardware flags.
local usage = require "ztrain.cli.usage"
local plan = require "ztrain.plan"
local steptime = require "ztrain.plan.steptime"
local recipe = require "ztrain.train.recipe"
local plan_report = require "ztrain.insight.plan_report"

local M = {}

-- The hardware flags of `ztrain plan` (the step-time model's): name ->
-- { key of plan.hardware's options, parser }.
local FLAGS = {
  hosts = { "hosts", "count" }, ["gpus-per-host"] = { "gpus_per_host", "count" },
  link = { "link", "parse_rate" }, latency = { "latency", "parse_time" },
  ["intra-link"] = { "intra_link", "parse_rate" }, ["intra-latency"] = { "intra_latency", "parse_time" },
  flops = { "flops", "parse_flops" }, mfu = { "mfu", "fraction" },
}

-- MAX_RANKS: the most ranks plan plans for (2^20: past any machine; inf,
-- which passes n == math.floor(n), would never end). The pipeline_1f1b
-- row is left out where it cannot put one stage on each rank (plan/init.lua).
local MAX_RANKS = 1048576

-- whole(n) -> n is a whole number from 1 to MAX_RANKS
local function whole(n)
  return type(n) == "number" and n >= 1 and n <= MAX_RANKS and n == math.floor(n)
end

local function flag_value(name, v)
  local f = FLAGS[name]
  if f[2] == "count" then
    local n = tonumber(v)
    if not whole(n) then
      error(("plan: --%s %s must be a whole number >= 1 and at most %d (the most ranks plan plans for)")
            :format(name, tostring(v), MAX_RANKS), 0)
    end
    return n
  elseif f[2] == "fraction" then
    local n = tonumber(v)
    if not n or not (n > 0 and n <= 1) then      -- (nan fails both)
      error(("plan: --mfu %s must be a fraction in (0, 1], e.g. 0.4"):format(tostring(v)), 0)
    end
    return n
  end
  local n, why = steptime[f[2]](v)
  if not n then error(("plan: --%s: %s"):format(name, why), 0) end
  -- 1e999 reads as inf: no rate or time the step-time model could use
  if n ~= n or n == math.huge then
    error(("plan: --%s %s is not a finite number; give e.g. %s"):format(name, tostring(v),
          ({ parse_rate = "100gbit", parse_time = "5us", parse_flops = "989T" })[f[2]] or "a number"), 0)
  end
  return n
end

-- check_ranks(nproc, given): nproc ranks can be planned; given says
-- where the number came from as the user typed it (nproc=N, --hosts A x
-- --gpus-per-host B, the recipe's launch.nproc). Raises a user error
-- naming it and the accepted range.
local function check_ranks(nproc, given)
  if not whole(nproc) then
    error(("plan: %s: the ranks to plan for must be a whole number from 1 to %d"):format(given, MAX_RANKS), 0)
  end
end

-- plan_args(args) -> recipe path or nil, overrides, nproc, hardware options.
local function plan_args(args)
  local path, over, nproc, hw = nil, {}, nil, {}
  local i = 0
  while i < #args do
    i = i + 1
    local a = args[i]
    local k, v = a:match("^([%w_%.]+)=(.*)$")
    local flag, fv = a:match("^%-%-([%w%-]+)=(.*)$")
    flag = flag or a:match("^%-%-([%w%-]+)$")
    if flag then
      if not FLAGS[flag] then
        error(("plan: unknown flag --%s (known: --hosts, --gpus-per-host, --link, --latency, --intra-link, " ..
               "--intra-latency, --flops, --mfu)"):format(flag), 0)
      end
      if not fv then
        i = i + 1
        fv = args[i]
        if not fv then error(("plan: --%s needs a value"):format(flag), 0) end
      end
      hw[FLAGS[flag][1]] = flag_value(flag, fv)
    elseif not k and a:match("%.lua$") and not path then path = a
    elseif k == "nproc" or k == "launch.nproc" then
      nproc = tonumber(v)
      if not whole(nproc) then
        error(("plan: %s must be a whole number >= 1 and at most %d (the ranks to plan for)"):format(a, MAX_RANKS), 0)
      end
    elseif k then over[#over + 1] = a
    else error(("plan: cannot read argument %q: expected [RECIPE.lua] key=value (e.g. model.size=gpt2-xl " ..
               "nproc=8 device.memory_limit=16GiB)"):format(a), 0) end
  end
  return path, over, nproc, hw
end

-- main(args) -> exit code: `ztrain plan [RECIPE.lua] key=value ...`.
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(usage.command("plan")); return 0 end
  local path, over, nproc, hwopts = plan_args(args)
  local r, err
  if path then r, err = recipe.load(path, over)
  else
    -- without a recipe: GPT-2's own vocabulary (what its sizes are known
    -- by), unless a tokenizer or vocabulary is given
    local given = false
    for _, o in ipairs(over) do
      if o:match("^data%.tokenizer=") or o:match("^model%.vocab_size=") then given = true end
    end
    if not given then table.insert(over, 1, "model.vocab_size=" .. plan.GPT2_VOCAB) end
    r, err = recipe.resolve({}, over)
  end
  if not r then error(err, 0) end
  -- --hosts x --gpus-per-host is the rank count when nproc is not given
  local given = nproc and ("nproc=%d"):format(nproc)
  if not nproc and hwopts.hosts and hwopts.gpus_per_host then
    nproc = hwopts.hosts * hwopts.gpus_per_host
    given = ("--hosts %d x --gpus-per-host %d = %d ranks"):format(hwopts.hosts, hwopts.gpus_per_host, nproc)
  end
  if not nproc then
    nproc = math.max(r.launch.nproc, 1)
    given = ("launch.nproc = %s (the recipe's)"):format(tostring(r.launch.nproc))
  end
  check_ranks(nproc, given)
  local hw = plan.hardware(nproc, hwopts)    -- (its layout errors first: they name --hosts)
  local rows = plan.rows(r, nproc, nil, hw)
  rows.hw = hw
  io.stdout:write(plan_report.table(rows, r))
  return 0
end

return M
