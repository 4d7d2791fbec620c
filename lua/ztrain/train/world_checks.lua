-- ztrain.train.world_checks: what a recipe and a rank count decide alone.
--
-- The launcher asks before it starts any rank (cli/init.lua), so a recipe
-- that cannot run on N ranks says why in one line, not once per rank under
-- Open MPI's abort banner; each rank's build asks again (trainer_build.lua)
-- for jobs a launcher of its own started (mpirun, srun). The same words
-- either way. Pure: no communicator, no device.
local groups = require "ztrain.parallel.groups"
local single = require "ztrain.parallel.strategy.single"
local batch = require "ztrain.parallel.batch"

local M = {}

-- accumulation(r, dp) -> micro-batches a step | nil, err
-- (parallel/batch.lua: the planner asks it too)
M.accumulation = batch.accumulation

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
