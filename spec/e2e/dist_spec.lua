-- Multi-rank training through `ztrain --nproc N` (real MPI ranks): the same
-- math under every strategy, the ZeRO memory formulas, and errors that stop
-- the job instead of hanging it. Small model, few steps: N=2 and N=4
-- (oversubscribed on this 2-core machine).
local cjson = require "cjson"

local util = require "helpers.util"

local tmpdir, summary = util.outdir, util.summary

-- run(args) -> output, exit code; killed after `limit` seconds (124).
local function run(args, limit)
  return util.sh(("timeout %d build/ztrain %s"):format(limit or 120, args))
end

local function losses(dir)
  local out = {}
  for _, m in ipairs(util.metrics(dir)) do
    out[#out + 1] = ("%d:%s"):format(m.step, m.loss_hex)     -- exact bits
  end
  return table.concat(out, " ")
end

-- Small settings shared by every run, so digests are comparable.
local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 " ..
             "train.eval_every=0 train.eval_batches=2 lr.warmup=1 data.tokenizer=bytes -q"

-- train(nproc, recipe, extra) -> summary, per-step loss bits, out dir; one
-- run per configuration: a later case with the same one (zero2 and dp
-- accumulating 2 at N=2) reads the first's outputs
local trained = {}
local function train(nproc, recipe, extra)
  local key = ("%s %s %s"):format(tostring(nproc), recipe, extra or "")
  if trained[key] then return unpack(trained[key], 1, 3) end
  local dir = tmpdir()
  local launch = nproc and ("--nproc " .. nproc .. " ") or ""
  local path = recipe:find("/", 1, true) and recipe or ("recipes/" .. recipe .. ".lua")
  local out, rc = run(("%s %s %s %s out=%s"):format(launch, path, BASE, extra or "", dir))
  assert(rc == 0, ("%s %s failed (rc %s):\n%s"):format(recipe, extra or "", tostring(rc), out))
  trained[key] = { summary(dir), losses(dir), dir }
  return unpack(trained[key], 1, 3)
end

describe("same math on every strategy", function()
  for _, n in ipairs({ 2, 4 }) do
    it(("dp, zero1, zero2, zero3 at N=%d equal one rank accumulating %d micro-batches"):format(n, n), function()
      local ref, ref_losses = train(nil, "single", "batch.accumulate=" .. n)
      for _, strat in ipairs({ "dp", "zero1", "zero2", "zero3" }) do
        local s, l = train(n, strat)
        assert.are.equal(n, s.world_size)
        assert.are.equal(strat, s.strategy)
        assert.are.equal(ref.param_digest, s.param_digest, strat .. " digest differs from single")
        assert.are.equal(ref_losses, l, strat .. " per-step losses differ")
      end
    end)
  end

  it("holds with accumulation: at N=2 x accumulate 2 all strategies agree", function()
    -- (not with one rank accumulating 4: that sums ((g0+g1)+g2)+g3, two ranks
    -- accumulating sum (g0+g1)+(g2+g3); same world size, same bits)
    local ref, ref_losses = train(2, "dp", "batch.accumulate=2")
    for _, strat in ipairs({ "zero1", "zero2", "zero3" }) do
      local s, l = train(2, strat, "batch.accumulate=2")
      assert.are.equal(ref.param_digest, s.param_digest, strat .. " with accumulation")
      assert.are.equal(ref_losses, l, strat .. " losses with accumulation")
    end
  end)

  it("a user-written wrapper strategy (examples/timed_strategy.lua) changes no bits", function()
    local ref = train(2, "zero2")
    local s = train(2, "examples/timed_zero2.lua", "optim.lr=3e-3")   -- as recipes/zero2.lua
    assert.are.equal(ref.param_digest, s.param_digest)
  end)

  it("dp's opt-in deferred reduction sums every rank's gradients, in another order", function()
    -- dp_deferred, wrapped by a user strategy that prints each rank's
    -- parameter digest after every step (the summary has rank 0's only)
    local recipe = os.tmpname() .. ".lua"
    local f = assert(io.open(recipe, "w"))
    f:write([[
      local zt = require "ztrain"
      local S = zt.strategy.dp { defer_reduction = true }
      local step, n = S.step, 0
      local function after(ctx, ...)
        n = n + 1
        print(("rank %d step %d digest %s"):format(ctx.rank, n, zt.digest.params(ctx.model)))
        return ...
      end
      S.step = function(ctx, ...) return after(ctx, step(ctx, ...)) end
      return { strategy = S }
    ]])
    f:close()
    local dir = tmpdir()
    local out, rc = run(("--nproc 2 %s %s batch.accumulate=2 out=%s"):format(recipe, BASE, dir))
    os.remove(recipe)
    assert.are.equal(0, rc, out)
    local s = summary(dir)
    assert.are.equal("dp_deferred", s.strategy)
    local ref, _, ref_dir = train(2, "dp", "batch.accumulate=2")
    local function step1(d)
      for line in io.lines(d .. "/metrics.jsonl") do
        local m = cjson.decode(line)
        if m.step == 1 then return m end
      end
    end
    local a, b = step1(dir), step1(ref_dir)
    -- the same parameters before the first update: the same loss, bit for bit
    assert.are.equal(b.loss_hex, a.loss_hex)
    -- the gradient of all ranks' micro-batches (a rank alone has a far
    -- different norm), summed in another order: equal to rounding only
    assert.is_true(math.abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm,
                   ("grad_norm %.9g vs dp's %.9g"):format(a.grad_norm, b.grad_norm))
    assert.are_not.equal(ref.param_digest, s.param_digest, "deferred should sum in another order than dp")
    -- every rank holds the same parameters after every step, and rank 0's
    -- last digest is the one in summary.json
    local by_step = {}
    for rank, step, d in out:gmatch("rank (%d) step (%d+) digest (%x+)") do
      by_step[step] = by_step[step] or {}
      by_step[step][rank] = d
    end
    for step = 1, 3 do
      local d = by_step[tostring(step)]
      assert(d and d["0"] and d["1"], "no digests for step " .. step .. ":\n" .. out)
      assert.are.equal(d["0"], d["1"], "ranks differ after step " .. step)
    end
    assert.are.equal(s.param_digest, by_step["3"]["0"])
  end)
end)

describe("ZeRO memory", function()
  -- model state measured (params + grads + optim peaks) within 5% of the formula
  local function formula(strat, psi, n)
    return ({ dp = 16 * psi, zero1 = 8 * psi + 8 * psi / n, zero2 = 4 * psi + 12 * psi / n,
              zero3 = 16 * psi / n })[strat]
  end
  for _, n in ipairs({ 2, 4 }) do
    it(("matches the formulas at N=%d"):format(n), function()
      for _, strat in ipairs({ "dp", "zero1", "zero2", "zero3" }) do
        local s = train(n, strat, "model.size=gpt2-mini train.steps=1")
        local want = formula(strat, s.model.params, n)
        assert.are.equal(n, #s.memory)
        for _, m in ipairs(s.memory) do
          local by = m.by_category
          local got = by.params.device + by.grads.device + by.optim.device
          assert.is_true(math.abs(got - want) / want < 0.05,
                         ("%s N=%d rank %d: measured %d, formula %d"):format(strat, n, m.rank, got, want))
        end
        local p = s.predicted
        assert.is_true(math.abs(p.params + p.grads + p.optim - want) < 1)
      end
    end)
  end
end)

describe("errors instead of hangs", function()
  it("stops on a global batch that does not divide into ranks x micro-batch, with a valid choice", function()
    local out, rc = run("--nproc 2 recipes/dp.lua batch.micro=4 batch.global=12 -q out=" .. tmpdir(), 60)
    assert.are_not.equal(0, rc)
    assert.matches("batch.global 12 does not divide into 2 rank(s) x batch.micro 4 = 8", out, 1, true)
    assert.matches("use batch.global=8, or batch.global=16, or batch.micro=6 or 3 or 2", out, 1, true)
  end)

  it("names the keys on which ranks disagree", function()
    local recipe = os.tmpname() .. ".lua"
    local f = assert(io.open(recipe, "w"))
    f:write([[
      local rank = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or "0")
      return { strategy = "dp", train = { steps = 10 + rank }, data = { seq_len = 32 } }
    ]])
    f:close()
    local out, rc = run("--nproc 2 " .. recipe .. " -q out=" .. tmpdir(), 60)
    os.remove(recipe)
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: ranks disagree on the recipe: train.steps (rank 0: 10, rank 1: 11). Every rank must " ..
                   "resolve the same recipe (same file, same overrides, nothing rank-dependent)", out, 1, true)
  end)

  it("stops every rank cleanly on a diverged loss and still writes summary.json", function()
    local dir = tmpdir()
    local env, mpi = util.mpi_log()
    local out, rc = util.sh(env .. "timeout 60 build/ztrain --nproc 2 recipes/dp.lua optim.lr=1000 optim.clip=0 " ..
                            "lr.warmup=0 train.steps=20 data.seq_len=32 -q out=" .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("training diverged", out, 1, true)
    local said = out .. mpi()
    assert.is_nil(said:find("MPI_ABORT", 1, true), "a clean stop, not an abort: " .. said)
    assert.matches("^error: loss is nan", summary(dir).exit)
  end)

  it("refuses --nproc when the launched world has another size", function()
    -- ZTRAIN_COMM=mpi says "already launched": MPI starts as one rank, not two
    local p = io.popen("ZTRAIN_COMM=mpi timeout 60 build/ztrain --nproc 2 recipes/dp.lua -q out=" .. tmpdir() .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("*a"); p:close()
    local rc = tonumber(out:match("rc=(%d+)%s*$"))
    assert.are_not.equal(0, rc)
    assert.matches("--nproc 2, but the launcher started 1 rank(s)", out, 1, true)
  end)

  it("finalizes MPI after a --script on several ranks", function()
    local script = os.tmpname() .. ".lua"
    local f = assert(io.open(script, "w"))
    f:write('local w = zt.comm.world(); w:barrier(); if w.rank == 0 then print("ranks " .. w.size) end\n')
    f:close()
    local out, rc = run("--nproc 2 --script " .. script, 60)
    os.remove(script)
    assert.are.equal(0, rc, out)
    assert.matches("ranks 2", out, 1, true)
  end)

  it("ends the job, not hangs, when a rank dies (how soon: make bench)", function()
    local recipe = os.tmpname() .. ".lua"
    local f = assert(io.open(recipe, "w"))
    -- a strategy that kills rank 1 (SIGKILL: no chance to clean up) in its
    -- second step, mid-training, while rank 0 goes on into collectives
    f:write([[
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
    f:close()
    local out, rc = run("--nproc 2 " .. recipe .. " -q out=" .. tmpdir(), 60)
    os.remove(recipe)
    assert.are_not.equal(0, rc)
    assert.are_not.equal(124, rc, "the job hung:\n" .. out)
  end)
end)
