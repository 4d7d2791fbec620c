-- ztrain.run: run a resolved recipe end to end and write its outputs.
--
-- run(recipe, {quiet=}) -> summary table. Errors before training (bad data,
-- over-limit memory, ...) raise with a clear message; a failure during
-- training still writes summary.json with exit = "error: ...".
local zffi = require "ztrain.ffi"
local C = zffi.C
local trainer = require "ztrain.trainer"
local report = require "ztrain.report"
local recipe_mod = require "ztrain.recipe"
local cjson_null = require("ztrain.util.json").null

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

local memory = require "ztrain.memory"
local errors = require "ztrain.errors"
local interrupt = require "ztrain.interrupt"
local fs = require "ztrain.util.fs"

local run, write_timeline

-- Every pipeline rank's recorded events, by pipeline rank (a collective
-- over the pipeline group): { [rank + 1] = { { op, stage, mb, t0, t1 } } }.
local function gather_events(tr, events)
  local OPS = require("ztrain.schedule").OP_LIST
  local pp = tr.pp
  if not pp then return { events } end
  local code = {}
  for i, op in ipairs(OPS) do code[op] = i end
  local flat = {}
  for _, e in ipairs(events) do
    for _, v in ipairs({ code[e.op], e.stage or -1, e.mb or -1, e.t0, e.t1 }) do flat[#flat + 1] = v end
  end
  local counts = pp:gather_doubles({ #flat })
  local most = 0
  for _, c in ipairs(counts) do most = math.max(most, c[1]) end
  for i = #flat + 1, most do flat[i] = 0 end
  local all, out = pp:gather_doubles(flat), {}
  for r = 1, pp.size do
    local list, row = {}, all[r]
    for i = 1, counts[r][1], 5 do
      list[#list + 1] = { op = OPS[row[i]], stage = row[i + 1] >= 0 and row[i + 1] or nil,
                          mb = row[i + 2] >= 0 and row[i + 2] or nil, t0 = row[i + 3], t1 = row[i + 4] }
    end
    out[r] = list
  end
  return out
end

-- timeline.svg and timeline.json of the recorded step (every pipeline
-- rank's row), with the simulator's predicted bubble beside the measured
-- one. A failed write is reported in the summary, not fatal to a finished run.
write_timeline = function(tr, out, events)
  local ok, res = pcall(function()
    local tl = require "ztrain.pipeline.timeline"
    local sim = require("ztrain.pipeline.simulate").run(tr.env.lists, {})
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
  local comm = require "ztrain.comm"
  -- the output directory: unique, not an earlier run's, locked (rundir.lua)
  local out, lock = require("ztrain.rundir").claim(r, comm.world())
  local watch = comm.watch({ timeout = r.comm.timeout, check = r.comm.check })
  local ok, res, tr = pcall(run, r, opts or {}, out)
  comm.watch(watch)
  lock:release()
  memory.set_limit("device", 0)
  pcall(memory.set_limit, "device", limit)
  C.zt_set_threads(threads)
  if not ok then
    -- all-ranks errors and those with an exit status of their own keep their kind
    if errors.is_all_ranks(res) or (type(res) == "table" and res.status) then error(res, 0) end
    -- a user needs the message, not the Lua file and line it came from
    error(errors.message(res), 0)
  end
  return res, tr
end

function run(r, opts, out)
  local t_start = C.zt_now()
  C.zt_mem_reset_peak()       -- peaks in the summary are this run's
  local tr = trainer.new(r, { quiet = opts.quiet, out = out })
  local lead = tr.rank == 0          -- rank 0 alone prints and writes outputs
  local log = { metrics = function() end, progress = function() end, close = function() return true end }
  if lead then
    local lerr
    log, lerr = report.open(out, { total_steps = r.train.steps, quiet = opts.quiet })
    if not log then tr:free(); error(errors.io(lerr), 0) end
  end
  local steps_ms, tps, first_loss, last = {}, {}, nil, nil
  local timeline_events
  local eval_loss, test_loss, sample_text
  local status = "ok"
  local ckpt = require "ztrain.checkpoint"
  local ckpt_root = r.train.ckpt_dir ~= "" and r.train.ckpt_dir or (out .. "/checkpoints")
  local resumed, saved = nil, nil
  if lead and not opts.quiet then
    for _, w in ipairs(tr.warnings or {}) do io.stderr:write("ztrain: warning: ", w, "\n") end
  end
  -- checkpoints go where they can be written: checked before training, not
  -- after hours of it (every rank stops alike)
  if r.train.ckpt_every > 0 then
    local err = ""
    if lead then
      local ok, merr = fs.mkdirs(ckpt_root, "output directory")
      if not ok then err = "train.ckpt_dir: " .. tostring(merr) end
    end
    err = errors.agree(tr.world, err)
    if err ~= "" then tr:free(); log:close(); error(errors.all_ranks(err), 0) end
  end
  local t_train = C.zt_now()
  local comm_report = require "ztrain.comm_report"
  local comm_acc, comm_stats = comm_report.new(), require("ztrain.comm").stats
  local function sample(step)
    if r.sample.tokens <= 0 then return end
    sample_text = tr:sample(r.sample)
    if lead and not opts.quiet and sample_text then
      print(("sample at step %d: %s"):format(step, sample_text))
    end
  end
  -- one training step with its evaluation, sample, checkpoint and log line
  local function one_step()
    -- the schedule driver's last step is recorded for timeline.svg/json
    local record = tr.driver.name == "schedule" and tr.step + 1 == r.train.steps
    if record then tr.env.events = {} end
    local comm_before = comm_stats()
    local rec = tr:train_step()
    rec.comm = comm_report.step(comm_acc, comm_before, comm_stats())
    if record then
      timeline_events = gather_events(tr, tr.env.events)
      tr.env.events = nil
    end
    first_loss = first_loss or rec.loss
    rec.tokens_per_s = rec.tokens / (rec.step_ms / 1000)
    -- step 1 pays for first touches of every buffer: medians skip it
    if rec.step > 1 or r.train.steps == 1 then
      steps_ms[#steps_ms + 1], tps[#tps + 1] = rec.step_ms, rec.tokens_per_s
    end
    local is_last = rec.step == r.train.steps
    if (r.train.eval_every > 0 and rec.step % r.train.eval_every == 0) or is_last then
      rec.eval_loss = tr:evaluate()
      eval_loss = rec.eval_loss or eval_loss
      sample(rec.step)
      rec.sample = sample_text
    end
    if is_last and tr.test_loader then test_loss = tr:evaluate(tr.test_loader) end
    if r.train.ckpt_every > 0 and (rec.step % r.train.ckpt_every == 0 or is_last) then
      saved = ckpt.save_run(tr, ckpt_root, r.train.ckpt_keep)
    end
    local log_now = rec.step == 1 or is_last or rec.eval_loss or
                    (r.train.log_every > 0 and rec.step % r.train.log_every == 0)
    rec.loss_hex = ("%a"):format(rec.loss)   -- exact, for comparing runs bit for bit
    if log_now then log:metrics(rec) end
    log:progress(rec, C.zt_now() - t_train, log_now)
    last = rec
    if rec.loss ~= rec.loss or math.abs(rec.loss) == math.huge then
      -- the loss was reduced over ranks: every rank stops here together
      error(errors.all_ranks(("loss is %s at step %d: training diverged; lower optim.lr, raise " ..
            "lr.warmup or set optim.clip"):format(tostring(rec.loss), rec.step)), 0)
    end
  end
  local longest = 0
  if opts.graceful then interrupt.grace(60) end      -- start-up, and the first step
  local okrun, rerr = pcall(function()
    if r.resume ~= "" then
      -- resume = latest: this run's checkpoint directory; else a path
      local from = r.resume == "latest" and ckpt_root or r.resume
      local dir = ckpt.resume_run(tr, from)
      resumed = { from = dir, step = tr.step }
      if lead and not opts.quiet then print(("resumed from %s at step %d"):format(dir, tr.step)) end
    end
    while tr.step < r.train.steps do
      -- Ctrl-C (at the REPL) stops here, between steps, on every rank at
      -- once; the step itself is shielded (async work in flight mid-step)
      interrupt.poll_all(tr.world)
      local t0 = C.zt_now()
      interrupt.shield(one_step)
      -- a stop request leaves 5x the longest step (evaluation and
      -- checkpoints included) to reach the next boundary; a rank that cannot
      -- (a peer died under it) then ends on its own (interrupt.c)
      longest = math.max(longest, C.zt_now() - t0)
      if opts.graceful then interrupt.grace(math.max(5, 5 * longest)) end
    end
  end)
  -- export.hf: the trained model as a Hugging Face directory (every rank
  -- takes part: sharded parameters are gathered, pipeline stages sent)
  local exported
  if okrun and r.export.hf ~= "" then
    okrun, rerr = pcall(tr.export_hf, tr, r.export.hf)
    if okrun then exported = r.export.hf end
  end
  if not okrun then
    -- other ranks may be waiting in a collective: finish the run only when
    -- every rank stopped at the same point
    if tr.world_size > 1 and not errors.is_all_ranks(rerr) then error(rerr, 0) end
    status = interrupt.is_interrupt(rerr) and "interrupted" or ("error: " .. errors.message(rerr))
  end
  if not okrun and opts.graceful and interrupt.is_interrupt(rerr) and tr.step > 0 then
    -- a graceful stop (SIGINT/SIGTERM to a run): every rank finished the
    -- same step (poll_all agreed on it); keep it as a checkpoint
    interrupt.grace_done()
    local okc, dir = pcall(ckpt.save_run, tr, ckpt_root, r.train.ckpt_keep)
    local msg
    if okc then
      saved = dir
      msg = ("interrupted after step %d; checkpoint %s: continue with resume=latest out=%s"):format(
            tr.step, dir, out)
    else
      msg = ("interrupted after step %d; the checkpoint failed: %s"):format(tr.step, errors.message(dir))
    end
    rerr = interrupt.error(true)
    rerr.msg = msg
  end
  local okc, cerr = log:close()
  if not okc and okrun then okrun, rerr, status = false, errors.io(cerr), "error: " .. cerr end

  local model = tr.model
  -- a collective, before the summary's other gathers (counted out: see comm_report)
  local comm_per_step = comm_report.per_step(tr.world, comm_acc)
  local summary = {
    recipe = r.name, recipe_path = r.path, strategy = tr.strategy.name,
    world_size = tr.world_size, backend = require("ffi").string(C.zt_device_name()),
    threads = C.zt_get_threads(),
    model = { name = tr.cfg.name, params = model.nparams, layers = tr.cfg.L, channels = tr.cfg.C,
              heads = tr.cfg.NH, vocab = tr.cfg.V, context = tr.cfg.maxT },
    data = { files = #tr.dataset.files, kind = tr.dataset.kind, train_tokens = tr.dataset.train.n,
             valid_tokens = tr.dataset.valid and tr.dataset.valid.n or 0,
             test_tokens = tr.dataset.test and tr.dataset.test.n or cjson_null, tokenizer = tr.tokenizer.name },
    batch = { micro = r.batch.micro, accumulate = tr.accumulate, seq_len = r.data.seq_len,
              global = r.batch.micro * tr.accumulate * tr.dp.size },
    steps = last and last.step or 0,
    tokens = (last and last.step or 0) * r.batch.micro * r.data.seq_len * tr.accumulate * tr.dp.size,
    pipeline = tr.pp and { stages = tr.pp.size, split = type(r.pipeline.split) == "string" and r.pipeline.split
                           or "given", unit_seconds = tr.unit_times or cjson_null, units = (function()
      local c = {}
      for i, st in ipairs(tr.stages) do c[i] = #st.units end
      return c end)() } or cjson_null,
    first_loss = first_loss or cjson_null, final_loss = last and last.loss or cjson_null,
    eval_loss = eval_loss or cjson_null, perplexity = eval_loss and math.exp(eval_loss) or cjson_null,
    test_loss = test_loss or cjson_null, test_perplexity = test_loss and math.exp(test_loss) or cjson_null,
    sample = sample_text or cjson_null,
    checkpoint = saved or cjson_null, resumed = resumed or cjson_null,
    activations = tr:activation_report(),
    warnings = tr.warnings,
    blas = require("ffi").string(C.zt_blas_info()),
    gemm = tr.gemm or "fp32",
    attention = tr.recipe.device.attention,
    tokens_per_s = median(tps), step_ms_median = median(steps_ms),
    seconds = C.zt_now() - t_start,
    memory = report.with_totals(report.gather_memory(tr.world)),
    predicted = tr.strategy.predicted and tr.strategy.predicted(tr.ctx),
    -- the strategy's public state: each kind's dtype, tier and sharding
    state = tr.ctx.state and require("ztrain.strategy.state").describe(tr.ctx.state).kinds or cjson_null,
    driver = tr.driver.name,
    strategy_stats = tr.strategy.describe and tr.strategy.describe(tr.ctx) or cjson_null,
    param_digest = digest_or_null(tr),
    comm = tr.world.backend,
    comm_per_step = comm_per_step,
    export = exported and { hf = exported } or cjson_null,
    exit = status, out = out,
    recipe_resolved = recipe_mod.serialize(r),
  }
  if lead and timeline_events then
    summary.timeline = write_timeline(tr, out, timeline_events)
  end
  -- keep: the trainer stays alive for the caller (the REPL explores it);
  -- an interrupt then ends the run, not the call
  local stopped = not okrun and opts.keep and interrupt.is_interrupt(rerr)
  local keep = opts.keep and (okrun or stopped)
  if not keep then tr:free() end
  if lead then
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
