-- ZeRO-Offload (host tier): the optimizer state, and under stage 3 the
-- parameter shards, on the host; the same bits as without offload; memory
-- per tier as predicted; a model that does not fit on the device under
-- zero3 trains with offload.
local util = require "helpers.util"
local zt = require "ztrain"

local BASE = "model.size=gpt2-mini data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 " ..
             "train.eval_every=0 lr.warmup=1 optim.clip=0.05 -q"

local function run(args, base)
  local dir = util.outdir()
  local out, rc = util.sh(("timeout 120 build/ztrain %s %s out=%s"):format(args, base or BASE, dir))
  local s
  local losses = {}
  if rc == 0 then
    s = util.summary(dir)
    for _, m in ipairs(util.metrics(dir)) do losses[#losses + 1] = m.loss_hex end
  end
  util.rm(dir)
  return s, table.concat(losses, " "), out, rc
end

-- ref_run(args): run(args) once per spec run; a reference run serves every
-- case it is the reference of (zero2 and zero3 without offload at N = 1 and
-- 2: the host-tier and the nvme cases; zero3 N=2: prefetch and memory)
local refs = {}
local function ref_run(args)
  if not refs[args] then refs[args] = { run(args) } end
  return unpack(refs[args], 1, 4)
end

describe("offload: same math", function()
  -- small staging: every unit's shard streams through many chunks
  for _, n in ipairs({ 1, 2 }) do
    it(("zero1/2/3 with offload equal them without at N=%d, with accumulation"):format(n), function()
      local launch = n > 1 and ("--nproc " .. n .. " ") or ""
      for _, pair in ipairs({ { "zero1", "zero1_offload" }, { "zero2", "zero2_offload" },
                              { "zero3", "zero3_offload" } }) do
        local a, la, oa, ra = ref_run(launch .. "recipes/zero3.lua batch.accumulate=2 strategy=" .. pair[1])
        assert.are.equal(0, ra, oa)
        local b, lb, ob, rb = run(launch .. "recipes/zero3.lua batch.accumulate=2 offload.staging=64KiB strategy=" ..
                                  pair[2])
        assert.are.equal(0, rb, ob)
        assert.are.equal(pair[2], b.strategy)
        assert.are.equal(a.param_digest, b.param_digest, pair[2])
        assert.are.equal(la, lb, pair[2] .. " loss bits")
      end
    end)
  end
end)

-- the aio engines: at N=1 each that opens here (offload.aio_engine forces
-- it), at N=2 auto's choice; the summary names the engine that ran
local engines = require("ztrain.core.aio").engines()
local nvme_cases = {}
for _, e in ipairs(engines) do nvme_cases[#nvme_cases + 1] = { 1, e == "io_uring" and "uring" or "threads", e } end
nvme_cases[#nvme_cases + 1] = { 2, "auto", engines[1] }

describe("infinity (nvme): same math", function()
  for _, case in ipairs(nvme_cases) do
    local n, engine, want_engine = case[1], case[2], case[3]
    it(("zero3_infinity equals zero3, and zero2 with its optimizer on nvme equals zero2, at N=%d, aio %s"):format(
         n, engine), function()
      local launch = n > 1 and ("--nproc " .. n .. " ") or ""
      local dir = util.tmpdir()
      util.sh("mkdir -p " .. dir .. "/nvme")
      for _, pair in ipairs({ { "zero3", "zero3_infinity" },
                              { "zero2", 'zt.strategy.zero{stage=2,offload_optimizer="nvme"}' } }) do
        local a, la, oa, ra = ref_run(launch .. "recipes/zero3.lua batch.accumulate=2 strategy=" .. pair[1])
        assert.are.equal(0, ra, oa)
        -- checksums on, a staging pool small enough for many chunks per unit
        local recipe = dir .. "/r.lua"
        util.write(recipe, ('local zt = require "ztrain"; local r = dofile("recipes/zero3.lua"); ' ..
                            'r.strategy = %s; return r'):format(pair[2]:match("^zt") and pair[2] or ("%q"):format(pair[2])))
        local b, lb, ob, rb = run(("%s%s batch.accumulate=2 offload.staging=96KiB offload.checksum=true " ..
                                   "offload.nvme_path=%s/nvme offload.aio_engine=%s"):format(launch, recipe, dir, engine))
        assert.are.equal(0, rb, ob)
        assert.are.equal(want_engine, b.strategy_stats.offload.aio_engine, pair[2])
        -- the optimizer reads and writes every nvme byte once a step: what
        -- the tier holds (rank 0's, as counted by the allocator); the disk's
        -- busy time is part of the step, its depth at most the engine's
        local off, by = b.strategy_stats.offload, b.memory[1].by_category
        local held = (by.params.nvme or 0) + (by.optim.nvme or 0)
        assert.are.equal(held, off.nvme_read_bytes, pair[2] .. " bytes read")
        assert.are.equal(held, off.nvme_written_bytes, pair[2] .. " bytes written")
        assert.is_true(off.disk_busy_ms > 0 and off.disk_busy_ms <= off.optimizer_ms, pair[2] .. " busy")
        assert.is_true(off.disk_depth >= 1 and off.disk_depth <= off.aio_queue_depth,
                       pair[2] .. " depth " .. off.disk_depth)
        -- queue depth and block size "auto": the disk probe's, named in the summary
        assert.matches("nvme probe of", off.aio_probe, 1, true)
        assert.matches(off.aio_queue_depth .. " x ", off.aio_probe, 1, true)
        assert.is_true(off.aio_block_bytes >= 4096, pair[2] .. " block")
        assert.are.equal(a.param_digest, b.param_digest, pair[2])
        assert.are.equal(la, lb, pair[2] .. " loss bits")
        -- every swap file is gone at exit
        local left = util.sh("find " .. dir .. "/nvme -type f | wc -l")
        assert.are.equal("0", left:match("^(%d+)"), "swap files left behind")
      end
      util.rm(dir)
    end)
  end

  it("puts parameters and moments on the nvme tier as predicted, within 5%", function()
    local dir = util.tmpdir()
    local s, _, out, rc = run("--nproc 2 recipes/zero3.lua strategy=zero3_infinity offload.nvme_path=" .. dir)
    assert.are.equal(0, rc, out)
    for _, m in ipairs(s.memory) do
      for _, tier in ipairs({ "device", "host", "nvme" }) do
        for _, cat in ipairs({ "params", "grads", "optim" }) do
          local got, exp = m.by_category[cat][tier], s.predicted.tiers[tier][cat]
          local ok = (exp == 0 and got == 0) or (exp > 0 and math.abs(got - exp) / exp < 0.05)
          assert.is_true(ok, ("rank %d %s %s: measured %d, predicted %d"):format(m.rank, tier, cat, got, exp))
        end
      end
      assert.is_true(m.nvme_peak > 0)
    end
    util.rm(dir)
  end)

  it("a full disk stops the run with the path, ENOSPC and what to do, and leaves no file", function()
    local dir = util.tmpdir()
    local _, mrc = util.sh("mount -t tmpfs -o size=1m tmpfs " .. dir)
    if mrc ~= 0 then
      pending("cannot mount a small tmpfs here (needs root): ENOSPC not exercised")
      util.rm(dir)
      return
    end
    local _, _, out, rc = run("recipes/zero3.lua strategy=zero3_infinity offload.nvme_path=" .. dir)
    local left = util.sh("find " .. dir .. " -type f | wc -l")
    util.sh("umount " .. dir)
    util.rm(dir)
    assert.are.equal(1, rc, out)
    assert.matches(dir, out, 1, true)
    assert.matches("ENOSPC", out, 1, true)
    assert.matches("offload.nvme_path", out, 1, true)
    assert.are.equal("0", left:match("^(%d+)"), "swap files left on the full disk")
  end)

  it("swap files of a run killed mid-training are removed by the next run on the same path", function()
    local dir = util.tmpdir()
    local recipe = dir .. "/killed.lua"
    -- SIGKILL in the second step: no exit handler runs, the swap files stay
    util.write(recipe, [[
      local zt = require "ztrain"
      local ffi = require "ffi"
      ffi.cdef "int getpid(void); int kill(int pid, int sig);"
      local S = zt.strategy.zero { stage = 3, offload_optimizer = "nvme", offload_params = "nvme" }
      local step, n = S.step, 0
      S.step = function(ctx, lr)
        n = n + 1
        if n == 2 then ffi.C.kill(ffi.C.getpid(), 9) end
        return step(ctx, lr)
      end
      return { strategy = S, model = { size = "gpt2-mini" }, data = { seq_len = 32 }, batch = { micro = 2 },
               train = { steps = 5, eval_every = 0 } }
    ]])
    util.sh("mkdir -p " .. dir .. "/nvme")
    local out, rc = util.sh(("timeout 60 build/ztrain %s -q offload.nvme_path=%s/nvme out=%s/o1"):format(recipe, dir, dir))
    assert.are_not.equal(0, rc, out)
    local left = util.sh("find " .. dir .. "/nvme -name 'swap*' -type f | wc -l")
    assert.is_true(tonumber(left:match("^(%d+)")) > 0, "the killed run should have left its swap files")
    local s, _, out2, rc2 = run("recipes/zero3.lua strategy=zero3_infinity offload.nvme_path=" .. dir .. "/nvme")
    assert.are.equal(0, rc2, out2)
    local after = util.sh("find " .. dir .. "/nvme -name 'swap*' -type f | wc -l")
    assert.are.equal("0", after:match("^(%d+)"), "a dead run's swap files were not cleaned up")
    util.rm(dir)
  end)

  it("a missing nvme_path is an error, not a new directory", function()
    local missing = util.outdir() .. "/typo"
    local _, _, out, rc = run("recipes/zero3.lua strategy=zero3_infinity offload.nvme_path=" .. missing)
    assert.are.equal(1, rc, out)
    assert.matches("offload.nvme_path " .. missing .. " does not exist; create it", out, 1, true)
    assert.is_nil(io.open(missing), "the directory was created")
  end)

  it("a bad nvme_path stops the run with the path named", function()
    local f = os.tmpname()             -- a file, not a directory
    local _, _, out, rc = run("recipes/zero3.lua strategy=zero3_infinity offload.nvme_path=" .. f)
    os.remove(f)
    assert.are.equal(1, rc, out)
    assert.matches(f, out, 1, true)
    assert.is_nil(out:find("%.lua:%d+:"), "a user error, without a Lua location:\n" .. out)
  end)
end)

describe("offload: parameter prefetch", function()
  it("fetching 1, 2 or 4 units ahead from the host changes no bits", function()
    local ref, lref, o, rc = ref_run("--nproc 2 recipes/zero3.lua strategy=zero3")
    assert.are.equal(0, rc, o)
    for _, d in ipairs({ 1, 2, 4 }) do
      local s, l, out, rc2 = run("--nproc 2 recipes/zero3.lua strategy=zero3_offload offload.prefetch=" .. d)
      assert.are.equal(0, rc2, out)
      assert.are.equal(ref.param_digest, s.param_digest, "prefetch " .. d)
      assert.are.equal(lref, l)
    end
  end)
end)

describe("offload: memory", function()
  it("puts each term on the tier it predicts, within 5%, on every tier and rank", function()
    for _, strat in ipairs({ "zero2_offload", "zero3_offload", "zero3" }) do
      local s, _, out, rc = ref_run("--nproc 2 recipes/zero3.lua strategy=" .. strat)
      assert.are.equal(0, rc, out)
      for _, m in ipairs(s.memory) do
        for _, tier in ipairs({ "device", "host" }) do
          local want = s.predicted.tiers[tier]
          for _, cat in ipairs({ "params", "grads", "optim" }) do
            local got, exp = m.by_category[cat][tier], want[cat]
            local ok = (exp == 0 and got == 0) or (exp > 0 and math.abs(got - exp) / exp < 0.05)
            assert.is_true(ok, ("%s rank %d %s %s: measured %d, predicted %d"):format(strat, m.rank, tier, cat,
                                                                                        got, exp))
          end
        end
        -- the staging pool shows as host working memory, at its predicted size
        assert.are.equal(s.predicted.staging, m.by_category.comm.host, strat)
      end
    end
  end)

  it("a model that does not fit under zero3 trains under zero3_offload", function()
    local base = BASE:gsub("train.steps=3", "train.steps=2") .. " device.memory_limit=12MiB"
    local _, _, out, rc = run("recipes/zero3.lua", base)
    assert.are.equal(1, rc, out)
    assert.matches("device memory limit exceeded", out, 1, true)
    assert.matches("zero3_offload", out, 1, true)       -- the error says what to do
    local s, _, out2, rc2 = run("recipes/zero3.lua strategy=zero3_offload", base)
    assert.are.equal(0, rc2, out2)
    assert.is_true(s.memory[1].device_peak <= 12 * 2 ^ 20)
    assert.is_true(s.final_loss < s.first_loss)
  end)
end)

describe("offload: options", function()
  local function err(opts)
    local ok, e = pcall(zt.strategy.zero, opts)
    assert.is_false(ok)
    return tostring(e)
  end
  it("names what is wrong and what to do", function()
    assert.matches("offload_params needs stage 3", err({ stage = 2, offload_params = "host" }), 1, true)
    assert.matches('offload_params needs offload_optimizer too', err({ stage = 3, offload_params = "host" }), 1, true)
    assert.matches('offload_optimizer must be "none", "host" or "nvme", got gpu', err({ stage = 1, offload_optimizer = "gpu" }),
                   1, true)
    local r, e = zt.recipe.resolve({}, { "offload.staging=lots" })
    assert.is_table(r)       -- a size string is only read when a strategy offloads
    local ok, e2 = pcall(require("ztrain.parallel.strategy.offload").staging_bytes, r)
    assert.is_false(ok)
    assert.matches('offload.staging: cannot read size "lots"', tostring(e2), 1, true)
  end)
end)

describe("offload: the nvme keys", function()
  local TINY = "model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.eval_every=0 " ..
               "train.steps=2 -q"

  it("a bad block size, queue depth or engine is refused naming the key, and OUT/nvme is not left", function()
    for _, c in ipairs({
      { "offload.block_size=3", "offload.block_size must be a multiple of 4096 bytes" },
      { "offload.block_size=512MiB", "offload.block_size must be a multiple of 4096 bytes (4KiB) up to 256MiB" },
      { "offload.block_size=abc", 'offload.block_size: cannot read size "abc"' },
      -- (the recipe's range is the engine's limit: refused before the run starts)
      { "offload.queue_depth=300", 'offload.queue_depth must be an integer in [1, 256] or "auto", got 300' },
      { "offload.aio_engine=foo", 'offload.aio_engine must be "auto", "uring" or "threads", got foo' },
    }) do
      local dir = util.tmpdir()          -- made before: the run leaves it, and must leave it as it was
      local out, rc = util.sh(("timeout 120 build/ztrain recipes/infinity.lua %s launch.nproc=1 %s out=%s")
                              :format(TINY, c[1], dir))
      local left = io.open(dir .. "/nvme")
      if left then left:close() end
      util.rm(dir)
      assert.are.equal(1, rc, out)
      assert.matches("ztrain: ", out, 1, true)
      assert.matches(c[2], out, 1, true)
      for _, bad in ipairs({ "nvme_path", "zt_aio", "aio.configure", "[EINVAL]" }) do
        assert.is_nil(out:find(bad, 1, true), c[1] .. ": " .. out)
      end
      assert.is_nil(left, c[1] .. ": an empty " .. dir .. "/nvme was left")
    end
    -- offload.aio_engine "auto" defers to $ZTRAIN_AIO_ENGINE: a bad one is named as such
    local dir = util.tmpdir()
    local out, rc = util.sh(("ZTRAIN_AIO_ENGINE=bogus timeout 120 build/ztrain recipes/infinity.lua %s launch.nproc=1 " ..
                             "out=%s"):format(TINY, dir))
    local left = io.open(dir .. "/nvme")
    if left then left:close() end
    util.rm(dir)
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: ZTRAIN_AIO_ENGINE=bogus is not an engine: use auto, uring or threads", out, 1, true)
    assert.is_nil(out:find("nvme_path", 1, true), out)
    assert.is_nil(left, "an empty " .. dir .. "/nvme was left")
  end)

  it("a swap directory the engine cannot use is removed if the run made it, kept if it was there", function()
    local offload, aio = require "ztrain.parallel.strategy.offload", require "ztrain.core.aio"
    local configure = aio.configure
    aio.configure = function() error("aio.configure: zt_aio_open: cannot open the swap file: Permission denied [EACCES]", 0) end
    local r = { offload = { block_size = "1MiB", queue_depth = 8, stripes = 1 } }
    local made, there = util.tmpdir(), util.tmpdir()
    util.sh("mkdir " .. there .. "/nvme")
    local ok1, e1 = pcall(offload.configure_nvme, r, made)
    local ok2 = pcall(offload.configure_nvme, r, there)
    aio.configure = configure
    local gone, kept = io.open(made .. "/nvme") == nil, io.open(there .. "/nvme") ~= nil
    util.rm(made); util.rm(there)
    assert.is_false(ok1); assert.is_false(ok2)
    assert.are.equal(("offload.nvme_path=%s/nvme: cannot open the swap file: Permission denied"):format(made),
                     tostring(e1))
    assert.is_true(gone, "OUT/nvme made by the run was left")
    assert.is_true(kept, "a directory that was there was removed")
  end)
end)
