-- ztrain.plan.steptime: the step-time model. What `ztrain plan` uses for time as
-- it uses plan.lua for bytes, what tools/bench_scale.lua calibrates on the
-- measured table and tools/scale_predict.lua extrapolates to GPU clusters.
--
--   step = compute + optimizer + offload + exposed communication
--   compute      FLOPs a rank does per step / its FLOP rate (hw.flops, the
--                rate of one rank that has its device to itself, over
--                hw.share; with hw.cores, all ranks share that many cores,
--                as one CPU machine's namespace "hosts" do: a rank's rate
--                over (ranks computing at once) / cores once they outnumber
--                them, the pipeline's idle stages not counted)
--   optimizer    AdamW touches 28 bytes per parameter it owns (4 reads, 3
--                writes of fp32) at hw.mem_bw (on the host for offload)
--   offload      the shards moved to and from the host (plan.traffic's
--                offload bytes) at hw.host_bw
--   communication the bytes each rank sends per step (the ZeRO formulas, per
--                micro-batch as ztrain reduces each micro-batch in canonical
--                order) over the slower tier they cross, at hw.eta x the link
--                rate, plus hw.latency per message of a ring (2(N-1) steps
--                an all-reduce, N-1 a reduce-scatter or all-gather); a ring
--                over H hosts of G ranks is hierarchical: (G-1)/G of the
--                bytes over the intra-host link, (H-1)/H of a 1/G share over
--                the inter-host one (one NIC per rank, as rail-optimised
--                clusters have).
--   exposed      communication x (1 - hidden), hidden the share of it behind
--                compute (measured: summary.json comm_per_step.hidden_share),
--                at most the backward's compute.
-- Pipelines: the schedule's own simulator (parallel/schedule/simulate.lua) runs the
-- action lists with F and B from the stage's FLOPs and each RECV delayed
-- by the activation transfer (B·T·C·4 bytes per micro-batch per boundary,
-- each way), so the bubble (p-1)/(m+p-1) and the transfers on the critical
-- path come from the schedule, not a formula; ztrain's tied embedding adds
-- the head's wte gradient per micro-batch (last -> first stage, async) and
-- the embedding's parameters after the step (first -> last). pipeline_dp
-- adds the stage's gradient reduction over its data-parallel group (zero1).
--
-- All times in seconds, bytes in bytes, rates in bytes or FLOPs per second.
-- Pure Lua (no FFI): the specs and the planner run it without the runtime.
local sched = require "ztrain.parallel.schedule.library"
local sim = require "ztrain.parallel.schedule.simulate"
local M = {}

M.ADAM_BYTES = 28            -- per parameter: read p, g, m, v; write p, m, v (fp32)

-- params(cfg) -> parameter count of a GPT-2 shape (gpt2.lua's layout:
-- wte, wpe, L blocks of 12C^2 + 13C, the final norm; the head is tied).
function M.params(cfg)
  local C = cfg.C
  return cfg.V * C + cfg.maxT * C + cfg.L * (12 * C * C + 13 * C) + 2 * C
end

-- flops_per_token(cfg, T, recompute, n) -> training FLOPs per token: forward
-- 2 x the matmul parameters (blocks' 12C^2 and the head's V·C; or n, e.g.
-- all parameters, as tools/bench_common.lua's PaLM count 6 N + 12 L C T
-- takes) plus the attention's 2 x 2·T·C per layer (scores and weighted sum,
-- counted full as the usual estimate does); backward twice the forward;
-- recomputed (checkpointed) blocks one forward more.
function M.flops_per_token(cfg, T, recompute, n)
  local C, L = cfg.C, cfg.L
  local fwd = 2 * (n or 12 * L * C * C + cfg.V * C) + 4 * L * T * C
  return fwd * (recompute and 4 or 3)
end

local STAGE = { dp = 0, dp_deferred = 0, single = 0, zero1 = 1, zero2 = 2, zero3 = 3,
                zero2_offload = 2, zero3_offload = 3, zero3_infinity = 3 }
M.STRATEGIES = { "dp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "pipeline_1f1b",
                 "pipeline_dp" }

-- ring(S, N) -> the bytes one rank sends in a ring all-reduce of S bytes.
function M.ring_allreduce(S, N) return N > 1 and 2 * S * (N - 1) / N or 0 end
-- the bytes one rank sends in a reduce-scatter (or all-gather) of S bytes
function M.ring_half(S, N) return N > 1 and S * (N - 1) / N or 0 end

-- collectives(o) -> { {kind, bytes (the whole buffer), count (per step)} }:
-- the data-parallel collectives of a strategy per step. o: strategy, psi,
-- m (micro-batches), lowp (2-byte parameters), embed (the embedding unit's
-- elements, (V + maxT)·C: zero3's extra gather; 0 or nil: none). Gradients are reduced in
-- fp32 (ztrain widens them), parameters gathered in their stored dtype.
function M.collectives(o)
  local s, psi, m = o.strategy, o.psi, o.m or 1
  local pb = o.lowp and 2 or 4
  local stage = STAGE[s]
  if s == "dp_deferred" then return { { kind = "all_reduce", bytes = 4 * psi, count = 1 } } end
  if stage == 0 then return { { kind = "all_reduce", bytes = 4 * psi, count = m } } end
  if stage == nil then error(("steptime: unknown strategy %q (known: %s)"):format(tostring(s),
                                table.concat(M.STRATEGIES, ", ")), 0) end
  local c = { { kind = "reduce_scatter", bytes = 4 * psi, count = m } }
  if stage < 3 then c[2] = { kind = "all_gather", bytes = pb * psi, count = 1 }
  else
    c[2] = { kind = "all_gather", bytes = pb * psi, count = 2 * m }     -- forward and backward
    -- the head reads the embedding's tied wte: zero.lua gathers the
    -- embedding unit (o.embed elements) once more per micro-batch for it
    -- (measured: 25.9 MB a step more on gpt2-mini, 2 ranks, 2 micro-batches)
    if (o.embed or 0) > 0 then c[3] = { kind = "all_gather", bytes = pb * o.embed, count = m } end
  end
  return c
end

-- dp_bytes(o) -> bytes one rank sends per step in the data-parallel
-- collectives over N ranks (fp32, m = 1: dp 2·4Ψ(N-1)/N, zero1/2 the
-- same, zero3 1.5x).
function M.dp_bytes(o, N)
  local total = 0
  for _, c in ipairs(M.collectives(o)) do
    local f = c.kind == "all_reduce" and M.ring_allreduce or M.ring_half
    total = total + c.count * f(c.bytes, N)
  end
  return total
end

-- link(hw, tier) -> the bytes per second a tier ("intra" or "inter") carries, its latency per message
local function link(hw, tier)
  if tier == "intra" then return (hw.intra_bw or hw.inter_bw) * (hw.intra_eta or hw.eta or 1), hw.intra_latency or 0 end
  return hw.inter_bw * (hw.eta or 1), hw.latency or 0
end

-- collective_time(kind, S, H, G, hw, units) -> seconds for one collective
-- of S bytes over H hosts x G ranks, split in `units` messages per ring
-- step (ztrain reduces unit by unit: each unit is its own collective).
function M.collective_time(kind, S, H, G, hw, units)
  units = units or 1
  local steps = kind == "all_reduce" and 2 or 1
  local bi, li = link(hw, "intra")
  local bo, lo = link(hw, "inter")
  local t = 0
  if G > 1 then t = t + steps * (S * (G - 1) / G / bi + (G - 1) * li * units) end
  if H > 1 then t = t + steps * ((S / G) * (H - 1) / H / bo + (H - 1) * lo * units) end
  return t
end

local function opt_time(n, hw) return M.ADAM_BYTES * n / (hw.mem_bw or math.huge) end

-- rate(hw, busy) -> a rank's FLOP rate when `busy` ranks compute at once:
-- hw.flops over hw.share, and where they all share hw.cores one-thread
-- cores (one machine's namespace hosts), over busy / cores once they
-- outnumber the cores.
local function rate_of(hw, busy)
  local r = hw.flops / (hw.share or 1)
  if hw.cores then r = r / math.max(1, busy / hw.cores) end
  return r
end

-- dp_step(o, hw) -> the breakdown of a data-parallel (dp / ZeRO) step.
local function dp_step(o, hw)
  local N = o.hosts * o.gpus
  local tokens = o.B * o.T * o.m
  local rate = rate_of(hw, N)
  local r = { compute = tokens * M.flops_per_token(o.cfg, o.T, o.recompute) / rate }
  local stage = STAGE[o.strategy]
  local offl = o.strategy:match("offload") or o.strategy:match("infinity")
  r.optimizer = stage == 0 and opt_time(o.psi, hw) or
                opt_time(o.psi / N, offl and { mem_bw = hw.host_mem_bw or hw.mem_bw } or hw)
  r.comm, r.bytes, r.messages = 0, M.dp_bytes(o, N), 0
  for _, c in ipairs(M.collectives(o)) do
    r.comm = r.comm + c.count * M.collective_time(c.kind, c.bytes, o.hosts, o.gpus, hw, o.units)
    r.messages = r.messages + c.count * (o.units or 1) * (c.kind == "all_reduce" and 2 or 1) * (N - 1)
  end
  r.offload = 0
  if offl then
    local pb = o.lowp and 2 or 4
    local bytes = (4 + pb) * o.psi / N + (stage == 3 and 2 * pb * o.psi / N * o.m or 0)
    -- infinity: the shards live on nvme (its rate when given)
    local bw = o.strategy:match("infinity") and (hw.nvme_bw or hw.host_bw) or hw.host_bw
    r.offload = bytes / (bw or math.huge)
  end
  local hidden = type(o.hidden) == "table" and (o.hidden[o.strategy] or o.hidden.default) or o.hidden or 0
  -- at most the backward (2/3 of the compute) can hide communication
  r.hidden = math.min(r.comm * hidden, r.compute * 2 / 3)
  r.exposed = r.comm - r.hidden
  r.step = r.compute + r.optimizer + r.offload + r.exposed
  return r
end

-- units(cfg, T) -> GPT-2's units as gpt2.lua lays them out: { n (parameters),
-- f (forward FLOPs per token) }: the embedding (a lookup: no FLOPs to
-- speak of), L blocks, the head (the final norm; its matmul is the tied wte's).
function M.units(cfg, T)
  local C = cfg.C
  local u = { { n = (cfg.V + cfg.maxT) * C, f = 0 } }
  for _ = 1, cfg.L do u[#u + 1] = { n = 12 * C * C + 13 * C, f = 2 * 12 * C * C + 4 * T * C } end
  u[#u + 1] = { n = 2 * C, f = 2 * cfg.V * C }
  return u
end

-- stages(units, p) -> { { n, f, first, last } per stage }: pipeline.split =
-- "params" as parallel/schedule/stages.lua cuts it (each boundary nearest k/p of the
-- cumulative parameter count, at least one unit left for each later stage).
function M.stages(units, p)
  local total, cum = 0, {}
  for i, u in ipairs(units) do total = total + u.n; cum[i] = total end
  local out, start = {}, 1
  for s = 1, p do
    local stop = #units
    if s < p then
      local target, bd = total * s / p, math.huge
      for i = start, #units - (p - s) do
        local d = math.abs(cum[i] - target)
        if d < bd then stop, bd = i, d end
      end
    end
    local st = { n = 0, f = 0, first = s == 1, last = s == p }
    for i = start, stop do st.n = st.n + units[i].n; st.f = st.f + units[i].f end
    out[s] = st
    start = stop + 1
  end
  return out
end

-- pipe_step(o, hw) -> the breakdown of a 1F1B pipeline of o.stages stages
-- (one per host unless given), each stage replicated over dp ranks.
local function pipe_step(o, hw)
  local N = o.hosts * o.gpus
  local p = o.stages or (o.strategy == "pipeline_dp" and o.hosts or N)
  local dp = math.floor(N / p)
  if p < 2 or dp < 1 or dp * p ~= N then
    error(("steptime: a pipeline of %d stages cannot use %d ranks (%d hosts x %d): the stages must divide them")
          :format(p, N, o.hosts, o.gpus), 0)
  end
  local m = o.m
  -- the stages as pipeline.split = "params" cuts them: the slowest one
  -- paces the pipeline (the simulator takes one time for every stage)
  local stages = M.stages(M.units(o.cfg, o.T), p)
  local fmax, fsum = 0, 0
  for _, st in ipairs(stages) do fmax = math.max(fmax, st.f); fsum = fsum + st.f end
  -- ranks computing at once: each replica's stages, busy fsum / fmax of the time
  local rate = rate_of(hw, dp * fsum / fmax)
  local per = o.B * o.T * (o.recompute and 4 or 3) / rate
  local f_mb = per * fmax                                             -- F + B of the slowest stage
  -- a boundary crosses hosts when the stages are spread over them (the
  -- seeds' layout: pipeline across hosts, data parallelism within)
  local tier = (o.hosts > 1) and "inter" or "intra"
  local bw, lat = link(hw, tier)
  local act = o.B * o.T * o.cfg.C * (o.stream16 and 2 or 4)   -- the residual stream's row (bf16 with bf16 GEMMs)
  local x = act / bw + lat
  local res = sim.run(sched.build("1f1b", { ranks = p, microbatches = m, chunks = 1 }),
                      { times = { F = f_mb / 3, B = 2 * f_mb / 3 }, latency = x })
  -- the simulator gives every stage the slowest one's time; a faster stage
  -- shortens the fill and drain by what it saves on one micro-batch (1F1B
  -- with unequal stages: (m - 1) x the slowest + one pass through all)
  local makespan = res.makespan - (p * fmax - fsum) * per
  local r = { compute = m * f_mb, bubble = res.bubble, schedule = makespan, messages = 2 * m + m + 1 }
  -- the tied embedding: the head's wte gradient per micro-batch, async, to
  -- the first stage (it needs them by its last backward), then the
  -- embedding's parameters back after the step
  local V, C, pb = o.cfg.V, o.cfg.C, o.lowp and 2 or 4
  local tied = m * (4 * V * C / bw + lat)
  local sync = (V + o.cfg.maxT) * C * pb / bw + lat
  r.tied = math.max(0, tied - (makespan - f_mb))              -- what the schedule cannot hide
  r.comm = 2 * m * x + tied + sync
  -- per boundary, each way; a rank's: its activations forward and
  -- gradients back, the last stage the head's wte gradient every
  -- micro-batch, the first the embedding's parameters after the step
  -- (measured exactly so on gpt2-mini, 2 stages: spec/unit/scale_fit_spec.lua),
  -- and its stage's gradients over its data-parallel group (zero1, within
  -- a host while the group fits one); the busiest rank's bytes
  r.act_bytes = 2 * m * act
  r.bytes, r.dpcomm, r.optimizer = 0, 0, 0
  local G = math.min(dp, o.gpus)
  for _, st in ipairs(stages) do
    local b = (st.first and 0 or m * act) + (st.last and 0 or m * act) + (st.last and m * 4 * V * C or 0) +
              (st.first and (V + o.cfg.maxT) * C * pb or 0)
    if dp > 1 then
      local so = { strategy = "zero1", psi = st.n, m = m, lowp = o.lowp }
      local t = 0
      for _, c in ipairs(M.collectives(so)) do
        t = t + c.count * M.collective_time(c.kind, c.bytes, math.floor(dp / G), G, hw, o.units)
      end
      r.dpcomm = math.max(r.dpcomm, t)
      b = b + M.dp_bytes(so, dp)
    end
    r.bytes = math.max(r.bytes, b)
    r.optimizer = math.max(r.optimizer, opt_time(st.n / dp, hw))
  end
  r.hidden = 0
  r.exposed = r.schedule - r.compute + r.tied + sync + r.dpcomm
  r.offload = 0
  r.step = makespan + r.tied + sync + r.dpcomm + r.optimizer
  return r
end

-- A GPU cluster, as assumptions (docs/scaling.md states them): H100 SXM,
-- 989 TFLOP/s dense bf16 at 40% MFU; NVLink 4 within a host (900 GB/s both
-- ways: 450 GB/s each way per GPU), NDR InfiniBand across (400 Gbit/s per
-- GPU), NCCL reaching 80% of either, 2 us a message within a host and 5 us
-- across; HBM3 3.35 TB/s for the optimizer; offload over PCIe 5 (25 GB/s
-- a GPU, effective) to a host whose 200 GB/s of memory bandwidth 8 GPUs
-- share (CPU AdamW).
M.CLUSTER = { flops = 989e12 * 0.40, peak_flops = 989e12, mfu = 0.40, share = 1, intra_bw = 450e9, intra_eta = 0.8,
              intra_latency = 2e-6, inter_bw = 400e9 / 8, eta = 0.8, latency = 5e-6, mem_bw = 3.35e12,
              host_bw = 25e9, host_mem_bw = 200e9 / 8, nvme_bw = 3e9, gpus_per_host = 8, memory = 80 * 2 ^ 30 }

-- parse_rate("100gbit" | "25GB/s" | "400e9") -> bytes per second, or nil, why
local RATE_UNITS = { kbit = 1e3 / 8, mbit = 1e6 / 8, gbit = 1e9 / 8, tbit = 1e12 / 8, ["kb/s"] = 1e3, ["mb/s"] = 1e6,
                     ["gb/s"] = 1e9, ["tb/s"] = 1e12 }
function M.parse_rate(s)
  local n, unit = tostring(s):lower():match("^%s*([%d%.e%+%-]+)%s*([%a/]*)%s*$")
  local v = tonumber(n)
  local mult = unit == "" and 1 or RATE_UNITS[unit]
  if not v or not mult or v <= 0 then
    return nil, ("%s is not a link rate: give e.g. 100gbit, 10mbit, 450GB/s or bytes per second"):format(tostring(s))
  end
  return v * mult
end

-- parse_time("5us" | "1ms" | "2e-6") -> seconds, or nil, why
local TIME_UNITS = { ns = 1e-9, us = 1e-6, ms = 1e-3, s = 1 }
function M.parse_time(s)
  local n, unit = tostring(s):lower():match("^%s*([%d%.e%+%-]+)%s*(%a*)%s*$")
  local v = tonumber(n)
  local mult = unit == "" and 1 or TIME_UNITS[unit]
  if not v or not mult or v < 0 then
    return nil, ("%s is not a latency: give e.g. 5us, 1ms or seconds"):format(tostring(s))
  end
  return v * mult
end

-- parse_flops("989e12" | "989T" | "20G") -> FLOP/s, or nil, why
local FLOP_UNITS = { [""] = 1, k = 1e3, m = 1e6, g = 1e9, t = 1e12, p = 1e15 }
function M.parse_flops(s)
  local n, unit = tostring(s):lower():match("^%s*([%d%.e%+%-]+)%s*(%a?)%s*$")
  local v = tonumber(n)
  local mult = unit and FLOP_UNITS[unit]
  if not v or not mult or v <= 0 then
    return nil, ("%s is not a FLOP rate: give e.g. 989T (FLOP/s, dense) or 989e12"):format(tostring(s))
  end
  return v * mult
end

-- step(o, hw) -> { step, compute, optimizer, offload, comm, exposed,
-- hidden, bytes, messages, bubble (pipelines) } in seconds and bytes.
-- o = { cfg (a GPT-2 shape: L, C, V, maxT), strategy (M.STRATEGIES), B
-- (micro-batch), T (sequence), m (micro-batches a step: accumulate, or the
-- pipeline's), hosts, gpus (ranks per host), stages (pipelines), lowp,
-- stream16 (the residual stream bf16: bf16 GEMMs, 2-byte boundary rows),
-- recompute, units (collectives per ring step: 1 bucket, or the units),
-- hidden (share or { strategy = share, default = }), psi (default
-- params(cfg)), embed (default (V + maxT)·C; 0: no tied re-gather) }.
-- hw = { flops, share, cores, inter_bw, intra_bw, eta, intra_eta, latency,
-- intra_latency, mem_bw, host_bw, host_mem_bw, nvme_bw }.
function M.step(o, hw)
  assert(o.cfg and o.strategy and o.B and o.T, "steptime.step: o.cfg, o.strategy, o.B and o.T are required")
  assert(hw and hw.flops and hw.inter_bw, "steptime.step: hw.flops and hw.inter_bw are required")
  local q = setmetatable({ psi = o.psi or M.params(o.cfg), m = o.m or 1, hosts = o.hosts or 1, gpus = o.gpus or 1,
                           embed = o.embed or (o.cfg.V + o.cfg.maxT) * o.cfg.C }, { __index = o })
  local r
  if o.strategy:match("^pipeline") then r = pipe_step(q, hw) else r = dp_step(q, hw) end
  r.strategy = o.strategy
  return r
end

return M
