-- ztrain.plan: the memory planner. Predicts the bytes one rank holds, by
-- tier (device, host, nvme) and category (params, grads, optim,
-- activations, comm, other: memory.lua's), for a recipe under a strategy,
-- without allocating anything.
--
-- The prediction follows what the code allocates, not a textbook formula:
--  * model state: every unit's flat buffer is u.padded elements (gpt2.lua;
--    sharded strategies pad to N x the norm block), a shard is padded / N;
--    the optimizer's moments cover u.numel (replicated) or the shard (zero);
--    mixed precision keeps fp32 master weights with the moments (optim) and
--    an fp32 accumulator (grads) where it accumulates (dp: always). The
--    seeds' 2 + 2 + 12 bytes per parameter are these numbers without the
--    padding.
--  * activations: one activation set of the sequential driver plus the
--    stage's scratch, from model/activations.lua's own slab plan (exact).
--  * model state and working buffers are each strategy's own memory model
--    (S.footprint: strategy/footprint.lua, replicated.lua, zero_footprint.lua),
--    which the planner asks without knowing strategies by name. Working
--    buffers (comm): the gradient buckets, gathered units, MPI scratch and
--    host staging that strategy/zero.lua, dp.lua and offload.lua keep in
--    their pools. These follow the pools' reuse pattern: in flight
--    at once are the unit computing, the one prefetched and MAX_INFLIGHT
--    reductions (zero.lua), each pooled by size. Measured equal on
--    gpt2-tiny and gpt2-mini (spec/e2e/plan_spec.lua); for other shapes an
--    estimate of the same pattern.
--  * mixed precision without the bf16 GEMMs: precision.lua's fp32 work
--    buffers (plan/activations.lua's precision_work).
-- Runs of the schedule driver (pipelines, a schedule on one stage) are
-- planned rank by rank as they run (plan/pipeline.lua): the heaviest rank.
-- The pre-flight check and its refusal: plan/preflight.lua.
local memory = require "ztrain.core.memory"
local family = require "ztrain.model.family"
local host = require "ztrain.util.host"
local headroom = require "ztrain.plan.headroom"
local fp = require "ztrain.parallel.strategy.footprint"
local strategy = require "ztrain.parallel.strategy"
local rep = require "ztrain.parallel.strategy.replicated"
local data = require "ztrain.model.data"
local hf = require "ztrain.model.hf"
local stage = require "ztrain.parallel.driver.stage"
local pipeline = require "ztrain.plan.pipeline"
local batch = require "ztrain.parallel.batch"
local steptime = require "ztrain.plan.steptime"
local acts = require "ztrain.plan.activations"
local precision = require "ztrain.model.precision"
local schedules = require "ztrain.parallel.schedule.library"

local M = {}

local TIERS, CATS = memory.tiers, memory.categories
local GPT2_VOCAB = 50257
local NORM_BLOCK = 1024       -- shard.lua's BLOCK (zt_sum_block); read from the runtime when loaded

-- The strategies the plan compares, by name (each resolved through the
-- strategy registry, which says where it keeps things and how many bytes:
-- S.placement, S.footprint, strategy/footprint.lua), with the plan's own
-- facts: single is listed for one rank only; pipeline_1f1b is a schedule
-- over replicated stages, not a strategy object.
local LISTED = { { name = "single", one_rank = true }, { name = "dp" }, { name = "zero1" }, { name = "zero2" },
                 { name = "zero3" }, { name = "zero2_offload" }, { name = "zero3_offload" },
                 { name = "zero3_infinity" }, { name = "pipeline_1f1b", pipeline = true } }

-- spec_of(strategy) -> the plan's description of a strategy object or
-- name: { name, stage, otier, ptier (its placement), footprint }, or nil for
-- a strategy without a memory model (a user's own).
function M.spec_of(s)
  if type(s) == "string" then
    for _, e in ipairs(M.STRATEGIES or {}) do if e.name == s then return e end end   -- the plan's list
    local ok, obj = pcall(strategy.resolve, s)
    if not ok then return nil end
    s = obj
  end
  if type(s) ~= "table" or type(s.placement) ~= "table" or type(s.footprint) ~= "function" then return nil end
  local p = s.placement
  return { name = s.name, stage = p.stage, otier = p.otier, ptier = p.ptier, footprint = s.footprint }
end

local function replicated_spec(name)
  return { name = name, stage = 0, footprint = rep.footprint }
end

-- M.STRATEGIES: LISTED with each one's description (spec_of), in order
M.STRATEGIES = {}
for i, e in ipairs(LISTED) do
  local spec = e.pipeline and replicated_spec(e.name) or assert(M.spec_of(e.name), e.name)
  spec.one_rank, spec.pipeline = e.one_rank, e.pipeline
  M.STRATEGIES[i] = spec
end

-- vocab(r) -> the vocabulary a run of r would have: model.vocab_size, or
-- its tokenizer's (256 for bytes; bpe reads its vocabulary, a fraction of
-- a second), else GPT-2's 50257.
function M.vocab(r)
  if r.model.vocab_size > 0 then return r.model.vocab_size end
  if r.data.tokenizer == "bytes" then return 256 end
  local ok, tok = pcall(data.tokenizer, r.data.tokenizer)
  return ok and tok.vocab_size or GPT2_VOCAB
end
M.GPT2_VOCAB = GPT2_VOCAB

local function norm_block()
  local ok, shard = pcall(require, "ztrain.parallel.strategy.shard")
  return ok and shard.BLOCK or NORM_BLOCK
end

-- units(cfg, pad) -> the model's units (numel, padded, kind), no buffers.
function M.units(cfg, pad)
  return family.new(cfg, { alloc = false, pad = pad }).units
end

local function zero_tiers()
  local t = {}
  for _, tier in ipairs(TIERS) do
    t[tier] = {}
    for _, c in ipairs(CATS) do t[tier][c] = 0 end
  end
  return t
end

local add = fp.add
M.mpi_scratch = fp.mpi_scratch

-- model_config(r) -> the GPT-2 shape a recipe asks for (the plan's vocab).
function M.model_config(r)
  if r.model.from ~= "" then
    return hf.config(hf.dir_of(r.model.from))
  end
  return family.config(r.model.size, { vocab_size = M.vocab(r) })
end

-- batch_of(r, N) -> r as it runs on N data-parallel ranks: batch.global
-- divided into batch.accumulate as the trainer divides it (a view of r;
-- r itself when there is nothing to divide, or it does not divide).
local function batch_of(r, N)
  local a = batch.accumulation(r, N)
  if not a or a == r.batch.accumulate then return r end
  return setmetatable({ batch = setmetatable({ accumulate = a }, { __index = r.batch }) }, { __index = r })
end

-- A run of the schedule driver (a pipeline, or a schedule on one stage):
-- plan/pipeline.lua predicts every pipeline rank; rank 0 also samples,
-- from a full copy of the model where it holds a pipeline's first stages
-- only. Returns the heaviest rank's prediction, and every rank's.
local function driven(cfg, r, spec, world)
  local P = math.max(r.pipeline.stages, 1)
  local N = spec.one_rank and 1 or math.max(math.floor(world / P), 1)
  r = batch_of(r, N)
  local ranks = pipeline.predict(cfg, r, { spec = spec, P = P, N = N,
                                           new_t = zero_tiers, pad = spec.stage == 0 and family.PAD or N * norm_block() })
  acts.sample(ranks[1], cfg, r, { stage = P > 1 and 1 or spec.stage })
  return M.heaviest(ranks), ranks
end

-- heaviest(ranks, measure) -> the rank's t with the most bytes by
-- measure(totals) (default: the device tier's)
function M.heaviest(ranks, measure)
  measure = measure or function(tot) return tot.device end
  local best, most
  for _, t in ipairs(ranks) do
    local n = measure(M.totals(t))
    if not best or n > most then best, most = t, n end
  end
  return best
end

-- The pipeline_1f1b row of the plan: the recipe as 1F1B over one stage per
-- rank (nproc of them, or pipeline.stages), replicated stages, no data
-- parallelism; the recipe's split.
local function one_f_one_b(r, P)
  -- a split given as counts is the recipe's stages' (x chunks): here by parameters
  local split = r.pipeline.split
  if type(split) == "table" and #split ~= P then split = "params" end
  return setmetatable({ schedule = "1f1b", pipeline = { stages = P, chunks = 1, placement = "", split = split } },
                      { __index = r })
end
local ROW_STAGE = replicated_spec("pipeline_1f1b")

-- predict(r, opts) -> { device = { params =, grads =, optim =, activations =,
-- comm =, other = }, host = {...}, nvme = {...} }: one rank's peak bytes.
-- r: a resolved recipe (recipe.resolve); opts.nproc (world size, default
-- r.launch.nproc or 1), opts.strategy (a name or object; default
-- r.strategy), opts.cfg (the model's shape; default from r), opts.data_parallel
-- (a pipeline recipe's strategy over nproc data-parallel ranks instead of
-- its pipeline: the plan's alternatives). Raises for a strategy the
-- planner does not know.
-- A recipe the schedule driver runs (pipeline.stages > 1, or a schedule
-- on one stage) is planned as it runs (plan/pipeline.lua): its heaviest
-- pipeline rank's bytes.
-- Returns t, the strategy's description, and for a scheduled run every
-- pipeline rank's t (ranks[pipeline rank + 1]; a world rank w is pipeline
-- rank floor(w / data-parallel ranks)).
function M.predict(r, opts)
  opts = opts or {}
  local spec = opts.spec or M.spec_of(opts.strategy or r.strategy)
  if not spec then
    local s = opts.strategy or r.strategy
    error(("plan: cannot predict strategy %s: it has no memory model (S.placement and S.footprint, " ..
           "docs/strategies.md)"):format(type(s) == "table" and tostring(s.name) or tostring(s)), 0)
  end
  local world = opts.nproc or math.max(r.launch.nproc, 1)
  local cfg = opts.cfg or M.model_config(r)
  local lowp = r.precision ~= "fp32"
  local t = zero_tiers()
  if spec.pipeline then
    local P = math.max(r.pipeline.stages > 1 and r.pipeline.stages or world, 1)
    return (driven(cfg, one_f_one_b(r, P), ROW_STAGE, P)), spec
  end
  if pipeline.driven(r) and (r.pipeline.stages == 1 or not opts.data_parallel) then
    local best, ranks = driven(cfg, r, spec, world)
    return best, spec, ranks
  end
  local N = spec.one_rank and 1 or world
  r = batch_of(r, N)
  local pad = spec.stage == 0 and family.PAD or N * norm_block()
  local model = family.new(cfg, { alloc = false, pad = pad })
  local units = model.units
  spec.footprint(t, { units = units, N = N, lowp = lowp, accumulate = r.batch.accumulate, recipe = r,
                      tied = model:tied() })
  acts.activations(t, cfg, r, units, 1, stage.checkpoint_units(units, r.train.checkpoint_activations))
  acts.precision_work(t, r, model, units)
  acts.sample(t, cfg, r, spec)
  return t, spec
end

-- totals(t) -> { device =, host =, nvme = } bytes per tier.
function M.totals(t)
  local out = {}
  for _, tier in ipairs(TIERS) do
    local n = 0
    for _, c in ipairs(CATS) do n = n + t[tier][c] end
    out[tier] = n
  end
  return out
end

---------------------------------------------------------------------------
-- Ranking: which strategy that fits is fastest to try. Simple and stated:
-- first the slowest tier a step streams state through (none < pipeline
-- bubble < host < nvme), then the bytes a rank moves per step over the
-- network and to/from host or nvme (the textbook volumes: all-reduce 2x
-- the gradient, reduce-scatter + all-gather, zero3's two gathers; offload
-- moves gradient and parameter shards, nvme the optimizer state too).
local CLASS = { none = 0, pipeline = 1, host = 2, nvme = 3 }

-- traffic(spec, psi, N, lowp) -> { class =, net =, offload = } bytes per step.
function M.traffic(spec, psi, N, lowp)
  local pb, f = lowp and 2 or 4, N > 1 and (N - 1) / N or 0
  local net, off = 0, 0
  if spec.pipeline then return { class = CLASS.pipeline, net = 0, offload = 0 } end
  if spec.stage == 0 then net = 2 * 4 * psi * f
  elseif spec.stage < 3 then net = (4 + pb) * psi * f
  else net = (4 + 2 * pb) * psi * f end
  local class = CLASS.none
  if spec.otier then
    class = CLASS[spec.otier]
    off = (4 + pb) * psi / N                                     -- gradient shards out, parameters back
    if spec.ptier then off = off + 2 * pb * psi / N end          -- parameter shards fetched each pass
    if spec.otier == "nvme" then off = off + 2 * (8 + (lowp and 4 or 0)) * psi / N end
  end
  return { class = class, net = net, offload = off }
end

-- available() -> bytes of MemAvailable (/proc/meminfo), or nil.
M.available = host.mem_available

-- limit(r, local_ranks) -> bytes a rank may hold on the device tier, and
-- where the number comes from: device.memory_limit, or on the CPU backend
-- (device and host are both this machine's memory) MemAvailable shared by
-- the local ranks.
function M.limit(r, local_ranks)
  local lim = memory.parse_size(r.device.memory_limit) or 0
  if lim > 0 then return lim, "device.memory_limit", true end
  local avail = M.available()
  if not avail then return nil end
  local share, over = headroom.share(r, avail, local_ranks)
  return share, headroom.describe(r, avail, local_ranks, over), false
end

-- measure(r, explicit) -> fn(totals) -> the bytes a limit is compared
-- with: the device tier under device.memory_limit; without one, on the CPU
-- backend, device + host (both this machine's memory); else the host tier.
function M.measure(r, explicit)
  if explicit then return function(tot) return tot.device end end
  if r.device.backend == "cpu" then return function(tot) return tot.device + tot.host end end
  return function(tot) return tot.host end
end

-- fits(t, r, limit, explicit) -> true when a rank's prediction fits the
-- limit (M.limit) by M.measure.
function M.fits(t, r, limit, explicit)
  if not limit then return true end
  return M.measure(r, explicit)(M.totals(t)) <= limit
end

-- faster(a, b) -> true when row a ranks before row b: the slower tier
-- class last, then fewer bytes moved, then (a tie, e.g. zero1 and zero2)
-- fewer device bytes.
function M.faster(a, b)
  local ta, tb = a.traffic, b.traffic
  if ta.class ~= tb.class then return ta.class < tb.class end
  local ma, mb = ta.net + ta.offload, tb.net + tb.offload
  if ma ~= mb then return ma < mb end
  return a.totals.device < b.totals.device
end

local function psi_of(cfg)
  local n = 0
  for _, u in ipairs(M.units(cfg, family.PAD)) do n = n + u.numel end
  return n
end

-- hardware(nproc, o) -> steptime's hardware for `ztrain plan`: the stated
-- cluster (steptime.CLUSTER) with o's overrides (hosts, gpus_per_host,
-- link, latency, intra_link, intra_latency, flops, mfu: numbers, already
-- parsed), and the layout: hosts x gpus_per_host = nproc. Raises naming the
-- flag when they disagree.
function M.hardware(nproc, o)
  o = o or {}
  local hw = {}
  for k, v in pairs(steptime.CLUSTER) do hw[k] = v end
  if o.flops then hw.peak_flops = o.flops end
  if o.mfu then hw.mfu = o.mfu end
  hw.flops = hw.peak_flops * hw.mfu
  if o.link then hw.inter_bw = o.link end
  if o.latency then hw.latency = o.latency end
  if o.intra_link then hw.intra_bw = o.intra_link end
  if o.intra_latency then hw.intra_latency = o.intra_latency end
  -- no layout given: as many ranks a host as divide nproc, up to the cluster's
  local G = o.gpus_per_host or (o.hosts and nproc / o.hosts)
  if not G then
    G = math.min(nproc, hw.gpus_per_host)
    while nproc % G ~= 0 do G = G - 1 end
  end
  local H = o.hosts or nproc / G
  if H * G ~= nproc or H ~= math.floor(H) or G ~= math.floor(G) then
    error(("plan: nproc=%d ranks cannot be laid out as %s host(s) x %s rank(s) a host: give --hosts and " ..
           "--gpus-per-host whose product is nproc"):format(nproc, o.hosts and tostring(o.hosts) or "whole",
           o.gpus_per_host and tostring(o.gpus_per_host) or "whole"), 0)
  end
  hw.hosts, hw.gpus_per_host = H, G
  return hw
end

-- time(r, spec, nproc, cfg, hw) -> steptime's breakdown of one step (its
-- .step in seconds) for a strategy of the plan at nproc ranks laid out as
-- hw says (M.hardware), or nil for one the model does not know.
function M.time(r, spec, nproc, cfg, hw)
  local name = spec.one_rank and "dp" or spec.name
  if spec.pipeline then name = "pipeline_1f1b" end
  local one = spec.one_rank or nproc == 1
  local o = { cfg = cfg, strategy = name, B = r.batch.micro, T = r.data.seq_len, m = r.batch.accumulate,
              hosts = one and 1 or hw.hosts, gpus = one and 1 or hw.gpus_per_host, lowp = r.precision ~= "fp32",
              stream16 = (precision.gemm16(r)), recompute = r.train.checkpoint_activations and true or false, units = cfg.L + 2 }
  -- a layout or strategy the model does not cover ("steptime: ..."): no
  -- time; anything else is a bug and raises
  local ok, res = pcall(steptime.step, o, hw)
  if ok then return res end
  if type(res) == "string" and res:match("^steptime: ") then return nil end
  error(res, 0)
end

-- rows(r, nproc, cfg, hw) -> one row per strategy of M.STRATEGIES that
-- applies at nproc ranks: { name, t (predict), totals, fits, traffic, time
-- (steptime, when hw is given: M.hardware) }, and the limit's description;
-- rows.best is the fastest row that fits (by the ranking below), rows.quickest
-- the one the step-time model finds fastest among those that fit.
function M.rows(r, nproc, cfg, hw)
  cfg = cfg or M.model_config(r)
  local psi, lowp = psi_of(cfg), r.precision ~= "fp32"
  -- the ranks that share a host's memory: a layout's ranks a host (hw),
  -- else all of them on this machine
  local limit, source, explicit = M.limit(r, hw and hw.gpus_per_host or nproc)
  local rows = { cfg = cfg, psi = psi, nproc = nproc, limit = limit, source = source }
  -- a pipeline recipe: first its own row, the run as it is asked for
  -- (plan/pipeline.lua; no step time: steptime.lua models 1F1B on one
  -- chunk, the pipeline_1f1b row)
  local P = math.max(r.pipeline.stages, 1)
  if P > 1 then
    local own = M.spec_of(r.strategy)
    if own and nproc % P == 0 and own.stage ~= 3 then      -- (zero3 across stages is refused)
      local _, _, ranks = M.predict(r, { spec = own, nproc = nproc, cfg = cfg })
      local t = M.heaviest(ranks, M.measure(r, explicit))
      rows[#rows + 1] = { name = "recipe", spec = own, recipe = true, t = t, totals = M.totals(t),
                          fits = M.fits(t, r, limit, explicit), ranks = nproc,
                          traffic = { class = CLASS.pipeline, net = 0, offload = 0 } }
    end
  end
  -- the pipeline_1f1b row puts one stage on each rank: from 2 ranks up to
  -- one unit (embedding, a block, the head) a rank, and a schedule's bound
  local one_stage_each = nproc >= 2 and nproc <= cfg.L + 2 and nproc <= schedules.MAX_STAGES
  for _, spec in ipairs(M.STRATEGIES) do
    local applies = (spec.one_rank or nproc > 1 or spec.otier) and not (spec.pipeline and not one_stage_each)
    if applies then
      local N = spec.one_rank and 1 or nproc
      local t = M.predict(r, { spec = spec, nproc = nproc, cfg = cfg, data_parallel = true })
      local row = { name = spec.name, spec = spec, t = t, totals = M.totals(t), fits = M.fits(t, r, limit, explicit),
                    traffic = M.traffic(spec, psi, N, lowp), ranks = spec.pipeline and nproc or N }
      if hw then row.time = M.time(r, spec, nproc, cfg, hw) end
      if row.time then
        -- a pipeline's step is one replica's micro-batches, dp's every rank's
        local replicas = (spec.pipeline or spec.one_rank) and 1 or N
        row.tokens_per_s = r.batch.micro * r.data.seq_len * r.batch.accumulate * replicas / row.time.step
      end
      rows[#rows + 1] = row
      if row.fits and row.time and (nproc == 1 or not spec.one_rank) then
        local q = rows.quickest
        -- a tie (zero1 and zero2 move the same bytes): the fewer device bytes
        if not q or row.tokens_per_s > q.tokens_per_s or
           (row.tokens_per_s == q.tokens_per_s and row.totals.device < q.totals.device) then rows.quickest = row end
      end
      -- single uses one rank of nproc: the fastest to try only on one rank
      local candidate = row.fits and (nproc == 1 or not spec.one_rank)
      local b = rows.best
      if candidate and (not b or M.faster(row, b)) then
        rows.best = row
      end
    end
  end
  return rows
end

---------------------------------------------------------------------------
-- The planner's category columns (`ztrain plan`'s and the refusal's): a
-- tier's bytes marked h (host) or n (nvme).
local TIER_MARK = { device = "", host = " h", nvme = " n" }
M.COLUMNS = { { "params", { "params" } }, { "grads", { "grads" } }, { "optim", { "optim" } },
              { "activations", { "activations" } }, { "working", { "comm", "other" } } }

-- A category column: its bytes on every tier, the tier marked (h host, n nvme).
function M.cell(t, cats)
  local parts = {}
  for _, tier in ipairs(memory.tiers) do
    local n = 0
    for _, c in ipairs(cats) do n = n + t[tier][c] end
    if n > 0 then parts[#parts + 1] = memory.format(n) .. TIER_MARK[tier] end
  end
  return #parts == 0 and "0" or table.concat(parts, " + ")
end

return M
