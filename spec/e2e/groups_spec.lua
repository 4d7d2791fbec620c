-- Groups: data-parallel and pipeline sub-communicators of the world, on
-- real MPI ranks (4 ranks: 2 stages x 2 replicas).
local util = require "helpers.util"
local sh = util.sh

describe("groups", function()
  it("cuts 4 ranks into 2 stages x 2 replicas, stages consecutive, and both groups carry traffic", function()
    local script = os.tmpname() .. ".lua"
    local f = assert(io.open(script, "w"))
    f:write([[
      local groups = require "ztrain.parallel.groups"
      local w = zt.comm.world()
      local g = groups.build(w, { pp = 2 })
      -- every member of my dp group sums its world rank: the sum names the members
      local t = zt.tensor.new({ 1 }); t:fill(w.rank)
      g.dp:all_reduce(t)
      local dpsum = t:totable()[1]
      t:fill(w.rank); g.pp:all_reduce(t)
      local ppsum = t:totable()[1]
      t:free()
      print(("rank %d stage %d replica %d dp %d/%d sum %d pp %d/%d sum %d"):format(w.rank, g.stage,
            g.replica, g.dp.rank, g.dp.size, dpsum, g.pp.rank, g.pp.size, ppsum))
      groups.free(g)
    ]])
    f:close()
    local out, rc = sh("timeout 60 build/ztrain --nproc 4 --script " .. script)
    os.remove(script)
    assert.are.equal(0, rc, out)
    -- stage 0 = ranks 0, 1; stage 1 = ranks 2, 3; pp groups {0, 2}, {1, 3}
    assert.matches("rank 0 stage 0 replica 0 dp 0/2 sum 1 pp 0/2 sum 2", out, 1, true)
    assert.matches("rank 1 stage 0 replica 1 dp 1/2 sum 1 pp 0/2 sum 4", out, 1, true)
    assert.matches("rank 2 stage 1 replica 0 dp 0/2 sum 5 pp 1/2 sum 2", out, 1, true)
    assert.matches("rank 3 stage 1 replica 1 dp 1/2 sum 5 pp 1/2 sum 4", out, 1, true)
  end)

  it("a ping-pong on one group is not queued behind an all-reduce on another", function()
    -- rank 0 starts a 32 MiB all-reduce on group A, then ping-pongs on B;
    -- rank 1 ping-pongs on B first and joins A's all-reduce only after: with
    -- one queue for both groups this deadlocks (timeout 124), with
    -- independent progress the ping-pong finishes before the all-reduce
    local script = os.tmpname() .. ".lua"
    local f = assert(io.open(script, "w"))
    f:write([[
      local w = zt.comm.world()
      local A, B = w:split(0, w.rank), w:split(0, w.rank)
      local big = zt.tensor.new({ 8 * 1024 * 1024 }); big:fill(1)
      local msg = zt.tensor.new({ 256 })
      local req, done_first
      if w.rank == 0 then req = A:all_reduce(big, true) end
      for i = 1, 4 do
        if w.rank == 0 then B:send(msg, 1, i); B:recv(msg, 1, i)
        elseif w.rank == 1 then B:recv(msg, 0, i); B:send(msg, 0, i) end
      end
      if w.rank == 0 then done_first = req:test() end
      if w.rank ~= 0 then req = A:all_reduce(big, true) end
      req:wait()
      local v = big:totable()
      if w.rank == 0 then
        print(("ping-pong done; all-reduce finished before it: %s; sum %g"):format(tostring(done_first), v[1]))
      end
      big:free(); msg:free(); A:free(); B:free()
    ]])
    f:close()
    local out, rc = sh("timeout 60 build/ztrain --nproc 2 --script " .. script)
    os.remove(script)
    assert.are_not.equal(124, rc, "deadlock: the ping-pong waited for the other group's all-reduce")
    assert.are.equal(0, rc, out)
    assert.matches("ping-pong done; all-reduce finished before it: false; sum 2", out, 1, true)
  end)

  it("refuses a world that does not divide into the stages, naming valid choices", function()
    local groups = require "ztrain.parallel.groups"
    local ok, err = pcall(groups.build, { size = 6, rank = 0 }, { pp = 4 })
    assert.is_false(ok)
    assert.are.equal("6 rank(s) do not divide into 4 pipeline stages; use 1, 2, 3, 6 stages, or a multiple of 4 ranks",
                     tostring(err))
  end)
end)
