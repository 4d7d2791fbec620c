-- The step-time model (steptime.lua) against hand-computed cases: the
-- ZeRO byte formulas (issue 14: dp 2·4Ψ(N-1)/N per rank per step, zero1/2
-- the same, zero3 1.5x; pipeline B·T·C·4 per micro-batch per boundary,
-- each way), the FLOP count, the ring's time on one and two tiers, the
-- pipeline's bubble (p-1)/(m+p-1) from the schedule's simulator, and
-- monotonicity in bandwidth. Pure Lua, well under a second.
local st = require "ztrain.plan.steptime"
local gpt2 = require "ztrain.model.gpt2"

local function near(a, b, rel) return math.abs(a - b) <= (rel or 1e-12) * math.max(math.abs(a), math.abs(b), 1e-300) end

-- a link with no latency and no other costs: only what a case checks
local function hw(over)
  local h = { flops = 1e9, inter_bw = 1e8, eta = 1, latency = 0 }
  for k, v in pairs(over or {}) do h[k] = v end
  return h
end

describe("steptime: counts", function()
  it("GPT-2's parameters: 124,439,808 (Hugging Face's count), and the units' sum for every size", function()
    assert.are.equal(124439808, st.params(gpt2.config("gpt2")))
    for name in pairs(gpt2.sizes) do
      local cfg, n = gpt2.config(name), 0
      for _, u in ipairs(gpt2.new(cfg, { alloc = false, pad = 16 }).units) do n = n + u.numel end
      assert.are.equal(n, st.params(cfg), name)
    end
  end)

  it("FLOPs per token: 3 x (2 x matmul parameters + 4·L·T·C), 4 x with recomputation", function()
    local cfg = { L = 1, C = 2, V = 3, maxT = 4 }
    -- forward: 2 x (12·1·4 + 3·2) + 4·1·4·2 = 108 + 32
    assert.are.equal(3 * 140, st.flops_per_token(cfg, 4))
    assert.are.equal(4 * 140, st.flops_per_token(cfg, 4, true))
  end)
end)

describe("steptime: bytes per rank per step (fp32)", function()
  local psi = 1e6
  for _, N in ipairs({ 2, 4, 8, 64 }) do
    it(("dp 2·4Ψ(N-1)/N, zero1/zero2 the same, zero3 1.5x, at N = %d"):format(N), function()
      local dp = 2 * 4 * psi * (N - 1) / N
      assert.is_true(near(dp, st.dp_bytes({ strategy = "dp", psi = psi }, N)))
      assert.is_true(near(dp, st.dp_bytes({ strategy = "zero1", psi = psi }, N)))
      assert.is_true(near(dp, st.dp_bytes({ strategy = "zero2", psi = psi }, N)))
      assert.is_true(near(1.5 * dp, st.dp_bytes({ strategy = "zero3", psi = psi }, N)))
      assert.is_true(near(1.5 * dp, st.dp_bytes({ strategy = "zero3_offload", psi = psi }, N)))
    end)
  end

  it("every micro-batch is reduced (canonical order): m x the gradient's share, zero1/2 gather once", function()
    local f = 1 / 2
    assert.is_true(near(4 * 8 * psi * f, st.dp_bytes({ strategy = "dp", psi = psi, m = 4 }, 2)))
    assert.is_true(near(8 * psi * f, st.dp_bytes({ strategy = "dp_deferred", psi = psi, m = 4 }, 2)))
    assert.is_true(near((4 * 4 + 4) * psi * f, st.dp_bytes({ strategy = "zero2", psi = psi, m = 4 }, 2)))
    assert.is_true(near(4 * (4 + 2 * 4) * psi * f, st.dp_bytes({ strategy = "zero3", psi = psi, m = 4 }, 2)))
    -- bf16: gradients still reduced in fp32, parameters gathered in 2 bytes
    assert.is_true(near((4 + 2 * 2) * psi * f, st.dp_bytes({ strategy = "zero3", psi = psi, lowp = true }, 2)))
  end)

  it("pipeline: B·T·C·4 bytes per micro-batch per boundary, each way", function()
    local cfg = gpt2.config("gpt2-mini")
    local r = st.step({ cfg = cfg, strategy = "pipeline_1f1b", B = 3, T = 32, m = 5, hosts = 2 }, hw())
    assert.are.equal(2 * 5 * 3 * 32 * cfg.C * 4, r.act_bytes)
    -- the busiest rank (the last of 2): its gradients back and the tied
    -- embedding's gradient every micro-batch
    assert.are.equal(5 * 3 * 32 * cfg.C * 4 + 5 * 4 * cfg.V * cfg.C, r.bytes)
  end)

  it("an unknown strategy is named with the known ones", function()
    local ok, err = pcall(st.step, { cfg = gpt2.config("gpt2-tiny"), strategy = "zero9", B = 1, T = 8 }, hw())
    assert.is_false(ok)
    assert.matches('unknown strategy "zero9"', err, 1, true)
    assert.matches("zero3_offload", err, 1, true)
  end)
end)

describe("steptime: times", function()
  it("a ring all-reduce over H hosts: 2 (S (H-1)/H / bw + (H-1) latency)", function()
    local h = hw({ inter_bw = 1e6, latency = 1e-3 })
    assert.is_true(near(2 * (8e6 / 2 / 1e6 + 1e-3), st.collective_time("all_reduce", 8e6, 2, 1, h)))
    assert.is_true(near(4e6 * 3 / 4 / 1e6 + 3e-3, st.collective_time("all_gather", 4e6, 4, 1, h)))
    -- eta scales the link: half the rate, twice the bytes' time
    h.eta = 0.5
    assert.is_true(near(2 * (8e6 / 2 / 5e5 + 1e-3), st.collective_time("all_reduce", 8e6, 2, 1, h)))
  end)

  it("hierarchical: (G-1)/G of S intra-host, (H-1)/H of S/G inter-host per rank", function()
    local h = hw({ intra_bw = 1e9, intra_latency = 1e-6, inter_bw = 1e8, latency = 1e-5 })
    local S = 1e9
    local want = 2 * (S * 3 / 4 / 1e9 + 3 * 1e-6) + 2 * (S / 4 * 1 / 2 / 1e8 + 1e-5)
    assert.is_true(near(want, st.collective_time("all_reduce", S, 2, 4, h)))
  end)

  it("compute: tokens x FLOPs per token / (rate / ranks sharing it); no communication on one rank", function()
    local cfg = gpt2.config("gpt2-tiny")
    local o = { cfg = cfg, strategy = "dp", B = 2, T = 16, m = 3, hosts = 1, gpus = 1 }
    local r = st.step(o, hw({ share = 4 }))
    assert.is_true(near(2 * 16 * 3 * st.flops_per_token(cfg, 16) / (1e9 / 4), r.compute))
    assert.are.equal(0, r.comm)
    assert.are.equal(r.compute, r.step)
  end)

  it("ranks sharing a machine's cores: a rank's rate over ranks / cores once they outnumber them", function()
    local cfg = gpt2.config("gpt2-tiny")
    local o = { cfg = cfg, strategy = "dp", B = 2, T = 16, hosts = 4 }
    local own = st.step(o, hw({ inter_bw = 1e30 }))
    assert.is_true(near(2 * own.compute, st.step(o, hw({ inter_bw = 1e30, cores = 2 })).compute))
    assert.is_true(near(own.compute, st.step(o, hw({ inter_bw = 1e30, cores = 4 })).compute))
    -- a pipeline's stages compute one at a time on gpt2-mini (the embedding
    -- stage is a lookup, the last holds the blocks and the head): no sharing on 2 cores
    local p = { cfg = gpt2.config("gpt2-mini"), strategy = "pipeline_1f1b", B = 2, T = 16, m = 4, hosts = 2 }
    assert.is_true(near(st.step(p, hw({ inter_bw = 1e30 })).step, st.step(p, hw({ inter_bw = 1e30, cores = 2 })).step))
    assert.is_true(near(st.step(p, hw({ inter_bw = 1e30 })).step, st.step(p, hw({ inter_bw = 1e30, cores = 1 })).step))
    -- on 4 stages the two one-block stages overlap the last: more than one core's work at once
    p.hosts = 4
    assert.is_true(st.step(p, hw({ inter_bw = 1e30, cores = 1 })).step > st.step(p, hw({ inter_bw = 1e30 })).step)
  end)

  it("hidden communication comes off the step, at most the backward's compute", function()
    local cfg = gpt2.config("gpt2-mini")
    local o = { cfg = cfg, strategy = "dp", B = 1, T = 16, hosts = 2 }
    local full = st.step(o, hw())
    o.hidden = 0.5
    local half = st.step(o, hw())
    assert.is_true(near(full.step - 0.5 * full.comm, half.step))
    o.hidden = 1
    local all = st.step(o, hw({ inter_bw = 1e3 }))      -- a trickle: far more than the backward
    assert.is_true(near(all.compute * 2 / 3, all.hidden))
  end)

  for _, pm in ipairs({ { 2, 4 }, { 4, 8 }, { 4, 1 } }) do
    local p, m = pm[1], pm[2]
    it(("1F1B p=%d m=%d: the simulator's bubble (p-1)/(m+p-1), step (m-1) slowest + one pass on a free link"):format(p, m),
       function()
      local cfg = gpt2.config("gpt2-mini")
      local o = { cfg = cfg, strategy = "pipeline_1f1b", B = 2, T = 32, m = m, hosts = p }
      local r = st.step(o, hw({ inter_bw = 1e30 }))
      assert.is_true(near((p - 1) / (m + p - 1), r.bubble, 1e-9))
      -- the slowest stage paces it: split by parameters, the embedding (a
      -- lookup) is a stage of its own and the last holds the head's matmul:
      -- p=2: 4 blocks + head; p=4: embed | block | block | 2 blocks + head
      local C, V = cfg.C, cfg.V
      local block, head = 2 * 12 * C * C + 4 * 32 * C, 2 * V * C
      local fmax = p == 2 and 4 * block + head or 2 * block + head
      local pass = 4 * block + head                 -- every stage once (the embedding's lookup: none)
      assert.is_true(near(2 * 32 * 3 * ((m - 1) * fmax + pass) / 1e9, r.step, 1e-9))
    end)
  end

  it("stages are cut as parallel/schedule/stages.lua cuts them (pipeline.split = params)", function()
    local stages = require "ztrain.parallel.schedule.stages"
    for _, case in ipairs({ { "gpt2-mini", 2 }, { "gpt2-mini", 4 }, { "gpt2", 4 }, { "gpt2-xl", 8 }, { "gpt2-xl", 16 } }) do
      local cfg = gpt2.config(case[1])
      local want = stages.partition(gpt2.new(cfg, { alloc = false, pad = 16 }), case[2], "params")
      local units, got, k = st.units(cfg, 64), {}, 0
      for i, s in ipairs(st.stages(units, case[2])) do
        -- count the units each stage took, from its parameters
        local n, c = 0, 0
        while n < s.n do k = k + 1; n = n + units[k].n; c = c + 1 end
        got[i] = c
      end
      assert.are.same(want, got, case[1] .. " p=" .. case[2])
    end
  end)

  it("every strategy is slower on a slower link, and zero3 moves more than dp", function()
    local cfg = gpt2.config("gpt2-mini")
    for _, s in ipairs(st.STRATEGIES) do
      local last
      for _, bw in ipairs({ 1e11, 1e10, 1e9, 1e8 }) do
        local r = st.step({ cfg = cfg, strategy = s, B = 2, T = 32, m = 2, hosts = 2, gpus = 2 },
                          hw({ inter_bw = bw, intra_bw = 1e11, latency = 1e-5, mem_bw = 1e10, host_bw = 1e10 }))
        if last then assert.is_true(r.step > last, s .. " at " .. bw) end
        last = r.step
      end
    end
    local o = { cfg = cfg, B = 2, T = 32, hosts = 4, embed = 0 }
    o.strategy = "dp"
    local dp = st.step(o, hw())
    o.strategy = "zero3"
    local z3 = st.step(o, hw())
    assert.is_true(near(1.5 * dp.bytes, z3.bytes))
    -- ztrain's zero3 gathers the embedding once more a micro-batch (the head's tied wte)
    o.embed = nil
    local z3e = st.step(o, hw())
    assert.is_true(near(z3.bytes + 4 * (cfg.V + cfg.maxT) * cfg.C * 3 / 4, z3e.bytes))
    assert.is_true(z3.comm > dp.comm)
  end)
end)
