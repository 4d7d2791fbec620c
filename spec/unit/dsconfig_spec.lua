-- DeepSpeed configs (dsconfig.lua): five configs shaped like the seeds'
-- ds_config_*.json (stage 1, 2, 3, offload, infinity) under
-- spec/fixtures/ds_config/ mapped onto recipe keys, the keys named as
-- ignored, and the ones refused (--ds-config and ds-convert in the program:
-- spec/e2e/dsconfig_command_spec.lua).
local util = require "helpers.util"
local ds = require "ztrain.train.dsconfig"

local DIR = "spec/fixtures/ds_config/"

-- keys(name, world) -> { ["recipe.key"] = value }, notes
local function keys(name, world)
  local out = ds.convert(ds.read(DIR .. "ds_config_" .. name .. ".json"), { world = world or 2 })
  local k = {}
  for _, kv in ipairs(out.keys) do k[kv[1]] = kv[2] end
  return k, out.notes
end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return require("ztrain.core.errors").message(e)
end

describe("ds-config: the five seeds' shapes", function()
  it("stage 1: zero1, fp16 with its dynamic scale, batch sizes, AdamW, WarmupLR", function()
    local k, notes = keys("stage1")
    assert.are.same({ strategy = "zero1", precision = "fp16", ["fp16.initial_scale_power"] = 16,
                      ["fp16.loss_scale_window"] = 1000, ["fp16.hysteresis"] = 2, ["fp16.min_loss_scale"] = 1,
                      ["batch.micro"] = 8, ["batch.accumulate"] = 1, ["batch.global"] = 16,
                      ["optim.lr"] = 3e-4, ["optim.betas"] = { 0.9, 0.999 }, ["optim.eps"] = 1e-8,
                      ["optim.weight_decay"] = 0.01, ["optim.clip"] = 1, ["lr.warmup"] = 100,
                      ["lr.schedule"] = "constant", ["train.log_every"] = 10 }, k)
    assert.are.same({
      "ds-config: zero_optimization.reduce_bucket_size is not supported (ignored; gradients are reduced per unit)",
      "ds-config: wall_clock_breakdown is not supported (ignored; summary.json and metrics.jsonl time every step)",
    }, notes)
  end)

  it("stage 2: zero2, fp32, WarmupDecayLR as a linear decay over total_num_steps, the bucket knobs named", function()
    local k, notes = keys("stage2")
    assert.are.equal("zero2", k.strategy)
    assert.is_nil(k.precision)
    assert.are.equal("linear", k["lr.schedule"])
    assert.are.equal(0, k["lr.min_ratio"])
    assert.are.equal(2, k["train.steps"])
    assert.are.equal(3e-3, k["optim.lr"])
    local text = table.concat(notes, "\n")
    for _, key in ipairs({ "allgather_bucket_size", "allgather_partitions", "contiguous_gradients",
                           "reduce_bucket_size", "reduce_scatter" }) do
      assert.matches("ds-config: zero_optimization." .. key .. " is not supported (ignored", text, 1, true)
    end
    assert.is_nil(text:find("overlap_comm", 1, true), "overlap_comm = true is what ztrain does")
  end)

  it("stage 3: zero3, bf16, Adam as AdamW, micro and accumulation checked at 2 ranks", function()
    local k, notes = keys("stage3")
    assert.are.equal("zero3", k.strategy)
    assert.are.equal("bf16", k.precision)
    assert.are.same({ 4, 2, 16 }, { k["batch.micro"], k["batch.accumulate"], k["batch.global"] })
    assert.are.equal(0.5, k["optim.clip"])
    assert.are.equal(0, k["optim.weight_decay"])
    local text = table.concat(notes, "\n")
    assert.matches("ds-config: zero_optimization.sub_group_size is not supported (ignored", text, 1, true)
    assert.matches("ds-config: zero_optimization.stage3_prefetch_bucket_size is not supported (ignored", text, 1, true)
    assert.matches("ds-config: optimizer.params.torch_adam is not supported (ignored", text, 1, true)
    assert.are.equal(9, #notes)
  end)

  it("offload: zero3_offload (cpu), WarmupCosineLR, train_batch_size completed as DeepSpeed does", function()
    local k, notes = keys("offload")
    assert.are.equal("zero3_offload", k.strategy)
    assert.are.same({ 2, 4, 16 }, { k["batch.micro"], k["batch.accumulate"], k["batch.global"] })
    assert.are.same({ "cosine", 0.1, 50, 1000 }, { k["lr.schedule"], k["lr.min_ratio"], k["lr.warmup"], k["train.steps"] })
    assert.are.same({ 12, 500 }, { k["fp16.initial_scale_power"], k["fp16.loss_scale_window"] })
    assert.matches("offload_optimizer.pin_memory is not supported (ignored", table.concat(notes, "\n"), 1, true)
  end)

  it("infinity: zero3_infinity (nvme), nvme_path and aio onto offload.*", function()
    local k, notes = keys("infinity")
    assert.are.equal("zero3_infinity", k.strategy)
    assert.are.equal("/local_nvme", k["offload.nvme_path"])
    assert.are.same({ 1048576, 8 }, { k["offload.block_size"], k["offload.queue_depth"] })
    assert.are.same({ 1, 4, 8 }, { k["batch.micro"], k["batch.accumulate"], k["batch.global"] })
    local text = table.concat(notes, "\n")
    assert.matches("ds-config: aio.thread_count is not supported (ignored; libuv's thread pool)", text, 1, true)
    assert.matches("ds-config: zero_optimization.offload_param.max_in_cpu is not supported (ignored)", text, 1, true)
    assert.are.equal(11, #notes)
  end)

  it("the converted keys are valid recipe overrides", function()
    for _, name in ipairs({ "stage1", "stage2", "stage3", "offload", "infinity" }) do
      local list = ds.overrides(DIR .. "ds_config_" .. name .. ".json", 2)
      assert(require("ztrain.train.recipe").resolve({}, list))
    end
  end)
end)

describe("ds-config: what is refused", function()
  local function conv(t, world) return ds.convert(t, { world = world or 1 }) end

  it("DeepSpeed's batch check, in its words", function()
    local e = err_of(conv, { train_batch_size = 32, train_micro_batch_size_per_gpu = 4,
                             gradient_accumulation_steps = 2 }, 2)
    assert.matches("Check batch related parameters. " ..
                   "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size: " ..
                   "32 != 4 * 2 * 2", e, 1, true)
    assert.matches("not a whole number", err_of(conv, { train_batch_size = 10, train_micro_batch_size_per_gpu = 4 }),
                   1, true)
  end)

  it("keys that change the math", function()
    local cases = {
      { { fp16 = { enabled = true, loss_scale = 128 } }, "fp16.loss_scale = 128 is a static loss scale" },
      { { scheduler = { type = "WarmupLR", params = { warmup_num_steps = 10 } } }, 'warmup_type is "log"' },
      { { scheduler = { type = "OneCycle", params = {} } }, 'scheduler.type "OneCycle" is not supported' },
      { { optimizer = { type = "Lamb", params = {} } }, 'optimizer.type "Lamb" is not supported' },
      { { optimizer = { type = "Adam", params = { adam_w_mode = false } } }, "adam_w_mode = false" },
      { { communication_data_type = "fp16" }, 'communication_data_type = "fp16"' },
      { { fp16 = { enabled = true }, bf16 = { enabled = true } }, "both true" },
      { { zero_optimization = { stage = "auto" } }, 'zero_optimization.stage is "auto", which ztrain fills only' },
      { { zero_optimization = { stage = 2, offload_param = { device = "cpu" } } }, "offload_param needs stage 3" },
      { { zero_optimization = { stage = 3, offload_optimizer = { device = "cpu" } } }, "has no strategy name" },
    }
    for _, c in ipairs(cases) do
      local e = err_of(conv, c[1])
      assert.matches("^ds%-config: ", e)
      assert.matches(c[2], e, 1, true)
    end
  end)

  it("an unknown top-level key is named, not dropped", function()
    local out = conv({ some_new_feature = { x = 1 }, steps_per_print = 5 })
    assert.are.same({ "ds-config: some_new_feature is not supported (ignored)" }, out.notes)
  end)

  it("a value of the wrong JSON kind is refused naming its key, not read as absent", function()
    local cases = {
      { { tensorboard = { enabled = true, output_path = 5 } }, "tensorboard.output_path must be a string, got 5" },
      { { csv_monitor = { enabled = true, job_name = true } }, "csv_monitor.job_name must be a string, got true" },
      { { fp16 = { enabled = "yes" } }, 'fp16.enabled must be true or false, got "yes"' },
      { { bf16 = { enabled = 1 } }, "bf16.enabled must be true or false, got 1" },
      { { fp16 = true }, "fp16 must be an object, got true" },
      { { zero_optimization = { 1, 2 } }, "zero_optimization must be an object, got an array" },
      { { zero_optimization = { stage = "3" } }, 'zero_optimization.stage must be a number, got "3"' },
      { { zero_optimization = { stage = 3, offload_param = { device = 5 } } },
        "zero_optimization.offload_param.device must be a string, got 5" },
      { { zero_optimization = { stage = 3, offload_optimizer = "nvme" } },
        'zero_optimization.offload_optimizer must be an object, got "nvme"' },
      { { zero_optimization = { stage = 1, overlap_comm = "no" } },
        'zero_optimization.overlap_comm must be true or false, got "no"' },
      { { optimizer = "AdamW" }, 'optimizer must be an object, got "AdamW"' },
      { { optimizer = { type = 1 } }, "optimizer.type must be a string, got 1" },
      { { optimizer = { type = "AdamW", params = { betas = 0.9 } } }, "optimizer.params.betas must be an array, got 0.9" },
      { { optimizer = { type = "AdamW", params = { betas = { 0.9 } } } },
        "optimizer.params.betas must be an array of two numbers" },
      { { optimizer = { type = "AdamW", params = { amsgrad = "false" } } },
        'optimizer.params.amsgrad must be true or false, got "false"' },
      { { scheduler = { type = "WarmupLR", params = { warmup_type = 1 } } },
        "scheduler.params.warmup_type must be a string, got 1" },
      { { amp = { enabled = "true" } }, 'amp.enabled must be true or false, got "true"' },
      { { prescale_gradients = 1 }, "prescale_gradients must be true or false, got 1" },
      { { wandb = true }, "wandb must be an object, got true" },
      { { aio = { block_size = "1MiB" } }, 'aio.block_size must be a number, got "1MiB"' },
      { { steps_per_print = { 1 } }, "steps_per_print must be a number, got an array" },
      { { steps_per_print = {} }, "steps_per_print must be a number, got an empty array or object" },
    }
    for _, c in ipairs(cases) do
      local ok, e = pcall(conv, c[1])
      assert.is_false(ok, c[2])
      e = require("ztrain.core.errors").message(e)
      assert.are.equal("ds-config: " .. c[2], e:sub(1, #c[2] + 11))
    end
  end)

  it("a value out of its recipe key's range is refused naming the file's key", function()
    local function opt(params) return { optimizer = { type = "AdamW", params = params } } end
    local cases = {
      { opt { lr = -1 }, "optimizer.params.lr must be a number in [0, 1000], got -1 (ztrain's optim.lr)" },
      { opt { eps = 0 }, "optimizer.params.eps must be a number in [1e-30, 1], got 0 (ztrain's optim.eps)" },
      { opt { weight_decay = -0.1 }, "optimizer.params.weight_decay must be a number in [0, 1000], got -0.1" },
      { opt { betas = { 1.5, -2 } }, "optimizer.params.betas must be a pair of numbers in [0, 1) like { 0.9, 0.95 }, " ..
                                       "got { 1.5, -2 } (ztrain's optim.betas)" },
      { { gradient_clipping = -1 }, "gradient_clipping must be a number in [0, 1e+30], got -1 (ztrain's optim.clip)" },
      { { train_micro_batch_size_per_gpu = 1e300 },
        "train_micro_batch_size_per_gpu must be an integer in [1, 2147483648], got 1e+300 (ztrain's batch.micro)" },
      { { gradient_accumulation_steps = -2 }, "gradient_accumulation_steps must be an integer in [1, 2147483648]" },
      { { train_batch_size = 2 ^ 40 }, "train_batch_size must be an integer in [0, 2147483648]" },
      { { train_micro_batch_size_per_gpu = 2 ^ 30, gradient_accumulation_steps = 2 ^ 30 },
        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size must be an integer" },
      { { steps_per_print = 0.5 }, "steps_per_print must be an integer in [0, 1099511627776], got 0.5" },
      { { fp16 = { enabled = true, min_loss_scale = 0 } }, "fp16.min_loss_scale must be a number in [" },
      { { scheduler = { type = "WarmupLR", params = { warmup_type = "linear", warmup_max_lr = -3 } } },
        "scheduler.params.warmup_max_lr must be a number in [0, 1000], got -3 (ztrain's optim.lr)" },
      { { scheduler = { type = "WarmupDecayLR", params = { warmup_type = "linear", total_num_steps = 0 } } },
        "scheduler.params.total_num_steps must be an integer in [1, " },
      { { aio = { block_size = 3 } }, "aio.block_size must be a multiple of 4096 bytes" },
      { { aio = { queue_depth = 300 } }, "aio.queue_depth must be an integer in [1, 256] or \"auto\", got 300" },
    }
    for _, c in ipairs(cases) do
      local e = err_of(conv, c[1])
      assert.are.equal("ds-config: " .. c[2], e:sub(1, #c[2] + 11))
    end
  end)

  it("a file that starts with a UTF-8 byte order mark reads as without it", function()
    local path = os.tmpname()
    util.write(path, "\239\187\191{ \"gradient_clipping\": 0.5 }")
    local ok, t = pcall(ds.read, path)
    os.remove(path)
    assert.is_true(ok, ok or require("ztrain.core.errors").message(t))
    assert.are.same({ gradient_clipping = 0.5 }, t)
  end)

  it("a file that is not JSON is one line naming it", function()
    local path = os.tmpname()
    util.write(path, "{ not json")
    local e = err_of(ds.read, path)
    os.remove(path)
    assert.matches("^ds%-config: " .. path:gsub("%p", "%%%0") .. " is not a JSON object", e)
  end)
end)
