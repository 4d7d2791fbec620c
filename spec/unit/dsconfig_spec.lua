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

  it("a file that is not JSON is one line naming it", function()
    local path = os.tmpname()
    util.write(path, "{ not json")
    local e = err_of(ds.read, path)
    os.remove(path)
    assert.matches("^ds%-config: " .. path:gsub("%p", "%%%0") .. " is not a JSON object", e)
  end)
end)
