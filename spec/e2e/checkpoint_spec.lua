-- Checkpoints (lua/ztrain/train/checkpoint/init.lua, train.ckpt_every, resume=): a
-- run killed with SIGKILL -- at any moment, also in the middle of writing a
-- checkpoint -- resumes from `latest` to the digest and per-step loss bits
-- of a run never interrupted; a checkpoint saved by one strategy and world
-- size loads into another (reading only each rank's ranges); damaged
-- checkpoints are named and refused; a full disk keeps the previous one.
local cjson = require "cjson"
local util = require "helpers.util"

local BASE = "model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 train.log_every=1 " ..
             "train.eval_every=0 lr.warmup=2 optim.clip=0.05 -q"

local summary = util.summary
-- per-step loss bits of a run: { [step] = hex }, and the values
local function losses(dir)
  local out, val = {}, {}
  for _, m in ipairs(util.metrics(dir)) do out[m.step], val[m.step] = m.loss_hex, m.loss end
  return out, val
end

-- after: overrides that come after BASE's
local function run(args, dir, timeout, after)
  local out, rc = util.sh(("timeout %d build/ztrain %s %s %s out=%s"):format(timeout or 120, args, BASE, after or "",
                                                                       dir))
  assert.are.equal(0, rc, args .. "\n" .. out)
  return summary(dir)
end

-- start a run in the background (its own session), wait until its first
-- checkpoint is complete (`latest` exists), then `delay` seconds more, and
-- kill it with SIGKILL (however loaded the machine, a checkpoint exists).
-- The whole session: under --nproc, mpirun and the ranks run in a process
-- group of their own, and a launcher killed alone ends the job through
-- mpirun (SIGTERM to the ranks after 1 s: a graceful stop, not a kill)
local function run_and_kill(args, dir, delay, after)
  local pidfile = os.tmpname()
  util.sh(("setsid sh -c 'echo $$ > %s; exec timeout 120 build/ztrain %s %s %s out=%s' > /dev/null 2>&1 &")
          :format(pidfile, args, BASE, after or "", dir))
  local pid
  for _ = 1, 200 do
    local s = util.read(pidfile)
    pid = tonumber(s:match("%d+"))
    if pid then break end
    util.sh("sleep 0.05")
  end
  assert(pid, "the run did not start")
  util.sh(("for i in $(seq 600); do [ -e %s/checkpoints/latest ] && break; sleep 0.1; done"):format(dir))
  util.sh(("sleep %.3f"):format(delay))
  util.sh(("pkill -KILL -s %d"):format(pid))  -- launcher, mpirun and ranks at once
  -- until none is left but zombies (an orphan's reaper may be slow)
  util.sh(("while ps -o stat= -s %d | grep -qv '^Z'; do sleep 0.05; done"):format(pid))
  os.remove(pidfile)
end

describe("checkpoints", function()
  -- { name, launch args }: the strategy families of the issue
  local CASES = {
    { "dp", "--nproc 2 recipes/dp.lua" },
    { "zero3", "--nproc 2 recipes/zero3.lua" },
    { "zero3_offload", "--nproc 2 recipes/zero3_offload.lua data.tokenizer=bytes model.size=gpt2-tiny" },
    { "1f1b", "--nproc 2 recipes/pipeline_1f1b.lua model.size=gpt2-tiny" },
    { "infinity (nvme)", "--nproc 2 recipes/infinity.lua data.tokenizer=bytes" },
    { "zbv", "--nproc 2 recipes/pipeline_zbv.lua" },
    { "zero1 bf16", "--nproc 2 recipes/zero1.lua precision=bf16" },
  }
  for _, c in ipairs(CASES) do
    it(c[1] .. ": killed with SIGKILL, resumed from latest, equals the uninterrupted run bit for bit", function()
      -- a model slow enough that the kill lands mid-run (it lands 0.05 s
      -- after the first checkpoint: step 1 or 2 of 12; 30 steps took the
      -- suite ~73 s over the eight cases)
      local steps, M = 12, "model.size=gpt2-mini data.seq_len=64"
      local ref = util.outdir()
      local s0 = run(c[2] .. " train.steps=" .. steps, ref, nil, M)
      local l0 = losses(ref)
      local dir = util.outdir()
      -- a checkpoint every step; killed as the first appears
      run_and_kill(c[2] .. (" train.steps=%d train.ckpt_every=1"):format(steps), dir, 0.05, M)
      local s1 = run(c[2] .. (" train.steps=%d train.ckpt_every=1 resume=latest"):format(steps), dir, nil, M)
      assert.are.equal(s0.param_digest, s1.param_digest)
      assert.is_table(s1.resumed, "the second run resumed")
      assert.is_true(s1.resumed.step < steps, "killed before the end (resumed at step " .. s1.resumed.step .. ")")
      local l1 = losses(dir)
      for step = s1.resumed.step + 1, steps do
        assert.are.equal(l0[step], l1[step], c[1] .. " step " .. step)
      end
      util.rm(ref); util.rm(dir)
    end)
  end

  it("SIGKILL at random moments while checkpoints are written: latest always loads and resumes exactly", function()
    local args = "recipes/single.lua model.size=gpt2-mini train.steps=30 train.ckpt_every=1 train.ckpt_keep=3"
    local M = "data.seq_len=128 batch.micro=8"       -- slow enough that kills land mid-run
    local ref = util.outdir()
    local s0 = run(args, ref, nil, M)
    math.randomseed(os.time())
    local mid = 0
    for k = 1, 3 do
      local dir = util.outdir()
      local delay = math.random() * 1.0
      run_and_kill(args, dir, delay, M)
      -- a run that finished before the kill wrote its summary
      local finished = io.open(dir .. "/summary.json") and summary(dir)
      local out, rc = util.sh(("timeout 120 build/ztrain %s %s %s resume=latest out=%s"):format(args, BASE, M, dir))
      if not finished and rc == 1 and out:find("nothing is left to train", 1, true) then
        -- killed between its last checkpoint (step 30) and its summary: nothing to resume
        assert.matches("is at step 30", out, 1, true)
      elseif finished then
        -- resuming a finished run is refused; its own digest is the uninterrupted one
        assert.are.equal(1, rc, out)
        assert.matches("nothing is left to train", out, 1, true)
        assert.are.equal(s0.param_digest, finished.param_digest, ("kill %d after %.2f s"):format(k, delay))
      else
        assert.are.equal(0, rc, out)
        local s1 = summary(dir)
        assert.are.equal(s0.param_digest, s1.param_digest, ("kill %d after %.2f s"):format(k, delay))
        if s1.resumed.step < 30 then mid = mid + 1 end
      end
      -- no stale temporary directory survives the next save, and at most keep=3 remain
      local ls = util.sh("ls -a " .. dir .. "/checkpoints")
      assert.is_nil(ls:find("%.tmp"), ls)
      local n = 0
      for _ in ls:gmatch("step%-%d+") do n = n + 1 end
      assert.is_true(n <= 3, ls)
      util.rm(dir)
    end
    assert.is_true(mid >= 1, "at least one kill landed before the run's end")
    util.rm(ref)
  end)

  it("keeps a manifest with the layout, per-file checksums, and only the newest ckpt_keep", function()
    local dir = util.outdir()
    run("recipes/single.lua train.steps=5 train.ckpt_every=1 train.ckpt_keep=2", dir)
    local root = dir .. "/checkpoints"
    assert.are.equal("step-00000005", util.read(root .. "/latest"):match("%S+"))
    local ls = util.sh("ls " .. root)
    assert.is_nil(ls:find("step-00000003", 1, true), ls)
    assert.truthy(ls:find("step-00000004", 1, true), ls)
    local man = cjson.decode(util.read(root .. "/step-00000005/manifest.json"))
    assert.are.equal("ztrain-checkpoint", man.format)
    assert.are.equal(5, man.step)
    assert.are.equal(1, #man.files)
    assert.are.equal(64, #man.files[1].blocks_sha256)
    assert.are.equal("embed", man.model.units[1].name)
    -- every kind but gradients, for every unit
    local idx = cjson.decode(util.read(root .. "/step-00000005/rank-00000.json"))
    local kinds = {}
    for _, e in ipairs(idx.entries) do kinds[e.kind] = true end
    assert.is_true(kinds.params and kinds.exp_avg and kinds.exp_avg_sq and not kinds.grads)
    util.rm(dir)
  end)

  -- Resharding: the saved state goes to whoever holds each range now. Bits
  -- equal where the summation order is the same: N ranks x 1 micro-batch
  -- = 1 rank accumulating N (a 2-stage pipeline accumulating m = one rank
  -- accumulating m). zero3 on 4 ranks -> zero1 on 2 ranks accumulating 2
  -- keeps the global batch and data order but sums (b0+b1)+(b2+b3) instead
  -- of ((b0+b1)+b2)+b3, so that case is checked to resume and go on training
  -- from the saved state, not for bits.
  it("a checkpoint saved by zero3 on 4 ranks or a 2-stage pipeline resumes elsewhere", function()
    local function save(args, steps_total, at)
      local dir = util.outdir()
      run(args .. (" train.steps=%d train.ckpt_every=%d"):format(steps_total, at), dir)
      return dir .. "/checkpoints/step-" .. ("%08d"):format(at)
    end
    -- zero3 N=4 -> single accumulating 4: the uninterrupted single run's bits
    local ref = util.outdir()
    local s0 = run("recipes/single.lua batch.accumulate=4 train.steps=6", ref)
    local ck = save("--nproc 4 recipes/zero3.lua", 6, 3)
    local dir = util.outdir()
    local s1 = run("recipes/single.lua batch.accumulate=4 train.steps=6 resume=" .. ck, dir)
    assert.are.equal(s0.param_digest, s1.param_digest, "zero3 N=4 -> single")
    -- 2-stage 1F1B -> single
    local ck2 = save("--nproc 2 recipes/single.lua batch.accumulate=4 pipeline.stages=2 schedule=1f1b", 6, 3)
    local dir2 = util.outdir()
    local s2 = run("recipes/single.lua batch.accumulate=4 train.steps=6 resume=" .. ck2, dir2)
    assert.are.equal(s0.param_digest, s2.param_digest, "pipeline -> single")
    -- 2-stage 1F1B -> dp on 4 ranks (4 x 1 micro-batch: the same sum as 1 x 4)
    local dir4 = util.outdir()
    local s4 = run("--nproc 4 recipes/dp.lua train.steps=6 resume=" .. ck2, dir4)
    assert.are.equal(s0.param_digest, s4.param_digest, "pipeline -> dp")
    util.rm(dir4)
    -- zero3 N=4 -> zero1 N=2 accumulating 2: loads, and the first step after it
    -- starts from the saved parameters (its loss equals the saved run's next)
    local dir3 = util.outdir()
    local s3 = run("--nproc 2 recipes/zero1.lua batch.accumulate=2 train.steps=6 resume=" .. ck, dir3)
    assert.are.equal(3, s3.resumed.step)
    assert.are.equal(3, #(function() local t = {} for k in pairs(losses(dir3)) do t[#t + 1] = k end return t end)())
    local l4 = select(2, losses(ref))[4]
    local got = select(2, losses(dir3))[4]
    assert.is_true(math.abs(l4 - got) < 1e-5, l4 .. " vs " .. got)
    for _, d in ipairs({ ref, dir, dir2, dir3, ck:match("^(.*)/checkpoints"), ck2:match("^(.*)/checkpoints") }) do
      util.rm(d)
    end
  end)

  it("ztrain export: a zero3 checkpoint on 2 ranks becomes a Hugging Face directory with the run's digest", function()
    local dir = util.outdir()
    local s = run("--nproc 2 recipes/zero3.lua train.steps=3 train.ckpt_every=3", dir, nil, "data.tokenizer=bpe")
    local hf = util.outdir()
    local out, rc = util.sh(("build/ztrain export %s/checkpoints %s"):format(dir, hf))
    assert.are.equal(0, rc, out)
    for _, f in ipairs({ "config.json", "model.safetensors", "vocab.json", "merges.txt" }) do
      assert.is_truthy(io.open(hf .. "/" .. f), f)
    end
    -- loaded back with a learning rate of 0: the parameters are the run's
    local s2 = run(("recipes/single.lua model=hf:%s optim.lr=0 train.steps=1"):format(hf), util.outdir(), nil,
                   "data.tokenizer=bpe")
    assert.are.equal(s.param_digest, s2.param_digest)
    local bad, brc = util.sh(("build/ztrain export %s/nowhere %s.x"):format(dir, hf))
    assert.are.equal(1, brc, bad)
    assert.matches("is neither a checkpoint", bad, 1, true)
    -- an export replaces nothing: a directory that holds anything is refused, untouched
    local again, arc = util.sh(("build/ztrain export %s/checkpoints %s"):format(dir, hf))
    assert.are.equal(1, arc, again)
    assert.matches("is not empty (it holds", again, 1, true)
    util.rm(dir); util.rm(hf)
  end)

  describe("refuses a damaged or mismatched checkpoint, naming it", function()
    -- { title, damage done to a copy of a zero3 checkpoint (nil: resume the
    -- one saved at model.vocab_size=300, as it is), overrides, message }.
    -- Every case's resume is launched together in setup and each `it` checks
    -- its own: a resume stops at its first check, then mpirun takes about a
    -- second to end the failed job (one after another 13 s, together 5 s)
    local CASES = {
      { "a flipped byte: the file and block that fail their checksum",
        function(d) util.sh(("printf '\\001' | dd of=%s/rank-00001.bin bs=1 seek=100 conv=notrunc 2>/dev/null")
                            :format(d)) end, nil, "rank-00001.bin block 0 (bytes 0.." },
      { "a truncated file", function(d) util.sh("truncate -s 1000 " .. d .. "/rank-00000.bin") end, nil,
        { "rank-00000.bin is truncated or unreadable at block 0 (bytes 0..", "bytes); resume from an older checkpoint" } },
      { "a missing shard", function(d) util.sh("rm " .. d .. "/rank-00001.bin") end, nil, "cannot open rank-00001.bin" },
      { "a checkpoint of another model size", function() end, "model.size=gpt2-mini",
        "but this run's model has 4, 128, 4 and 256" },
      { "something that is not a checkpoint", function(d) util.sh("rm " .. d .. "/manifest.json") end, nil,
        "is neither a checkpoint" },
      -- saved with bytes at model.vocab_size=300; resumed with a 270-token BPE at 300
      { "a checkpoint of another tokenizer with the same vocabulary size", nil,
        "model.vocab_size=300 data.tokenizer=bpe:spec/fixtures/bpe/tiny",
        'was trained with data.tokenizer = "bytes", this run uses "bpe:spec/fixtures/bpe/tiny"' },
      { "a checkpoint at or past train.steps", function() end, "train.steps=2",
        "is at step 2 and train.steps is 2: nothing is left to train" },
    }
    local dirs, got, mpi_text = {}, {}, {}
    setup(function()
      local dir = util.outdir()
      run("--nproc 2 recipes/zero3.lua train.steps=2 train.ckpt_every=2", dir)
      local ck = dir .. "/checkpoints/step-00000002"
      local d300 = util.outdir()
      run("--nproc 2 recipes/zero3.lua train.steps=2 train.ckpt_every=2", d300, nil, "model.vocab_size=300")
      local logs, jobs = util.tmpdir(), {}
      dirs = { dir, d300, logs }
      local function launch(k, cmd)
        jobs[#jobs + 1] = ("(ZTRAIN_MPI_LOG=%s/mpi%s timeout 60 %s > %s/%s 2>&1; echo \"rc=$?\" >> %s/%s) &")
                          :format(logs, k, cmd, logs, k, logs, k)
      end
      for i, c in ipairs(CASES) do
        local resume = d300 .. "/checkpoints"
        if c[2] then
          local copy = util.tmpdir()
          dirs[#dirs + 1] = copy
          util.sh(("cp -r %s %s/ck"):format(ck, copy))
          c[2](copy .. "/ck")
          resume = copy .. "/ck"
        end
        launch(i, ("build/ztrain --nproc 2 recipes/zero3.lua train.steps=3 %s %s resume=%s out=%s")
                  :format(BASE, c[3] or "", resume, util.outdir()))
      end
      util.sh(table.concat(jobs, "\n") .. "\nwait")
      for i = 1, #CASES do
        -- the terminal's text, then Open MPI's own (job/launch.lua keeps it out of the terminal)
        local f = io.open(("%s/mpi%d"):format(logs, i))
        got[i] = util.read(logs .. "/" .. i)
        mpi_text[i] = f and f:read("*a") or ""
        if f then f:close() end
      end
    end)
    teardown(function() for _, d in ipairs(dirs) do util.rm(d) end end)

    for i, c in ipairs(CASES) do
      it(c[1], function()
        local out = got[i]
        assert.are.equal(1, tonumber(out:match("rc=(%d+)%s*$")), out)
        for _, want in ipairs(type(c[4]) == "table" and c[4] or { c[4] }) do assert.matches(want, out, 1, true) end
        assert.is_nil((out .. mpi_text[i]):find("MPI_ABORT", 1, true), out .. mpi_text[i])
        assert.is_nil(out:find("%.lua:%d+"), "no Lua location in a user error: " .. out)
      end)
    end
  end)

  it("a checkpoint directory that cannot be written stops the run before it trains, saying why", function()
    local mnt = util.tmpdir()
    local _, mrc = util.sh("mount -t tmpfs -o size=1m,ro tmpfs " .. mnt)
    if mrc ~= 0 then pending("cannot mount a read-only tmpfs here (needs root)"); return end
    local dir = util.outdir()
    local out, rc = util.sh(("timeout 60 build/ztrain recipes/single.lua train.steps=3 train.ckpt_every=1 " ..
                             "train.ckpt_dir=%s/ck %s out=%s"):format(mnt, BASE, dir))
    util.sh("umount " .. mnt)
    assert.are.equal(1, rc, out)
    assert.matches("train.ckpt_dir: cannot create output directory " .. mnt .. "/ck: Read-only file system; " ..
                   "choose another train.ckpt_dir", out, 1, true)
    local m = io.open(dir .. "/metrics.jsonl")
    assert.is_true(m == nil or m:read("*a") == "", "no step was trained")
    if m then m:close() end
    util.rm(mnt); util.rm(dir)
  end)

  it("a full disk while writing: a clear error, the previous checkpoint and latest intact", function()
    local mnt = util.tmpdir()
    local _, mrc = util.sh("mount -t tmpfs -o size=2m tmpfs " .. mnt)
    if mrc ~= 0 then
      pending("cannot mount a small tmpfs here (needs root): the full disk is not exercised")
      return
    end
    local dir = util.outdir()
    -- gpt2-tiny's state is ~1 MiB a checkpoint: the second or third fills 2 MiB
    local out, rc = util.sh(("timeout 120 build/ztrain recipes/single.lua train.steps=6 train.ckpt_every=1 " ..
                             "train.ckpt_keep=5 train.ckpt_dir=%s %s out=%s"):format(mnt, BASE, dir))
    assert.are.equal(3, rc, out)          -- an unwritable output (docs/errors.md)
    assert.matches("No space left on device", out, 1, true)
    assert.matches("the previous checkpoint is intact", out, 1, true)
    local latest = util.read(mnt .. "/latest"):match("%S+")
    local ls = util.sh("ls -a " .. mnt)
    assert.is_nil(ls:find("%.tmp"), "the failed checkpoint's temporary directory is gone: " .. ls)
    -- latest still loads
    local dir2 = util.outdir()
    local s = run(("recipes/single.lua train.steps=6 resume=%s"):format(mnt), dir2)
    assert.are.equal(tonumber(latest:match("%d+")), s.resumed.step)
    util.sh("umount " .. mnt)
    util.rm(mnt); util.rm(dir); util.rm(dir2)
  end)
end)
