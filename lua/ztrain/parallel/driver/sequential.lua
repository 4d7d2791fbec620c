-- ztrain.parallel.driver.sequential: the plain step on one stage. For each
-- micro-batch: forward over the units (the loss at the head), backward over
-- them in reverse; then the strategy's step. One activation set at a time.
--
-- The same step written as data is schedule.one_stage(m), which the schedule
-- driver executes with the same bits (spec/e2e/driver_spec.lua).
local stage_run = require "ztrain.parallel.driver.stage"
local losses = require "ztrain.parallel.driver.losses"

local M = { name = "sequential" }

-- step(env, lr) -> loss_sum (sum over micro-batches of their mean loss), grad_norm.
-- env: { ctx, strategy, stages, pools, microbatches, load = fn(a, mb) }
function M.step(env, lr)
  local ctx, S = env.ctx, env.strategy
  assert(#env.stages == 1, "the sequential driver runs one stage; use a schedule for pipelines")
  local stage, pool = env.stages[1], env.pools[1]
  pool:reset()
  env.ledger = env.ledger or losses.new(env.microbatches)
  env.ledger:reset()
  for mb = 0, env.microbatches - 1 do
    local a = pool:acquire(mb)
    a.dscale = env.dscale
    env.load(a, mb)
    stage_run.forward(ctx, S, stage, a, mb)
    env.ledger:keep(a)             -- read at the step's end: no host wait here
    stage_run.backward(ctx, S, stage, a, mb)
    pool:release(mb)
  end
  local gnorm = S.step(ctx, lr)
  return env.ledger:total() or 0.0, gnorm
end

return M
