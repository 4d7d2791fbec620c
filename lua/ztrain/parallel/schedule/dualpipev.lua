-- ztrain.parallel.schedule.dualpipev: DualPipe-V (DeepSeek-V3's DualPipe cut
-- to one V: Liu et al. 2024, arXiv 2412.19437; deepseek-ai/DualPipe's
-- DualPipeV; PyTorch's ScheduleDualPipeV), as a compute order per rank in
-- the IR of ztrain.parallel.schedule.
--
-- Placement V, two chunks per rank: rank r holds stages r (chunk 0, on the
-- way down) and 2p - 1 - r (chunk 1, on the way back up), so the first and
-- the last stage -- GPT-2's tied embedding and head -- share rank 0. Each
-- rank runs eight phases (PyTorch's step 1..8, the same counts):
--   1  F0 x 2(p - r - 1)               warm-up, chunk 0
--   2  (F0 F1) x (r + 1)
--   3  (I1 W F1) x (p - r - 1)         zero bubble: chunk 1's backward split
--   4  (F0 B1, F1 B0) x (m - 2p + r + 1)  the main phase: a forward of one
--                                      chunk overlapped with a backward of the other
--   5  (B1, F1 B0) x (p - r - 1)
--   6  (B1 B0) x (r + 1)               the second half as I (zero bubble)
--   7  (W, B0) x (p - r - 1)
--   8  W x (r + 1)                     the weight gradients left
-- B takes the next micro-batch of the stage's input-gradient count, I does
-- too and queues its W, and W runs the oldest queued. Needs m >= 2p.
--
-- Overlap, as far as the schedule driver can: it runs one action at a
-- time on one stream, so an overlapped pair (F of one chunk, B of the
-- other) runs back to back; the forward's SEND_F is posted before the
-- backward computes (sends never block), so its activations travel while
-- the backward runs -- the communication DualPipe hides under the other
-- chunk's compute. Posting the pair's RECV_B before its forward was
-- tried: the simulator shows no gain with posted receives and a longer
-- makespan with blocking ones (p=4 m=8: 51 -> 54), so each RECV stays
-- right before its reader (with_comms).
--
-- On rank 0 the head's backward of micro-batch i comes long before the
-- embedding's: the driver keeps each head part of the tied wte gradient
-- apart until then (driver/grad_order.lua).
local M = {}

local function C(op, s, i) return { op = op, stage = s, mb = i } end

-- order(r, p, m) -> rank r's compute order (F, B, I, W)
function M.order(r, p, m)
  local o, cf, ci, queue = {}, {}, {}, {}
  local s0, s1 = r, 2 * p - 1 - r
  local function f(s)
    cf[s] = (cf[s] or 0)
    o[#o + 1] = C("F", s, cf[s])
    cf[s] = cf[s] + 1
  end
  local function b(s, split)
    ci[s] = (ci[s] or 0)
    o[#o + 1] = C(split and "I" or "B", s, ci[s])
    if split then queue[#queue + 1] = { s, ci[s] } end
    ci[s] = ci[s] + 1
  end
  local function w()
    local q = table.remove(queue, 1)
    if q then o[#o + 1] = C("W", q[1], q[2]) end
  end
  for _ = 1, 2 * (p - r - 1) do f(s0) end                             -- 1
  for _ = 1, r + 1 do f(s0); f(s1) end                                -- 2
  for _ = 1, p - r - 1 do b(s1, true); w(); f(s1) end                 -- 3
  for i = 0, m - 2 * p + r do                                         -- 4
    f(s0); b(s1)                        -- (PyTorch does not overlap the first pair of rank p - 1)
    f(s1); b(s0)
  end
  for _ = 1, p - r - 1 do b(s1); f(s1); b(s0) end                -- 5
  local zb = false                                                    -- 6
  local n6 = r + 1
  for i = 0, n6 - 1 do
    if i == math.floor(n6 / 2) and r % 2 == 1 then zb = true end
    b(s1, zb)
    if i == math.floor(n6 / 2) and r % 2 == 0 then zb = true end
    b(s0, zb)
  end
  for _ = 1, p - r - 1 do w(); b(s0, zb) end                          -- 7
  for _ = 1, r + 1 do w() end                                         -- 8
  return o
end

-- build(q, with_comms) -> lists: every rank's order (q from the library's
-- params, placement V), its communication placed by with_comms.
function M.build(q, with_comms)
  local R, m = q.ranks, q.microbatches
  if m < 2 * R then
    error(("dualpipev: microbatches (%d) must be at least the stages (2 x %d ranks = %d): the V fills both " ..
           "chunks before its main phase; use m >= %d"):format(m, R, 2 * R, 2 * R), 0)
  end
  local orders = {}
  for r = 0, R - 1 do orders[r + 1] = M.order(r, R, m) end
  return with_comms(orders, q)
end

return M
