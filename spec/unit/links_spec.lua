-- parallel/driver/links.lua against a pipeline group that records what it
-- is asked (no MPI): every rank makes the same splits, each link joins the
-- two ranks of its boundary with the sender marked, and the ranks' first
-- exchanges (connect) pair in one order.
local links = require "ztrain.parallel.driver.links"
local lib = require "ztrain.parallel.schedule.library"

-- a fake pipeline group of rank `rank`: split(color, key) records the call
-- and returns a fake communicator recording sends, receives and frees
local function group(rank, log, fail_at)
  local pp = { rank = rank, splits = {} }
  function pp:split(color, key)
    self.splits[#self.splits + 1] = { color = color, key = key }
    if fail_at and #self.splits == fail_at then error("split failed") end
    local c = { color = color, freed = false }
    function c:free() self.freed = true; log[#log + 1] = "free" end
    function c:send(_, peer) log[#log + 1] = ("send %s to %d"):format(self.name or "?", peer) end
    function c:recv(_, peer) log[#log + 1] = ("recv %s from %d"):format(self.name or "?", peer) end
    return c
  end
  return pp
end

local buf = { view = function() return { free = function() end } end }

local function build(p, placement, chunks)
  local q = lib.params({ ranks = p, chunks = chunks, microbatches = 4, placement = placement })
  local out = {}
  for r = 0, p - 1 do
    local log = {}
    local pp = group(r, log)
    local l = links.build(pp, q.stage_rank, q.stages)
    for i, x in ipairs(l.all) do x.comm.name = tostring(i) end
    out[r] = { links = l, pp = pp, log = log }
  end
  return out, q
end

describe("links: a communicator per boundary and direction", function()
  it("1F1B at p=2: one link each way, the sender marked, peers numbered by pipeline rank", function()
    local ranks = build(2, "loop", 1)
    local a, b = ranks[0].links, ranks[1].links
    assert.are.equal(1, a[links.key(0, false)].peer); assert.are.equal(0, b[links.key(0, false)].peer)
    assert.is_true(a[links.key(0, false)].send); assert.is_false(b[links.key(0, false)].send)
    assert.is_false(a[links.key(0, true)].send); assert.is_true(b[links.key(0, true)].send)
    assert.are.equal(2, #ranks[0].pp.splits); assert.are.equal(2, #ranks[1].pp.splits)
  end)

  it("every rank makes the same splits; non-members free theirs; connect pairs in one order", function()
    for _, c in ipairs({ { 4, "loop", 1 }, { 3, "loop", 2 }, { 2, "v", 2 }, { 4, "v", 2 } }) do
      local ranks, q = build(c[1], c[2], c[3])
      local want = #ranks[0].pp.splits
      local boundaries = 0
      for s = 0, q.stages - 2 do if q.stage_rank(s) ~= q.stage_rank(s + 1) then boundaries = boundaries + 1 end end
      assert.are.equal(2 * boundaries, want, c[2])
      for r = 0, c[1] - 1 do
        assert.are.equal(want, #ranks[r].pp.splits, "rank " .. r)
        -- each split: the two members colour 1, every other rank colour 0 (and frees it)
        local members = 0
        for _, sp in ipairs(ranks[r].pp.splits) do if sp.color == 1 then members = members + 1 end end
        assert.are.equal(#ranks[r].links.all, members)
      end
      -- the link of each boundary and direction: sender on the stage that sends, peers each other
      for s = 0, q.stages - 2 do
        local x, y = q.stage_rank(s), q.stage_rank(s + 1)
        for _, back in ipairs({ false, true }) do
          local k = links.key(s, back)
          if x == y then
            assert.is_nil(ranks[x].links[k])
          else
            local lx, ly = ranks[x].links[k], ranks[y].links[k]
            assert.are.equal(not back, lx.send); assert.are.equal(back, ly.send)
            assert.are.equal(x < y and 1 or 0, lx.peer); assert.are.equal(x < y and 0 or 1, ly.peer)
          end
        end
      end
      -- connect: for every pair of ranks, the links they share come in the
      -- same order on both, one sending where the other receives
      for x = 0, c[1] - 1 do
        for y = x + 1, c[1] - 1 do
          local ox, oy = {}, {}
          for _, l in ipairs(ranks[x].links.all) do
            for k, v in pairs(ranks[x].links) do
              if v == l and k ~= "all" and ranks[y].links[k] then ox[#ox + 1] = { k = k, send = l.send } end
            end
          end
          for _, l in ipairs(ranks[y].links.all) do
            for k, v in pairs(ranks[y].links) do
              if v == l and k ~= "all" and ranks[x].links[k] then oy[#oy + 1] = { k = k, send = l.send } end
            end
          end
          assert.are.equal(#ox, #oy)
          for i = 1, #ox do
            assert.are.equal(ox[i].k, oy[i].k)
            assert.are.equal(ox[i].send, not oy[i].send)
          end
        end
      end
      for r = 0, c[1] - 1 do
        links.connect(ranks[r].links, buf)
        local n = 0
        for _, e in ipairs(ranks[r].log) do if e:match("^send") or e:match("^recv") then n = n + 1 end end
        assert.are.equal(#ranks[r].links.all, n)
      end
    end
  end)

  it("a build that fails part-way frees the links it made, then raises", function()
    local q = lib.params({ ranks = 2, chunks = 2, microbatches = 4, placement = "loop" })
    local log = {}
    local pp = group(0, log, 3)
    assert.has_error(function() links.build(pp, q.stage_rank, q.stages) end, "split failed")
    local frees = 0
    for _, e in ipairs(log) do if e == "free" then frees = frees + 1 end end
    assert.are.equal(2, frees)
  end)
end)
