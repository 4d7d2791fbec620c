-- ztrain.parallel.strategy.footprint: the facts a strategy's memory model adds up.
--
-- Each built-in strategy owns its memory model: S.footprint(t, f) adds the
-- bytes its setup and step allocate, by tier and category, to t (t[tier][cat]
-- as plan.lua keeps it), for f = { units (the model's units, padded as the
-- strategy pads them: numel, padded, kind), N (data-parallel ranks), lowp
-- (a 2-byte precision), accumulate (micro-batches a step), recipe, tied
-- (the units hold a head that writes the embedding's gradient), held (a
-- schedule completes some of their gradients ahead of their turn) }. The
-- planner (plan.lua) asks the strategy; it knows no strategy by name.
-- Beside it S.placement says where the strategy keeps things ({ stage = 0
-- (replicated) .. 3, otier, ptier: the optimizer's and parameters' offload
-- tiers, or nil }), which the planner's traffic and step-time models read.
-- These are the measured allocations (spec/e2e/plan_spec.lua compares them with
-- a run's peaks); S.predicted is the ZeRO paper's textbook count.
local M = {}

function M.add(t, tier, cat, bytes) t[tier][cat] = t[tier][cat] + bytes end
local add = M.add

-- shapes(units) -> the largest unit of each kind (padded elements), the
-- largest of all, and the block count.
function M.shapes(units)
  local s = { embed = 0, head = 0, block = 0, blocks = 0, largest = 0 }
  for _, u in ipairs(units) do
    s[u.kind] = math.max(s[u.kind], u.padded)
    if u.kind == "block" then s.blocks = s.blocks + 1 end
    s.largest = math.max(s.largest, u.padded)
  end
  return s
end

-- The MPI reduction scratch of one collective over n elements on p ranks
-- (comm_mpi.c: p x S floats, S capped by the budget max(4 MiB, p x 256 KiB)).
function M.mpi_scratch(n, p)
  if p <= 1 then return 0 end
  local budget = math.max(4 * 2 ^ 20, p * 256 * 2 ^ 10)
  local S = math.min(math.floor(budget / (4 * p)), math.ceil(n / p))
  return p * S * 4
end

-- Mixed precision: gradients widened to fp32 for the reduction, one buffer
-- per unit size in flight (measured: every unit of a small model).
function M.widened(s)
  return 4 * (s.embed + s.head + math.min(s.blocks, 3) * s.block)
end

-- Model state of a full replica of these units (single, dp; a pipeline
-- stage): parameters and gradients in the stored dtype, the fp32 moments,
-- with a 2-byte precision the fp32 master weights, and the fp32
-- accumulator where gradients are accumulated, or (widened: dp) reduced
-- widened into it.
function M.replicated_state(t, units, lowp, accumulate, widened)
  for _, u in ipairs(units) do
    add(t, "device", "params", (lowp and 2 or 4) * u.padded)
    add(t, "device", "grads", (lowp and 2 or 4) * u.padded)
    add(t, "device", "optim", 8 * u.numel + (lowp and 4 * u.padded or 0))
    if accumulate > 1 or (lowp and widened) then add(t, "device", "grads", 4 * u.padded) end
  end
end

return M
