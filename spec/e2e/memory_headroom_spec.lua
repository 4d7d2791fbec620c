-- Pre-flight with headroom (issue 30 item 2): without device.memory_limit a
-- run may plan to fill device.memory_fraction (0.9) of MemAvailable, less
-- what its process holds beyond its tensors (measured RSS); a memory limit
-- under one page is refused, not read as "no limit"; every [ELIMIT] ends
-- with what to change. Checked on the pre-flight's answer against a stated
-- MemAvailable, on this process's RSS as ps(1) reports it, and on the exit
-- status and message of real runs.
local u = require "spec.helpers.util"
local zt = require "ztrain"
local plan = require "ztrain.plan"
local pre = require "ztrain.plan.preflight"
local strategy = require "ztrain.parallel.strategy"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local TINY = "recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes train.steps=1 train.eval_every=0 -q"

-- the pre-flight of recipe r against a MemAvailable of `avail` bytes
local function preflight(r, avail)
  local saved = plan.available
  plan.available = function() return avail end
  local ok, res = pcall(pre.check, { recipe = r, strategy = strategy.resolve(r.strategy),
                                          cfg = plan.model_config(r), nproc = 1, local_ranks = 1 })
  plan.available = saved
  assert(ok, res)
  return res
end

local function need(r)
  local t = plan.totals(plan.predict(r, { nproc = 1 }))
  return t.device + t.host
end

describe("pre-flight headroom", function()
  it("refuses a prediction at 95% of MemAvailable, takes one at 80%", function()
    local r = assert(zt.recipe.load("recipes/single.lua", { "model.size=gpt2-mini" }))
    local P = need(r)
    local msg = preflight(r, math.floor(P / 0.95))
    assert.is_string(msg)
    assert.matches("not enough memory (predicted before the run)", msg, 1, true)
    assert.matches("x device.memory_fraction = 0.9 over 1 local rank(s), less ", msg, 1, true)
    assert.matches("raise device.memory_fraction (at most 1) or set device.memory_limit", msg, 1, true)
    -- the overhead taken off is this process's own (code, libraries, the Lua
    -- heap: a few MiB for a run, more inside a spec runner that has loaded
    -- every spec): room for it, and 16 MiB for what it grows meanwhile
    local room = require("ztrain.plan.headroom").overhead() + 16 * 2 ^ 20
    assert.is_nil(preflight(r, math.floor(P / 0.8) + room))
    -- the key moves the line: at 0.99, 95% fits (with the overhead's room)
    local r99 = assert(zt.recipe.load("recipes/single.lua", { "model.size=gpt2-mini", "device.memory_fraction=0.99" }))
    assert.is_nil(preflight(r99, math.floor((P + room) / 0.99) + 2 ^ 20))
  end)

  it("takes this process's own overhead off a rank's share: RSS as ps(1) sees it, less the tensors", function()
    local headroom = require "ztrain.plan.headroom"   -- (here: the module is new)
    local r = assert(zt.recipe.load("recipes/single.lua", {}))
    local avail = 64 * 2 ^ 30
    local share, over = headroom.share(r, avail, 2)
    -- ps reads the RSS of the shell's parent: this process
    local kb = tonumber(io.popen("ps -o rss= -p $PPID"):read("*l"))
    local rss = kb * 1024
    local tensors = zt.memory.current("device") + zt.memory.current("host")
    assert.is_true(over > 1 * 2 ^ 20, "overhead " .. over)
    assert.is_true(math.abs(over - (rss - tensors)) < 8 * 2 ^ 20, ("overhead %d, ps %d"):format(over, rss - tensors))
    assert.are.equal(math.floor(avail * 0.9 / 2) - over, share)
    -- `ztrain plan` says so
    local out, rc = u.sh(ZT .. " plan recipes/single.lua")
    assert.are.equal(0, rc, out)
    assert.matches("limit per rank: [%d.]+ %a+ %(MemAvailable [%d.]+ %a+ in /proc/meminfo x device.memory_fraction = " ..
                   "0.9 over 1 local rank%(s%), less [%d.]+ %a+ this process holds beyond its tensors", out)
  end)

  it("a run refused by the fraction, then accepted when device.memory_fraction is raised", function()
    local r = assert(zt.recipe.load("recipes/single.lua", { "model.size=gpt2-tiny", "data.tokenizer=bytes" }))
    local P, avail = need(r), plan.available()
    if not avail then pending("no MemAvailable here"); return end
    -- the share is P less the overhead (~10-30 MiB): refused, though P itself fits
    local frac = P / avail
    local d = u.outdir()
    local out, rc = u.sh(("%s %s device.memory_fraction=%.9f out=%s"):format(ZT, TINY, frac, d))
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: not enough memory %(predicted before the run%): gpt2%-tiny under single needs [%d.]+ %a+ " ..
                   "per rank %(params .-%), but each rank has [%d.]+ %a+ %(MemAvailable [%d.]+ %a+ in /proc/meminfo " ..
                   "x device%.memory_fraction = [%d.e%-]+ over 1 local rank%(s%), less [%d.]+ %a+ this process " ..
                   "holds beyond its tensors: code, data, Lua heap%); .-, or raise device%.memory_fraction " ..
                   "%(at most 1%) or set device%.memory_limit to try anyway %(`ztrain plan ", out)
    assert.not_matches("%.lua:%d+:", out)
    -- room for the prediction and 300 MiB more: it runs
    local d2 = u.outdir()
    out, rc = u.sh(("%s %s device.memory_fraction=%.9f out=%s"):format(ZT, TINY, (P + 300 * 2 ^ 20) / avail, d2))
    assert.are.equal(0, rc, out)
    u.rm(d); u.rm(d2)
  end)
end)

-- refused(args) -> the output of a 2-rank run of args with a share of
-- 1e-06 of MemAvailable: exit status 1, one message (the pattern `said`
-- once), no MPI abort, no summary written
local function refused(args, said)
  local d = u.outdir()
  local env, mpi = u.mpi_log()
  local out, rc = u.sh(("%s%s --nproc 2 %s train.steps=1 -q device.memory_fraction=0.000001 out=%s")
                       :format(env, ZT, args, d))
  assert.are.equal(1, rc, out)
  local _, n = out:gsub(said, "")
  assert.are.equal(1, n, out)
  assert.not_matches("MPI_ABORT", out .. mpi())
  assert.is_nil(io.open(d .. "/summary.json"))
  return out
end

-- a strategy of one's own without a memory model (S.footprint): the
-- model-state bytes its S.predicted says, against the same share
describe("a strategy without a memory model: the model-state check", function()
  it("takes the same headroom, and every rank stops together with one message", function()
    local out = refused("examples/diloco.lua",
      "ztrain: gpt2%-tiny with diloco needs [%d.]+ %a+ of model state per rank, but each rank has 0 B %(MemAvailable " ..
      "[%d.]+ %a+ in /proc/meminfo x device.memory_fraction = 1e%-06 over 2 local rank%(s%), less [%d.]+ %a+ this " ..
      "process holds beyond its tensors")
    assert.matches(" this process holds beyond its tensors: code, data, Lua heap): use a smaller model.size, zero3 " ..
                   "with more ranks, raise device.memory_fraction (at most 1), or set device.memory_limit to try anyway",
                   out, 1, true)
  end)
end)

-- (until the planner predicted pipelines, they were checked on model state
-- only: the activation sets in flight went unchecked)
describe("pipelines: the pre-flight predicts them as they run", function()
  it("takes the same headroom, and every rank stops together with one message", function()
    local out = refused("recipes/pipeline_1f1b.lua model.size=gpt2-tiny data.tokenizer=bytes",
      "ztrain: not enough memory %(predicted before the run%): gpt2%-tiny under single, 2 pipeline stages %(the " ..
      "heaviest rank%) needs [%d.]+ %a+ per rank %(params [^)]*activations [%d.]+ %a+, working 4 B; h = host, n = " ..
      "nvme%), but each rank has 0 B %(MemAvailable [%d.]+ %a+ in /proc/meminfo x device.memory_fraction = 1e%-06 " ..
      "over 2 local rank%(s%), less [%d.]+ %a+ this process holds beyond its tensors")
    assert.matches("use more pipeline.stages, train.checkpoint_activations=true, or a schedule that keeps fewer " ..
                   "activation sets (`ztrain schedule` prints them), lower batch.micro or data.seq_len", out, 1, true)
  end)
end)

-- the alternatives a refused pipeline is offered: each strategy's heaviest
-- rank by what the limit is compared with, fewest bytes first; checked
-- against the ranks' predictions summed here, the tiers by hand
describe("pipelines: the alternatives offered", function()
  it("take each strategy's heaviest rank by the limit's measure, fewest bytes first", function()
    -- (4 stages: the heaviest is the second, not the first; host bytes 0 in
    -- both measures, so they agree here: a pipeline's strategies keep no
    -- state on the host)
    local r = assert(zt.recipe.load("recipes/pipeline_1f1b.lua",
                                    { "model.size=gpt2-tiny", "data.tokenizer=bytes", "pipeline.stages=4" }))
    local cfg, world = plan.model_config(r), 2 * r.pipeline.stages
    local spec = plan.spec_of(r.strategy)
    -- explicit: the device tier alone; else, on the CPU: device + host
    for _, case in ipairs({ { explicit = true }, { explicit = false } }) do
      local function bytes(t, tier)
        local n = 0
        for _, v in pairs(t[tier]) do n = n + v end
        return n
      end
      local function sum(t)
        return case.explicit and bytes(t, "device") or bytes(t, "device") + bytes(t, "host")
      end
      local want, most_of = {}, {}
      for _, name in ipairs({ "dp", "zero1", "zero2" }) do
        if name ~= spec.name then
          local _, _, ranks = plan.predict(r, { spec = plan.spec_of(name), nproc = world, cfg = cfg })
          assert.are.equal(r.pipeline.stages, #ranks, name .. ": one prediction a stage")
          local most = 0
          for _, t in ipairs(ranks) do most = math.max(most, sum(t)) end
          want[#want + 1], most_of[name] = most, most
        end
      end
      table.sort(want)
      -- a limit every alternative fits: all, fewest bytes first
      local alts = pre.pipeline_alternatives(r, spec, world, cfg, want[#want], case.explicit)
      assert.are.equal(#want, #alts, "all fit")
      for i, a in ipairs(alts) do
        assert.are.equal(most_of[a.name], sum(a.t), a.name .. ": its heaviest rank")
        assert.are.equal(want[i], sum(a.t), "order " .. i)
      end
      -- a limit under the lightest: none
      assert.are.same({}, pre.pipeline_alternatives(r, spec, world, cfg, want[1] - 1, case.explicit))
    end
  end)
end)

describe("device.memory_limit below one page", function()
  for _, v in ipairs({ "0.5", "0.0000001KiB", "1KiB" }) do
    it(v .. " is refused naming the key, not read as no limit", function()
      local d = u.outdir()
      local out, rc = u.sh(("%s %s device.memory_limit=%s out=%s"):format(ZT, TINY, v, d))
      assert.are.equal(1, rc, out)
      assert.matches(("ztrain: recipes/single.lua: device.memory_limit: %q is "):format(v), out, 1, true)
      assert.matches(" bytes, not 0 (no limit) and below one page (4096 bytes): give a size such as 2GiB, or 0 for " ..
                     "no limit", out, 1, true)
      assert.is_nil(io.open(d .. "/summary.json"))
    end)
  end

  it("0 is no limit, 4096 a limit", function()
    assert.are.equal(0, zt.memory.parse_limit("0"))
    assert.are.equal(0, zt.memory.parse_limit(0))
    assert.are.equal(4096, zt.memory.parse_limit("4KiB"))
    assert.is_nil((zt.memory.parse_limit(4095)))
  end)
end)

describe("[ELIMIT] says what to change", function()
  -- (the runtime's own check, core.ffi's: a strategy of one's own without a
  -- memory model is checked on its model state, 14.5 MiB here; its first
  -- forward's activations then pass the limit. A planned strategy at its
  -- predicted peak did once on an AMX machine, bf16's step 96 KiB over the
  -- prediction, and not on others: not a test that can fail everywhere.)
  it("a limit the pre-flight passes but the run exceeds (the activations past a model-state check)", function()
    local d = u.outdir()
    local out, rc = u.sh(("%s examples/diloco.lua train.steps=2 -q device.memory_limit=16MiB out=%s"):format(ZT, d))
    assert.are.equal(1, rc, out)
    assert.matches("device memory limit exceeded: requested [%d.]+ %a+ for activations", out)
    assert.matches("[ELIMIT]; raise device.memory_limit, lower batch.micro, data.seq_len or model.size, or move " ..
                   "model state off the device (strategy=zero3_offload", out, 1, true)
    local _, n = out:gsub("raise device.memory_limit", "")
    assert.are.equal(1, n, out)                 -- said once
    assert.is_nil(io.open(d .. "/summary.json"))
    u.rm(d)
  end)

  it("every ELIMIT the runtime raises through core.ffi's check carries the remedy", function()
    zt.memory.set_limit("device", zt.memory.current("device") + 4096)
    local ok, err = pcall(zt.tensor.new, { 1024, 1024 })
    zt.memory.set_limit("device", 0)
    assert.is_false(ok)
    assert.matches("[ELIMIT]; raise device.memory_limit", tostring(err), 1, true)
  end)
end)
