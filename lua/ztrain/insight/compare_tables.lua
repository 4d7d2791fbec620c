-- ztrain.insight.compare_tables: `ztrain compare`'s results as Markdown (for
-- people: the seeds' TRAINING_RESULTS table) and CSV (for tools: exact
-- numbers, bytes as integers, one column per tier and category).
--
-- rows as ztrain.insight.compare.collect makes them: label, ranks, accumulate,
-- code, failed, step_ms, tokens_per_s, final_loss, mem, peak, state,
-- predicted, digest, same, summary.
local svg = require "ztrain.util.svg"
local charts = require "ztrain.insight.charts"

local M = {}

-- the settings every compared run gets first (compare.lua pins them;
-- results.md names them)
M.DEFAULTS = { "model.size=gpt2-tiny", "data.tokenizer=bytes", "batch.micro=8", "train.steps=20",
               "train.log_every=1", "train.eval_every=0", "train.eval_batches=4", "sample.tokens=0" }

-- CSV columns in order; a column's value comes from get(row) (nil: empty)
local function col(name, get) return { name = name, get = get } end
M.COLUMNS = {
  col("strategy", function(r) return r.label end),
  col("recipe", function(r) return r.recipe end),
  col("ranks", function(r) return r.ranks end),
  col("accumulate", function(r) return r.accumulate end),
  col("threads", function(r) return r.summary and r.summary.threads end),
  col("status", function(r) return r.failed and "failed" or "ok" end),
  col("exit_code", function(r) return r.code end),
  col("error", function(r) return r.failed end),
  col("step_ms_median", function(r) return r.step_ms end),
  col("tokens_per_s", function(r) return r.tokens_per_s end),
  col("final_loss", function(r) return r.final_loss end),
}
for _, tier in ipairs(charts.TIERS) do
  M.COLUMNS[#M.COLUMNS + 1] = col(tier .. "_peak", function(r) return r.peak and r.peak[tier] end)
end
for _, tier in ipairs(charts.TIERS) do
  for _, cat in ipairs(charts.CATEGORIES) do
    M.COLUMNS[#M.COLUMNS + 1] = col(tier .. "_" .. cat, function(r) return r.mem and r.mem[tier][cat] end)
  end
end
for _, c in ipairs({
  col("model_state_predicted", function(r) return r.predicted end),
  col("model_state_measured", function(r) return r.state end),
  col("param_digest", function(r) return r.digest end),
  col("same_bits", function(r) return r.same end),
}) do M.COLUMNS[#M.COLUMNS + 1] = c end

-- a CSV field: numbers as %.14g (summary.json's own precision, so a value
-- read back equals the JSON's), text quoted when it must be (RFC 4180)
local function field(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v ~= v then return "nan" end
    return ("%.14g"):format(v)
  end
  v = tostring(v)
  if v:find('[,"\n\r]') then return '"' .. v:gsub('"', '""') .. '"' end
  return v
end

function M.csv(rows)
  local out, names = {}, {}
  for i, c in ipairs(M.COLUMNS) do names[i] = c.name end
  out[1] = table.concat(names, ",")
  for _, r in ipairs(rows) do
    local f = {}
    for i, c in ipairs(M.COLUMNS) do f[i] = field(c.get(r)) end
    out[#out + 1] = table.concat(f, ",")
  end
  return table.concat(out, "\n") .. "\n"
end

local function cell(s) return (tostring(s):gsub("|", "\\|"):gsub("\n", " ")) end
local function bytes(n) return n and n > 0 and svg.format_bytes(n) or (n and "0" or "—") end

-- settings(rows, o) -> a sentence: what every run trained
local function settings(rows, o)
  for _, r in ipairs(rows) do
    local s = r.summary
    if s and type(s.model) == "table" and type(s.batch) == "table" then
      return ("%s (%s parameters), %s step(s) of %d sequences x %d tokens (global batch), %s, %s"):format(s.model.name, charts.thousands(s.model.params), tostring(s.steps),
              s.batch.global, s.batch.seq_len, s.backend or "?",
              type(s.recipe_resolved) == "string" and s.recipe_resolved:match('precision="(%w+)"') or "fp32")
    end
  end
  return "no run produced a summary"
end

local function main_table(rows)
  local t = {
    "| strategy | ranks x micro-batches | time/step (median) | tokens/s | device peak | host peak | nvme peak " ..
    "| model state predicted | model state measured | final loss | param digest | same bits | status |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
  }
  for _, r in ipairs(rows) do
    local status = r.failed and ("failed (exit %d): %s"):format(r.code, r.failed) or "ok"
    local num = function(fmt, v) return type(v) == "number" and fmt:format(v) or "—" end
    local threads = r.summary and tonumber(r.summary.threads)
    t[#t + 1] = ("| %s | %d x %d%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"):format(
      cell(r.label), r.ranks, r.accumulate,
      threads and (" (%d thread%s)"):format(threads, threads == 1 and "" or "s") or "", num("%.1f ms", r.step_ms),
      type(r.tokens_per_s) == "number" and charts.thousands(r.tokens_per_s) or "—",
      bytes(r.peak and r.peak.device), bytes(r.peak and r.peak.host), bytes(r.peak and r.peak.nvme),
      bytes(r.predicted), bytes(r.state), num("%.4f", r.final_loss),
      r.digest and ("`%s`"):format(r.digest:sub(1, 12)) or "—", r.same or "—", cell(status))
  end
  return table.concat(t, "\n")
end

local function category_table(rows)
  local head = { "| strategy | tier |" }
  local rule = { "|---|---|" }
  for _, cat in ipairs(charts.CATEGORIES) do head[#head + 1] = " " .. cat .. " |"; rule[#rule + 1] = "---:|" end
  head[#head + 1] = " tier peak |"; rule[#rule + 1] = "---:|"
  local t = { table.concat(head), table.concat(rule) }
  for _, r in ipairs(rows) do
    if r.mem then
      for _, tier in ipairs(charts.TIERS) do
        if tier == "device" or (r.peak[tier] or 0) > 0 then
          local line = { ("| %s | %s |"):format(cell(r.label), tier) }
          for _, cat in ipairs(charts.CATEGORIES) do line[#line + 1] = " " .. bytes(r.mem[tier][cat]) .. " |" end
          line[#line + 1] = " " .. bytes(r.peak[tier]) .. " |"
          t[#t + 1] = table.concat(line)
        end
      end
    end
  end
  return table.concat(t, "\n")
end

-- markdown(rows, o) -> results.md text
function M.markdown(rows, o)
  return table.concat({
    "# ztrain compare", "",
    settings(rows, o) .. ".", "",
    ("Every run got `%s`%s, and its own item's key=value."):format(
      table.concat(M.DEFAULTS, " "),
      #o.overrides > 0 and (", then `" .. table.concat(o.overrides, " ") .. "`") or ""), "",
    main_table(rows), "",
    "Time and tokens/s: medians over the steps after the first. Memory: per rank (the largest " ..
    "rank's), peaks. Model state: parameters + gradients + optimizer state on every tier; " ..
    "predicted by the strategy's ZeRO formula (docs/strategies.md, `strategy.predicted`), measured by the " ..
    "allocator's peaks per category. Same bits: the param_digest (SHA-256 of every parameter) " ..
    "equals the first run's.", "",
    "## Peak memory per rank by tier and category", "",
    category_table(rows), "",
    "Each category's own peak; they need not coincide, so the tier peak can be less than their sum.",
    "", "Charts: memory.svg, throughput.svg, loss.svg. Each run's outputs: its own directory.", "",
  }, "\n")
end

return M
