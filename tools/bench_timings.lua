-- tools/bench_timings.lua -- `make bench`'s timings row: how long things take
-- that the specs used to assert with a stopwatch (a stopwatch fails on a busy
-- machine, and a spec's time is no functional check). The specs keep what
-- they check (exit status, messages, bits); this measures the time, beside
-- the target each spec used to assert.
--
--   build/ztrain --script tools/bench_timings.lua
--
-- 1. the pre-flight refusal of gpt2-xl under 16 GiB: seconds from the
--    launch to exit 1 (spec/e2e/plan_spec.lua; target < 20 s: before the
--    model is built)
-- 2. kill -9 of rank 1 in its second step under --nproc 2: seconds until the
--    job has ended (spec/e2e/dist_spec.lua; target < 30 s)
-- 3. a rank that cannot reach its stop point after SIGTERM: seconds until
--    it ends itself (spec/e2e/reliability_spec.lua; hard_after 2, grace 1;
--    target < 10 s)
-- 4. generation with a KV cache: the per-token step at t = 128 beside a full
--    forward over 128 positions, gpt2-mini (spec/unit/generate_spec.lua;
--    target: under half)
-- 5. the per-op profile: the op families' share of 3 measured gpt2-tiny
--    steps (spec/unit/profile_spec.lua; target >= 50 %; the rest is Lua,
--    data and allocation)
-- 6. where the pipeline driver gives activation sets back
--    (parallel/schedule/sets.lua, at trainer build): interleaved 1F1B and
--    DualPipe-V at p = 8, m = 128 with GPT-2's tie (target < 2 s each; it
--    was 16-19 s moving one wait per simulator run)
local zt = require "ztrain"
local now = zt.ffi.C.zt_now

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a"); p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end
local function tmpname() local p = os.tmpname(); os.remove(p); return p end
local function write(path, s) local f = assert(io.open(path, "w")); f:write(s); f:close() end
local function row(what, secs, target, met, extra)
  print(("timings: %-58s %8.3f s   (target %s: %s)%s"):format(what, secs, target, met and "met" or "NOT met",
                                                              extra or ""))
end
local function timed(cmd)
  local t0 = now()
  local out, rc = sh(cmd)
  return now() - t0, rc, out
end

-- 1. pre-flight refusal
do
  local out_dir = tmpname()
  local secs, rc = timed("timeout 60 build/ztrain recipes/single.lua model.size=gpt2-xl device.memory_limit=16GiB " ..
                         "train.steps=1 -q out=" .. out_dir)
  row("plan: gpt2-xl refused before the run", secs, "< 20 s", rc == 1 and secs < 20, rc ~= 1 and (" exit " .. rc) or nil)
  os.execute("rm -rf " .. out_dir)
end

-- 2. a rank killed mid-step
do
  local recipe = tmpname() .. ".lua"
  write(recipe, [[
    local zt = require "ztrain"
    local ffi = require "ffi"
    ffi.cdef "int getpid(void); int kill(int pid, int sig);"
    local S = zt.strategy.dp()
    local step = S.step
    local n = 0
    S.step = function(ctx, lr)
      n = n + 1
      if n == 2 and ctx.rank == 1 then ffi.C.kill(ffi.C.getpid(), 9) end
      return step(ctx, lr)
    end
    return { strategy = S, train = { steps = 50 }, data = { seq_len = 32 }, batch = { micro = 2 } }
  ]])
  local out_dir = tmpname()
  local secs, rc = timed("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 build/ztrain " ..
                         "--nproc 2 " .. recipe .. " -q out=" .. out_dir)
  row("dist: job ended after kill -9 of a rank", secs, "< 30 s", rc ~= 0 and rc ~= 124 and secs < 30,
      rc == 124 and " hung" or nil)
  os.remove(recipe); os.execute("rm -rf " .. out_dir)
end

-- 3. the grace period
do
  local script = tmpname() .. ".lua"
  write(script, [[
    local interrupt = require "ztrain.core.interrupt"
    interrupt.install({ interrupt.SIGTERM })
    interrupt.set_action("raise")
    interrupt.hard_after(2)
    interrupt.grace(1)
    require("ztrain.core.libc").kill(require("ztrain.core.libc").getpid(), interrupt.SIGTERM)
    local t0 = os.time()
    while os.time() - t0 < 20 do end      -- never reaches a stop point
    print("not stopped")
  ]])
  local secs, rc = timed("build/ztrain --script " .. script)
  row("reliability: a stuck rank ends after its grace period", secs, "< 10 s", rc == 143 and secs < 10,
      rc ~= 143 and (" exit " .. rc) or nil)
  os.remove(script)
end

-- 4. a KV-cache step beside a full forward
do
  local gen = require "ztrain.model.generate"
  local cfg = zt.gpt2.config("gpt2-mini", { vocab_size = 256 })
  cfg.maxT = 512
  local m = zt.gpt2.new(cfg)
  m:init(8)
  local s = gen.session(m, 512)
  local ids = {}
  for i = 1, 128 do ids[i] = (i * 37) % 256 end
  s:feed(ids)
  local step = math.huge
  for _ = 1, 20 do
    local t0 = now()
    s:feed({ 65 })
    step = math.min(step, now() - t0)
    s:rewind(128)
  end
  s:free()
  local a = m:activations(1, 128)
  local full = math.huge
  for _ = 1, 3 do
    local t0 = now()
    m:forward_all(a)
    full = math.min(full, now() - t0)
  end
  a:free(); m:free()
  row("generate: KV-cache step at t=128 (gpt2-mini)", step, "< half the full forward", step < full / 2,
      (" full forward %.3f s"):format(full))
end

-- 5. the profile's share of a step
do
  local profile = require "ztrain.record.profile"
  local trainer = require "ztrain.train.trainer"
  local tr = trainer.new(assert(zt.recipe.resolve({}, { "model.size=gpt2-tiny", "data.seq_len=32", "batch.micro=2",
                                                        "train.eval_every=0", "optim.clip=0.05" })), { quiet = true })
  local prof = profile.start(tr.model, tr.ctx)
  tr:train_step()
  prof:reset()
  local t0 = now()
  for _ = 1, 3 do tr:train_step() end
  local steps = now() - t0
  prof:stop()
  local share = prof:total() / steps
  tr:free()
  row("profile: 3 gpt2-tiny steps, the op families' share", steps, ">= 50 % in ops", share >= 0.5,
      (" ops %.0f %%"):format(100 * share))
end
-- 6. sets.plan on long schedules
do
  local lib = require "ztrain.parallel.schedule.library"
  local sets = require "ztrain.parallel.schedule.sets"
  for _, name in ipairs({ "interleaved_1f1b", "dualpipev" }) do
    local lists = lib.build(name, { ranks = 8, microbatches = 128, chunks = 2 })
    local t0 = now()
    sets.plan(lists, { tied = true })
    local secs = now() - t0
    row(("sets: %s at p=8, m=128, tied, planned"):format(name), secs, "< 2 s", secs < 2)
  end
end
