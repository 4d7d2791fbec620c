-- spec/helpers/late_receiver.lua -- run under `ztrain --nproc 2 --script`,
-- with arg[1] = micro-batches, arg[2] = the schedule (1f1b, gpipe, ..., or
-- crossed, below), arg[3] = milliseconds and arg[4] = grads (default) or
-- inputs: two steps of gpt2-tiny over 2 (or 4) stages on 2 ranks through
-- the schedule driver, where rank 0 posts each receive of a gradient that
-- late (a busy or descheduled peer: a send to it stays out), or rank 1
-- each receive of an input.
-- Prints, per stage, the activation sets its pool made and the number
-- parallel/schedule/sets.lua plans for it, which the driver must keep to
-- whatever the timing, and with one stage a rank, the buffers the last
-- stage made for its parts of the tied embedding's gradient:
--   rank R stage S sets peak P planned Q live L
--   rank R tied parts made P planned Q
local ffi = require "ffi"
local bit = require "bit"
local zt = require "ztrain"
local gpt2 = require "ztrain.model.gpt2"
local stage_run = require "ztrain.parallel.driver.stage"
local schedule = require "ztrain.parallel.schedule"
local library = require "ztrain.parallel.schedule.library"
local sets = require "ztrain.parallel.schedule.sets"
local driver = require "ztrain.parallel.driver.schedule"
local groups = require "ztrain.parallel.groups"
local toy = require "spec.helpers.toy_steps"
local pipeline_stages = require "ztrain.parallel.schedule.stages"

pcall(ffi.cdef, "int usleep(unsigned int usec);")
local M, sched, late_ms, late_what = tonumber(arg[1]), arg[2], tonumber(arg[3]), arg[4] or "grads"
local B, Tl = 2, 16
local w = zt.comm.world()
local g = groups.build(w, { pp = 2 })
local cfg = gpt2.config("gpt2-tiny", { vocab_size = 256 })
local model = gpt2.new(cfg)
model:init(7)

-- each unit's gradient summed over the step's micro-batches (the test
-- compares runs of one schedule family)
local S, acc = toy.accumulator()
local load = toy.loader(B, Tl)

-- "grads": rank 0 takes its gradients late, each backward receive posted
-- after a sleep; "inputs": rank 1 takes its inputs late (the first stage
-- then takes the head's tied parts early)
local pp = g.pp
if pp.rank == (late_what == "grads" and 0 or 1) then
  local recv = pp.recv
  pp.recv = function(self, x, src, tag, async)
    local backward = tag % (2 * M) >= M                            -- driver/schedule.lua's tag()
    if backward == (late_what == "grads") then ffi.C.usleep(late_ms * 1000) end
    return recv(self, x, src, tag, async)
  end
end

-- "crossed": rank 0 takes the last micro-batch's gradient first, so rank 1
-- must not wait for micro-batch 0's send before its next forward (it would
-- deadlock): sets.lua leaves that set to STEP
local function crossed(q)
  local A, l0, l1 = schedule.action, {}, {}
  for i = 0, q.microbatches - 1 do
    l0[#l0 + 1] = A("F", 0, i); l0[#l0 + 1] = A("SEND_F", 0, i)
    l1[#l1 + 1] = A("RECV_F", 1, i); l1[#l1 + 1] = A("F", 1, i)
    l1[#l1 + 1] = A("B", 1, i); l1[#l1 + 1] = A("SEND_B", 1, i)
  end
  for i = q.microbatches - 1, 0, -1 do l0[#l0 + 1] = A("RECV_B", 0, i); l0[#l0 + 1] = A("B", 0, i) end
  l0[#l0 + 1] = { op = "STEP" }; l1[#l1 + 1] = { op = "STEP" }
  return { l0, l1 }
end

-- two stages a rank for the schedules that need them: ZB-V and DualPipe-V
-- in a V (stages 0 and 3 on rank 0), interleaved 1F1B looped (0 and 2)
local v = (sched == "zbv" or sched == "dualpipev" or sched == "interleaved_1f1b") and 2 or 1
local V = library.placement(sched) == "v"
local function stage_rank(s)
  if v == 1 then return s end
  if V then return s < 2 and s or 3 - s end
  return s % 2
end
local lists = library.build(sched == "crossed" and crossed or sched, { ranks = 2, microbatches = M, chunks = v })
local stages = stage_run.stages(model, v == 1 and { 2, 2 } or { 1, 1, 1, 1 })
local pools = {}
for i, st in ipairs(stages) do
  if stage_rank(st.index) == pp.rank then pools[i] = stage_run.pool(model, st, B, Tl) end
end
-- the tied embedding across ranks (one stage a rank): the head's parts of
-- the wte gradient go to rank 0 from buffers the driver gives back
local tied
if v == 1 then
  local holds = {}
  for _, u in ipairs(stages[pp.rank + 1].units) do holds[u.index] = true end
  tied = pipeline_stages.tied(model, pp, holds, 0, 1, "f32")
  tied:init(7)
end
local env = { ctx = { model = model, training = true, tied = tied }, strategy = S, stages = stages, pools = pools,
              microbatches = M, lists = lists, pp = pp, stage_rank = stage_rank,
              load = load, dscale = 1.0 / (B * Tl * M) }
driver.step(env, 0)
if tied then tied:sync_params() end
driver.step(env, 0)        -- a second step reuses the sets: no more are made
if tied then tied:sync_params() end

local planned = sets.plan(lists, { tied = tied ~= nil }).peak
for i, pool in pairs(pools) do
  local live = 0
  for _ in pairs(pool.live) do live = live + 1 end
  print(("rank %d stage %d sets peak %d planned %d live %d"):format(pp.rank, i - 1, pool.peak_sets, planned[i - 1],
                                                                    live))
  pool:free()
end
if tied and tied.replica then
  print(("rank %d tied parts made %d planned %d"):format(pp.rank, tied.made or 0, planned[sets.PART] or 0))
end
-- the summed gradients' bits (FNV-1a over every float of this rank's
-- units, in unit order): a buffer reused while its send was still out
-- would have sent other numbers
local h = 0xcbf29ce484222325ULL
local f = ffi.new("float[1]")
for i in ipairs(model.units) do
  if acc[i] then
    local v = acc[i]:totable()
    for k = 1, #v do
      f[0] = v[k]
      local bits = ffi.cast("uint32_t *", f)[0]
      h = bit.bxor(h, 0ULL + bits) * 0x100000001b3ULL
    end
    acc[i]:free()
  end
end
print(("rank %d gradients %s"):format(pp.rank, tostring(h)))
if tied then tied:free() end
model:free()
groups.free(g)
