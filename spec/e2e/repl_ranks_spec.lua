-- The multi-rank REPL keeps the session (issue 29, problem 13 and
-- deliverable 7): its own traffic (the chunk from rank 0, the ranks' texts
-- back) runs on a communicator of its own, so a chunk's collective that only
-- some ranks call is reported -- by the checked collectives, which the REPL
-- turns on, or by the watchdog when they are off -- instead of colliding
-- with the REPL's gather (MPI_ERR_TRUNCATE, a rank gone, the session lost).
-- Driven through pipes (no terminal): the front end reads plain lines.
local util = require "helpers.util"

local function repl(lines, env)
  return util.run(("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 %s timeout 120 " ..
                   "build/ztrain --nproc 2 -i"):format(env or ""), table.concat(lines, "\n") .. "\n")
end

describe("the multi-rank REPL", function()
  it("reports a collective only some ranks call and keeps the session and its globals", function()
    -- ZTRAIN_COMM_CHECK unset: the REPL checks collectives by itself
    local out, rc = repl({
      "kept = 42",
      "w = zt.comm.world(); x = zt.tensor.new({4}):fill(w.rank + 1)",
      "if w.rank == 0 then w:all_reduce(x) end",
      "kept + 1",
      -- the other way round, twice on rank 1: the first fails, the chunk ends there
      "if w.rank == 1 then w:all_reduce(x); w:all_reduce(x) end",
      -- the world is level again: a matched all_reduce sums as ever
      "w:all_reduce(x); x:totable()[1]",
      -- a group split in the session: fenced too
      "g = w:split(0)",
      "if w.rank == 0 then g:all_reduce(x) end",
      "g:all_reduce(x); x:totable()[1]",
      "kept + 2",
    }, "ZTRAIN_COMM_CHECK=")
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("TRUNCATE", 1, true), out)
    assert.matches("%[rank 0%] error: all_reduce: zt_comm_watch check: collective #%d+ on the world %(2 ranks%) " ..
                   "differs between ranks: rank 0 calls all_reduce %(f32, 4 elements%) at repl:1; rank 1 calls " ..
                   "a fence at the end of its chunk %(the REPL%)", out)
    assert.matches("%[rank 1%] error: zt_comm_watch check: collective #%d+ on the world %(2 ranks%) differs " ..
                   "between ranks: rank 0 calls all_reduce", out)
    assert.matches("[all ranks] 43\n", out, 1, true)
    assert.matches("%[rank 1%] error: all_reduce: zt_comm_watch check: collective #%d+ on the world %(2 ranks%) " ..
                   "differs between ranks: rank 0 calls a fence at the end of its chunk %(the REPL%); rank 1 calls " ..
                   "all_reduce %(f32, 4 elements%) at repl:1", out)
    assert.matches("[all ranks] 3\n", out, 1, true)                     -- 1 + 2, no stray sum
    assert.matches("%[rank 0%] error: all_reduce: zt_comm_watch check: collective #%d+ on group %x+ %(2 ranks%) " ..
                   "differs between ranks", out)
    assert.matches("[all ranks] 6\n", out, 1, true)                     -- 3 + 3
    assert.matches("[all ranks] 44\n", out, 1, true)
  end)

  it("keeps the session when a run fails on one rank alone (the run checks, as the session does)", function()
    local out_dir = util.outdir()
    local out, rc = repl({
      -- rank 1's trainer fails in its third step; rank 0's reductions go on
      "if zt.comm.world().rank == 1 then local T = require 'ztrain.train.trainer'; local new = T.new; " ..
      "T.new = function(...) local t = new(...); local step = t.train_step; t.train_step = function(self) " ..
      "if self.step == 2 then error('boom on rank 1', 0) end return step(self) end return t end end",
      "kept = 1",
      ('s = zt.train("recipes/dp.lua", {"train.steps=6", "launch.nproc=0", "comm.timeout=60", "out=%s"})')
        :format(out_dir),
      "kept + 1",
    }, "ZTRAIN_COMM_CHECK=")
    util.rm(out_dir)
    assert.are.equal(0, rc, out)
    assert.matches("[rank 1] error: boom on rank 1\n", out, 1, true)
    assert.matches("%[rank 0%] error: all_reduce: comm.check: collective #%d+ on the world %(2 ranks%) differs " ..
                   "between ranks: rank 0 calls all_reduce %(f32, %d+ elements%) at strategy/dp.lua:%d+; rank 1 " ..
                   "calls a fence at the end of its chunk %(the REPL%)", out)
    assert.matches("[all ranks] 2\n", out, 1, true)
  end)

  it("with comm.check off, the watchdog names the chunk's collective, not the REPL's gather", function()
    local out, rc = repl({
      "zt.comm.watch{timeout = 2}",
      "w = zt.comm.world(); x = zt.tensor.new({4}):fill(1)",
      "if w.rank == 0 then w:all_reduce(x) end",
    }, "ZTRAIN_COMM_CHECK=0")
    assert.are.equal(5, rc, out)
    assert.is_nil(out:find("TRUNCATE", 1, true), out)
    assert.matches("ztrain: rank 0: zt_comm_watch timeout: all_reduce #%d+ on the world %(2 ranks%), 16 bytes, " ..
                   "has waited 2.0 s for its peers", out)
    assert.matches("  rank 1: last completed fence #%d+ on that group", out)
  end)
end)
