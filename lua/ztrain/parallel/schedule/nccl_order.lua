-- ztrain.parallel.schedule.nccl_order: what NCCL's point-to-point asks of a
-- schedule's lists.
--
-- MPI keeps a pipeline's messages apart by tag (driver/schedule.lua: one
-- per boundary, direction and micro-batch), so a rank may receive them in
-- any order. NCCL has no tags: between two ranks of a communicator the
-- n-th send is the n-th receive posted (runtime/comm_nccl.c). The driver
-- issues a rank's SEND_* and RECV_* in its list's order, and the tied
-- embedding's parts (parallel/schedule/stages.lua's Tied, a communicator of
-- its own) leave at the last stage's weight passes and are taken at the
-- first stage's, each in its list's order. A list that MPI runs correctly
-- may then pair a message with another of the same size: no error, wrong
-- activations or gradients. check() refuses it, naming the first message
-- out of order. (Built-in schedules receive in the order they send.)
local simulate = require "ztrain.parallel.schedule.simulate"

local M = {}

local COMPUTE = { F = true, B = true, I = true, W = true }
local ORDINAL = { "1st", "2nd", "3rd" }
local function nth(n) return ORDINAL[n] or (n .. "th") end

-- what a message carries, in words
local function describe(key)
  local dir, b, mb = key:match("^(%a):?(%d*):(%d+)$")
  if dir == "F" then return ("stage %s's output of micro-batch %s"):format(b, mb) end
  if dir == "B" then return ("stage %d's input gradient of micro-batch %s"):format(tonumber(b) + 1, mb) end
  return ("the head's part of the embedding's gradient of micro-batch %s"):format(mb)
end

-- the stage -> rank map the lists say (0-based ranks)
local function owners(lists)
  local at = {}
  for r, list in ipairs(lists) do
    for _, a in ipairs(list) do if COMPUTE[a.op] then at[a.stage] = r - 1 end end
  end
  return at
end

-- each directed pair's messages in issue order: out[src][dst] (sends) and
-- into[dst][src] (receives posted), entries { key, index, action }
local function streams(lists, at)
  local out, into = {}, {}
  local function push(t, a, b, e)
    t[a] = t[a] or {}
    t[a][b] = t[a][b] or {}
    local s = t[a][b]
    s[#s + 1] = e
  end
  for r, list in ipairs(lists) do
    local me = r - 1
    for i, a in ipairs(list) do
      local key = simulate.message(a)
      if key then
        local send = a.op == "SEND_F" or a.op == "SEND_B"
        local peer = at[(a.op == "SEND_F" or a.op == "RECV_B") and a.stage + 1 or a.stage - 1]
        if peer and peer ~= me then
          push(send and out or into, me, peer, { key = key, index = i, action = a })
        end
      end
    end
  end
  return out, into
end

-- the tied parts: the last stage's weight passes (sends, on its rank) and
-- the first stage's (receives), in list order, when two ranks hold them
local function tied_streams(lists, at)
  local L = simulate.tied_last(lists)
  if not L then return nil end
  local sends, takes = {}, {}
  for _, a in ipairs(lists[at[L] + 1]) do
    if (a.op == "B" or a.op == "W") and a.stage == L then sends[#sends + 1] = a end
  end
  for i, a in ipairs(lists[at[0] + 1]) do
    if (a.op == "B" or a.op == "W") and a.stage == 0 then takes[#takes + 1] = { a = a, index = i } end
  end
  return sends, takes, at[L], at[0]
end

local FIX = "; reorder the receiving rank's list to take them in the order they are sent, or run " ..
            "comm.backend=mpi (messages matched by tag)"
-- ZB-V and DualPipe-V: both chunks of a V cross between the same two ranks
-- in both directions, interleaved differently on each side
local FIX_BUILTIN = "; ztrain's schedules on the V placement (zbv, dualpipev) need a communicator per stage " ..
                    "boundary under NCCL, not built yet: run comm.backend=mpi, or a schedule on the loop " ..
                    "placement (1f1b, interleaved_1f1b, zb_h1, gpipe)"

-- check(lists, opts) -> true | nil, message. opts.tied: the model's
-- embedding is tied to its head (GPT-2, tied Llamas); opts.builtin: the
-- lists are one of ztrain's schedules (the advice differs).
function M.check(lists, opts)
  local fix = opts and opts.builtin and FIX_BUILTIN or FIX
  local at = owners(lists)
  local out, into = streams(lists, at)
  for src, dsts in pairs(out) do
    for dst, sent in pairs(dsts) do
      local got = (into[dst] or {})[src] or {}
      for n = 1, math.max(#sent, #got) do
        local s, g = sent[n], got[n]
        if not s or not g or s.key ~= g.key then
          local what = s and ("rank %d's %s message to rank %d is %s (action %d, %d%s%d)"):format(src, nth(n), dst,
                                describe(s.key), s.index, s.action.stage, s.action.op, s.action.mb) or
                       ("rank %d sends rank %d %d messages"):format(src, dst, #sent)
          local other = g and ("rank %d's %s receive from rank %d takes %s (action %d, %d%s%d)"):format(dst, nth(n), src,
                                describe(g.key), g.index, g.action.stage, g.action.op, g.action.mb) or
                        ("rank %d posts %d receives from rank %d"):format(dst, #got, src)
          return nil, ("comm.backend=nccl pairs the messages between two ranks by order, not tag: %s, but %s%s")
                      :format(what, other, fix)
        end
      end
    end
  end
  if opts and opts.tied then
    local sends, takes, last, first = tied_streams(lists, at)
    for n = 1, sends and #sends or 0 do
      local s, g = sends[n], takes[n]
      if g and s.mb ~= g.a.mb then
        return nil, ("comm.backend=nccl pairs the messages between two ranks by order, not tag: rank %d sends %s " ..
                     "%s (at %d%s%d), but rank %d's %s take (action %d, %d%s%d) is micro-batch %d's%s")
                    :format(last, nth(n), describe("T:" .. s.mb), s.stage, s.op, s.mb, first, nth(n), g.index,
                            g.a.stage, g.a.op, g.a.mb, g.a.mb, fix)
      end
    end
  end
  return true
end

return M
