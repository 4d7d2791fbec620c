-- A checkpoint that cannot be written (issue 30, "outputs agree"): the run
-- ends with exit 3 like any other unwritable output, naming the file, and
-- its summary.json's step count, loss and digest describe one state -- the
-- steps trained -- checked against an uninterrupted run of that many steps.
local cjson = require "cjson"
local u = require "spec.helpers.util"

local ROOT = io.popen("pwd"):read("*l")
local RUN = "recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes data.seq_len=32 batch.micro=2 " ..
            "train.eval_every=0 train.log_every=1 -q data.cache=off"

local function can_tmpfs()
  local _, rc = u.sh("unshare -rm sh -c 'mount -t tmpfs -o size=64k tmpfs /mnt'")
  return rc == 0
end

describe("a checkpoint on a full disk", function()
  it("exits 3 naming the file, and the summary is the trained steps' state", function()
    if not can_tmpfs() then
      pending("no user+mount namespace here to make a small tmpfs")
      return
    end
    local out, ref = u.outdir(), u.outdir()
    -- 256 KiB holds no checkpoint of gpt2-tiny (about 1.3 MB): step 2's fails
    local script = ("mount -t tmpfs -o size=256k tmpfs /mnt && cd %s && build/ztrain %s train.steps=4 " ..
                    "train.ckpt_every=2 train.ckpt_dir=/mnt/ck out=%s; echo \"exit=$?\"; echo LS:; ls -A /mnt/ck 2>/dev/null"):format(
                    ROOT, RUN, out)
    local text = u.sh("unshare -rm sh -c '" .. script:gsub("'", "'\\''") .. "'")
    assert.matches("exit=3", text, 1, true)
    assert.matches("ztrain: checkpoint /mnt/ck/step-00000002: rank 0: cannot write /mnt/ck/.step-00000002.tmp/",
                   text, 1, true)
    assert.matches(": No space left on device; the previous checkpoint is intact", text, 1, true)
    assert.is_nil(text:match("LS:.*%.step"), "a temporary checkpoint left behind:\n" .. text)
    local s = cjson.decode(u.read(out .. "/summary.json"))
    -- the state is step 2's: its count, its loss and its digest
    local o2, rc = u.sh(("build/ztrain %s train.steps=2 out=%s"):format(RUN, ref))
    assert.are.equal(0, rc, o2)
    local w = cjson.decode(u.read(ref .. "/summary.json"))
    assert.are.equal(2, s.steps)
    assert.are.equal(w.final_loss, s.final_loss)
    assert.are.equal(w.param_digest, s.param_digest)
    assert.matches("^error: ", s.exit)
    u.rm(out); u.rm(ref)
  end)
end)
