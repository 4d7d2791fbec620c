-- The same math across hosts (issue 14 item 2): ranks launched by Open MPI
-- from a hostfile onto a test cluster of network-namespace hosts
-- (tools/netcluster.sh, docs/cluster.md) give the param_digest of the same
-- world on this one machine -- dp, zero3, zero3_offload, 1F1B and
-- pipeline x dp on 2 and 4 hosts -- and their bytes really cross the
-- links: each host's link counters show what dp's all-reduce must send,
-- 2 * 4 * Psi * (N - 1) / N bytes per step and rank (fp32, Psi parameters).
-- The oracle is a run of the same settings on one machine (--nproc N), or
-- for strategies that are the same math as dp / one rank, that run.
local nc = require "helpers.netcluster"
local util = require "helpers.util"

local PREFIX = "ztms"                     -- this spec's cluster (never a benchmark's)
local BASE = "data.seq_len=32 batch.micro=2 train.steps=3 train.log_every=1 train.eval_every=0 " ..
             "train.eval_batches=2 lr.warmup=1 data.tokenizer=bytes -q"
local TINY, ACCUM2 = "model.size=gpt2-tiny", "model.size=gpt2-tiny batch.accumulate=2"

local why = nc.unavailable()

describe("multi-host runs on a namespace test cluster", function()
  if why then
    pending("multi-host specs skipped: " .. why)
    return
  end

  local want = {}                          -- one-machine digests

  -- run(args) -> summary of a run that must succeed
  local function run(args)
    local s, out, rc = nc.run(args)
    assert(rc == 0 and s, ("ztrain %s failed (rc %s):\n%s"):format(args, tostring(rc), out))
    return s
  end

  -- The bytes the comm counters say each rank sent over the run's steps
  -- (comm_per_step.ranks[i].run_sent, counted as each collective is
  -- issued, from the transport's algorithm) must have crossed its host's
  -- link (rank i on host i: one slot a host), with TCP/IP headers and the
  -- uncounted end-of-run gathers (the digest's: up to the whole model
  -- once, 4 Psi) on top.
  local function link_bytes_cover(s, before, n)
    local psi = s.model.params
    for i = 0, n - 1 do
      local counted = s.comm_per_step.ranks[i + 1].run_sent
      local sent = nc.sent_since(PREFIX, before, i)
      assert.is_true(counted > 0, ("rank %d counted no bytes"):format(i))
      assert.is_true(sent >= counted, ("host %d's link carried %d bytes, fewer than rank %d's " ..
                                       "counters say it sent (%d)"):format(i, sent, i, counted))
      assert.is_true(sent <= counted * 1.15 + 4 * psi + 300000,
                     ("host %d's link carried %d bytes, far more than rank %d counted (%d)")
                     :format(i, sent, i, counted))
    end
  end

  local cluster = nc.cluster(PREFIX, 4, function()
    -- the oracle: the same worlds on this machine
    want.dp2 = run(("--nproc 2 recipes/dp.lua %s %s"):format(BASE, TINY)).param_digest
    want.dp4 = run(("--nproc 4 recipes/dp.lua %s %s"):format(BASE, TINY)).param_digest
    want.single_accum2 = run(("recipes/single.lua %s %s"):format(BASE, ACCUM2)).param_digest
    want.dp2_accum2 = run(("--nproc 2 recipes/dp.lua %s %s"):format(BASE, ACCUM2)).param_digest
  end)
  local hostfile = cluster.hostfile
  setup(cluster.up)
  teardown(cluster.down)

  for _, n in ipairs({ 2, 4 }) do
    it(("dp on %d hosts: the one-machine digest, and the all-reduce's bytes crossed every link"):format(n),
       function()
      local before = nc.snapshot(PREFIX, n)
      local s = run(("--hostfile %s recipes/dp.lua %s %s"):format(hostfile(n), BASE, TINY))
      assert.are.equal(n, s.world_size)
      assert.are.equal(want["dp" .. n], s.param_digest)
      -- what each rank must send: 2 * 4 Psi (N-1)/N per step; on top of it
      -- TCP/IP headers (~2-3%), the loss reductions, Open MPI's own channel
      local psi = s.model.params
      local must = s.steps * 2 * 4 * psi * (n - 1) / n
      for i = 0, n - 1 do
        local sent = nc.sent_since(PREFIX, before, i)
        assert.is_true(sent >= must, ("host %d sent %d bytes, less than dp's all-reduce needs (%d): " ..
                                      "the bytes went another way"):format(i, sent, must))
        assert.is_true(sent <= must * 1.15 + 200000, ("host %d sent %d bytes, far more than dp's %d")
                       :format(i, sent, must))
      end
    end)

    it(("zero3 on %d hosts gives dp's one-machine digest; its counted bytes cross the links"):format(n), function()
      local before = nc.snapshot(PREFIX, n)
      local s = run(("--hostfile %s --nproc %d recipes/zero3.lua %s %s"):format(hostfile(n), n, BASE, TINY))
      assert.are.equal(n, s.world_size)
      assert.are.equal(want["dp" .. n], s.param_digest)
      link_bytes_cover(s, before, n)
    end)

    it(("zero3_offload on %d hosts gives dp's one-machine digest"):format(n), function()
      local s = run(("--hostfile %s --nproc %d recipes/zero3_offload.lua %s %s"):format(hostfile(n), n, BASE, TINY))
      assert.are.equal(n, s.world_size)
      assert.are.equal(want["dp" .. n], s.param_digest)
    end)

    it(("1F1B with %d stages on %d hosts gives one rank's digest (accumulating)"):format(n, n), function()
      local before = nc.snapshot(PREFIX, n)
      local s = run(("--hostfile %s --nproc %d recipes/pipeline_1f1b.lua %s %s pipeline.stages=%d")
                    :format(hostfile(n), n, BASE, ACCUM2, n))
      assert.are.equal(n, s.world_size)
      assert.are.equal(want.single_accum2, s.param_digest)
      link_bytes_cover(s, before, n)
    end)
  end

  it("pipeline x dp (2 stages x 2 replicas) on 4 hosts gives dp on 2 ranks' digest", function()
    local s = run(("--hostfile %s recipes/pipeline_dp.lua %s %s"):format(hostfile(4), BASE, ACCUM2))
    assert.are.equal(4, s.world_size)
    assert.are.equal(want.dp2_accum2, s.param_digest)
  end)

  it("the recipe key launch.hostfile launches across hosts as --hostfile does", function()
    local s = run(("recipes/dp.lua %s %s launch.hostfile=%s"):format(BASE, TINY, hostfile(2)))
    assert.are.equal(2, s.world_size)               -- launch.nproc = 0: one rank per slot
    assert.are.equal(want.dp2, s.param_digest)
  end)

  it("netcluster.sh: hostfile, status, shape, a bad prefix refused, down idempotent", function()
    -- no way out of the machine: no default route in a host, no IPv6
    for i = 0, 3 do
      local h = PREFIX .. i
      assert.are.equal("rc=0", (util.sh(("ip -n %s route show default"):format(h)):gsub("%s+", "")))
      assert.are.equal("rc=0", (util.sh(("ip -n %s -6 addr show"):format(h)):gsub("%s+", "")))
    end
    local hf = nc.sh(PREFIX, "hostfile")
    assert.matches("^" .. PREFIX .. "0 slots=1\n" .. PREFIX .. "1 slots=1\n", hf)
    local o, rc = nc.sh(PREFIX, "shape 1gbit " .. PREFIX .. "2")
    assert.are.equal(0, rc, o)
    assert.matches(PREFIX .. "2 %S+ link=up qdisc=htb rate=1Gbit", nc.sh(PREFIX, "status"))
    nc.sh(PREFIX, "shape none")
    assert.matches(PREFIX .. "2 %S+ link=up qdisc=noqueue rate=unlimited", nc.sh(PREFIX, "status"))
    o, rc = nc.sh("Bad-1", "up 1")
    assert.are.equal(1, rc)
    assert.matches("ZTRAIN_NETCLUSTER=Bad%-1: a prefix is 3%-8 characters", o)
    o, rc = nc.sh(PREFIX, "up 2")
    assert.are.equal(1, rc)
    assert.matches("a cluster with prefix " .. PREFIX .. " is already up", o)
    -- a second cluster beside it, removed twice
    o, rc = nc.sh(PREFIX .. "z", "up 1")
    assert.are.equal(0, rc, o)
    assert.are.equal(0, select(2, nc.down(PREFIX .. "z")))
    assert.are.equal(0, select(2, nc.down(PREFIX .. "z")))
    assert.are.equal("", nc.leftovers(PREFIX .. "z"))
  end)

  it("the ranks took their share of this machine's cores (cores / ranks, at least 1)", function()
    local cores = tonumber((util.sh("nproc"):match("(%d+)")))
    local s = run(("--hostfile %s recipes/dp.lua %s %s train.steps=1"):format(hostfile(4), BASE, TINY))
    assert.are.equal(math.max(1, math.floor(cores / 4)), s.threads)
  end)
end)

-- tools/netcluster.sh given bad arguments: the script's own one-line
-- message and exit status 1 (2 for no command: the usage), nothing made or
-- changed. Fast: one 1-host cluster, no run.
describe("netcluster.sh refuses bad arguments", function()
  if why then
    pending("netcluster.sh specs skipped: " .. why)
    return
  end
  local P = "ztmsa"

  it("no command, up without a count or rate, exec without a host, a bad subnet, a short prefix", function()
    local function refused(args, status, pattern)
      local o, rc = nc.sh(P, args)
      assert.are.equal(status, rc, o)
      assert.matches(pattern, o)
    end
    refused("", 2, "up N %[%-%-rate RATE%]")                          -- the usage
    refused("up", 1, "netcluster: up needs a host count")
    refused("exec", 1, "netcluster: usage: tools/netcluster.sh exec HOST CMD")
    refused("up 2 --rate", 1, "^netcluster: up: %-%-rate needs a rate")
    refused("up 2 --slots", 1, "^netcluster: up: %-%-slots needs a count")
    local o, rc
    for _, bad in ipairs({ "garbage", "10.213.256", "10.213", "10.213.1.2" }) do
      o, rc = util.sh(("ZTRAIN_NETCLUSTER_SUBNET=%s ZTRAIN_NETCLUSTER=%s tools/netcluster.sh up 1"):format(bad, P))
      assert.are.equal(1, rc, o)
      assert.matches("netcluster: ZTRAIN_NETCLUSTER_SUBNET=" .. bad:gsub("%p", "%%%0") .. " is not", o)
      assert.are.equal("", nc.leftovers(P), "a refused up made nothing")
    end
    -- a short prefix would match other clusters' namespaces (a0, a1, ...)
    for _, short in ipairs({ "a", "ab" }) do
      o, rc = nc.sh(short, "down")
      assert.are.equal(1, rc, o)
      assert.matches("prefix is 3%-8 characters", o)
    end
  end)

  it("a failed ip command during up: exit 1, the partial cluster removed", function()
    -- an `ip` that fails to add addresses (as a clash would)
    local bin = util.tmpdir()
    util.write(bin .. "/ip", "#!/bin/sh\n[ \"$1 $2\" = 'addr add' ] || [ \"$3 $4\" = 'addr add' ] && " ..
                             "{ echo 'RTNETLINK answers: File exists' >&2; exit 2; }\nexec /usr/sbin/ip \"$@\"\n")
    util.sh("chmod +x " .. bin .. "/ip")
    local o, rc = util.sh(("PATH=%s:$PATH ZTRAIN_NETCLUSTER=%s tools/netcluster.sh up 2"):format(bin, P))
    util.rm(bin)
    nc.down(P)
    assert.are.equal(1, rc, o)
    assert.matches("netcluster: cannot add address", o)
    assert.are.equal("", nc.leftovers(P))
  end)

  it("shape with a bad rate: refused before any qdisc is touched, the old rate kept", function()
    local ok, err = pcall(function()
      local o, rc = nc.sh(P, "up 1 --rate 1gbit")
      assert.are.equal(0, rc, o)
      for _, bad in ipairs({ "garbage", "10", "5 mbit", "1gbit;x" }) do
        o, rc = nc.sh(P, ("shape '%s'"):format(bad))
        assert.are.equal(1, rc, o)
        assert.matches("^netcluster: shape " .. bad:gsub("%p", "%%%0") .. ": a rate looks like", o)
        assert.is_nil(o:find("Usage", 1, true), o)                     -- not tc's usage text
        local st = nc.sh(P, "status")
        assert.matches(P .. "0 %S+ link=up qdisc=htb rate=1Gbit", st)
        assert.matches("rate 1gbit", st)
      end
      o, rc = nc.sh(P, "shape 5MBit")                                  -- tc's units, any case
      assert.are.equal(0, rc, o)
      assert.matches(P .. "0 %S+ link=up qdisc=htb rate=5Mbit", nc.sh(P, "status"))
      o, rc = nc.sh(P, "up 1 --rate fast")
      assert.are.equal(1, rc, o)
      assert.matches("a rate looks like", o)
    end)
    nc.remove(P)
    assert(ok, err)
  end)
end)
