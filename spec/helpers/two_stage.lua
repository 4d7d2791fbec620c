-- spec/helpers/two_stage.lua -- run under `ztrain --nproc 2 --script`, with
-- arg[1] = micro-batches and arg[2] = "split" or "fused": one GPipe step of
-- gpt2-tiny over 2 stages on 2 ranks through the schedule driver, against
-- the one-stage step on each rank (same parameters, same data). Prints, per
-- unit of this rank's stage, the largest gradient difference, and the loss.
-- Embed's wte is left out: its tied gradient has a part on each stage, which
-- the Pipeline issue will sum (only wpe is compared).
local zt = require "ztrain"
local gpt2 = require "ztrain.model.gpt2"
local toy = require "spec.helpers.toy_steps"
local stage_run = require "ztrain.parallel.driver.stage"
local schedule = require "ztrain.parallel.schedule"
local driver = require "ztrain.parallel.driver.schedule"
local groups = require "ztrain.parallel.groups"

local A = schedule.action
local M, split = tonumber(arg[1]), arg[2] == "split"
local B, Tl = 2, 16
local w = zt.comm.world()
local g = groups.build(w, { pp = 2 })
local cfg = gpt2.config("gpt2-tiny", { vocab_size = 256 })
local model = gpt2.new(cfg)
model:init(7)

-- a strategy that only accumulates each unit's gradient in micro-batch order
local S, acc = toy.accumulator()
local load = toy.loader(B, Tl)

local function env_for(counts, lists, pp)
  local stages = stage_run.stages(model, counts)
  local pools = {}
  for i, st in ipairs(stages) do pools[i] = stage_run.pool(model, st, B, Tl) end
  return { ctx = { model = model, training = true }, strategy = S, stages = stages, pools = pools,
           microbatches = M, lists = lists, pp = pp, stage_rank = function(s) return s end,
           load = load, dscale = 1.0 / (B * Tl * M) }
end

local ref = env_for(nil, schedule.one_stage(M), nil)
local ref_loss = driver.step(ref, 0)
local want = {}
for i in ipairs(model.units) do want[i] = acc[i]:totable(); acc[i]:free(); acc[i] = nil end

-- GPipe: embed + block.0 on stage 0, block.1 + head on stage 1
local bw = split and { "I", "W" } or { "B" }
local l0, l1 = {}, {}
for i = 0, M - 1 do l0[#l0 + 1] = A("F", 0, i); l0[#l0 + 1] = A("SEND_F", 0, i) end
for i = 0, M - 1 do
  l0[#l0 + 1] = A("RECV_B", 0, i)
  for _, op in ipairs(bw) do l0[#l0 + 1] = A(op, 0, i) end
end
for i = 0, M - 1 do l1[#l1 + 1] = A("RECV_F", 1, i); l1[#l1 + 1] = A("F", 1, i) end
for i = 0, M - 1 do
  l1[#l1 + 1] = A(bw[1], 1, i); l1[#l1 + 1] = A("SEND_B", 1, i)
  if split then l1[#l1 + 1] = A("W", 1, i) end
end
l0[#l0 + 1] = { op = "STEP" }; l1[#l1 + 1] = { op = "STEP" }
local lists = { l0, l1 }
assert(schedule.validate(lists, { stages = 2, microbatches = M }))
local env = env_for({ 2, 2 }, lists, g.pp)
local loss = driver.step(env, 0)

local pool = env.pools[g.stage + 1]
for _, u in ipairs(pool.stage.units) do
  local got, exp = acc[u.index]:totable(), want[u.index]
  local first = u.kind == "embed" and cfg.V * cfg.C + 1 or 1      -- skip the tied wte
  local worst = 0
  for k = first, u.numel do worst = math.max(worst, math.abs(got[k] - exp[k])) end
  print(("rank %d unit %s diff %g"):format(w.rank, u.name, worst))
end
if loss then print(("rank %d loss %s ref %s"):format(w.rank, ("%a"):format(loss), ("%a"):format(ref_loss))) end
local live = 0
for _ in pairs(pool.live) do live = live + 1 end
print(("rank %d sets peak %d live %d"):format(w.rank, pool.peak_sets, live))
for _, p in ipairs(ref.pools) do p:free() end
pool:free()
for _, t in pairs(acc) do t:free() end
model:free()
groups.free(g)
