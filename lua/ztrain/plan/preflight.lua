-- ztrain.plan.preflight: the pre-flight check of a run (train/trainer.lua,
-- before anything is allocated) and its refusal's words: the planner's
-- prediction (plan/init.lua) against the memory a rank may hold, and what
-- to try instead.
local memory = require "ztrain.core.memory"
local plan = require "ztrain.plan"

local M = {}

-- The pre-flight check of a run (trainer.lua, before anything is
-- allocated): the same prediction as `ztrain plan`, against
-- device.memory_limit (the device tier), or without one on the CPU backend
-- against the machine's available memory shared by the local ranks (device
-- and host are both RAM there; the kernel's OOM killer would end the run
-- without a word). nvme bytes live on disk and are not counted. A
-- pipeline (or a schedule on one stage) is predicted as it runs
-- (plan/pipeline.lua), its heaviest rank: every rank stops alike.
-- o = { recipe, strategy (object), cfg, nproc (data-parallel ranks),
-- local_ranks }. Returns nil when it fits, false when the strategy is one
-- the planner does not predict, else the refusal's text.
function M.check(o)
  local r = o.recipe
  local spec = plan.spec_of(o.strategy)
  if not spec then return false end
  -- a GPU without device.memory_limit: not checked (its memory is not
  -- known before the device is up; its host tier is the machine's)
  local explicit = (memory.parse_size(r.device.memory_limit) or 0) > 0
  if not explicit and r.device.backend ~= "cpu" then return nil end
  local lr = math.max(o.local_ranks or 1, 1)
  local limit, why = plan.limit(r, lr)
  if not limit then return nil end
  local P = math.max(r.pipeline.stages, 1)
  local world = o.nproc * P
  local measure = plan.measure(r, explicit)
  local t, _, ranks = plan.predict(r, { spec = spec, nproc = world, cfg = o.cfg })
  -- a pipeline: its heaviest rank by what the limit is compared with
  if ranks then t = plan.heaviest(ranks, measure) end
  local need = measure(plan.totals(t))
  if need <= limit then return nil end
  local alts = P > 1 and M.pipeline_alternatives(r, spec, world, o.cfg, limit, explicit) or
               M.alternatives(r, spec, world, o.cfg)
  local what = P > 1 and ("%s under %s, %d pipeline stages (the heaviest rank%s)"):format(o.cfg.name, spec.name, P,
                 r.pipeline.split == "time" and '; pipeline.split = "time" planned as "params"' or "") or
               ("%s under %s"):format(o.cfg.name, spec.name)
  return M.refusal({ what = what, t = t, need = need, limit = limit, why = why, explicit = explicit,
    alts = alts, nproc = world, recipe = r, pipeline = P > 1, measure = measure })
end

-- alternatives(r, spec, nproc, cfg) -> the plan's rows that fit instead
-- of spec at the same ranks, fastest first (a limit explicit or not, as
-- the pre-flight check's).
function M.alternatives(r, spec, nproc, cfg)
  local alts = {}
  for _, row in ipairs(plan.rows(r, nproc, cfg)) do
    if row.fits and not row.recipe and row.name ~= spec.name and not row.spec.pipeline and
       (nproc == 1 or not row.spec.one_rank) then
      alts[#alts + 1] = row
    end
  end
  table.sort(alts, plan.faster)
  return alts
end

-- A pipeline's strategies (the stages' data-parallel groups): the
-- replicated and ZeRO stages 1 and 2 (trainer_build.lua refuses stage 3).
local PIPELINE_STRATEGIES = { "dp", "zero1", "zero2" }

-- pipeline_alternatives(r, spec, world, cfg, limit, explicit) -> the
-- recipe's pipeline under the other strategies it composes with that fit,
-- fewest bytes first by what the limit is compared with (with one replica
-- no data parallelism shards anything: none).
function M.pipeline_alternatives(r, spec, world, cfg, limit, explicit)
  local alts = {}
  if world / math.max(r.pipeline.stages, 1) < 2 then return alts end
  local measure = plan.measure(r, explicit)
  for _, name in ipairs(PIPELINE_STRATEGIES) do
    local s = plan.spec_of(name)
    if s and s.name ~= spec.name then
      -- each alternative's heaviest rank by what the limit is compared with, as the run's
      local t, _, ranks = plan.predict(r, { spec = s, nproc = world, cfg = cfg })
      if ranks then t = plan.heaviest(ranks, measure) end
      if plan.fits(t, r, limit, explicit) then alts[#alts + 1] = { name = name, spec = s, t = t, totals = plan.totals(t) } end
    end
  end
  table.sort(alts, function(a, b) return measure(a.totals) < measure(b.totals) end)
  return alts
end

-- refusal(o) -> the pre-flight's message (M.check): the predicted
-- bytes per category, the limit, and what to try: the strategies that fit,
-- fastest first, and the `ztrain plan` line that shows them all.
function M.refusal(o)
  local parts = {}
  for _, c in ipairs(plan.COLUMNS) do parts[#parts + 1] = c[1] .. " " .. plan.cell(o.t, c[2]) end
  local try = {}
  for i = 1, math.min(#o.alts, 3) do
    local a = o.alts[i]
    try[#try + 1] = ("strategy=%s (%s)"):format(a.name, memory.format(o.measure(a.totals)))
  end
  local r = o.recipe
  local plan_line = ("ztrain plan %s%snproc=%d%s"):format(r.path and (r.path .. " ") or "",
    r.path and "" or ("model.size=" .. r.model.size .. " "), o.nproc,
    o.explicit and (" device.memory_limit=" .. tostring(r.device.memory_limit)) or "")
  local head = o.explicit and "device memory limit exceeded (predicted before the run): " or
               "not enough memory (predicted before the run): "
  local over = o.explicit and ("over device.memory_limit = " .. memory.format(o.limit)) or
               ("but each rank has %s (%s)"):format(memory.format(o.limit), o.why)
  local advice
  if o.pipeline then
    -- a pipeline's activations are the sets its schedule keeps in flight
    advice = (#try > 0 and ("try " .. table.concat(try, ", ") .. ", ") or "") ..
             "use more pipeline.stages, train.checkpoint_activations=true, or a schedule that keeps fewer " ..
             "activation sets (`ztrain schedule` prints them)"
  else
    advice = #try > 0 and ("try " .. table.concat(try, ", ")) or
             ("no other strategy fits at %d rank(s): use more ranks or train.checkpoint_activations=true"):format(o.nproc)
  end
  local escape = o.explicit and "raise device.memory_limit" or
                 "raise device.memory_fraction (at most 1) or set device.memory_limit to try anyway"
  return ("%s%s needs %s per rank (%s; h = host, n = nvme), %s; %s, lower batch.micro or data.seq_len, or %s " ..
          "(`%s` with your overrides shows every strategy)"):format(head, o.what, memory.format(o.need),
          table.concat(parts, ", "), over, advice, escape, plan_line)
end

return M
