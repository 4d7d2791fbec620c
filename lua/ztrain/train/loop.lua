-- ztrain.train.loop: the training loop of a run (run.lua: its directory, its
-- summary). open(r, opts, out) builds the trainer and the run's record
-- (the state below, R); train(R) resumes if asked and steps until
-- train.steps, each step with its evaluation, sample, checkpoint, log line
-- and interrupt point; stop(R, ok, err) settles how it ended: an error's
-- status, a graceful stop's checkpoint, the metrics file closed.
local zffi = require "ztrain.core.ffi"
local C = zffi.C
local ffi_string = require("ffi").string
local trainer = require "ztrain.train.trainer"
local report = require "ztrain.record.report"
local errors = require "ztrain.core.errors"
local interrupt = require "ztrain.core.interrupt"
local fs = require "ztrain.util.fs"
local ckpt = require "ztrain.train.checkpoint"
local comm_report = require "ztrain.record.comm"
local comm = require "ztrain.core.comm"
local schedule = require "ztrain.parallel.schedule"
local libc = require "ztrain.core.libc"
local throughput = require "ztrain.record.throughput"
local host = require "ztrain.util.host"

local M = {}

-- Every pipeline rank's recorded events, by pipeline rank (a collective
-- over the pipeline group): { [rank + 1] = { { op, stage, mb, t0, t1 } } }.
function M.gather_events(tr, events)
  local OPS = schedule.OP_LIST
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

-- open(r, opts, out) -> R: the trainer (tr), whether this rank leads
-- (rank 0 alone prints and writes), the metrics log, where checkpoints go
-- (checked writable before training, not after hours of it: every rank
-- stops alike), and what the steps record (steps_ms, tps, first_loss,
-- last, eval_loss, test_loss, sample_text, timeline_events, resumed, saved).
function M.open(r, opts, out)
  local R = { r = r, opts = opts, out = out, t_start = C.zt_now(), started = libc.now(), steps_ms = {}, tps = {},
              status = "ok", start_step = 0, tokens_before = 0, history = {} }
  C.zt_mem_reset_peak()       -- peaks in the summary are this run's
  local tr = trainer.new(r, { quiet = opts.quiet, out = out })
  R.tr, R.lead = tr, tr.rank == 0
  R.log = { metrics = function() end, progress = function() end, close = function() return true end,
            resume_at = function() return {} end }
  if R.lead then
    local log, lerr = report.open(out, { total_steps = r.train.steps, quiet = opts.quiet, resume = r.resume ~= "",
                                         report = r.report })
    if not log then tr:free(); error(errors.io(lerr), 0) end
    R.log = log
  end
  R.ckpt_root = r.train.ckpt_dir ~= "" and r.train.ckpt_dir or (out .. "/checkpoints")
  if R.lead and not opts.quiet then
    for _, w in ipairs(tr.warnings or {}) do io.stderr:write("ztrain: warning: ", w, "\n") end
  end
  if r.train.ckpt_every > 0 then
    local err = ""
    if R.lead then
      local ok, merr = fs.mkdirs(R.ckpt_root, "output directory")
      if not ok then err = "train.ckpt_dir: " .. tostring(merr) end
    end
    err = errors.agree(tr.world, err)
    if err ~= "" then tr:free(); R.log:close(); error(errors.all_ranks(err), 0) end
  end
  R.t_train, R.comm_acc, R.smooth = C.zt_now(), comm_report.new(), throughput.smoother()
  return R
end

local function sample(R, step)
  if R.r.sample.tokens <= 0 then return end
  R.sample_text = R.tr:sample(R.r.sample)
  if R.lead and not R.opts.quiet and R.sample_text then
    print(("sample at step %d: %s"):format(step, R.sample_text))
  end
end

-- the step's evaluation (every eval_every steps and the last), with the
-- sample; the test split's at the last; a checkpoint every ckpt_every
local function after_step(R, rec, is_last)
  local r, tr = R.r, R.tr
  if (r.train.eval_every > 0 and rec.step % r.train.eval_every == 0) or is_last then
    rec.eval_loss = tr:evaluate()
    R.eval_loss = rec.eval_loss or R.eval_loss
    sample(R, rec.step)
    rec.sample = R.sample_text
  end
  if is_last and tr.test_loader then R.test_loss = tr:evaluate(tr.test_loader) end
  if r.train.ckpt_every > 0 and (rec.step % r.train.ckpt_every == 0 or is_last) then
    local ok, res = pcall(ckpt.save_run, tr, R.ckpt_root, r.train.ckpt_keep, M.record(R))
    -- a checkpoint that cannot be written is an unwritable output: exit 3,
    -- on every rank alike when every rank raised it
    if not ok then
      if type(res) == "table" then res.status = errors.EXIT.io else res = errors.io(errors.message(res)) end
      error(res, 0)
    end
    R.saved = res
  end
end

-- fp16's loss scaler after a step: an overflow at the minimum scale ends
-- the run (the gradient norm it tested was reduced over ranks: every rank
-- stops here together)
local function check_scaler(R, rec)
  local LS = R.tr.ctx.loss_scaler
  if not (LS and LS.stuck) then return end
  error(errors.all_ranks(("fp16: step %d overflowed (inf or NaN gradients) with the loss scale already at its " ..
        "minimum, fp16.min_loss_scale = %.6g, and no hysteresis left: training cannot go on; lower " ..
        "fp16.min_loss_scale, lower optim.lr or use precision=bf16"):format(rec.step, LS.min_scale)), 0)
end

-- the end of a run's steps: a run every step of which was skipped (fp16
-- overflows) trained nothing, and must not end as if it had
local function check_trained(R, skipped_before)
  local LS, steps = R.tr.ctx.loss_scaler, R.tr.step - R.start_step
  if not LS or steps <= 0 or LS.skipped - skipped_before < steps then return end
  error(errors.all_ranks(("fp16: every step of this run was skipped (%d of %d: inf or NaN gradients at every " ..
        "loss scale tried, the last %.6g): the weights are unchanged; lower fp16.initial_scale_power, lower " ..
        "optim.lr or use precision=bf16"):format(steps, steps, LS.scale)), 0)
end

-- one training step with its evaluation, sample, checkpoint and log line
local function one_step(R)
  local r, tr = R.r, R.tr
  -- the schedule driver's last step is recorded for timeline.svg/json
  local record = tr.driver.name == "schedule" and tr.step + 1 == r.train.steps
  if record then tr.env.events = {} end
  local comm_before = comm.stats()
  local rec = tr:train_step()
  rec.comm = comm_report.step(R.comm_acc, comm_before, comm.stats())
  if record then
    R.timeline_events = M.gather_events(tr, tr.env.events)
    tr.env.events = nil
  end
  R.first_loss = R.first_loss or rec.loss
  rec.tokens_per_s = rec.tokens / (rec.step_ms / 1000)
  -- step 1 pays for first touches of every buffer: medians skip it, and
  -- so does the smoothed figure (the live line's and the ETA's:
  -- record/throughput.lua) after showing it alone
  local first = rec.step == R.start_step + 1
  if rec.step > 1 or r.train.steps == 1 then
    R.steps_ms[#R.steps_ms + 1], R.tps[#R.tps + 1] = rec.step_ms, rec.tokens_per_s
  end
  rec.step_ms_smoothed = first and rec.step_ms or R.smooth(rec.step_ms)
  rec.tokens_per_s_smoothed = rec.tokens / (rec.step_ms_smoothed / 1000)
  local is_last = rec.step == r.train.steps
  -- the step is trained: whatever follows fails, the summary's step, loss
  -- and digest describe this same state
  R.last = rec
  after_step(R, rec, is_last)
  local log_now = rec.step == 1 or is_last or rec.eval_loss or
                  (r.train.log_every > 0 and rec.step % r.train.log_every == 0)
  rec.loss_hex = ("%a"):format(rec.loss)   -- exact, for comparing runs bit for bit
  -- the records keep every step of a run up to EVERY_STEP steps (a line
  -- costs ~65 us); longer runs, the logged steps. The printed lines follow
  -- train.log_every either way
  if log_now or r.train.steps <= M.EVERY_STEP then R.log:metrics(rec) end
  R.log:progress(rec, log_now)
  if rec.loss ~= rec.loss or math.abs(rec.loss) == math.huge then
    -- the loss was reduced over ranks: every rank stops here together
    error(errors.all_ranks(("loss is %s at step %d: training diverged; lower optim.lr, raise " ..
          "lr.warmup or set optim.clip"):format(tostring(rec.loss), rec.step)), 0)
  end
  check_scaler(R, rec)
end

-- runs of at most this many steps record every step in metrics.jsonl (and
-- report.tensorboard / report.csv); longer ones the train.log_every steps
M.EVERY_STEP = 10000

-- tokens a step of this run trains (every rank's micro-batches)
local function step_tokens(R)
  return R.r.batch.micro * R.r.data.seq_len * R.tr.accumulate * R.tr.dp.size
end
M.step_tokens = step_tokens

-- tokens(R) -> tokens trained over the whole run up to the trainer's step,
-- resumes included
function M.tokens(R)
  return R.tokens_before + math.max(0, R.tr.step - R.start_step) * step_tokens(R)
end

-- record(R) -> what a checkpoint keeps of the run (the manifest's "run"):
-- the tokens trained up to this step and the run's segments
function M.record(R)
  return { tokens = M.tokens(R), history = R.history }
end

-- continue_record(R, dir, man): the run goes on from a checkpoint: its
-- tokens and segments (from the manifest; a checkpoint older than this
-- record counts its steps at this run's batch), and the loss history in
-- metrics.jsonl up to its step (the first kept line's loss is the run's)
local function continue_record(R, dir, man)
  local run = type(man.run) == "table" and man.run or {}
  R.start_step = man.step
  R.tokens_before = tonumber(run.tokens) or man.step * step_tokens(R)
  R.history = type(run.history) == "table" and run.history or {}
  local kept = R.log:resume_at(man.step)
  if kept[1] and type(kept[1].loss) == "number" then R.first_loss = kept[1].loss end
end

-- banner(R) -> what the start banner says (record/report.lua print_banner)
function M.banner(R)
  local r, tr = R.r, R.tr
  local G = r.batch.micro * tr.accumulate * tr.dp.size
  return { model = tr.cfg.name, params = tr.model.nparams, strategy = tr.strategy.name, world = tr.world_size,
           stages = tr.pp and tr.pp.size or 1, device = ffi_string(C.zt_device_name()), precision = r.precision,
           global = G, micro = r.batch.micro, accumulate = tr.accumulate, dp = tr.dp.size, T = r.data.seq_len,
           steps = r.train.steps, from_step = tr.step, step_tokens = step_tokens(R),
           resumed = R.resumed and R.resumed.from or nil, out = R.out,
           load = host.load_average(), cores = host.cores(), threads = C.zt_get_threads(),
           omp_wait = os.getenv("OMP_WAIT_POLICY"), omp_wait_auto = zffi.omp_wait_auto }
end

-- begin_segment(R): this process's part of the run, as the history keeps it
local function begin_segment(R)
  local tr = R.tr
  R.history[#R.history + 1] = {
    started = os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(R.started)), step = tr.step,
    from = R.resumed and R.resumed.from or nil, strategy = tr.strategy.name, world_size = tr.world_size,
    global_batch = R.r.batch.micro * tr.accumulate * tr.dp.size, seq_len = R.r.data.seq_len }
end

-- train(R) -> ok, err: resume (resume = latest: this run's checkpoint
-- directory; else a path), then the steps, then export.hf (every rank takes
-- part: sharded parameters are gathered, pipeline stages sent).
function M.train(R)
  local r, tr, opts = R.r, R.tr, R.opts
  local longest = 0
  if opts.graceful then interrupt.grace(60) end      -- start-up, and the first step
  local okrun, rerr = pcall(function()
    if r.resume ~= "" then
      local from = r.resume == "latest" and R.ckpt_root or r.resume
      local dir, man = ckpt.resume_run(tr, from)
      R.resumed = { from = dir, step = tr.step, placement_changed = man.placement_changes,
                    kernels_changed = man.kernel_changes }
      continue_record(R, dir, man)
      if R.lead and not opts.quiet then
        local moved = #man.placement_changes > 0 and (" (placed otherwise: %s; the same math)")
                      :format(table.concat(man.placement_changes, ", ")) or ""
        local kern = #man.kernel_changes > 0 and (" (with other kernels: %s; other bits from here on)")
                     :format(table.concat(man.kernel_changes, ", ")) or ""
        if man.kernel_changes[1] == "not recorded" then
          kern = " (the checkpoint does not record its kernels: written before 2026-11-28, " ..
                 "its bits may differ from here on)"
        end
        print(("resumed from %s at step %d%s%s"):format(dir, tr.step, moved, kern))
      end
    end
    begin_segment(R)
    if R.lead and not opts.quiet then report.print_banner(M.banner(R)) end
    local skipped_before = tr.ctx.loss_scaler and tr.ctx.loss_scaler.skipped or 0
    R.t_steps, R.t_last = C.zt_now(), nil
    while tr.step < r.train.steps do
      -- Ctrl-C (at the REPL) stops here, between steps, on every rank at
      -- once; the step itself is shielded (async work in flight mid-step)
      interrupt.poll_all(tr.world)
      local t0 = C.zt_now()
      interrupt.shield(one_step, R)
      -- a stop request leaves 5x the longest step (evaluation and
      -- checkpoints included) to reach the next boundary; a rank that cannot
      -- (a peer died under it) then ends on its own (interrupt.c)
      R.t_last = C.zt_now()          -- the wall clock's figure: first step's start to last step's end
      longest = math.max(longest, R.t_last - t0)
      if opts.graceful then interrupt.grace(math.max(5, 5 * longest)) end
    end
    check_trained(R, skipped_before)
  end)
  if okrun and r.export.hf ~= "" then
    okrun, rerr = pcall(tr.export_hf, tr, r.export.hf)
    if okrun then R.exported = r.export.hf end
  end
  return okrun, rerr
end

-- stop(R, ok, err) -> ok, err: how the run ended. Other ranks may be
-- waiting in a collective: an error ends the run here only when every rank
-- stopped at the same point (else it raises); a graceful stop (SIGINT or
-- SIGTERM to a run) keeps the step every rank finished as a checkpoint;
-- the metrics file is closed (a failed close fails the run).
-- what a stop says when it came before any step (the launcher promised a
-- checkpoint and summary.json; there is nothing to save)
M.NOT_STARTED = "interrupted before the first step: nothing was trained or saved"

function M.stop(R, okrun, rerr)
  local tr, opts = R.tr, R.opts
  if not okrun then
    if tr.world_size > 1 and not errors.is_all_ranks(rerr) then error(rerr, 0) end
    R.status = interrupt.is_interrupt(rerr) and "interrupted" or ("error: " .. errors.message(rerr))
  end
  if not okrun and opts.graceful and interrupt.is_interrupt(rerr) and tr.step > 0 then
    interrupt.grace_done()
    local okc, dir = pcall(ckpt.save_run, tr, R.ckpt_root, R.r.train.ckpt_keep, M.record(R))
    local msg
    if okc then
      R.saved = dir
      msg = ("interrupted after step %d; checkpoint %s: continue with resume=latest out=%s"):format(
            tr.step, dir, R.out)
    else
      msg = ("interrupted after step %d; the checkpoint failed: %s"):format(tr.step, errors.message(dir))
    end
    rerr = interrupt.error(true)
    rerr.msg = msg
  elseif not okrun and interrupt.is_interrupt(rerr) and type(rerr) == "table" and tr.step == 0 then
    rerr.msg = M.NOT_STARTED
  end
  local okc, cerr = R.log:close()
  if not okc and okrun then okrun, rerr, R.status = false, errors.io(cerr), "error: " .. cerr end
  return okrun, rerr
end

return M
