-- ztrain.insight.plan_report: the table `ztrain plan` prints (cli/plan.lua
-- reads the command line); the numbers, and the pre-flight refusal's words,
-- come from plan.lua.
local memory = require "ztrain.core.memory"
local plan = require "ztrain.plan"

local M = {}

local fmt = memory.format
local cell, COLUMNS = plan.cell, plan.COLUMNS

local function gb(n) return fmt(n) end

-- table(rows, r) -> the text `ztrain plan` prints.
function M.table(rows, r)
  local cfg, out = rows.cfg, {}
  local function say(s, ...) out[#out + 1] = select("#", ...) > 0 and s:format(...) or s end
  say("%s: %.1fM parameters (%d layers, %d channels, vocabulary %d), %d rank(s), %s; activations for " ..
      "batch.micro=%d x data.seq_len=%d%s", cfg.name, rows.psi / 1e6, cfg.L, cfg.C, cfg.V, rows.nproc, r.precision,
      r.batch.micro, r.data.seq_len, r.train.checkpoint_activations and ", checkpointed" or "")
  say("limit per rank: %s", rows.limit and (fmt(rows.limit) .. " (" .. rows.source .. ")") or "none known")
  say("")
  local head = ("%-16s %-5s %-10s %-10s %-10s  %-12s %-12s %-12s %-12s %-25s %-4s %10s %12s")
  say(head, "strategy", "ranks", "device", "host", "nvme", "params", "grads", "optim", "activations", "working",
      "fits", "step", "tokens/s")
  for _, row in ipairs(rows) do
    local t, tot = row.t, row.totals
    local cells = {}
    for i, c in ipairs(COLUMNS) do cells[i] = cell(t, c[2]) end
    local name = row.name .. (row.recipe and "+" or row.spec.pipeline and "*" or "")
    say(head, name, tostring(row.ranks), fmt(tot.device), fmt(tot.host), fmt(tot.nvme), cells[1], cells[2],
        cells[3], cells[4], cells[5], row.fits and "yes" or "no", row.time and M.seconds(row.time.step) or "-",
        row.tokens_per_s and ("%.0f"):format(row.tokens_per_s) or "-")
  end
  say("")
  say("bytes per rank at the step's peak; h = host tier, n = nvme tier; working = gradient buckets, gathered " ..
      "units, MPI scratch, offload staging (comm) and aio buffers.")
  if rows[1] and rows[1].recipe then
    local pl = r.pipeline
    local sched = (r.schedule ~= "" and type(r.schedule) == "string") and r.schedule or
                  (pl.chunks > 1 and "interleaved_1f1b" or "1f1b")
    say("+ recipe: the run as asked for, %s over %d data-parallel rank(s) x %d pipeline stages x %d chunk(s), " ..
        "schedule %s: its heaviest rank, with the activation sets, kept gradients and W records the schedule " ..
        "driver keeps (lua/ztrain/plan/pipeline.lua%s).", rows[1].spec.name, rows.nproc / pl.stages, pl.stages,
        pl.chunks, type(r.schedule) == "function" and "(a function)" or sched,
        pl.split == "time" and '; pipeline.split = "time" planned as "params"' or "")
  end
  if rows[#rows] and rows[#rows].spec.pipeline then
    say("* pipeline_1f1b: one stage per rank (no data parallelism), the heaviest stage: its units as " ..
        "pipeline.split divides them, the activation sets the schedule driver keeps on it.")
  end
  local fit = {}
  for _, row in ipairs(rows) do if row.fits then fit[#fit + 1] = row.name end end
  if #fit == 0 then
    say("nothing fits: use more ranks (nproc=), a smaller batch.micro or data.seq_len, " ..
        "train.checkpoint_activations=true, or a larger device.memory_limit")
  else
    say("fits: %s", table.concat(fit, ", "))
  end
  local b = rows.best
  if b then
    local tr = b.traffic
    say("fastest to try: %s (moves %s per rank per step over the network%s; ranking: device-only before a " ..
        "pipeline before host offload before nvme, then the fewest bytes moved)", b.name, gb(tr.net),
        tr.offload > 0 and (", " .. gb(tr.offload) .. " to and from " .. (b.spec.otier or "")) or "")
  end
  local hw = rows.hw
  if hw then
    -- the model's cluster, not this machine: say so where the defaults stand
    local gpu = hw.peak_flops == 989e12 and " (an H100's dense bf16 peak, not this machine: --flops, --mfu for " ..
                "another)" or ""
    say("step, tokens/s: lua/ztrain/plan/steptime.lua on %d host(s) x %d rank(s): %.0f TFLOP/s a rank (%.0f x MFU %.0f%%)" .. gpu .. ", " ..
        "links %s across hosts (%s a message), %s within (%s), at %.0f%% of their rate; hidden communication not " ..
        "counted (docs/scaling.md)", hw.hosts, hw.gpus_per_host, hw.flops / 1e12, hw.peak_flops / 1e12, hw.mfu * 100,
        M.rate(hw.inter_bw), M.seconds(hw.latency), M.rate(hw.intra_bw), M.seconds(hw.intra_latency), 100 * hw.eta)
    local q = rows.quickest
    if q then
      say("quickest by the step-time model: %s (%s a step, %.0f tokens/s)", q.name, M.seconds(q.time.step),
          q.tokens_per_s)
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- seconds(x) -> "1.25 s", "420 ms", "5 us"
function M.seconds(x)
  if x >= 1 then return ("%.2f s"):format(x) end
  if x >= 1e-3 then return ("%.0f ms"):format(x * 1e3) end
  return ("%.0f us"):format(x * 1e6)
end

-- rate(bytes per second) -> "400 Gbit/s"
function M.rate(b)
  local bits = 8 * b
  if bits >= 1e12 then return ("%.1f Tbit/s"):format(bits / 1e12) end
  if bits >= 1e9 then return ("%.0f Gbit/s"):format(bits / 1e9) end
  return ("%.0f Mbit/s"):format(bits / 1e6)
end

return M
