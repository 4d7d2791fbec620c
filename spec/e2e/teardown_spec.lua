-- Teardown of a --nproc job (issue 30, family 7): the whole job -- the
-- launcher, mpirun, every rank -- ends in about a second whatever N, after
-- SIGKILL of the launcher, SIGTERM to it (a graceful stop), or SIGINT twice.
--
-- What it measured before (docs/cluster.md, "Ending a job"): Open MPI 4.1
-- ends a job's ranks with SIGCONT, 1 s of sleep, SIGTERM (to a rank only a
-- stop request), 1 s of sleep, SIGKILL (odls_base_sigkill_timeout = 1): a
-- killed launcher's job took 2 s or more (1.8-3.3 s at 2-64 ranks), and a
-- graceful stop's mpirun outlived its ranks by 1 s (it ends the job on the
-- first rank's non-zero exit the same way). The launcher now runs mpirun with
-- `--mca odls_base_sigkill_timeout 0`; these tests time the mechanism's parts
-- (from the signal, and from the first rank's exit) with bounds today's
-- code meets by a wide margin and the old one cannot meet (its floors are
-- those sleeps), on a loaded machine too.
local u = require "spec.helpers.util"
local launch = require "ztrain.job.launch"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local ARGS = "recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes -q strategy=dp " ..
             "batch.micro=2 data.seq_len=32 train.steps=100000 train.log_every=1"

-- run(n, signals, extra) -> { status, first, last, ranks, log, out, dir }: start
-- `--nproc n`, wait for 2 logged steps, send each signal of `signals` (a
-- word: KILL, TERM or INT, 0.1 s apart), then watch the launcher, mpirun and
-- each rank (mpirun's children) until every one has ended (no process, or a
-- zombie: it does nothing any more). first: seconds from the last signal to
-- the first rank's end; last: to the end of the last process of the job.
local function run(n, signals, extra)
  local d = u.tmpdir()
  local script = ([[
    cd %s
    %s --nproc %d %s %s out=%s/out > %s/log 2>&1 & pid=$!
    (sleep 300; kill -KILL $pid 2>/dev/null) >/dev/null 2>&1 & guard=$!
    i=0; while [ "$(cat %s/out/metrics.jsonl 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 5000 ]; do
      sleep 0.05; i=$((i+1)); done
    mp=$(pgrep -P $pid -x mpirun); ranks=$(pgrep -P "$mp" | tr '\n' ' ')
    ended() { local s; [ -e /proc/$1 ] || return 0; read -r s < /proc/$1/stat 2>/dev/null || return 0
              s=${s##*) }; [ "${s%%%% *}" = Z ]; }
    first=""; n=0
    for s in %s; do [ $n -gt 0 ] && sleep 0.1; kill -$s $pid; n=$((n+1)); done
    t0=$EPOCHREALTIME
    while :; do
      alive=0
      for p in $pid $mp $ranks; do
        if ended $p; then case " $ranks " in *" $p "*) [ -n "$first" ] || first=$EPOCHREALTIME;; esac
        else alive=1; fi
      done
      [ $alive = 0 ] && break; sleep 0.005
    done
    t1=$EPOCHREALTIME
    wait $pid; rc=$?; kill $guard 2>/dev/null
    echo "status=$rc first=$(echo "$first - $t0" | bc) last=$(echo "$t1 - $t0" | bc) ranks=$(echo $ranks | wc -w)"
  ]]):format(ROOT, ZT, n, ARGS, extra or "", d, d, d, signals)
  local out = u.sh("bash -c '" .. script:gsub("'", "'\\''") .. "'")
  return { status = tonumber(out:match("status=(%d+)")), first = tonumber(out:match("first=(-?[%d%.]+)")),
           last = tonumber(out:match("last=(-?[%d%.]+)")), ranks = tonumber(out:match("ranks=(%d+)")),
           log = u.read(d .. "/log"), out = out, dir = d }
end

local function tmp_dirs(root)
  return (u.sh("find " .. root .. " -name '*.tmp'"):gsub("rc=%d+%s*$", ""))
end

local function say(r) return r.out .. r.log end

describe("teardown of a --nproc job", function()
  it("mpirun is told not to wait between its signals to the ranks", function()
    local cmd = " " .. table.concat(assert(launch.command(2, "ztrain", {})), " ") .. " "
    assert.matches(" --mca odls_base_sigkill_timeout 0 ", cmd, 1, true)
    -- unless the user's own words set it: Open MPI refuses a parameter
    -- listed twice ("has been listed multiple times on the command line")
    local mine = " " .. table.concat(assert(launch.command(2, "ztrain", {},
      { mpirun_args = { "--mca", "odls_base_sigkill_timeout", "3" } })), " ") .. " "
    assert.matches(" --mca odls_base_sigkill_timeout 3 ", mine, 1, true)
    assert.is_nil(mine:find("odls_base_sigkill_timeout 0", 1, true), mine)
  end)

  for _, n in ipairs({ 2, 8 }) do
    it(("SIGKILL of the launcher ends %d ranks and mpirun within 1 s"):format(n), function()
      local r = run(n, "KILL")
      assert.are.equal(137, r.status, say(r))
      assert.are.equal(n, r.ranks, say(r))
      assert.is_true(r.last < 1, "took " .. tostring(r.last) .. " s: " .. say(r))   -- 0.04-0.2 s; was 1.7-2.1 s
      u.rm(r.dir)
    end)

    it(("SIGTERM (a graceful stop) on %d ranks: mpirun and the launcher end with the ranks"):format(n), function()
      local r = run(n, "TERM")
      assert.are.equal(130, r.status, say(r))
      assert.are.equal("interrupted", u.summary(r.dir .. "/out").exit, say(r))
      -- the step in flight and the checkpoint take what they take; after the
      -- first rank's exit mpirun slept 1 s before, now it ends the job at once
      assert.is_true(r.last - r.first < 0.8, ("the last process ended %s s after the first rank: %s")
                                                :format(tostring(r.last - r.first), say(r)))
      assert.is_true(r.last < 10, "took " .. tostring(r.last) .. " s: " .. say(r))
      u.rm(r.dir)
    end)

    it(("SIGINT twice on %d ranks (a checkpoint every step): 130 within 1.5 s, no .tmp left"):format(n), function()
      local r = run(n, "INT INT", "train.ckpt_every=1")
      -- one more try where the last process lagged: a 1.02 s lag came once
      -- in this session's four clean-clone CI runs (8 runs of this case; 0
      -- in 8 alone); the 1 s sleep this guards against lags in both tries
      if r.last - r.first >= 0.8 then
        print(("\n  teardown: the last process lagged %.2f s once; a second try"):format(r.last - r.first))
        u.rm(r.dir)
        r = run(n, "INT INT", "train.ckpt_every=1")
      end
      assert.are.equal(130, r.status, say(r))
      assert.is_nil(r.log:find("Segmentation fault", 1, true), say(r))
      assert.is_true(r.last < 1.5, "took " .. tostring(r.last) .. " s: " .. say(r))   -- 0.2-0.4 s; was 0.4-1.3 s
      -- the ranks end on the launcher's SIGTERM; mpirun slept 1 s after the first before ending (0.1-0.2 s now)
      assert.is_true(r.last - r.first < 0.8, ("the last process ended %s s after the first rank: %s")
                                                :format(tostring(r.last - r.first), say(r)))
      assert.are.equal("", tmp_dirs(r.dir .. "/out"), say(r))
      u.rm(r.dir)
    end)
  end
end)
