-- ztrain.train.run: run a resolved recipe end to end and write its outputs:
-- claim the output directory, run the loop (loop.lua), write summary.json
-- and the timeline.
--
-- run(recipe, {quiet=}) -> summary table. Errors before training (bad data,
-- over-limit memory, ...) raise with a clear message; a failure during
-- training still writes summary.json with exit = "error: ...".
local zffi = require "ztrain.core.ffi"
local C = zffi.C
local loop = require "ztrain.train.loop"
local comm_report = require "ztrain.record.comm"
local report = require "ztrain.record.report"
local recipe_mod = require "ztrain.train.recipe"
local cjson_null = require("ztrain.util.json").null
local memory = require "ztrain.core.memory"
local errors = require "ztrain.core.errors"
local interrupt = require "ztrain.core.interrupt"
local tl = require "ztrain.record.timeline"
local simulate = require "ztrain.parallel.schedule.simulate"
local comm = require "ztrain.core.comm"
local rundir = require "ztrain.job.rundir"
local ffi = require "ffi"
local state = require "ztrain.parallel.strategy.state"
local host = require "ztrain.util.host"
local libc = require "ztrain.core.libc"
local throughput = require "ztrain.record.throughput"
local grad_order = require "ztrain.parallel.driver.grad_order"

-- summary.json's layout version: 2 adds schema, version, commit, command,
-- host, started, ended, recipe_json and history (docs/cli.md "Run outputs")
local SCHEMA = 2

local M = {}

-- median(xs, low) -> the median of xs (0 when empty; xs is not reordered):
-- for an even count the mean of the middle two, or with `low` the lower of
-- them (tools/bench_common.lua's and tools/scale_predict.lua's medians).
function M.median(xs, low)
  if #xs == 0 then return 0 end
  local c = {}
  for i, v in ipairs(xs) do c[i] = v end
  table.sort(c)
  local n = #c
  if n % 2 == 1 or low then return c[math.floor((n + 1) / 2)] end
  return 0.5 * (c[n / 2] + c[n / 2 + 1])
end
local median = M.median

local run, write_timeline

-- wall_rate(R) -> tokens this process trained over the wall clock from its
-- first step's start to its last step's end (evaluations and checkpoints
-- between steps included), 0 before a step
local function wall_rate(R)
  local steps = R.tr.step - R.start_step
  if not (R.t_last and R.t_steps) or steps <= 0 or R.t_last <= R.t_steps then return 0 end
  return steps * loop.step_tokens(R) / (R.t_last - R.t_steps)
end

-- timeline.svg and timeline.json of the recorded step (every pipeline
-- rank's row), with the simulator's predicted bubble beside the measured
-- one. A failed write is reported in the summary, not fatal to a finished run.
write_timeline = function(tr, out, events)
  local ok, res = pcall(function()
    local sim = simulate.run(tr.env.lists, {})
    local name = tr.recipe.schedule ~= "" and tostring(tr.recipe.schedule) or "1f1b"
    if tr.pp then name = ("%s p=%d m=%d"):format(name, tr.pp.size, tr.accumulate) end
    local w = tl.write(out, events, { name = name, unit = "s", predicted_bubble = sim.bubble })
    return { svg = w.svg, json = w.json, bubble = w.bubble, predicted_bubble = sim.bubble }
  end)
  if ok then return res end
  return { error = errors.message(res) }
end

-- The digest, or null when computing it fails (after a failed step the
-- parameters may be incomplete; the step's own error is the one to report).
local function digest_or_null(tr)
  local ok, d = pcall(tr.param_digest, tr)
  return ok and d or cjson_null
end

-- run(recipe, opts) -> summary[, trainer]. The device memory limit and thread
-- count the recipe sets last only for the run (a REPL session keeps its own).
-- opts.keep: return the live trainer too (the caller frees it: tr:free());
-- an interrupt (ztrain.interrupt) then returns what was trained so far,
-- summary.exit = "interrupted", instead of raising.
function M.run(r, opts)
  local limit, threads = memory.limit("device"), C.zt_get_threads()
  -- the output directory: unique, not an earlier run's, locked (rundir.lua)
  local out, lock = rundir.claim(r, comm.world())
  -- the multi-rank REPL holds checking on (comm.hold_check): a rank whose
  -- run failed alone then meets the others' next collective with the REPL's
  -- fence, which both fail, instead of their data (repl/ranks.lua)
  local watch = comm.watch({ timeout = r.comm.timeout, check = r.comm.check or comm.check_held(),
                             names = { timeout = "comm.timeout", check = "comm.check" } })
  local state = {}
  local ok, res, tr = pcall(run, r, opts or {}, out, state)
  comm.watch(watch)
  -- --overwrite: the earlier run's files go once this run ends, or stops
  -- with its checkpoint written (a resume can go on from it), and come back
  -- otherwise (rundir.lua)
  if ok or (interrupt.is_interrupt(res) and state.saved) then lock:commit() else lock:rollback() end
  lock:release()
  memory.set_limit("device", 0)
  pcall(memory.set_limit, "device", limit)
  C.zt_set_threads(threads)
  if not ok then
    -- stopped while the trainer was built: the stop request promised a
    -- checkpoint and summary.json, and there is nothing to save yet
    if interrupt.is_interrupt(res) and not state.opened and type(res) == "table" then
      res.msg = loop.NOT_STARTED
    end
    -- (errors.keeps_kind: every rank's, or with an exit status of its own)
    if errors.keeps_kind(res) then error(res, 0) end
    -- a user needs the message, not the Lua file and line it came from
    error(errors.message(res), 0)
  end
  return res, tr
end

-- summary_of(R) -> summary.json's table for a run (R: loop.lua's record);
-- collectives in it (communication per step first, then memory and the
-- digest) run on every rank in this order.
local function summary_of(R)
  local r, tr = R.r, R.tr
  local model = tr.model
  -- a collective, before the summary's other gathers (counted out: see comm_report)
  local comm_per_step = comm_report.per_step(tr.world, R.comm_acc)
  local function iso(t) return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t)) end
  -- speed, one way everywhere (record/throughput.lua): model FLOPs at the
  -- median step (every rank's tokens), and MFU where a peak is known: over
  -- the job's devices, one a rank
  local fpt = throughput.flops_per_token(model.nparams, tr.cfg, r.data.seq_len)
  local tflops = median(R.tps) * fpt / 1e12
  local peak, peak_from = throughput.peak_tflops(r.report.peak_tflops, ffi.string(C.zt_device_name()),
                                                 ffi.string(C.zt_device_model()), r.precision ~= "fp32")
  return {
    schema = SCHEMA, version = ffi.string(C.zt_version()), commit = host.git_commit(zffi.home) or cjson_null,
    command = R.opts.command or cjson_null,
    host = { name = host.hostname(), cpu = host.cpu_name() or cjson_null, device = ffi.string(C.zt_device_name()) },
    started = iso(R.started), ended = iso(libc.now()),
    history = R.history,
    recipe = r.name, recipe_path = r.path, strategy = tr.strategy.name,
    world_size = tr.world_size, backend = ffi.string(C.zt_device_name()),
    threads = C.zt_get_threads(),
    model = { name = tr.cfg.name, params = model.nparams, layers = tr.cfg.L, channels = tr.cfg.C,
              heads = tr.cfg.NH, vocab = tr.cfg.V, context = tr.cfg.maxT },
    data = { files = #tr.dataset.files, kind = tr.dataset.kind, train_tokens = tr.dataset.train.n,
             valid_tokens = tr.dataset.valid and tr.dataset.valid.n or 0,
             test_tokens = tr.dataset.test and tr.dataset.test.n or cjson_null, tokenizer = tr.tokenizer.name },
    batch = { micro = r.batch.micro, accumulate = tr.accumulate, seq_len = r.data.seq_len,
              global = r.batch.micro * tr.accumulate * tr.dp.size },
    steps = R.last and R.last.step or 0,
    -- the whole run's, resumes included (loop.lua keeps them across)
    tokens = loop.tokens(R),
    pipeline = tr.pp and { stages = tr.pp.size, split = type(r.pipeline.split) == "string" and r.pipeline.split
                           or "given", unit_seconds = tr.unit_times or cjson_null, units = (function()
      local c = {}
      for i, st in ipairs(tr.stages) do c[i] = #st.units end
      return c end)(),
      -- rank 0's buffers for gradients completed ahead of their turn (driver/grad_order.lua)
      held_gradients = grad_order.stats(tr.env) or cjson_null } or cjson_null,
    first_loss = R.first_loss or cjson_null, final_loss = R.last and R.last.loss or cjson_null,
    eval_loss = R.eval_loss or cjson_null, perplexity = R.eval_loss and math.exp(R.eval_loss) or cjson_null,
    test_loss = R.test_loss or cjson_null, test_perplexity = R.test_loss and math.exp(R.test_loss) or cjson_null,
    sample = R.sample_text or cjson_null,
    checkpoint = R.saved or cjson_null, resumed = R.resumed or cjson_null,
    activations = tr:activation_report(),
    warnings = tr.warnings,
    blas = ffi.string(C.zt_blas_info()),
    gemm = tr.gemm or "fp32",
    attention = tr.attention,
    tokens_per_s = median(R.tps), step_ms_median = median(R.steps_ms),
    tokens_per_s_wall = wall_rate(R), flops_per_token = fpt, model_tflops = tflops,
    mfu = peak and tflops / (peak * tr.world_size) or cjson_null, peak_tflops = peak or cjson_null,
    peak_from = peak_from or cjson_null,
    seconds = C.zt_now() - R.t_start,
    memory = report.with_totals(report.gather_memory(tr.world)),
    predicted = tr.strategy.predicted and tr.strategy.predicted(tr.ctx),
    -- the strategy's public state: each kind's dtype, tier and sharding
    state = tr.ctx.state and state.describe(tr.ctx.state).kinds or cjson_null,
    driver = tr.driver.name,
    strategy_stats = tr.strategy.describe and tr.strategy.describe(tr.ctx) or cjson_null,
    param_digest = digest_or_null(tr),
    comm = tr.world.backend,
    comm_per_step = comm_per_step,
    export = R.exported and { hf = R.exported } or cjson_null,
    exit = R.status, out = R.out,
    recipe_resolved = recipe_mod.serialize(r),
    recipe_json = recipe_mod.plain(r),
  }
end

function run(r, opts, out, state)
  local R = loop.open(r, opts, out)
  state.opened = true
  local okrun, rerr = loop.stop(R, loop.train(R))
  state.saved = R.saved
  local tr = R.tr
  local summary = summary_of(R)
  if R.lead and R.timeline_events then
    summary.timeline = write_timeline(tr, out, R.timeline_events)
  end
  -- keep: the trainer stays alive for the caller (the REPL explores it);
  -- an interrupt then ends the run, not the call
  local stopped = not okrun and opts.keep and interrupt.is_interrupt(rerr)
  local keep = opts.keep and (okrun or stopped)
  if not keep then tr:free() end
  -- a run that trained no step (a failed resume, an error or a stop before
  -- the first step) records nothing: the previous summary.json stays (a
  -- resumed run's), and an empty metrics.jsonl it made goes, so nothing
  -- blocks the corrected retry on this out=
  local trained = R.last ~= nil
  if R.lead and not trained then
    local f = io.open(out .. "/metrics.jsonl", "rb")
    if f and f:seek("end") == 0 then f:close(); os.remove(out .. "/metrics.jsonl") elseif f then f:close() end
  end
  if R.lead and trained then
    local okw, werr = report.write_atomic(out .. "/summary.json", report.encode(summary) .. "\n")
    if not okw then
      -- the previous summary.json (if any) stays; the run is an I/O error
      if not okrun then werr = ("%s (the run had failed: %s)"):format(werr, errors.message(rerr)) end
      error(errors.io(werr), 0)
    end
    if not opts.quiet then report.print_summary(summary) end
  end
  if not okrun and not stopped then error(rerr, 0) end
  if summary.timeline and summary.timeline.error then error(errors.io(summary.timeline.error), 0) end
  return summary, keep and tr or nil
end

return M
