-- ztrain.insight.compare: what `ztrain compare` does (cli/compare.lua reads its
-- command line): train a list of strategies on the same
-- settings, one after another, and tabulate and chart what each cost.
--
--   ztrain compare [--nproc N] [ITEM ...] [key=value ...] [out=DIR]
--   ITEM = NAME[@RANKS][,key=value...]   NAME: a recipe in recipes/ or a .lua path
--
-- Each item runs as its own `ztrain` process (its own ranks, its own peak
-- memory) into DIR/<item>/; then DIR gets results.md, results.csv,
-- memory.svg, throughput.svg and loss.svg. Everything read comes from the
-- runs' contract files (summary.json, metrics.jsonl), never from this
-- process's memory: the table is what the runs left behind.
--
-- Same settings: every item gets the same pinned keys (DEFAULTS, then the
-- command line's key=value), and the same global batch: an item on fewer
-- ranks accumulates more micro-batches (single on 1 rank accumulates N),
-- so with DESIGN.md's "same math" every synchronous strategy ends with the
-- same param_digest, and the "same bits" column says so.
local json = require "ztrain.util.json"
local svg = require "ztrain.util.svg"
local charts = require "ztrain.insight.charts"
local tables = require "ztrain.insight.compare_tables"
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local recipe = require "ztrain.train.recipe"
local host = require "ztrain.util.host"

local M = {}

M.DEFAULT_ITEMS = { "single", "dp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "infinity" }
M.DEFAULT_NPROC = 2
-- pinned so recipes written for different jobs (zero3_offload trains
-- gpt2-mini on BPE tokens) run the same model, data and batch here
-- (kept beside the tables that print them: compare_tables.lua)
M.DEFAULTS = tables.DEFAULTS

local function user(fmt, ...) return errors.user(("compare: " .. fmt):format(...)) end

local function home() return rawget(_G, "ZTRAIN_HOME") or os.getenv("ZTRAIN_HOME") or "." end

-- the recipes/ names, for messages
local function known_recipes()
  local names = {}
  local p = io.popen(("ls %s/recipes 2>/dev/null"):format(M.shell_quote(home())))
  for line in p:lines() do
    local n = line:match("^(.-)%.lua$")
    if n then names[#names + 1] = n end
  end
  p:close()
  return table.concat(names, ", ")
end

function M.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The most ranks a compare run starts: this machine's usable cores x 8,
-- the launcher's bound without --oversubscribe (job/launch.lua), which
-- compare's runs do not pass.
local MOST_WHY = "this machine's usable cores x 8"
local function most_ranks() return host.cores() * 8 end

-- rank_count(s) -> s as a whole number from 1 to most_ranks(), or nil
-- (inf and nan are not whole: n == math.floor(n) holds for inf)
local function rank_count(s)
  local n = tonumber(s or "")
  if not n or n ~= n or n < 1 or n > most_ranks() or n ~= math.floor(n) then return nil end
  return n
end

-- is_override(a): "key=value" where key is a dotted name (an ITEM's name
-- has no "=" before a comma or "@")
local function is_override(a) return a:match("^[%a_][%w_.]*=") ~= nil end

-- split_item("zero3@2,model.seed=7") -> "zero3", "2", { "model.seed=7" }.
-- Commas start a new key=value only where one follows, so a value may hold
-- commas (data.text=bin:A,B,C).
local function split_item(s)
  local parts, rest = {}, s
  local head = rest:match("^([^,]*)")
  rest = rest:sub(#head + 1)
  while #rest > 0 do
    -- rest starts with ","; the next part runs to a comma followed by key=
    local j = 2
    local nextc = rest:find(",[%a_][%w_.]*=", j)
    parts[#parts + 1] = rest:sub(2, (nextc or #rest + 1) - 1)
    rest = nextc and rest:sub(nextc) or ""
  end
  local name, ranks = head:match("^(.-)@(.*)$")
  return name or head, ranks, parts
end

-- resolve(name) -> recipe path: a .lua file as given, else recipes/NAME.lua
local function resolve(name, item)
  if name == "" then error(user("%q: no recipe name before '@' or ','", item), 0) end
  if name:match("%.lua$") then
    if not fs.exists(name) then error(user("%s: no such recipe file", name), 0) end
    return name
  end
  local path = home() .. "/recipes/" .. name .. ".lua"
  if not fs.exists(path) then
    error(user("unknown recipe %q (recipes: %s; or give a RECIPE.lua path)", name, known_recipes()), 0)
  end
  return path
end

-- dir_name(label) -> a directory name: the label with odd characters as _
local function dir_name(label) return (label:gsub("%.lua$", ""):gsub("[^%w_.@=-]", "_")) end

-- parse(args) -> { items, overrides, out, nproc }. Raises user errors.
function M.parse(args)
  local o = { items = {}, overrides = {}, nproc = M.DEFAULT_NPROC }
  local i = 1
  while args[i] do
    local a = args[i]
    if a == "--nproc" then
      local n = rank_count(args[i + 1])
      if not n then
        error(user("--nproc needs a rank count >= 1 (e.g. --nproc 2), at most %d (%s)", most_ranks(),
                   MOST_WHY), 0)
      end
      o.nproc, i = n, i + 1
    elseif a:match("^%-") then
      error(user("unknown option %s (ztrain compare [--nproc N] [NAME[@RANKS][,key=value]...] " ..
                 "[key=value...] [out=DIR]; see ztrain --help)", a), 0)
    elseif a:match("^out=") then
      o.out = a:sub(5)
      if o.out == "" then error(user("out= needs a directory"), 0) end
    elseif is_override(a) then
      o.overrides[#o.overrides + 1] = a
    else
      o.items[#o.items + 1] = a
    end
    i = i + 1
  end
  if #o.items == 0 then
    for k, v in ipairs(M.DEFAULT_ITEMS) do o.items[k] = v end
  end
  o.accumulate = 1
  for _, kv in ipairs(o.overrides) do
    local v = kv:match("^batch%.accumulate=(.*)$")
    if v then
      o.accumulate = tonumber(v)
      if not o.accumulate or o.accumulate < 1 or o.accumulate ~= math.floor(o.accumulate) then
        error(user("%s: batch.accumulate must be a whole number >= 1", kv), 0)
      end
    end
  end
  o.runs = M.plan(o)
  return o
end

-- plan(o) -> runs: { label, dir, recipe, ranks, accumulate, overrides }
function M.plan(o)
  local runs, seen = {}, {}
  local global = o.nproc * o.accumulate         -- micro-batches per step, every run
  for _, item in ipairs(o.items) do
    local name, ranks, own = split_item(item)
    local path = resolve(name, item)
    local n = o.nproc
    if ranks then
      n = rank_count(ranks)
      if not n then
        error(user("%q: the rank count after '@' must be a whole number >= 1 (e.g. dp@2), at most %d (%s)", item,
                   most_ranks(), MOST_WHY), 0)
      end
    elseif name == "single" or name:match("([^/]+)$") == "single.lua" then
      n = 1
    end
    if global % n ~= 0 then
      error(user("%q: %d rank(s) cannot share the global batch of %d micro-batches (--nproc %d x " ..
                 "batch.accumulate %d); use a rank count that divides it, or raise --nproc",
                 item, n, global, o.nproc, o.accumulate), 0)
    end
    for _, kv in ipairs(own) do
      if not is_override(kv) then
        error(user("%q: cannot read %q: expected key=value after the comma", item, kv), 0)
      end
    end
    local dir = dir_name(item)
    if seen[dir] then
      local k = 2
      while seen[dir .. "-" .. k] do k = k + 1 end
      dir = dir .. "-" .. k
    end
    seen[dir] = true
    runs[#runs + 1] = { label = item, dir = dir, recipe = path, ranks = n, accumulate = global / n,
                        overrides = own }
  end
  return runs
end

-- check_shared(o): the shared settings (DEFAULTS and the command line's
-- key=value) read with each item's recipe, before anything runs. When no
-- recipe takes them (a misspelt key, a value out of range), that is said
-- once, instead of once per run; an item whose own recipe or overrides
-- fail still becomes a row of the table.
function M.check_shared(o)
  local first
  for _, run in ipairs(o.runs) do
    local kv = {}
    for _, x in ipairs(M.DEFAULTS) do kv[#kv + 1] = x end
    for _, x in ipairs(o.overrides) do kv[#kv + 1] = x end
    local ok, r, err = pcall(recipe.load, run.recipe, kv)
    if ok and r then return true end
    first = first or errors.message(ok and err or r)
  end
  error(user("no recipe takes the shared settings: %s", first), 0)
end

-- program(): the ztrain executable that runs each item
local function program()
  local a0 = rawget(_G, "arg") and _G.arg[0]
  if a0 and a0:find("ztrain$") and fs.exists(a0) then return a0 end
  return home() .. "/build/ztrain"
end

-- command(o, run, dir) -> shell command line (output to dir/log.txt)
function M.command(o, run, dir, again)
  local argv = { program() }
  -- this compare's own item from an earlier compare (its log.txt): replaced
  -- only when the new run ends, put back when it fails (rundir.lua)
  if again then argv[#argv + 1] = "--overwrite" end
  if run.ranks > 1 then argv[#argv + 1] = "--nproc"; argv[#argv + 1] = tostring(run.ranks) end
  argv[#argv + 1] = run.recipe
  for _, kv in ipairs(M.DEFAULTS) do argv[#argv + 1] = kv end
  for _, kv in ipairs(o.overrides) do argv[#argv + 1] = kv end
  argv[#argv + 1] = "batch.accumulate=" .. run.accumulate
  for _, kv in ipairs(run.overrides) do argv[#argv + 1] = kv end
  if run.ranks == 1 then argv[#argv + 1] = "launch.nproc=1" end  -- a recipe's launch.nproc = 2 stays 1 here
  argv[#argv + 1] = "out=" .. dir
  local q = {}
  for k, a in ipairs(argv) do q[k] = M.shell_quote(a) end
  return table.concat(q, " ") .. " > " .. M.shell_quote(dir .. "/log.txt") .. " 2>&1", argv
end

-- exit_code(status) -> the process's exit code (128 + signal when killed),
-- from os.execute's wait status (LuaJIT returns system()'s)
local function exit_code(st)
  if type(st) ~= "number" then return st and 0 or 1 end
  if st < 256 and st ~= 0 then return st % 128 + 128 end
  return math.floor(st / 256)
end

-- last_error(log) -> the last "ztrain: ..." line of a run's output
local function last_error(text)
  local found
  for line in (text or ""):gmatch("[^\n]+") do
    if line:find("^ztrain: ") or line:find("^ztrain: rank") then found = line:gsub("^ztrain: ", "") end
  end
  return found
end

-- read_curve(path) -> { { step, loss }, ... } from metrics.jsonl
function M.read_curve(path)
  local curve, text = {}, fs.read_file(path)
  for line in (text or ""):gmatch("[^\n]+") do
    local ok, rec = pcall(json.decode, line)
    if ok and type(rec) == "table" and type(rec.step) == "number" then
      curve[#curve + 1] = { rec.step, type(rec.loss) == "number" and rec.loss or 0 / 0 }
    end
  end
  return curve
end

-- measure(summary) -> mem { tier = { cat = bytes } }, peak { tier = bytes },
-- model state measured: the largest value over ranks of each (ranks differ
-- by a padded shard at most; the table is per rank)
function M.measure(s)
  local mem, peak, state = {}, {}, 0
  for _, tier in ipairs(charts.TIERS) do mem[tier], peak[tier] = {}, 0 end
  for _, m in ipairs(type(s.memory) == "table" and s.memory or {}) do
    for _, tier in ipairs(charts.TIERS) do
      peak[tier] = math.max(peak[tier], tonumber(m[tier .. "_peak"]) or 0)
      for _, cat in ipairs(charts.CATEGORIES) do
        local v = m.by_category and m.by_category[cat] and tonumber(m.by_category[cat][tier]) or 0
        mem[tier][cat] = math.max(mem[tier][cat] or 0, v)
      end
    end
    state = math.max(state, tonumber(m.model_state) or 0)
  end
  return mem, peak, state
end

-- predicted(summary) -> model-state bytes per rank the ZeRO formulas give
-- (strategy.predicted: params + grads + optim + accumulator), or nil
function M.predicted(s)
  local p = s.predicted
  if type(p) ~= "table" then return nil end
  return (p.params or 0) + (p.grads or 0) + (p.optim or 0) + (p.accumulator or 0)
end

-- collect(run, dir, code, log) -> a row of the table
function M.collect(run, dir, code, log)
  local row = { label = run.label, dir = dir, ranks = run.ranks, accumulate = run.accumulate, code = code,
                recipe = run.recipe }
  local text = fs.read_file(dir .. "/summary.json")
  local ok, s = pcall(json.decode, text or "")
  if text and ok and type(s) == "table" then row.summary = s end
  local exit = row.summary and row.summary.exit
  if code ~= 0 or not row.summary or exit ~= "ok" then
    local why = type(exit) == "string" and exit ~= "ok" and exit:gsub("^error: ", "") or last_error(log)
    if code == 130 then why = "interrupted (Ctrl-C)" end
    row.failed = why or ("exit status %d, no summary.json (see %s/log.txt)"):format(code, dir)
    if code == 0 then code = 1; row.code = code end
  end
  row.curve = M.read_curve(dir .. "/metrics.jsonl")
  if row.summary then
    s = row.summary
    row.mem, row.peak, row.state = M.measure(s)
    row.predicted = M.predicted(s)
    row.step_ms, row.tokens_per_s = s.step_ms_median, s.tokens_per_s
    row.final_loss, row.digest = s.final_loss, s.param_digest
    if type(row.digest) ~= "string" then row.digest = nil end
  end
  if row.failed then row.mem, row.peak = nil, nil end
  return row
end

-- mark_same_bits(rows): row.same = "reference" (the first digest), "same"
-- or "differs"; nil without a digest
function M.mark_same_bits(rows)
  local ref
  for _, r in ipairs(rows) do
    if r.digest and not r.failed then
      if not ref then ref = r.digest; r.same = "reference"
      else r.same = r.digest == ref and "same" or "differs" end
    end
  end
end

M.markdown, M.csv = tables.markdown, tables.csv

-- write_outputs(dir, rows, o) -> the paths written (each atomically)
function M.write_outputs(dir, rows, o)
  local paths = {}
  local function put(name, text) paths[#paths + 1] = svg.write(dir .. "/" .. name, text) end
  put("results.md", M.markdown(rows, o))
  put("results.csv", M.csv(rows))
  put("memory.svg", charts.memory(rows))
  put("throughput.svg", charts.throughput(rows))
  put("loss.svg", charts.loss(rows))
  return paths
end

-- run_all(o) -> rows; prints a line per run
function M.run_all(o, say)
  local rows = {}
  -- an item's directory holding a run compare did not make (no log.txt of
  -- an earlier compare): refused before anything runs, never replaced
  for _, run in ipairs(o.runs) do
    local dir = o.out .. "/" .. run.dir
    if not fs.exists(dir .. "/log.txt") then
      for _, f in ipairs({ "summary.json", "metrics.jsonl", "checkpoints" }) do
        if fs.exists(dir .. "/" .. f) then
          error(errors.user(("compare: %s holds a run compare did not make (%s); choose another out=, or move " ..
                             "that run away"):format(dir, f)), 0)
        end
      end
    end
  end
  for k, run in ipairs(o.runs) do
    local dir = o.out .. "/" .. run.dir
    local ok, err = fs.mkdirs(dir, "output directory")
    if not ok then error(errors.user(err), 0) end
    local cmd = M.command(o, run, dir, fs.exists(dir .. "/log.txt"))
    say(("[%d/%d] %s: %d rank(s) x %d micro-batch(es) ... "):format(k, #o.runs, run.label, run.ranks,
                                                                   run.accumulate), false)
    local t0 = os.time()
    local code = exit_code(os.execute(cmd))
    local row = M.collect(run, dir, code, fs.read_file(dir .. "/log.txt"))
    row.seconds = os.time() - t0
    if row.failed then
      say(("failed (exit %d): %s"):format(row.code, row.failed))
    else
      say(("%.1f ms/step, %s tok/s, loss %.4f"):format(row.step_ms, charts.thousands(row.tokens_per_s),
                                                      row.final_loss))
    end
    rows[#rows + 1] = row
    if code == 130 then
      -- Ctrl-C reached the run (system() shields this process): stop here,
      -- keeping the table of what ran, rather than start the next one
      say(("interrupted: stopping after %d of %d run(s)"):format(k, #o.runs))
      o.interrupted = true
      break
    end
  end
  M.mark_same_bits(rows)
  return rows
end

return M
