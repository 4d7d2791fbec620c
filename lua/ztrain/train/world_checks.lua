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
local schedules = require "ztrain.parallel.schedule.registry"
local nccl_order = require "ztrain.parallel.schedule.nccl_order"
local plan = require "ztrain.plan"

local M = {}

-- accumulation(r, dp) -> micro-batches a step | nil, err
-- (parallel/batch.lua: the planner asks it too)
M.accumulation = batch.accumulation

local function strategy_name(r)
  return type(r.strategy) == "table" and r.strategy.name or r.strategy
end

-- check(r, n) -> true | nil, err: recipe r on a world of n ranks: the
-- pipeline stages divide it, strategy single has one rank a stage, the
-- global batch splits over a stage's ranks, and under NCCL the schedule
-- receives in the order it sends
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
  if p > 1 and r.comm.backend == "nccl" then return M.nccl_order(r, ok) end
  return true
end

-- nccl_order(r, accumulate) -> true | nil, err: under comm.backend=nccl a
-- pipeline's lists must receive each link's messages in the order
-- they are sent (parallel/schedule/nccl_order.lua); the lists as the
-- trainer builds them. A schedule that cannot be built is left to the
-- trainer's own message.
function M.nccl_order(r, accumulate)
  local okr, lists, _, sched = pcall(schedules.lists, r, accumulate)
  if not okr then return true end
  -- GPT-2 and tied Llamas share the embedding with the head (its parts
  -- follow the weight passes); a model that cannot be read is taken as tied
  local okc, cfg = pcall(plan.model_config, r)
  local tied = not okc or cfg.family ~= "llama" or cfg.tied and true or false
  local ok, err = nccl_order.check(lists, { tied = tied })
  if ok then return true end
  return nil, ("schedule %s: %s"):format(type(sched) == "string" and sched or "(a function)", err)
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
