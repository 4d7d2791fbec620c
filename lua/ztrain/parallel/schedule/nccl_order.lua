-- ztrain.parallel.schedule.nccl_order: what NCCL's point-to-point asks of a
-- schedule's lists.
--
-- MPI keeps a pipeline's messages apart by tag (driver/schedule.lua: one
-- per boundary, direction and micro-batch), so a rank may receive them in
-- any order. NCCL has no tags: on a communicator the n-th send from one
-- rank to another is the other's n-th receive from it (runtime/comm_nccl.c).
-- The driver sends each boundary's messages of one direction over a link
-- of their own (driver/links.lua), issuing a rank's SEND_* and RECV_* in
-- its list's order; the tied embedding's parts (parallel/schedule/stages.lua's
-- Tied, a communicator of its own) leave at the last stage's weight passes
-- and are taken at the first stage's, each in its list's order. A list
-- that MPI runs correctly may still receive a link's messages in another
-- order than they were sent, pairing messages of the same size wrongly: no
-- error, wrong activations or gradients. check() refuses it, naming the
-- first message out of order. (Every built-in schedule pairs.)
local simulate = require "ztrain.parallel.schedule.simulate"
local links = require "ztrain.parallel.driver.links"

local M = {}

local ORDINAL = { "1st", "2nd", "3rd" }
local function nth(n) return ORDINAL[n] or (n .. "th") end

-- what a message carries, in words
local function describe(key)
  local dir, b, mb = key:match("^(%a):?(%d*):(%d+)$")
  if dir == "F" then return ("stage %s's output of micro-batch %s"):format(b, mb) end
  if dir == "B" then return ("stage %d's input gradient of micro-batch %s"):format(tonumber(b) + 1, mb) end
  return ("the head's part of the embedding's gradient of micro-batch %s"):format(mb)
end

-- each link's messages in issue order: out[link] (sends) and into[link]
-- (receives posted), entries { key, index, action, rank }; a link is a
-- boundary's direction (driver/links.lua's key), between two ranks only
local function streams(lists, at)
  local out, into = {}, {}
  local function push(t, link, e)
    t[link] = t[link] or {}
    t[link][#t[link] + 1] = e
  end
  for r, list in ipairs(lists) do
    local me = r - 1
    for i, a in ipairs(list) do
      local key = simulate.message(a)
      if key then
        local send = a.op == "SEND_F" or a.op == "SEND_B"
        local backward = a.op == "SEND_B" or a.op == "RECV_B"
        local b = (a.op == "SEND_F" or a.op == "RECV_B") and a.stage or a.stage - 1   -- the boundary b -> b + 1
        local peer = at[(a.op == "SEND_F" or a.op == "RECV_B") and a.stage + 1 or a.stage - 1]
        if peer and peer ~= me then
          push(send and out or into, links.key(b, backward), { key = key, index = i, action = a, rank = me })
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

-- check(lists, opts) -> true | nil, message. opts.tied: the model's
-- embedding is tied to its head (GPT-2, tied Llamas).
function M.check(lists, opts)
  local at = simulate.stage_ranks(lists)
  local out, into = streams(lists, at)
  local ids = {}
  for link in pairs(out) do ids[#ids + 1] = link end
  for link in pairs(into) do if not out[link] then ids[#ids + 1] = link end end
  table.sort(ids)
  for _, link in ipairs(ids) do
    local sent, got = out[link] or {}, into[link] or {}
    for n = 1, math.max(#sent, #got) do
      local s, g = sent[n], got[n]
      if not s or not g or s.key ~= g.key then
        local b, dir = math.floor(link / 2), link % 2 == 1 and "gradients" or "activations"   -- links.key's inverse
        local what = s and ("rank %d's %s message of boundary %d -> %d's %s is %s, its action %d (%d%s%d)")
                              :format(s.rank, nth(n), b, b + 1, dir, describe(s.key), s.index, s.action.stage,
                                      s.action.op, s.action.mb) or
                     ("its sender sends %d messages of boundary %d -> %d's %s"):format(#sent, b, b + 1, dir)
        local other = g and ("rank %d's %s receive of them takes %s, its action %d (%d%s%d)")
                              :format(g.rank, nth(n), describe(g.key), g.index, g.action.stage, g.action.op,
                                      g.action.mb) or
                      ("its receiver posts %d receives"):format(#got)
        return nil, ("comm.backend=nccl pairs the messages of a link by order, not tag: %s, but %s%s")
                    :format(what, other, FIX)
      end
    end
  end
  if opts and opts.tied then
    local sends, takes, last, first = tied_streams(lists, at)
    for n = 1, sends and #sends or 0 do
      local s, g = sends[n], takes[n]
      if g and s.mb ~= g.a.mb then
        return nil, ("comm.backend=nccl pairs the tied embedding's parts by order, not tag: rank %d's %s part " ..
                     "sent is %s (at %d%s%d), but rank %d's %s take (action %d, %d%s%d) is micro-batch %d's%s")
                    :format(last, nth(n), describe("T:" .. s.mb), s.stage, s.op, s.mb, first, nth(n), g.index,
                            g.a.stage, g.a.op, g.a.mb, g.a.mb, FIX)
      end
    end
  end
  return true
end

return M
