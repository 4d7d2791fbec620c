-- A second stop signal to a --nproc job (issue 30, family 1): the whole job
-- ends at once with 128 + the signal (130 for SIGINT, 143 for SIGTERM, as on
-- one rank), no segfault from mpirun (it is no longer sent the signal it
-- crashed on), no process of the job and no temporary checkpoint directory
-- left behind.
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local ZT = ROOT .. "/build/ztrain"
local TINY = ROOT .. "/recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes -q"

-- run `--nproc 2 args` in the background until its metrics show 3 steps,
-- send sig, then sig again gap s later; -> log, exit status, seconds from
-- the second signal to the launcher's end, processes of the job left
local function twice(d, args, sig, gap)
  local script = ([[
    %s --nproc 2 %s train.steps=100000 train.log_every=1 out=%s/out > %s/log 2>&1 & pid=$!
    (sleep 120; kill -KILL $pid 2>/dev/null) >/dev/null 2>&1 & guard=$!
    i=0; while [ "$(cat %s/out/metrics.jsonl 2>/dev/null | wc -l)" -lt 3 ] && [ $i -lt 2400 ]; do
      sleep 0.05; i=$((i+1)); done
    kill -%s $pid; sleep %s; t0=$(date +%%s.%%N); kill -%s $pid
    wait $pid; rc=$?; t1=$(date +%%s.%%N)
    kill $guard 2>/dev/null
    sleep 0.5
    echo "status=$rc seconds=$(echo "$t1 - $t0" | bc) left=$(pgrep -f "^[^ ]*(ztrain|mpirun|orted) .*out=%s/out" | wc -l)"
  ]]):format(ZT, args, d, d, d, sig, gap, sig, d)
  local out = u.sh("bash -c '" .. script:gsub("'", "'\\''") .. "'")
  return u.read(d .. "/log"), tonumber(out:match("status=(%d+)")), tonumber(out:match("seconds=([%d%.]+)")),
         tonumber(out:match("left=(%d+)")), out
end

local function tmp_dirs(root)
  local p = io.popen("find " .. root .. " -name '*.tmp' 2>/dev/null")
  local s = p:read("*a"); p:close()
  return s
end

describe("a second stop signal under --nproc", function()
  it("SIGINT twice (zero3_offload, checkpoints every step): 130 at once, nothing left", function()
    local d = u.tmpdir()
    -- 0.1 s apart, as SIGTERM's below: on a quick machine the graceful stop
    -- (the step in flight, its checkpoint) ended 2 ranks inside 0.2 s once,
    -- before the second signal came (the clean-clone CI at a4a3a2b)
    local log, rc, secs, left, out = twice(d, TINY .. " strategy=zero3_offload train.ckpt_every=1", "INT", 0.1)
    assert.are.equal(130, rc, out .. log)
    assert.is_nil(log:find("Segmentation fault", 1, true), log)
    assert.is_nil(log:find("abort is already in progress", 1, true), log)
    assert.matches("ztrain: stopping now (a second stop signal): ending every rank", log, 1, true)
    assert.is_true(secs < 5, "took " .. tostring(secs) .. " s")     -- about 1 s; a bound against hangs
    assert.are.equal(0, left, out)
    assert.are.equal("", tmp_dirs(d .. "/out"))
    u.rm(d)
  end)

  it("SIGTERM twice: 143, as on one rank", function()
    local d = u.tmpdir()
    -- 0.1 s apart: the graceful stop alone ends 2 ranks in 0.2-0.4 s since
    -- mpirun no longer sleeps before ending the job (teardown_spec); 0.3 s
    -- let it finish first (130)
    local log, rc, secs, left, out = twice(d, TINY .. " strategy=zero3", "TERM", 0.1)
    assert.are.equal(143, rc, out .. log)
    assert.matches("ztrain: stopping now (a second stop signal): ending every rank", log, 1, true)
    assert.is_nil(log:find("Segmentation fault", 1, true), log)
    assert.is_true(secs < 5, "took " .. tostring(secs) .. " s")
    assert.are.equal(0, left, out)
    u.rm(d)
  end)
end)
