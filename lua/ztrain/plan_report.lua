-- ztrain.plan_report: `ztrain plan` (the planner's table); the numbers,
-- and the pre-flight refusal's words, come from plan.lua.
local memory = require "ztrain.core.memory"
local plan = require "ztrain.plan"
local usage = require "ztrain.usage"

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
    local name = row.name .. (row.spec.pipeline and "*" or "")
    say(head, name, tostring(row.ranks), fmt(tot.device), fmt(tot.host), fmt(tot.nvme), cells[1], cells[2],
        cells[3], cells[4], cells[5], row.fits and "yes" or "no", row.time and M.seconds(row.time.step) or "-",
        row.tokens_per_s and ("%.0f"):format(row.tokens_per_s) or "-")
  end
  say("")
  say("bytes per rank at the step's peak; h = host tier, n = nvme tier; working = gradient buckets, gathered " ..
      "units, MPI scratch, offload staging (comm) and aio buffers.")
  if rows[#rows] and rows[#rows].spec.pipeline then
    say("* pipeline_1f1b: one stage per rank (no data parallelism), the heaviest stage: its units as " ..
        "pipeline.split divides them, its activation sets in flight from the schedule's simulator.")
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
    say("step, tokens/s: lua/ztrain/steptime.lua on %d host(s) x %d rank(s): %.0f TFLOP/s a rank (%.0f x MFU %.0f%%), " ..
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

-- The hardware flags of `ztrain plan` (the step-time model's): name ->
-- { key of plan.hardware's options, parser }.
local FLAGS = {
  hosts = { "hosts", "count" }, ["gpus-per-host"] = { "gpus_per_host", "count" },
  link = { "link", "parse_rate" }, latency = { "latency", "parse_time" },
  ["intra-link"] = { "intra_link", "parse_rate" }, ["intra-latency"] = { "intra_latency", "parse_time" },
  flops = { "flops", "parse_flops" }, mfu = { "mfu", "fraction" },
}

local function flag_value(name, v)
  local f = FLAGS[name]
  local st = require "ztrain.steptime"
  if f[2] == "count" then
    local n = tonumber(v)
    if not n or n < 1 or n ~= math.floor(n) then
      error(("plan: --%s %s must be a whole number >= 1"):format(name, tostring(v)), 0)
    end
    return n
  elseif f[2] == "fraction" then
    local n = tonumber(v)
    if not n or n <= 0 or n > 1 then error(("plan: --mfu %s must be a fraction in (0, 1], e.g. 0.4"):format(tostring(v)), 0) end
    return n
  end
  local n, why = st[f[2]](v)
  if not n then error(("plan: --%s: %s"):format(name, why), 0) end
  return n
end

-- plan_args(args) -> recipe path or nil, overrides, nproc, hardware options.
local function plan_args(args)
  local path, over, nproc, hw = nil, {}, nil, {}
  local i = 0
  while i < #args do
    i = i + 1
    local a = args[i]
    local k, v = a:match("^([%w_%.]+)=(.*)$")
    local flag, fv = a:match("^%-%-([%w%-]+)=(.*)$")
    flag = flag or a:match("^%-%-([%w%-]+)$")
    if flag then
      if not FLAGS[flag] then
        error(("plan: unknown flag --%s (known: --hosts, --gpus-per-host, --link, --latency, --intra-link, " ..
               "--intra-latency, --flops, --mfu)"):format(flag), 0)
      end
      if not fv then
        i = i + 1
        fv = args[i]
        if not fv then error(("plan: --%s needs a value"):format(flag), 0) end
      end
      hw[FLAGS[flag][1]] = flag_value(flag, fv)
    elseif not k and a:match("%.lua$") and not path then path = a
    elseif k == "nproc" or k == "launch.nproc" then
      nproc = tonumber(v)
      if not nproc or nproc < 1 or nproc ~= math.floor(nproc) then
        error(("plan: nproc=%s must be a whole number >= 1 (the ranks to plan for)"):format(v), 0)
      end
    elseif k then over[#over + 1] = a
    else error(("plan: cannot read argument %q: expected [RECIPE.lua] key=value (e.g. model.size=gpt2-xl " ..
               "nproc=8 device.memory_limit=16GiB)"):format(a), 0) end
  end
  return path, over, nproc, hw
end

-- main(args) -> exit code: `ztrain plan [RECIPE.lua] key=value ...`.
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(usage); return 0 end
  local path, over, nproc, hwopts = plan_args(args)
  local recipe = require "ztrain.recipe"
  local r, err
  if path then r, err = recipe.load(path, over)
  else
    -- without a recipe: GPT-2's own vocabulary (what its sizes are known
    -- by), unless a tokenizer or vocabulary is given
    local given = false
    for _, o in ipairs(over) do
      if o:match("^data%.tokenizer=") or o:match("^model%.vocab_size=") then given = true end
    end
    if not given then table.insert(over, 1, "model.vocab_size=" .. plan.GPT2_VOCAB) end
    r, err = recipe.resolve({}, over)
  end
  if not r then error(err, 0) end
  -- --hosts x --gpus-per-host is the rank count when nproc is not given
  if not nproc and hwopts.hosts and hwopts.gpus_per_host then nproc = hwopts.hosts * hwopts.gpus_per_host end
  nproc = nproc or math.max(r.launch.nproc, 1)
  local hw = plan.hardware(nproc, hwopts)
  local rows = plan.rows(r, nproc, nil, hw)
  rows.hw = hw
  io.stdout:write(M.table(rows, r))
  return 0
end


return M
