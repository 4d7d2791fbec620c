-- Communication counters against the formulas (issue 14 item 3): per step
-- and rank, fp32, the bytes each strategy moves, from summary.json's
-- comm_per_step (means over the steps after the first) and metrics.jsonl's
-- per-step `comm`. The expected numbers are computed here from the model's
-- shape, not read from the runtime:
--   unit sizes (GPT-2): embed = V*C + maxT*C (wte, wpe); block = 12C^2 + 13C
--     (ln1 2C, qkv 3C^2+3C, proj C^2+C, ln2 2C, fc 4C^2+4C, fcproj 4C^2+C);
--     head = 2C (ln_f; the LM head is tied to wte). Psi = their sum.
--   padding: every unit's flat buffer is rounded up to 16 elements (dp), or
--     to N x the norm block (1024) for the sharded strategies, so shards cut
--     on block edges (strategy/shard.lua).
--   all_reduce of n elements (comm_mpi.c: an all-to-all of N balanced
--     chunks, then an all-gather of the sums; rank r's chunk L_r = n/N, +1
--     for the first n%N ranks): 4 (n + (N-2) L_r) bytes each way, which is
--     the issue's 2*4n(N-1)/N when N divides n (it does for every unit here).
--   reduce_scatter / all_gather of a padded unit n: 4 n (N-1)/N each way.
-- Small host exchanges of the step (loss, gradient norm: kind "host") are
-- checked apart: a few hundred bytes.
local util = require "helpers.util"

local BASE = "data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 train.eval_every=0 " ..
             "train.eval_batches=2 lr.warmup=1 data.tokenizer=bytes model.size=gpt2-tiny -q"
local BLOCK = 1024          -- zt_sum_block(): the norm block the shards are cut on
local B, T = 2, 32          -- batch.micro, data.seq_len above

local function run(recipe, n, extra)
  local dir = util.outdir()
  local launch = n and ("--nproc " .. n .. " ") or ""
  local out, rc = util.sh(("build/ztrain %s%s %s %s out=%s"):format(launch, recipe, BASE, extra or "", dir))
  assert.are.equal(0, rc, out)
  local s, steps = util.summary(dir), util.metrics(dir)
  util.rm(dir)
  return s, steps
end

-- The model's units (element counts) from its shape.
local function units(m)
  local C = m.channels
  local u = { { kind = "embed", n = m.vocab * C + m.context * C } }
  for _ = 1, m.layers do u[#u + 1] = { kind = "block", n = 12 * C * C + 13 * C } end
  u[#u + 1] = { kind = "head", n = 2 * C }
  return u
end
local function pad(n, m) return math.ceil(n / m) * m end
local function psi(m)
  local t = 0
  for _, u in ipairs(units(m)) do t = t + u.n end
  return t
end
local function padded_total(us, m)
  local t = 0
  for _, u in ipairs(us) do t = t + pad(u.n, m) end
  return t
end
local function all_reduce_bytes(n, N, r)
  local L = math.floor(n / N) + (r < n % N and 1 or 0)
  return 4 * (n + (N - 2) * L)
end

-- Every rank: the kinds it used are exactly `want` (kind -> {sent, recv},
-- or a function(rank) giving that table) plus host metadata; totals add up.
local function check_ranks(s, want)
  local cps = s.comm_per_step
  assert.are.equal(s.world_size, #cps.ranks)
  assert.are.equal(2, cps.steps)        -- 3 steps, the first left out
  local mx = { sent = 0, recv = 0 }
  for _, e in ipairs(cps.ranks) do
    local w = type(want) == "function" and want(e.rank) or want
    for kind, v in pairs(w) do
      local got = e.by_kind[kind]
      assert.is_table(got, ("rank %d: no %s traffic"):format(e.rank, kind))
      assert.are.equal(v.sent, got.sent, ("rank %d %s sent"):format(e.rank, kind))
      assert.are.equal(v.recv, got.recv, ("rank %d %s recv"):format(e.rank, kind))
      if v.calls then assert.are.equal(v.calls, got.calls, ("rank %d %s calls"):format(e.rank, kind)) end
    end
    local sent, recv = 0, 0
    for kind, got in pairs(e.by_kind) do
      if kind ~= "host" then
        assert.is_table(w[kind], ("rank %d: unexpected %s traffic"):format(e.rank, kind))
      else
        assert.is_true(got.sent < 2048 and got.recv < 2048, "host metadata is small")
      end
      sent, recv = sent + got.sent, recv + got.recv
    end
    assert.are.equal(sent, e.sent)
    assert.are.equal(recv, e.recv)
    assert.is_true(e.busy_ms > 0, "busy time counted")
    assert.is_true(e.exposed_ms >= 0)
    assert.is_true(e.hidden_share >= 0 and e.hidden_share <= 1)
    mx.sent, mx.recv = math.max(mx.sent, e.sent), math.max(mx.recv, e.recv)
  end
  assert.are.same(mx, cps.max)
  assert.is_true(cps.hidden_share >= 0 and cps.hidden_share <= 1)
end

-- metrics.jsonl: every step has its comm record (rank 0's); the steps
-- after the first equal the summary's mean (the same collectives each step).
local function check_metrics(s, steps)
  assert.are.equal(3, #steps)
  for i = 2, #steps do
    assert.are.equal(s.comm_per_step.ranks[1].sent, steps[i].comm.sent, "step " .. i)
    assert.are.equal(s.comm_per_step.ranks[1].recv, steps[i].comm.recv, "step " .. i)
    assert.is_number(steps[i].comm.exposed_ms)
  end
end

describe("comm.stats (one local rank)", function()
  it("counts calls by kind, no bytes; stats_delta and reset_stats", function()
    local comm = require "ztrain.core.comm"
    local T = require "ztrain.core.tensor"
    local w = comm.world()
    comm.reset_stats()
    local a = comm.stats()
    assert.are.equal(0, a.calls)
    local x = T.new({ 8 }, { category = "other" })
    w:all_reduce(x)
    w:all_reduce(x, true):wait()
    w:barrier()
    local b = comm.stats()
    local d = comm.stats_delta(a, b)
    assert.are.equal(2, d.by_kind.all_reduce.calls)
    assert.are.equal(1, d.by_kind.barrier.calls)
    assert.are.equal(3, d.calls)
    assert.are.equal(0, d.sent + d.recv)          -- one rank: nothing crosses a link
    assert.is_true(d.busy_ms >= 0 and d.exposed_ms >= 0)
    comm.reset_stats()
    assert.are.equal(0, comm.stats().calls)
    x:free()
  end)
end)

describe("communication bytes per step and rank", function()
  it("one rank: nothing crosses a link", function()
    local s, steps = run("recipes/single.lua", nil)
    local e = s.comm_per_step.ranks[1]
    assert.are.equal(0, e.sent)
    assert.are.equal(0, e.recv)
    assert.are.equal(0, steps[2].comm.sent)
  end)

  for _, N in ipairs({ 2, 4 }) do
    it(("dp on %d ranks: all_reduce 2*4*Psi*(N-1)/N"):format(N), function()
      local s, steps = run("recipes/dp.lua", N)
      local us = units(s.model)
      assert.are.equal(s.model.params, psi(s.model))     -- the shape formula is the model's
      check_ranks(s, function(r)
        local b = 0
        for _, u in ipairs(us) do b = b + all_reduce_bytes(pad(u.n, 16), N, r) end
        -- every unit divides by N here: the issue's formula exactly
        assert.are.equal(2 * 4 * psi(s.model) * (N - 1) / N, b)
        return { all_reduce = { sent = b, recv = b, calls = #us } }
      end)
      check_metrics(s, steps)
    end)
  end

  -- ZeRO-1/2: reduce-scatter the gradients, all-gather the updated
  -- parameters: the dp volume over the padded buffers (P_N).
  for _, c in ipairs({ { "zero1", 2 }, { "zero2", 4 } }) do
    it(("%s on %d ranks: reduce_scatter + all_gather = dp's volume (padded)"):format(c[1], c[2]), function()
      local N = c[2]
      local s = run("recipes/" .. c[1] .. ".lua", N)
      local us = units(s.model)
      local P = padded_total(us, N * BLOCK)
      local half = 4 * P * (N - 1) / N
      check_ranks(s, { reduce_scatter = { sent = half, recv = half, calls = #us },
                       all_gather = { sent = half, recv = half, calls = #us } })
    end)
  end

  -- ZeRO-3: gradients reduce-scattered once (P_N); parameters gathered
  -- before use: forward gathers every unit, and embed again for the tied
  -- head (released after embed's forward); the head (last unit) stays
  -- gathered across the turn, with embed; backward regathers every block,
  -- and embed once more (released with the head after its input gradient).
  -- Gathers: embed 3x, each block 2x, head 1x -- about 1.5x dp's volume.
  for _, N in ipairs({ 2, 4 }) do
    it(("zero3 on %d ranks: gathers embed 3x, blocks 2x, head 1x (~1.5x dp)"):format(N), function()
      local s = run("recipes/zero3.lua", N)
      local us = units(s.model)
      local m = N * BLOCK
      local g, times = 0, { embed = 3, block = 2, head = 1 }
      for _, u in ipairs(us) do g = g + times[u.kind] * pad(u.n, m) end
      local rs = 4 * padded_total(us, m) * (N - 1) / N
      local ag = 4 * g * (N - 1) / N
      check_ranks(s, { reduce_scatter = { sent = rs, recv = rs, calls = #us },
                       all_gather = { sent = ag, recv = ag, calls = 3 + 2 * s.model.layers + 1 } })
      local dp = 2 * 4 * psi(s.model) * (N - 1) / N
      local ratio = s.comm_per_step.max.sent / dp
      assert.is_true(ratio > 1.4 and ratio < 1.8, "zero3 / dp = " .. ratio)
    end)
  end

  -- Pipeline (2 stages, accumulate A = 2): per micro-batch and boundary the
  -- activations B*T*C*4 go forward and their gradients back. The tied
  -- embedding adds: the head's wte gradient (V*C*4) per micro-batch to the
  -- first stage, and after the step the updated embed unit (padded to 16)
  -- back to the last.
  local function pipeline_p2p(m, A, stage)
    local act = A * B * T * m.channels * 4
    local wte_grads = A * m.vocab * m.channels * 4
    local embed = 4 * pad(m.vocab * m.channels + m.context * m.channels, 16)
    if stage == 0 then
      return { send = { sent = act + embed, recv = 0, calls = A + 1 },
               recv = { sent = 0, recv = act + wte_grads, calls = 2 * A } }
    end
    return { send = { sent = act + wte_grads, recv = 0, calls = 2 * A },
             recv = { sent = 0, recv = act + embed, calls = A + 1 } }
  end

  it("pipeline 1F1B on 2 ranks: activations B*T*C*4 per micro-batch each way", function()
    local s, steps = run("recipes/pipeline_1f1b.lua", 2, "batch.accumulate=2")
    check_ranks(s, function(r) return pipeline_p2p(s.model, 2, r) end)
    check_metrics(s, steps)
  end)

  -- 2 stages x dp 2 (ZeRO-1 within each stage): the stage's transfers, and
  -- its units' gradients reduce-scattered per micro-batch, parameters
  -- all-gathered once per step, over 2 ranks.
  it("pipeline x dp on 4 ranks: each stage's transfers plus its ZeRO-1 over 2", function()
    local s = run("recipes/pipeline_dp.lua", 4, "batch.accumulate=2")
    local us = units(s.model)
    local stage_units = { { us[1], us[2] }, { us[3], us[4] } }   -- split = params: [embed, block0], [block1, head]
    assert.are.same({ 2, 2 }, s.pipeline.units)
    check_ranks(s, function(r)
      local stage = r < 2 and 0 or 1          -- pipeline_dp's layout: ranks 0,1 stage 0; 2,3 stage 1
      local w = pipeline_p2p(s.model, 2, stage)
      local half = 4 * padded_total(stage_units[stage + 1], 2 * BLOCK) / 2
      w.reduce_scatter = { sent = 2 * half, recv = 2 * half, calls = 2 * 2 }
      w.all_gather = { sent = half, recv = half, calls = 2 }
      return w
    end)
  end)
end)
