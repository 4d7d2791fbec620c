-- Tracking tools (issue 29, item 6): report.csv and report.tensorboard
-- write each logged step beside metrics.jsonl, and keep one curve across a
-- resume into the same files (steps up to the checkpoint, then the resumed
-- run's: no gap, no step twice); a DeepSpeed config's tensorboard and
-- csv_monitor blocks map onto them, wandb is refused naming both, and its
-- "auto" values are filled from the recipe as Hugging Face's Trainer does.
-- The independent side: metrics.jsonl's exact loss bits (loss_hex), the
-- recipe file itself, and TensorBoard's EventAccumulator when the venv of
-- spec/unit/tensorboard_spec.lua exists.
local cjson = require "cjson"
local ffi = require "ffi"
local u = require "helpers.util"
local tb = require "ztrain.record.tensorboard"
local ds = require "ztrain.train.dsconfig"

local ZT = "build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 " ..
           "batch.micro=2 train.ckpt_every=3 train.log_every=1 train.eval_every=3 -q"

local function jsonl(path)
  local out = {}
  for l in u.read(path):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(l) end
  return out
end

-- csv(path) -> header, rows (each a table by column name; "" kept)
local function csv(path)
  local lines = {}
  for l in u.read(path):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local head, rows = {}, {}
  for name in (lines[1] .. ","):gmatch("([^,]*),") do head[#head + 1] = name end
  for i = 2, #lines do
    local row, k = {}, 0
    for v in (lines[i] .. ","):gmatch("([^,]*),") do k = k + 1; row[head[k]] = v end
    rows[#rows + 1] = row
  end
  return head, rows
end

-- fields(s) -> { { field, wire type, value } ... } of a protobuf message
local function fields(s)
  local out, i = {}, 1
  local function varint()
    local v, mul = 0, 1
    repeat
      local b = s:byte(i)
      i, v, mul = i + 1, v + (b % 128) * mul, mul * 128
    until b < 128
    return v
  end
  while i <= #s do
    local key = varint()
    local f, wt, v = math.floor(key / 8), key % 8, nil
    if wt == 0 then v = varint()
    elseif wt == 1 then v, i = s:sub(i, i + 7), i + 8
    elseif wt == 5 then v, i = s:sub(i, i + 3), i + 4
    else local n = varint(); v, i = s:sub(i, i + n - 1), i + n end
    out[#out + 1] = { f, wt, v }
  end
  return out
end

local function float(bytes)
  local p = ffi.new("float[1]")
  ffi.copy(p, bytes, 4)
  return tonumber(p[0])
end

-- events(dir) -> { { step =, values = { tag = value } } ... } of dir's one
-- events file (its records' framing read by the writer's own reader,
-- checked in spec/unit/tensorboard_spec.lua), the file_version record first
local function events(dir)
  local names = {}
  for n in u.sh("ls " .. dir):gmatch("[^\n]+") do if n:match("tfevents") then names[#names + 1] = n end end
  assert.are.equal(1, #names, "one events file in " .. dir)
  local out = {}
  for _, r in ipairs(tb.records(u.read(dir .. "/" .. names[1]))) do
    local e = { step = 0, values = {} }
    for _, f in ipairs(fields(r.data)) do
      if f[1] == 2 then e.step = f[3] end
      if f[1] == 5 then
        for _, v in ipairs(fields(f[3])) do
          local val = fields(v[3])
          e.values[val[1][3]] = float(val[2][3])
        end
      end
    end
    out[#out + 1] = e
  end
  return out
end

local function f32(x) return tonumber(ffi.new("float[1]", x)[0]) end

local function run(args)
  local out, rc = u.sh(ZT .. " " .. args)
  assert.are.equal(0, rc, out)
  return out
end

describe("tracking: report.csv and report.tensorboard across a resume", function()
  local dir, tbdir
  setup(function()
    dir, tbdir = u.outdir(), u.outdir()
    run("train.steps=6 report.csv=true report.tensorboard=" .. tbdir .. " out=" .. dir)
    -- resumed from step 3 although 4-6 were trained: the files keep 1-3, then 4-8
    run("train.steps=8 report.csv=true report.tensorboard=" .. tbdir .. " out=" .. dir ..
        " resume=" .. dir .. "/checkpoints/step-00000003")
  end)
  teardown(function() u.rm(dir); u.rm(tbdir) end)

  it("OUT/metrics.csv: a header, steps 1..8 once each, metrics.jsonl's values", function()
    local head, rows = csv(dir .. "/metrics.csv")
    assert.are.same({ "step", "time", "elapsed", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "eval_loss" },
                    head)
    local lines = jsonl(dir .. "/metrics.jsonl")
    assert.are.equal(8, #rows)
    for i, row in ipairs(rows) do
      local l = lines[i]
      assert.are.equal(i, tonumber(row.step))
      assert.are.equal(tonumber(l.loss_hex), tonumber(row.loss), "step " .. i)    -- exact
      assert.are.equal(l.step, tonumber(row.step))
      for _, k in ipairs({ "lr", "grad_norm", "step_ms", "time" }) do
        assert.is_true(math.abs(tonumber(row[k]) - l[k]) <= 1e-9 * math.abs(l[k]), k .. " at step " .. i)
      end
      assert.are.equal(l.eval_loss ~= nil, row.eval_loss ~= "", "eval_loss at step " .. i)
    end
    assert.are.same({ "3", "6", "8" }, { rows[3].step, rows[6].step, rows[8].step })
    assert.are.equal("", rows[4].eval_loss)
  end)

  it("the TensorBoard file: version record, steps 1..8 once each, each logged scalar as float32", function()
    local ev = events(tbdir)
    local steps = {}
    for i, e in ipairs(ev) do steps[i] = e.step end
    assert.are.same({ 0, 1, 2, 3, 4, 5, 6, 7, 8 }, steps)
    local lines = jsonl(dir .. "/metrics.jsonl")
    for i = 1, 8 do
      local v, l = ev[i + 1].values, lines[i]
      assert.are.equal(f32(tonumber(l.loss_hex)), v.loss, "loss at step " .. i)
      for _, k in ipairs({ "lr", "grad_norm", "tokens_per_s", "step_ms" }) do
        assert.is_true(math.abs(v[k] - l[k]) <= 1e-6 * math.abs(l[k]), k .. " at step " .. i)
      end
      assert.are.equal(l.eval_loss and f32(l.eval_loss), v.eval_loss, "eval_loss at step " .. i)
    end
  end)

  it("TensorBoard's EventAccumulator reads the resumed file: loss at steps 1..8, eval_loss at 3, 6, 8", function()
    local venv = os.getenv("ZTRAIN_TBVENV") or "/tmp/tbvenv"
    if not u.sh(venv .. "/bin/python -c 'import tensorboard' >/dev/null 2>&1; echo $?"):match("^0") then
      pending("no venv with tensorboard at " .. venv .. " (python3 -m venv " .. venv .. " && " .. venv ..
              "/bin/pip install tensorboard)")
      return
    end
    local py = tbdir .. ".py"
    u.write(py, ([[
from tensorboard.backend.event_processing import event_accumulator as ea
a = ea.EventAccumulator(%q, size_guidance={ea.SCALARS: 0})
a.Reload()
for t in ("loss", "eval_loss"):
    print(t, " ".join(str(e.step) for e in a.Scalars(t)))
]]):format(tbdir))
    local out, rc = u.sh(venv .. "/bin/python " .. py)
    os.remove(py)
    assert.are.equal(0, rc, out)
    assert.matches("loss 1 2 3 4 5 6 7 8\neval_loss 3 6 8\n", out, 1, true)
  end)
end)

describe("tracking: report keys a run cannot use", function()
  it("a CSV path that cannot be made ends the run naming report.csv (exit 3, no Lua location)", function()
    local dir = u.outdir()
    local out, rc = u.sh(ZT .. " train.steps=1 report.csv=/proc/ztrain-no/metrics.csv out=" .. dir)
    assert.are.equal(3, rc, out)
    assert.matches("report.csv: cannot create directory /proc/ztrain-no", out, 1, true)
    assert.is_nil(out:find("%.lua:%d+:"), out)
    -- nothing left that refuses the corrected retry on the same out= (an
    -- empty metrics.jsonl read as an earlier run's)
    assert.is_false(u.exists(dir .. "/metrics.jsonl"))
    local out2, rc2 = u.sh(ZT .. " train.steps=1 out=" .. dir)
    assert.are.equal(0, rc2, out2)
    -- a TensorBoard path that cannot be made, after a CSV that could: neither left
    local dir2 = u.outdir()
    local out3, rc3 = u.sh(ZT .. " train.steps=1 report.csv=true report.tensorboard=/proc/ztrain-no out=" .. dir2)
    assert.are.equal(3, rc3, out3)
    assert.is_false(u.exists(dir2 .. "/metrics.jsonl"))
    assert.is_false(u.exists(dir2 .. "/metrics.csv"))
    u.rm(dir); u.rm(dir2)
  end)

  it("report.tensorboard must be a path or true/false", function()
    local out, rc = u.sh(ZT .. " train.steps=1 'report.tensorboard={1}'")
    assert.are.equal(1, rc, out)
    assert.matches("report.tensorboard must be a path, true (inside out=) or false", out, 1, true)
  end)
end)

describe("tracking: a DeepSpeed config's monitors and \"auto\" values", function()
  local tmp
  setup(function() tmp = u.tmpdir() end)
  teardown(function() u.rm(tmp) end)

  local function config(t)
    local path = tmp .. "/ds_" .. tostring(#u.sh("ls " .. tmp)) .. ".json"
    u.write(path, cjson.encode(t))
    return path
  end

  it("an HF-style config: \"auto\" filled from the recipe, tensorboard and csv_monitor under output_path/job_name",
     function()
    local path = config({
      train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto", train_batch_size = "auto",
      gradient_clipping = "auto", fp16 = { enabled = "auto" }, bf16 = { enabled = "auto" },
      optimizer = { type = "AdamW", params = { lr = "auto", betas = "auto", eps = "auto", weight_decay = "auto" } },
      scheduler = { type = "WarmupDecayLR", params = { warmup_min_lr = "auto", warmup_max_lr = "auto",
                                                       warmup_num_steps = "auto", total_num_steps = "auto",
                                                       warmup_type = "linear" } },
      tensorboard = { enabled = true, output_path = tmp .. "/logs", job_name = "job1" },
      csv_monitor = { enabled = true, output_path = tmp .. "/logs", job_name = "job1" },
      wandb = { enabled = false, project = "p" },
    })
    local dir = u.outdir()
    local out = run("train.steps=4 --ds-config " .. path .. " out=" .. dir)
    local s = cjson.decode(u.read(dir .. "/summary.json"))
    u.rm(dir)
    local r = s.recipe_json
    -- recipes/single.lua's values (3e-3, warm-up 30, betas 0.9/0.95, decay 0.1, clip 1),
    -- the command line's micro-batch and steps; the scheduler's type is the file's
    assert.are.same({ 3e-3, { 0.9, 0.95 }, 1e-8, 0.1, 1 },
                    { r.optim.lr, r.optim.betas, r.optim.eps, r.optim.weight_decay, r.optim.clip })
    assert.are.same({ 30, "linear", 0 }, { r.lr.warmup, r.lr.schedule, r.lr.min_ratio })
    assert.are.same({ 2, 1, 0, 4, "fp32" }, { r.batch.micro, r.batch.accumulate, r.batch.global, r.train.steps,
                                             r.precision })
    for _, key in ipairs({ 'optimizer.params.lr is "auto": the recipe\'s optim.lr',
                           'scheduler.params.total_num_steps is "auto": the recipe\'s train.steps',
                           'train_batch_size is "auto": the recipe\'s batch.global' }) do
      assert.matches("ds-config: " .. key, out, 1, true)
    end
    assert.are.equal(tmp .. "/logs/job1", r.report.tensorboard)
    assert.are.equal(tmp .. "/logs/job1/metrics.csv", r.report.csv)
    local _, rows = csv(tmp .. "/logs/job1/metrics.csv")
    assert.are.equal(4, #rows)
    local ev = events(tmp .. "/logs/job1")
    assert.are.equal(5, #ev)
    assert.is_number(ev[5].values.loss)
  end)

  it("wandb enabled is refused, naming TensorBoard and the CSV as the offline alternatives", function()
    local path = config({ wandb = { enabled = true, project = "p" } })
    local out, rc = u.sh(ZT .. " train.steps=1 --ds-config " .. path)
    assert.are.equal(1, rc, out)
    assert.matches("ds-config: wandb.enabled = true: ztrain does not send runs to Weights & Biases; log offline " ..
                   "instead with report.tensorboard=DIR (TensorBoard event files) or report.csv=PATH", out, 1, true)
    assert.is_nil(out:find("%.lua:%d+:"), out)
  end)

  it("ds-convert: monitors without output_path go inside out=; an \"auto\" HF does not fill is refused", function()
    local out = ds.convert({ tensorboard = { enabled = true }, csv_monitor = { enabled = true, flush = 1 } })
    local k = {}
    for _, kv in ipairs(out.keys) do k[kv[1]] = kv[2] end
    assert.are.same({ ["report.tensorboard"] = true, ["report.csv"] = true }, k)
    assert.are.same({ "ds-config: csv_monitor.flush is not supported (ignored)" }, out.notes)
    local ok, e = pcall(ds.convert, { zero_optimization = { stage = "auto" } })
    assert.is_false(ok)
    assert.matches('zero_optimization.stage is "auto", which ztrain fills only where Hugging Face', tostring(e),
                   1, true)
  end)
end)
