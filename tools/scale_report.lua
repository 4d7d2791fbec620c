-- tools/scale_report.lua -- docs/scaling.md's measured block and
-- docs/scaling.svg from tools/bench_scale.lua's saved records.
--
--   local report = dofile("tools/scale_report.lua")
--   report.load(dir) -> records     report.render(records, {doc=, svg=, fit_out=}) -> text printed
--   report.replace_block(text, name, body) -> text   (between <!-- BEGIN name --> and <!-- END name -->)
--
-- The "when to use what" rows are computed from the records: each claim of
-- the seeds next to the measured cells that confirm or refute it; a cell
-- that was not measured reads n/a.
local cjson = require "cjson"
local svg = require "ztrain.util.svg"
local fit = dofile((require("ztrain").home or ".") .. "/tools/scale_fit.lua")

local M = {}

local ORDER = { single = 0, dp = 1, zero1 = 2, zero2 = 3, zero3 = 4, zero3_offload = 5, pipeline_1f1b = 6,
                pipeline_dp = 7 }

-- layout(rec) -> "2" (hosts, one rank each) or "2x2" (hosts x ranks a host)
function M.layout(rec)
  return tostring(rec.hosts) .. (((rec.slots or 1) > 1) and ("x" .. rec.slots) or "")
end
local function ranks(rec) return rec.hosts * (rec.slots or 1) end

-- load(dir) -> the records (every <id>.json but fit.json), in table order
function M.load(dir)
  local out = {}
  local p = io.popen(("ls %q 2>/dev/null"):format(dir))
  for name in p:lines() do
    if name:match("%.json$") and name ~= "fit.json" then
      local f = io.open(dir .. "/" .. name)
      local ok, rec = pcall(cjson.decode, f:read("*a"))
      f:close()
      if ok and type(rec) == "table" and rec.id then out[#out + 1] = rec end
    end
  end
  p:close()
  table.sort(out, function(a, b)
    if (a.slots or 1) ~= (b.slots or 1) then return (a.slots or 1) < (b.slots or 1) end
    if a.hosts ~= b.hosts then return a.hosts < b.hosts end
    local ra, rb = fit.rate_bytes(a.rate) or 0, fit.rate_bytes(b.rate) or 0
    if ra ~= rb then return ra < rb end
    return (ORDER[a.strategy] or 99) < (ORDER[b.strategy] or 99)
  end)
  return out
end

-- replace_block(text, name, body) -> text with the block's body replaced
-- (appended, with its markers, when the file has none yet)
function M.replace_block(text, name, body)
  local b, e = "<!-- BEGIN " .. name .. " -->", "<!-- END " .. name .. " -->"
  local i = text:find(b, 1, true)
  local j = i and text:find(e, i, true)
  if not (i and j) then return text .. "\n" .. b .. "\n" .. body .. "\n" .. e .. "\n" end
  return text:sub(1, i - 1) .. b .. "\n" .. body .. "\n" .. text:sub(j)
end

local function na(x, f) if type(x) ~= "number" then return "n/a" end return f(x) end
local function mib(x) return ("%.1f MiB"):format(x / 2 ^ 20) end
local function pct(x) return ("%.0f%%"):format(100 * x) end

-- bytes sent per step by the busiest rank (summary.json comm_per_step)
function M.sent(rec)
  local c = rec.comm_per_step
  if type(c) ~= "table" then return nil end
  if type(c.max) == "table" and type(c.max.sent) == "number" then return c.max.sent end
  local best
  for _, r in ipairs(type(c.ranks) == "table" and c.ranks or {}) do
    if type(r.sent) == "number" then best = math.max(best or 0, r.sent) end
  end
  return best
end

-- model_bytes(rec) -> the step-time model's bytes per step for the busiest rank
function M.model_bytes(rec)
  local ok, r = pcall(function()
    return require("ztrain.plan.steptime").step(fit.input(rec), { flops = 1, inter_bw = 1 }).bytes
  end)
  return ok and r or 0 / 0
end

-- find(recs, strategy, hosts, rate, slots) -> the record (slots default 1)
local function find(recs, s, h, rate, slots)
  for _, r in ipairs(recs) do
    if r.ok and r.strategy == s and r.hosts == h and r.rate == rate and (r.slots or 1) == (slots or 1) then
      return r
    end
  end
end

local function cell(r) return r and ("%.0f ms"):format(r.step_ms) or "n/a" end

-- conclusions(recs) -> markdown rows: the seeds' claim, what was measured.
function M.conclusions(recs)
  local rows, rates, hosts, seen = {}, {}, {}, {}
  for _, r in ipairs(recs) do
    if r.ok and r.hosts > 1 then
      if not seen["r" .. r.rate] then seen["r" .. r.rate] = true; rates[#rates + 1] = r.rate end
      if (r.slots or 1) == 1 and not seen["h" .. r.hosts] then seen["h" .. r.hosts] = true; hosts[#hosts + 1] = r.hosts end
    end
  end
  table.sort(rates, function(a, b) return (fit.rate_bytes(a) or 0) < (fit.rate_bytes(b) or 0) end)
  table.sort(hosts)
  local slow, fast, H = rates[1], rates[#rates], hosts[#hosts]
  local function row(claim, measured) rows[#rows + 1] = ("| %s | %s |"):format(claim, measured) end
  if not H then return "(no multi-host runs measured)" end
  if #rates < 2 then slow, fast = nil, nil end     -- one rate: no comparison across links
  local d1, d2 = find(recs, "dp", H, slow), find(recs, "dp", H, fast)
  row("dp needs bandwidth (gradient all-reduce every micro-batch)",
      d1 and d2 and ("dp on %d hosts: %s at %s vs %s at %s (%.2fx)"):format(H, cell(d1), slow, cell(d2), fast,
                                                                            d1.step_ms / d2.step_ms) or "n/a")
  local z1, z2 = find(recs, "zero3", H, slow), find(recs, "zero3", H, fast)
  local sb, db = z1 and M.sent(z1), d1 and M.sent(d1)
  row("ZeRO-3 moves 1.5x dp's bytes; the extra costs where links are slow",
      (z1 and d1 and z2 and d2) and ("bytes zero3/dp %s (the model: %.2fx; 1.5x plus ztrain's third gather of the " ..
                                     "embedding for the tied head); zero3 - dp: %+.0f ms at %s, %+.0f ms at %s"):format(
        (sb and db) and ("%.2fx"):format(sb / db) or "n/a", M.model_bytes(z1) / M.model_bytes(d1),
        z1.step_ms - d1.step_ms, slow, z2.step_ms - d2.step_ms, fast) or "n/a")
  local wins, loses = {}, {}
  for _, h in ipairs(hosts) do
    for _, rate in ipairs(rates) do
      local p, d = find(recs, "pipeline_1f1b", h, rate), find(recs, "dp", h, rate)
      if p and d then
        local t = ("%d hosts %s: %s vs dp %s"):format(h, rate, cell(p), cell(d))
        if p.step_ms < d.step_ms then wins[#wins + 1] = t else loses[#loses + 1] = t end
      end
    end
  end
  local tiedx = ""
  local pr = find(recs, "pipeline_1f1b", H, slow or rates[1])
  if pr and pr.model and pr.model.vocab then
    local b = pr.batch or {}
    tiedx = (" (ztrain's 1F1B also sends the tied embedding's wte gradient, %.1f MB, every micro-batch: %.0fx " ..
             "an activation of %.2f MB here)"):format(4 * pr.model.vocab * pr.model.channels / 1e6,
             pr.model.vocab / ((b.micro or 1) * (b.seq_len or 1)), 4 * (b.micro or 1) * (b.seq_len or 1) *
             pr.model.channels / 1e6)
  end
  row("pipeline across hosts beats dp over slow links (activations, not gradients, cross)",
      (#wins + #loses == 0) and "n/a" or ("faster: %s; slower: %s%s"):format(#wins > 0 and table.concat(wins, "; ") or
                                                                              "none", #loses > 0 and
                                                                              table.concat(loses, "; ") or "none", tiedx))
  local within, across = {}, {}
  for _, rate in ipairs(rates) do
    local pd, dd = find(recs, "pipeline_dp", 2, rate, 2), find(recs, "dp", 2, rate, 2)
    if pd and dd then
      local t = ("%s: pipeline_dp %s vs dp %s"):format(rate, cell(pd), cell(dd))
      if pd.step_ms < dd.step_ms then within[#within + 1] = t else across[#across + 1] = t end
    end
  end
  row("pipeline across nodes, data parallelism within (2 hosts x 2 ranks: pipeline_dp against dp over all 4)",
      (#within + #across == 0) and "n/a" or ("pipeline_dp faster: %s; dp faster: %s"):format(
        #within > 0 and table.concat(within, "; ") or "none", #across > 0 and table.concat(across, "; ") or "none"))
  local o, z = find(recs, "zero3_offload", H, fast), z2
  row("offload trades speed for device memory",
      (o and z) and ("zero3_offload vs zero3 on %d hosts at %s: %s vs %s (%+.0f%%)"):format(H, fast, cell(o), cell(z),
                                                                                            100 * (o.step_ms / z.step_ms - 1)) or "n/a")
  local a, b = find(recs, "zero1", H, slow), d1
  row("zero1 moves what dp moves (reduce-scatter + all-gather = all-reduce; accumulating, less: it gathers once a step)",
      (a and b) and ("at %s on %d hosts: zero1 %s (%s sent), dp %s (%s sent)"):format(slow, H, cell(a),
        na(M.sent(a), mib), cell(b), na(M.sent(b), mib)) or "n/a")
  return "| the seeds say | measured here |\n|---|---|\n" .. table.concat(rows, "\n")
end

-- table_md(recs, res) -> the measured table, with the model's step and error
function M.table_md(recs, res)
  local model = {}
  for _, p in ipairs(res and res.points or {}) do model[p.rec.id] = p end
  local lines = { "| strategy | hosts | link | step (ms) | tokens/s | sent / step / rank | model's bytes | hidden | " ..
                  "model (ms) | error |", "|---|---|---|---|---|---|---|---|---|---|" }
  for _, r in ipairs(recs) do
    local m = model[r.id]
    if r.ok then
      lines[#lines + 1] = ("| %s | %s | %s | %.1f | %.0f | %s | %s | %s | %s | %s |"):format(r.strategy,
        M.layout(r), r.rate, r.step_ms, r.tokens_per_s or 0, na(M.sent(r), mib),
        ranks(r) > 1 and mib(M.model_bytes(r)) or "-", na(fit.hidden_of(r), pct),
        m and ("%.1f"):format(m.model_ms) or "-", m and pct(m.err) or "-")
    else
      lines[#lines + 1] = ("| %s | %s | %s | failed | | | | | | |"):format(r.strategy, M.layout(r), r.rate)
    end
  end
  return table.concat(lines, "\n")
end

-- chart(recs, res) -> SVG: step time against link rate, a panel per
-- layout (2 hosts, 4 hosts, 2 hosts x 2 ranks), a line per strategy
-- (measured: solid with dots; model: dashed).
function M.chart(recs, res)
  local hosts, rates, strategies, seen = {}, {}, {}, {}
  for _, r in ipairs(recs) do
    if r.ok and r.hosts > 1 then
      local lay = { h = r.hosts, slots = r.slots or 1, name = M.layout(r) }
      if not seen["h" .. lay.name] then seen["h" .. lay.name] = true; hosts[#hosts + 1] = lay end
      if not seen["r" .. r.rate] then seen["r" .. r.rate] = true; rates[#rates + 1] = r.rate end
      if not seen["s" .. r.strategy] then seen["s" .. r.strategy] = true; strategies[#strategies + 1] = r.strategy end
    end
  end
  table.sort(hosts, function(a, b) if a.slots ~= b.slots then return a.slots < b.slots end return a.h < b.h end)
  table.sort(rates, function(a, b) return (fit.rate_bytes(a) or 0) < (fit.rate_bytes(b) or 0) end)
  table.sort(strategies, function(a, b) return (ORDER[a] or 99) < (ORDER[b] or 99) end)
  local model = {}
  for _, p in ipairs(res and res.points or {}) do model[p.rec.id] = p.model_ms end
  local PW, PH, L, TOP = 380, 260, 70, 70
  if #hosts == 0 then              -- nothing measured yet: say so, in the chart's place
    local doc = svg.new(600, 120)
    doc:title(20, "Step time against link bandwidth", "not measured yet: make bench-scale")
    return doc:finish()
  end
  local W = L + #hosts * (PW + 40) + 20
  local doc = svg.new(math.max(W, 500), TOP + PH + 110)
  doc:title(L, "Step time against link bandwidth",
            "measured (solid, dots) and the calibrated model (dashed); all hosts share this machine's cores")
  local maxv = 0
  for _, r in ipairs(recs) do if r.ok and r.hosts > 1 then maxv = math.max(maxv, r.step_ms, model[r.id] or 0) end end
  local step, ticks, _, hi = svg.ticks(0, maxv * 1.05, 5)
  for pi, lay in ipairs(hosts) do
    local h = lay.h
    local x0 = L + (pi - 1) * (PW + 40)
    local function X(i) return x0 + (#rates == 1 and PW / 2 or (i - 1) * PW / (#rates - 1)) end
    local function Y(v) return TOP + PH - v / hi * PH end
    doc:text(x0 + PW / 2, TOP - 8, lay.slots > 1 and ("%d hosts x %d ranks"):format(h, lay.slots) or
             ("%d hosts"):format(h), { ["text-anchor"] = "middle", ["font-weight"] = "bold" })
    for _, v in ipairs(ticks) do
      doc:line(x0, Y(v), x0 + PW, Y(v), { stroke = "#e5e5e5" })
      if pi == 1 then doc:text(x0 - 6, Y(v) + 4, svg.tick_label(v, step), { ["text-anchor"] = "end" }) end
    end
    for i, rate in ipairs(rates) do
      doc:text(X(i), TOP + PH + 18, rate, { ["text-anchor"] = "middle" })
    end
    for si, s in ipairs(strategies) do
      local color = svg.PALETTE[(si - 1) % #svg.PALETTE + 1]
      local meas, mod = {}, {}
      for i, rate in ipairs(rates) do
        local r = find(recs, s, h, rate, lay.slots)
        if r then
          meas[#meas + 1] = { X(i), Y(r.step_ms) }
          doc:element("circle", { cx = X(i), cy = Y(r.step_ms), r = 3.5, fill = color, class = "measured",
                                  ["data-strategy"] = s, ["data-hosts"] = lay.name, ["data-rate"] = rate,
                                  ["data-ms"] = r.step_ms,
                                  tooltip = ("%s, %s hosts, %s: %.1f ms"):format(s, lay.name, rate, r.step_ms) })
          if model[r.id] then mod[#mod + 1] = { X(i), Y(model[r.id]) } end
        end
      end
      if #meas > 1 then doc:polyline(meas, { stroke = color, ["stroke-width"] = 2, class = "measured" }) end
      if #mod > 1 then
        doc:polyline(mod, { stroke = color, ["stroke-width"] = 1.5, ["stroke-dasharray"] = "5,4", class = "model" })
      end
    end
    doc:line(x0, TOP + PH, x0 + PW, TOP + PH, { stroke = "#333333" })
  end
  doc:text(16, TOP + PH / 2, "ms/step", { transform = ("rotate(-90 16 %d)"):format(TOP + PH / 2) })
  local items = {}
  for si, s in ipairs(strategies) do items[si] = { label = s, color = svg.PALETTE[(si - 1) % #svg.PALETTE + 1], kind = "line" } end
  svg.legend(doc, L, TOP + PH + 40, items, W - L - 20)
  return doc:finish()
end

-- measured_block(recs, res, why) -> the markdown between the measured markers
function M.measured_block(recs, res, why, dir)
  local base = res and res.base
  local c = recs[1] and recs[1].config or {}
  local out = {}
  local function say(s, ...) out[#out + 1] = select("#", ...) > 0 and s:format(...) or s end
  say("Generated by `make bench-scale` (tools/bench_scale.lua) from " .. (dir or "build/bench_scale") ..
      "/*.json: %s, vocabulary 50257, " ..
      "batch.micro=%s x data.seq_len=%s, %s micro-batches per rank per step (the pipeline: that x hosts through its " ..
      "stages: the same global batch), one rank per host (2x2: 2 hosts of 2 ranks), %s steps (medians of the " ..
      "steps after the first).",
      tostring(c.model), tostring(c.B), tostring(c.T), tostring(c.accumulate), tostring(c.steps))
  say("")
  say(M.table_md(recs, res))
  say("")
  say("sent / step / rank: the busiest rank's bytes (summary.json `comm_per_step.max.sent`, loss exchanges " ..
      "included); model's bytes: lua/ztrain/plan/steptime.lua's for the same run; hidden: the share of " ..
      "communication time behind compute (`comm_per_step.hidden_share`); n/a where the run did not report them. " ..
      "Latency columns: not measured (this kernel has no netem; tools/netcluster.sh says so).")
  say("")
  say("### When to use what, measured")
  say("")
  say(M.conclusions(recs))
  say("")
  say("### The step-time model against the table")
  say("")
  if not res then
    say("Not calibrated: %s.", why or "no results")
  else
    local p = res.params
    say("`lua/ztrain/plan/steptime.lua` calibrated on these %d points (tools/scale_fit.lua). Measured, not fitted: the " ..
        "FLOP rate, %.2f GFLOP/s for one core (the one-rank, one-thread baseline, %.1f ms/step), a rank of H " ..
        "getting min(1, cores / H) of a core; the hidden share (where reported). Assumed: memory bandwidth %.2f GB/s for the " ..
        "optimizer's and offload's copies (bench_scale's mem_bw=). Fitted, three constants for the whole table: " ..
        "link efficiency eta = %.3f of tc's rate, latency %.0f us per message, contention %.2f (the compute of a " ..
        "multi-host rank takes that many times longer: MPI's progress and the kernel's TCP stack share the cores). " ..
        "**Error: mean %.1f%%, max %.1f%%** (|model - measured| / measured per point, column `error` above).",
        res.n, res.flops / 1e9, base.step_ms, p.mem_bw / 1e9, p.eta, p.latency * 1e6, p.contention,
        100 * res.mean, 100 * res.max)
  end
  return table.concat(out, "\n")
end

-- render(recs, opts) -> the text to print; writes opts.doc's measured
-- block, opts.svg and opts.fit_out (the calibration, for scale_predict).
function M.render(recs, opts)
  local res, why = fit.calibrate(recs, { mem_bw = opts.mem_bw })
  local block = M.measured_block(recs, res, why, opts.results)
  if opts.doc then
    local f = io.open(opts.doc)
    local text = f and f:read("*a") or "# Scaling\n"
    if f then f:close() end
    svg.write(opts.doc, M.replace_block(text, "measured", block))
  end
  if opts.svg then svg.write(opts.svg, M.chart(recs, res)) end
  if opts.fit_out and res then
    local pts = {}
    for _, p in ipairs(res.points) do pts[#pts + 1] = { id = p.rec.id, model_ms = p.model_ms, err = p.err } end
    svg.write(opts.fit_out, cjson.encode({ params = res.params, flops = res.flops, mean = res.mean, max = res.max,
                                          points = pts }) .. "\n")
  end
  return block .. "\n"
end

return M
