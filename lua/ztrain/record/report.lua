-- ztrain.record.report: what a run shows and leaves behind.
--
-- metrics.jsonl (one object per logged step), summary.json (the run's
-- contract, DESIGN.md "Run outputs"), a live progress line on a terminal
-- (plain lines otherwise), and the end-of-run table. With report.csv and
-- report.tensorboard, each logged step also goes to a CSV file and a
-- TensorBoard events file (record/tensorboard.lua), kept across resumes
-- as metrics.jsonl is.
local memory = require "ztrain.core.memory"
local fmt = require "ztrain.util.fmt"
local libc = require "ztrain.core.libc"
local durable = require "ztrain.util.durable"
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local json = require "ztrain.util.json"   -- its own settings: NaN as null, 14 digits
local comm = require "ztrain.core.comm"
local record_comm = require "ztrain.record.comm"
local tensorboard = require "ztrain.record.tensorboard"

local M = {}

-- mkdir -p; returns true or nil, "cannot create output directory PATH:
-- REASON" (util/fs.mkdirs; kept here for recipes and examples that call it)
function M.mkdirs(path) return fs.mkdirs(path, "output directory") end

-- Write a file atomically and durably (ztrain.util.durable): the old file or
-- the new one, never half of one; nil, "cannot write PATH: REASON" on failure.
M.write_atomic = durable.write_atomic

-- Is stdout a terminal? Under mpirun a rank's stdout is a pty whatever the
-- user's terminal is, so `ztrain --nproc` passes its own answer in ZTRAIN_TTY;
-- under another launcher, plain lines.
function M.is_tty()
  local env = os.getenv("ZTRAIN_TTY")
  if env then return env == "1" end
  if comm.launched() then return false end
  return libc.isatty(1) == 1
end

-- The process's resident memory from the OS (/proc/self/status): peak
-- (VmHWM) and current (VmRSS) bytes. It counts what the tier accounting
-- does not: the dataset, LuaJIT, OpenBLAS's and MPI's buffers, the code.
function M.rss()
  local f = io.open("/proc/self/status", "rb")
  if not f then return 0, 0 end
  local s = f:read("*a")
  f:close()
  local hwm, cur = s:match("VmHWM:%s*(%d+) kB"), s:match("VmRSS:%s*(%d+) kB")
  return (tonumber(hwm) or 0) * 1024, (tonumber(cur) or 0) * 1024
end

-- Memory snapshot for one rank, as summary.json carries it.
function M.memory_snapshot()
  local s = memory.stats()
  local by = {}
  for _, cat in ipairs(memory.categories) do
    by[cat] = { device = s.device.by_category[cat].peak, host = s.host.by_category[cat].peak,
                nvme = s.nvme.by_category[cat].peak }
  end
  return { rank = 0, device_peak = s.device.peak, host_peak = s.host.peak, nvme_peak = s.nvme.peak,
           rss_peak = (M.rss()), by_category = by }
end

-- Memory snapshots of every rank (a collective), indexed by rank + 1.
local FIELDS = { "device_peak", "host_peak", "nvme_peak", "rss_peak" }
function M.gather_memory(world)
  local mine = M.memory_snapshot()
  if world.size == 1 then return { mine } end
  local vals = {}
  for _, f in ipairs(FIELDS) do vals[#vals + 1] = mine[f] end
  for _, cat in ipairs(memory.categories) do
    vals[#vals + 1] = mine.by_category[cat].device
    vals[#vals + 1] = mine.by_category[cat].host
    vals[#vals + 1] = mine.by_category[cat].nvme
  end
  local all, out = world:gather_doubles(vals), {}
  for r, row in ipairs(all) do
    local m, i = { rank = r - 1, by_category = {} }, 1
    for _, f in ipairs(FIELDS) do m[f] = row[i]; i = i + 1 end
    for _, cat in ipairs(memory.categories) do
      m.by_category[cat] = { device = row[i], host = row[i + 1], nvme = row[i + 2] }
      i = i + 3
    end
    out[r] = m
  end
  return out
end

-- Add to each rank's entry: model_state (params + grads + optim peaks, every
-- tier) and working (comm: gradient buckets, gathered units, reduce scratch).
function M.with_totals(mem)
  for _, m in ipairs(mem) do
    local by = m.by_category
    local function both(c) return by[c].device + by[c].host + (by[c].nvme or 0) end
    m.model_state = both("params") + both("grads") + both("optim")
    m.working = both("comm")
  end
  return mem
end

local Log = {}
Log.__index = Log

-- What the tracking tools get of a logged step: TensorBoard's scalars (a
-- value that is absent, eval_loss between evaluations, is left out) and the
-- CSV's columns (an empty field).
local SCALARS = { "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "eval_loss" }
local CSV_COLUMNS = { "step", "time", "elapsed", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "eval_loss" }

-- csv_num(x) -> the shortest text that reads back as x ("" for none)
local function csv_num(x)
  if type(x) ~= "number" then return "" end
  if x ~= x or math.abs(x) == math.huge then return tostring(x) end
  return fmt.shortest(x)
end

-- where(v, outdir, default) -> the path a report.* key names: true = the
-- default inside out=, false or "" = none, else the path itself
local function where(v, outdir, default)
  if v == true then return outdir .. "/" .. default end
  if v == false or v == "" or v == nil then return nil end
  return v
end

-- open_csv(path, append) -> an appender with its header line written
local function open_csv(path, append)
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then
    local ok, err = fs.mkdirs(dir, "directory")
    if not ok then return nil, err end
  end
  local a, err = durable.appender(path, { append = append })
  if not a then return nil, err end
  if a.size == 0 then
    local ok, werr = a:append(table.concat(CSV_COLUMNS, ",") .. "\n")
    if not ok then a:close(); return nil, werr end
  end
  return a
end

-- open_tracking(log, outdir, opts): report.csv and report.tensorboard, if set
local function open_tracking(log, outdir, opts)
  local rep = opts.report or {}
  log.csv_path = where(rep.csv, outdir, "metrics.csv")
  if log.csv_path then
    log.csv_made = not fs.exists(log.csv_path)
    local a, err = open_csv(log.csv_path, opts.resume)
    if not a then return nil, "report.csv: " .. err end
    log.csv = a
  end
  local dir = where(rep.tensorboard, outdir, "tensorboard")
  if dir then
    local w, err = tensorboard.open(dir, { resume = opts.resume })
    if not w then return nil, "report.tensorboard: " .. err end
    log.tb = w
  end
  return true
end

-- open(outdir, {total_steps=, quiet=, resume=, report=}) -> logger.
-- metrics.jsonl starts empty, or with opts.resume keeps what it holds until
-- the resumed step is known (Log:resume_at): a resume that fails loses no
-- history. opts.report: the recipe's report.csv and report.tensorboard.
function M.open(outdir, opts)
  local path = outdir .. "/metrics.jsonl"
  local f, err = durable.appender(path, { append = opts.resume })
  if not f then return nil, err end
  local log = setmetatable({ f = f, path = path, outdir = outdir, tty = M.is_tty() and not opts.quiet,
                             quiet = opts.quiet, total = opts.total_steps, t0 = libc.now(), first_step = 0 }, Log)
  local ok, terr = open_tracking(log, outdir, opts)
  if not ok then
    log:close()
    -- what this call made goes (a resume's files stay as they were): an
    -- empty metrics.jsonl in out= would refuse the corrected retry as an
    -- earlier run
    if not opts.resume then
      os.remove(path)
      if log.csv_made then os.remove(log.csv_path) end
    end
    return nil, terr
  end
  return log
end

-- keep_csv(log, step): the CSV keeps its header and its rows up to `step`
local function keep_csv(log, step)
  local text = fs.read_file(log.csv_path) or ""
  local lines = {}
  for line in text:gmatch("([^\n]*)\n") do
    local s = tonumber(line:match("^([^,]*),"))
    if #lines == 0 and line:match("^step,") or s and s <= step then lines[#lines + 1] = line .. "\n" end
  end
  local okc, cerr = log.csv:close()
  if not okc then error(errors.io(cerr), 0) end
  local okw, werr = durable.write_atomic(log.csv_path, table.concat(lines))
  if not okw then error(errors.io(werr), 0) end
  local a, err = open_csv(log.csv_path, true)
  if not a then error(errors.io(err), 0) end
  log.csv = a
end

-- resume_at(step) -> the records kept (decoded, oldest first): the run
-- continues from a checkpoint at `step`, so metrics.jsonl keeps its lines
-- up to that step and drops the rest (steps trained after the checkpoint,
-- which the resumed run trains again) and any line cut short; rewritten
-- atomically, then appended to. A curve across the resume has no gap and
-- no step twice. The CSV and the TensorBoard file are cut back alike.
function Log:resume_at(step)
  self.first_step = step
  local text = fs.read_file(self.path) or ""
  local kept, lines = {}, {}
  for line in text:gmatch("[^\n]+") do
    local ok, rec = pcall(json.decode, line)
    if ok and type(rec) == "table" and type(rec.step) == "number" and rec.step <= step then
      kept[#kept + 1], lines[#lines + 1] = rec, line .. "\n"
    end
  end
  local okc, cerr = self.f:close()
  self.f = nil
  if not okc then error(errors.io(cerr), 0) end
  local okw, werr = durable.write_atomic(self.path, table.concat(lines))
  if not okw then error(errors.io(werr), 0) end
  local f, err = durable.appender(self.path, { append = true })
  if not f then error(errors.io(err), 0) end
  self.f = f
  if self.csv then keep_csv(self, step) end
  if self.tb then
    local okt, terr = self.tb:resume_at(step)
    if not okt then error(errors.io(terr), 0) end
  end
  return kept
end

local function fmt_eta(s)
  if s >= 3600 then return ("%dh%02dm"):format(math.floor(s / 3600), math.floor((s % 3600) / 60)) end
  return ("%dm%02ds"):format(math.floor(s / 60), math.floor(s % 60))
end

-- metrics(rec): rec has step, loss, lr, grad_norm, step_ms, tokens_per_s, ...
function Log:metrics(rec)
  -- when: the wall clock (seconds since the epoch) and this process's time
  -- since its run started
  rec.time = libc.now()
  rec.elapsed = rec.time - self.t0
  rec.memory = { device = memory.current("device"), host = memory.current("host"),
                 device_peak = memory.peak("device"), host_peak = memory.peak("host"),
                 rss = select(2, M.rss()) }
  local ok, err = self.f:append(json.encode(rec) .. "\n")
  -- a metrics file cut short is an I/O error of the run, not a silent gap
  if not ok then error(errors.io(err), 0) end
  self:track(rec)
end

-- track(rec): the step's CSV row and TensorBoard event (each one write)
function Log:track(rec)
  if self.csv then
    local row = {}
    for i, k in ipairs(CSV_COLUMNS) do row[i] = csv_num(rec[k]) end
    local ok, err = self.csv:append(table.concat(row, ",") .. "\n")
    if not ok then error(errors.io(err), 0) end
  end
  if self.tb then
    local list = {}
    for _, k in ipairs(SCALARS) do
      if type(rec[k]) == "number" then list[#list + 1] = { k, rec[k] } end
    end
    local ok, err = self.tb:scalars(rec.step, rec.time, list)
    if not ok then error(errors.io(err), 0) end
  end
end

-- progress(rec, plain): the live line on a TTY; a plain line otherwise
-- (only when asked: log steps). Its speed and ETA are the smoothed figure
-- (record/throughput.lua; rec.step_ms_smoothed, else the step's own).
function Log:progress(rec, plain)
  if self.quiet then return end
  local ms = rec.step_ms_smoothed or rec.step_ms
  local tps = rec.tokens_per_s_smoothed or rec.tokens_per_s
  local eta = ms / 1000 * (self.total - rec.step)
  local line = ("step %5d/%d  loss %.4f  lr %.2e  norm %.3f  %7.0f tok/s  %6.0f ms/step  eta %s")
      :format(rec.step, self.total, rec.loss, rec.lr, rec.grad_norm, tps, ms, fmt_eta(eta))
  if rec.eval_loss then line = line .. ("  eval %.4f"):format(rec.eval_loss) end
  if self.tty then
    io.stdout:write("\r\27[K", line)
    if plain then io.stdout:write("\n") end
    io.stdout:flush()
  elseif plain then
    io.stdout:write(line, "\n")
    io.stdout:flush()
  end
end

-- close() -> true | nil, err (the final fsync can fail too): every file
-- is closed; the first failure is the answer
function Log:close()
  local ok, err = true, nil
  for _, k in ipairs({ "f", "csv", "tb" }) do
    local h = self[k]
    self[k] = nil
    if h then
      local okc, cerr = h:close()
      if not okc and ok then ok, err = nil, cerr end
    end
  end
  return ok, err
end

-- print_banner(b[, w]): what a run is, before its first step (loop.lua
-- banner), to w (default io.stdout: anything with write and flush)
function M.print_banner(b, w)
  w = w or io.stdout
  local n = fmt.thousands
  w:write(("ztrain: %s (%s params) with %s on %d rank(s)%s, %s, %s\n")
          :format(b.model, n(b.params), b.strategy, b.world,
                  b.stages > 1 and (" (%d pipeline stages)"):format(b.stages) or "", b.device, b.precision))
  w:write(("  batch     %d sequences of %d tokens a step = micro %d x accumulate %d x %d data-parallel " ..
           "rank(s): %s tokens\n"):format(b.global, b.T, b.micro, b.accumulate, b.dp, n(b.step_tokens)))
  w:write(("  steps     %d%s, %s tokens to train\n")
          :format(b.steps, b.from_step > 0 and (" from step %d"):format(b.from_step) or "",
                  n((b.steps - b.from_step) * b.step_tokens)))
  if b.resumed then w:write(("  resumed   from %s\n"):format(b.resumed)) end
  -- a machine already busier than its cores: steps slow down and vary
  -- (other jobs, or more ranks x threads than cores)
  if b.load and b.cores and b.load > b.cores then
    w:write(("  machine   busy: load average %.1f over the last minute on %d core(s) (this rank: %d thread(s)" ..
             "%s); steps will be slower and vary\n"):format(b.load, b.cores, b.threads,
             b.omp_wait and (", OMP_WAIT_POLICY=" .. b.omp_wait .. (b.omp_wait_auto and " set by ztrain" or ""))
             or ""))
  end
  w:write(("  output    %s\n"):format(b.out))
  w:flush()
end

-- The end-of-run table, in the seeds' spirit.
function M.print_summary(s)
  local w = io.stdout
  w:write(("\n%s: %s on %d rank(s), %s (%d params), %d step(s), %d tokens\n")
          :format(s.recipe, s.strategy, s.world_size, s.model.name, s.model.params, s.steps, s.tokens))
  local function num(x) return type(x) == "number" and x or 0 / 0 end
  if type(s.first_loss) ~= "number" then
    w:write("  loss        (no step trained)")
  else
    w:write(("  loss        %.4f -> %.4f"):format(num(s.first_loss), num(s.final_loss)))
  end
  if type(s.test_loss) == "number" then w:write(("   test %.4f"):format(s.test_loss)) end
  if type(s.eval_loss) == "number" then w:write(("   eval %.4f (perplexity %.2f)"):format(s.eval_loss, s.perplexity)) end
  w:write(("\n  time        %.1f s; %.0f tokens/s at the median step (%.1f ms), %.0f tokens/s over the " ..
           "steps' wall clock\n"):format(s.seconds, s.tokens_per_s, s.step_ms_median,
                                         num(s.tokens_per_s_wall)))
  if type(s.model_tflops) == "number" then
    w:write(("  flops       %.3g TFLOP/s of model FLOPs at the median step%s\n"):format(s.model_tflops,
            type(s.mfu) == "number" and (", MFU %.1f%% of %d x %g TFLOP/s (%s)"):format(100 * s.mfu, s.world_size,
                                                                 s.peak_tflops, s.peak_from) or ""))
  end
  local pred = s.predicted
  local predicted = pred and (pred.params + pred.grads + pred.optim + (pred.accumulator or 0))
  for _, m in ipairs(s.memory) do
    local by = m.by_category
    local state = m.model_state
    w:write(("  memory%s device peak %s, host peak %s%s, process %s resident; model state %s%s\n")
            :format(#s.memory > 1 and (" r" .. m.rank) or "   ", memory.format(m.device_peak),
                    memory.format(m.host_peak),
                    (m.nvme_peak or 0) > 0 and (", nvme peak " .. memory.format(m.nvme_peak)) or "",
                    memory.format(m.rss_peak or 0),
                    memory.format(state),
                    predicted and (" (predicted " .. memory.format(predicted) .. ")") or ""))
    for _, tier in ipairs({ "device", "host", "nvme" }) do
      local parts = {}
      for _, cat in ipairs(memory.categories) do
        local v = by[cat][tier]
        if v and v > 0 then parts[#parts + 1] = cat .. " " .. memory.format(v) end
      end
      if #parts > 0 then w:write(("    %-6s by category %s\n"):format(tier, table.concat(parts, ", "))) end
    end
  end
  local hg = type(s.pipeline) == "table" and type(s.pipeline.held_gradients) == "table" and s.pipeline.held_gradients
  if hg then
    w:write(("  held grads  rank 0: %d buffer(s), %s, for gradients completed ahead of micro-batch order and " ..
             "tied head parts kept apart (in grads above)\n"):format(hg.buffers, memory.format(hg.bytes)))
  end
  local off = type(s.strategy_stats) == "table" and s.strategy_stats.offload
  if off then
    w:write(("  offload     per step: %.0f ms waiting for parameter fetches, %.0f ms waiting for the " ..
             "optimizer's transfers, %.0f ms updating on the host (%s%s)\n"):format(off.fetch_wait_ms,
             off.io_wait_ms, off.update_ms, off.tier, off.aio_engine and (", aio " .. off.aio_engine ..
             (off.aio_queue_depth and (" " .. off.aio_queue_depth .. " x " .. memory.format(off.aio_block_bytes))
              or "") .. ((off.aio_stripes or 1) > 1 and (", " .. off.aio_stripes .. " files a storage") or "")) or ""))
    local moved = (off.nvme_read_bytes or 0) + (off.nvme_written_bytes or 0)
    if moved > 0 and (off.optimizer_ms or 0) > 0 and (off.disk_busy_ms or 0) > 0 then
      w:write(("              the optimizer step %.0f ms, %.2f GB read and %.2f GB written on nvme: %.2f GB/s; " ..
               "blocks in flight %.0f%% of it, %.1f on average\n")
              :format(off.optimizer_ms, off.nvme_read_bytes / 1e9, off.nvme_written_bytes / 1e9,
                      moved / 1e6 / off.optimizer_ms, 100 * (off.disk_busy_ms or 0) / off.optimizer_ms,
                      off.disk_depth or 0))
    end
  end
  for _, l in ipairs(record_comm.lines(s.comm_per_step) or {}) do w:write(l, "\n") end
  if s.exit and s.exit ~= "ok" then w:write(("  exit        %s\n"):format(s.exit)) end
  w:write(("  digest      %s\n  output      %s\n"):format(s.param_digest, s.out))
end

function M.encode(t) return json.encode(t) end

return M
