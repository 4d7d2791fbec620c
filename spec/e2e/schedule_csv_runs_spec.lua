-- PyTorch's pipelining CSV as a run's schedule (issue 32, item 1):
-- schedule = "csv:PATH" and `ztrain schedule csv:PATH` read every format
-- ztrain knows PyTorch writes: compute-only with any number of chunks
-- (looped or V, the placement read from the file), 2.5's input-gradient
-- backward written as B, and the newer dumps' WAIT_* actions beside their
-- SEND/RECV. The files are written here in PyTorch's format from ztrain's
-- own library schedules (PyTorch's own dumps, by torch 2.15 and 2.5.1, are
-- spec/fixtures/pytorch/ and pytorch_fixtures_spec's), and each run on 2
-- ranks must give the digest of one rank accumulating the 4 micro-batches.
local util = require "spec.helpers.util"
local lib = require "ztrain.parallel.schedule.library"

local ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
local BASE = "model.size=gpt2-tiny data.seq_len=32 batch.micro=2 train.steps=3 train.eval_every=0 " ..
             "data.tokenizer=bytes lr.warmup=1 batch.accumulate=4 -q 'data.text=docs/*.md'"

local function cells(lists, cell)
  local rows = {}
  for r, l in ipairs(lists) do
    local c = {}
    for _, a in ipairs(l) do local t = cell(a); if t then c[#c + 1] = t end end
    rows[r] = table.concat(c, ",")
  end
  return table.concat(rows, "\r\n") .. "\r\n"             -- Python's csv.writer ends rows with CRLF
end
local function compute(a)
  if a.op == "F" or a.op == "B" or a.op == "I" or a.op == "W" then return ("%d%s%d"):format(a.stage, a.op, a.mb) end
end

local dir, files = nil, {}
local function digest(args)
  local s, out = util.summary_of(args .. " " .. BASE, 120)
  assert.is_truthy(s, out)
  return s.param_digest
end

describe("schedule = csv:PATH", function()
  local want
  setup(function()
    dir = util.tmpdir()
    local function write(name, text) files[name] = dir .. "/" .. name; util.write(files[name], text) end
    write("interleaved.csv", cells(lib.build("interleaved_1f1b", { ranks = 2, microbatches = 4, chunks = 2 }), compute))
    write("zbv.csv", cells(lib.build("zbv", { ranks = 2, microbatches = 4 }), compute))
    write("zb_b_as_i.csv", cells(lib.build("zb_h1", { ranks = 2, microbatches = 4 }), function(a)
      if a.op == "I" then return ("%dB%d"):format(a.stage, a.mb) end
      return compute(a) end))
    write("waits.csv", cells(lib.build("1f1b", { ranks = 2, microbatches = 4 }), function(a)
      if a.op:match("^SEND_") or a.op:match("^RECV_") then
        return ("%d%s%d,%dWAIT_%s%d"):format(a.stage, a.op, a.mb, a.stage, a.op, a.mb)
      end
      return compute(a) end))
    want = digest("recipes/single.lua")
  end)
  teardown(function() util.rm(dir) end)

  it("trains PyTorch's compute-only interleaved file (two chunks, looped) with one rank's digest", function()
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua pipeline.chunks=2 schedule=csv:" ..
                                  files["interleaved.csv"]))
  end)
  it("trains a V-placed compute-only file (ZB-V) with one rank's digest", function()
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua pipeline.chunks=2 pipeline.placement=v " ..
                                  "schedule=csv:" .. files["zbv.csv"]))
  end)
  it("reads 2.5's B-then-W as I, W and trains it with one rank's digest", function()
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=csv:" .. files["zb_b_as_i.csv"]))
    local out, rc = util.sh("build/ztrain schedule csv:" .. files["zb_b_as_i.csv"] .. " out=" .. dir .. "/s1")
    assert.are.equal(0, rc, out)
    assert.matches("8 B action(s) read as I: a W of the same stage and micro-batch follows them", out, 1, true)
  end)
  it("drops the WAIT_* actions of the communication format and trains it with one rank's digest", function()
    assert.are.equal(want, digest("--nproc 2 recipes/pipeline_1f1b.lua schedule=csv:" .. files["waits.csv"]))
    local out, rc = util.sh("build/ztrain schedule csv:" .. files["waits.csv"] .. " out=" .. dir .. "/s2")
    assert.are.equal(0, rc, out)
    assert.matches("dropped 16 WAIT_* action(s)", out, 1, true)
  end)
  it("says which placement a file needs", function()
    local d = util.outdir()
    local out, rc = util.sh(("%stimeout 60 build/ztrain --nproc 2 recipes/pipeline_1f1b.lua pipeline.chunks=2 " ..
                             "schedule=csv:%s %s out=%s"):format(ENV, files["zbv.csv"], BASE, d))
    assert.are.equal(1, rc, out)
    assert.matches("places stage 2 on rank 1, the run on rank 0: set pipeline.chunks = 2 and " ..
                   "pipeline.placement = \"v\" to run it", out, 1, true)
  end)
  it("`ztrain schedule csv:PATH` simulates the file as the built-in it came from", function()
    local out, rc = util.sh("build/ztrain schedule csv:" .. files["zbv.csv"] .. " out=" .. dir .. "/s3")
    assert.are.equal(0, rc, out)
    assert.matches("2 ranks, 4 stages (V), 4 micro-batches, compute only", out, 1, true)
    local builtin = util.sh("build/ztrain schedule zbv p=2 m=4 out=" .. dir .. "/s4")
    local b = builtin:match("bubble ([%d.]+)")
    assert.is_truthy(b, builtin)
    assert.matches("bubble " .. b:gsub("%.", "%%."), out)
  end)
end)
