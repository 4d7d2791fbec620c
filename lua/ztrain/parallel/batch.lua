-- ztrain.parallel.batch: how a step's batch divides over data-parallel
-- ranks. The trainer's checks (train/world_checks.lua) and the memory
-- planner (plan/init.lua) ask the same rule. Pure: recipe numbers only.
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

return M
