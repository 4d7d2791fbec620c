-- ztrain.train.world_checks: what a recipe and a rank count decide alone.
--
-- The launcher asks before it starts any rank (cli/init.lua), so a recipe
-- that cannot run on N ranks says why in one line, not once per rank under
-- Open MPI's abort banner; each rank's build asks again (trainer_build.lua)
-- for jobs a launcher of its own started (mpirun, srun). The same words
-- either way. Pure: no communicator, no device.
local groups = require "ztrain.parallel.groups"
local single = require "ztrain.parallel.strategy.single"

local M = {}

-- accumulation(r, dp) -> micro-batches a step | nil, err: batch.global,
-- when set, must split into dp ranks x batch.micro x accumulate
function M.accumulation(r, dp)
  local B, accum, G = r.batch.micro, r.batch.accumulate, r.batch.global
  if G == 0 then return accum end
  local per = B * dp
  if G % per ~= 0 then
    -- valid choices: the multiples of ranks x micro around G, and the
    -- micro-batch sizes that split G over the ranks
    local choices = {}
    local lo = G - G % per
    if lo >= per then choices[#choices + 1] = "batch.global=" .. lo end
    choices[#choices + 1] = "batch.global=" .. (lo + per)
    if G % dp == 0 then
      local per_rank, micros = G / dp, {}
      for d = math.min(per_rank, 2 * B), 1, -1 do
        if per_rank % d == 0 and #micros < 3 then micros[#micros + 1] = tostring(d) end
      end
      choices[#choices + 1] = "batch.micro=" .. table.concat(micros, " or ")
    end
    return nil, ("batch.global %d does not divide into %d rank(s) x batch.micro %d = %d sequences per " ..
                 "micro-step; use %s"):format(G, dp, B, per, table.concat(choices, ", or "))
  end
  local a = G / per
  if accum ~= 1 and accum ~= a then
    return nil, ("batch.global %d = %d rank(s) x batch.micro %d x %d, but batch.accumulate is %d; " ..
                 "set one of them"):format(G, dp, B, a, accum)
  end
  return a
end

local function strategy_name(r)
  return type(r.strategy) == "table" and r.strategy.name or r.strategy
end

-- check(r, n) -> true | nil, err: recipe r on a world of n ranks: the
-- pipeline stages divide it, strategy single has one rank a stage, the
-- global batch splits over a stage's ranks
function M.check(r, n)
  local p = r.pipeline.stages
  local ok, err = groups.check(n, p)
  if not ok then return nil, err end
  local dp = n / p
  if strategy_name(r) == "single" then
    ok, err = single.check_ranks(dp)
    if not ok then return nil, err end
  end
  ok, err = M.accumulation(r, dp)
  if not ok then return nil, err end
  return true
end

-- The strategies whose only point is splitting work over ranks: on one
-- rank they train as single would (offload and Infinity have a point there)
local DATA_PARALLEL = { dp = true, zero1 = true, zero2 = true, zero3 = true }

-- lone_rank(r, path) -> a warning | nil: recipe r (file path) runs a
-- data-parallel strategy on one rank, without pipeline stages
function M.lone_rank(r, path)
  local name = strategy_name(r)
  if not (DATA_PARALLEL[name] and r.pipeline.stages == 1) then return nil end
  return ("strategy %s on 1 rank trains what single would, with nothing to split or hide; start ranks " ..
          "with --nproc N (ztrain --nproc 2 %s)"):format(name, path or "RECIPE.lua")
end

return M
