-- tools/scale_fit.lua -- the step-time model (lua/ztrain/plan/steptime.lua)
-- calibrated on the measured scaling table (tools/bench_scale.lua's
-- records) and checked against it.
--
--   local fit = dofile("tools/scale_fit.lua")
--   local res = fit.calibrate(records)  -- { params, points = { {rec, model_ms, err} }, mean, max }
--
-- Known, not fitted: the model's shape and each run's batch (from the
-- record), the FLOP rate of one core (the one-rank, one-thread baseline:
-- its step time less its optimizer's at the assumed memory bandwidth), the
-- ranks sharing the machine's cores (every namespace host is this machine:
-- a run of H hosts has H one-thread ranks on the same cores, so a rank gets
-- min(1, cores / H) of a core), the link rate (tc's), the hidden share
-- (measured, summary.json comm_per_step.hidden_share; 0 where not
-- reported), the memory bandwidth of the optimizer's and offload's copies
-- (M.MEM_BW or bench_scale's mem_bw=: it trades with the FLOP rate, so a
-- fit cannot tell them apart). Fitted, three constants for the whole
-- table: eta (the fraction of the link rate MPI's TCP transport reaches),
-- latency (seconds per message), contention (how many times longer a
-- multi-host rank's compute takes than its share of the cores says: MPI's
-- progress and the kernel's TCP stack run on the same cores).
-- Minimising the mean squared log error: coordinate descent over grids,
-- then Nelder-Mead;
-- the error reported is |model - measured| / measured per point.
local st = require "ztrain.plan.steptime"
local gpt2 = require "ztrain.model.gpt2"

local M = {}

-- rate_bytes("10gbit") -> bytes per second (nil: no link, "local" or
-- "none"): steptime.parse_rate's, without its reason.
function M.rate_bytes(rate) return (st.parse_rate(rate)) end

local function cfg_of(rec)
  local m = rec.model or {}
  if m.layers then return { name = m.name, L = m.layers, C = m.channels, V = m.vocab, maxT = m.context } end
  return gpt2.config(rec.config.model, { vocab_size = 50257 })
end

function M.hidden_of(rec)
  local c = rec.comm_per_step
  return type(c) == "table" and type(c.hidden_share) == "number" and c.hidden_share or nil
end

-- the record's run as steptime's input
function M.input(rec)
  local cfg = cfg_of(rec)
  local b = rec.batch or {}
  local m = b.accumulate or rec.config.accumulate
  local o = { cfg = cfg, strategy = rec.strategy == "single" and "dp" or rec.strategy, B = b.micro or rec.config.B,
              T = b.seq_len or rec.config.T, m = m, hosts = rec.hosts, gpus = rec.slots or 1, units = cfg.L + 2,
              hidden = M.hidden_of(rec) or 0 }
  return o
end

local function baseline(recs)
  for _, r in ipairs(recs) do if r.ok and r.strategy == "single" then return r end end
end

-- hw_for(rec, p, base) -> steptime's hardware for one measured run
function M.hw_for(rec, p, base)
  local bo = M.input(base)
  local tokens = bo.B * bo.T * bo.m
  local opt = st.ADAM_BYTES * st.params(bo.cfg) / p.mem_bw
  local flops = tokens * st.flops_per_token(bo.cfg, bo.T) / math.max(base.step_ms / 1000 - opt, 1e-6)
  local bw = M.rate_bytes(rec.rate) or 1e30
  -- a rank of H on this machine's cores: a core each while there are
  -- enough, else a 1/H share of them; contention: what MPI's progress and
  -- the kernel's TCP stack take besides
  local ranks = rec.hosts * (rec.slots or 1)
  -- every rank on this machine's cores (steptime shares them among the
  -- ranks computing at once); ranks on one host (slots > 1) talk through
  -- its memory: the assumed memory bandwidth, no latency of note
  return { flops = flops, share = ranks > 1 and p.contention or 1, cores = base.cores or rec.cores or 1,
           inter_bw = bw, eta = p.eta, latency = p.latency, mem_bw = p.mem_bw, host_bw = p.mem_bw,
           intra_bw = p.mem_bw, intra_eta = 1, intra_latency = 0 }
end

-- predict(rec, p, base) -> model step ms for one record
function M.predict(rec, p, base)
  local r = st.step(M.input(rec), M.hw_for(rec, p, base))
  return r.step * 1000, r
end

local GRID = {
  eta = { lo = 0.02, hi = 1, log = true },
  latency = { lo = 1e-6, hi = 2e-2, log = true },
  contention = { lo = 0.3, hi = 3 },
}
local ORDER = { "eta", "latency", "contention" }
M.MEM_BW = 5e9        -- bytes/s the optimizer's and offload's copies move on this machine: stated, not fitted

local function loss(points, p, base)
  local s = 0
  for _, rec in ipairs(points) do
    local ms = M.predict(rec, p, base)
    s = s + math.log(ms / rec.step_ms) ^ 2
  end
  return s / #points
end

-- nelder_mead(f, p) -> the constants (ORDER's, clamped to GRID) that
-- minimise f, searched in log space from p: reflection, expansion,
-- contraction and shrink, 400 evaluations at most.
function M.nelder_mead(f, p0)
  local n = #ORDER
  local function params(x)
    local q = {}
    for i, k in ipairs(ORDER) do q[k] = math.min(math.max(math.exp(x[i]), GRID[k].lo), GRID[k].hi) end
    q.mem_bw = p0.mem_bw
    return q
  end
  local simplex = {}
  for i = 0, n do
    local x = {}
    for j, k in ipairs(ORDER) do x[j] = math.log(p0[k]) + (i == j and 0.3 or 0) end
    simplex[#simplex + 1] = { x = x, f = f(params(x)) }
  end
  local evals = n + 1
  local function point(c, d, t)
    local x = {}
    for j = 1, n do x[j] = c[j] + t * (d[j] - c[j]) end
    return { x = x, f = f(params(x)) }
  end
  while evals < 400 do
    table.sort(simplex, function(a, b) return a.f < b.f end)
    if simplex[n + 1].f - simplex[1].f < 1e-12 then break end
    local c = {}
    for j = 1, n do
      c[j] = 0
      for i = 1, n do c[j] = c[j] + simplex[i].x[j] / n end
    end
    local worst = simplex[n + 1]
    local r = point(c, worst.x, -1); evals = evals + 1
    if r.f < simplex[1].f then
      local e = point(c, worst.x, -2); evals = evals + 1
      simplex[n + 1] = e.f < r.f and e or r
    elseif r.f < simplex[n].f then
      simplex[n + 1] = r
    else
      local k = point(c, worst.x, 0.5); evals = evals + 1
      if k.f < worst.f then simplex[n + 1] = k
      else
        for i = 2, n + 1 do simplex[i] = point(simplex[1].x, simplex[i].x, 0.5); evals = evals + 1 end
      end
    end
  end
  table.sort(simplex, function(a, b) return a.f < b.f end)
  return params(simplex[1].x)
end

-- calibrate(recs, opts) -> { params, points, mean, max, n } or nil, why.
-- opts.mem_bw: the memory bandwidth to assume (default M.MEM_BW).
function M.calibrate(recs, opts)
  local base = baseline(recs)
  if not base then return nil, "no one-rank baseline (single_h1) measured" end
  local points = {}
  for _, r in ipairs(recs) do
    if r.ok and r.strategy ~= "single" and type(r.step_ms) == "number" then points[#points + 1] = r end
  end
  if #points == 0 then return nil, "no multi-host runs measured" end
  local p = { eta = 0.5, latency = 1e-4, contention = 1, mem_bw = opts and opts.mem_bw or M.MEM_BW }
  local best = loss(points, p, base)
  for _ = 1, 2 do
    for _, k in ipairs(ORDER) do
      local g = GRID[k]
      for i = 0, 40, 2 do
        local v = g.log and g.lo * (g.hi / g.lo) ^ (i / 40) or g.lo + (g.hi - g.lo) * i / 40
        local old = p[k]
        p[k] = v
        local l = loss(points, p, base)
        if l < best then best = l else p[k] = old end
      end
    end
  end
  -- then Nelder-Mead in log space from there (the constants are coupled:
  -- the FLOP rate depends on mem_bw, the exposed time on eta, latency and
  -- contention together, so one coordinate at a time stalls in the valley)
  p = M.nelder_mead(function(q) return loss(points, q, base) end, p)
  local res = { params = p, points = {}, n = #points, mean = 0, max = 0, base = base }
  for _, rec in ipairs(points) do
    local ms, parts = M.predict(rec, p, base)
    local err = math.abs(ms - rec.step_ms) / rec.step_ms
    res.points[#res.points + 1] = { rec = rec, model_ms = ms, err = err, parts = parts }
    res.mean = res.mean + err / #points
    res.max = math.max(res.max, err)
  end
  res.flops = M.hw_for(base, p, base).flops
  return res
end

return M
