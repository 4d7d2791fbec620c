-- An exported model carries what it was trained with (issue 29, "models
-- carry their tokenizer"): export.hf of a byte-tokenizer run writes a
-- vocab.json + merges.txt that give every text the byte tokenizer's ids
-- (a GPT-2 byte-level BPE without merges), so `ztrain generate DIR` works on
-- the export as it is; config.json says dropout 0, as ztrain trained.
local cjson = require "cjson"
local u = require "spec.helpers.util"
local zt = require "ztrain"
local bpe = require "ztrain.model.data.bpe"

-- `ztrain generate DIR` with DIR's own tokenizer gives the text tokenizer=bytes gives
local function generates_as_bytes(dir)
  local a, rca = u.sh(("build/ztrain generate %s 'The ' max_tokens=12 temperature=0"):format(dir))
  local b, rcb = u.sh(("build/ztrain generate %s 'The ' max_tokens=12 temperature=0 tokenizer=bytes"):format(dir))
  assert.are.equal(0, rca, a)
  assert.are.equal(0, rcb, b)
  assert.are.equal(b, a)
end

describe("export.hf of a byte-tokenizer run", function()
  local run, dir
  setup(function()
    run, dir = u.outdir(), u.outdir()
    local out, rc = u.sh(("build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes " ..
                          "data.seq_len=32 batch.micro=2 train.steps=3 train.eval_every=0 -q out=%s export.hf=%s")
                         :format(run, dir))
    assert.are.equal(0, rc, out)
  end)
  teardown(function() u.rm(run); u.rm(dir) end)

  it("holds a tokenizer that gives every byte string the byte tokenizer's ids", function()
    local bytes, exported = zt.data.tokenizer("bytes"), zt.data.tokenizer("hf:" .. dir)
    assert.are.equal(256, exported.vocab_size)
    assert.is_nil(exported.eot)
    local texts = { "Hello, world!\n", "  two  spaces\ttab", "héllo ünïcode", "don't 123 <|endoftext|>" }
    local all = {}
    for b = 0, 255 do all[#all + 1] = string.char(b) end
    texts[#texts + 1] = table.concat(all)
    for _, s in ipairs(texts) do
      local a, na = bytes.encode(s)
      local b, nb = exported:encode(s)
      assert.are.equal(na, nb, s)
      for i = 0, na - 1 do assert.are.equal(a[i], b[i], ("%q at %d"):format(s, i)) end
      assert.are.equal(s, exported:decode(b, nb))
    end
  end)

  it("generates as it is, the same text as with tokenizer=bytes named", function()
    generates_as_bytes(dir)
  end)

  it("says dropout 0 in config.json (ztrain trains without dropout)", function()
    local c = cjson.decode(u.read(dir .. "/config.json"))
    assert.are.equal(0, c.attn_pdrop)
    assert.are.equal(0, c.embd_pdrop)
    assert.are.equal(0, c.resid_pdrop)
  end)

  it("ztrain export of the run's checkpoint writes the same tokenizer files", function()
    local ck, ex = u.outdir(), u.outdir()
    local out, rc = u.sh(("build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes " ..
                          "data.seq_len=32 batch.micro=2 train.steps=2 train.ckpt_every=2 train.eval_every=0 -q out=%s")
                         :format(ck))
    assert.are.equal(0, rc, out)
    out, rc = u.sh(("build/ztrain export %s/checkpoints %s"):format(ck, ex))
    assert.are.equal(0, rc, out)
    assert.are.equal(u.read(dir .. "/vocab.json"), u.read(ex .. "/vocab.json"))
    assert.are.equal(u.read(dir .. "/merges.txt"), u.read(ex .. "/merges.txt"))
    u.rm(ck); u.rm(ex)
  end)
end)

local RUN = "data.seq_len=32 batch.micro=2 train.steps=1 train.eval_every=0 optim.lr=0"

-- a run's out= and export.hf= directories, after one step with data.tokenizer=tokenizer
local function exported(tokenizer)
  local src, dir = u.outdir(), u.outdir()
  local out, rc = u.sh(("build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=%s %s -q " ..
                        "out=%s export.hf=%s"):format(tokenizer, RUN, src, dir))
  assert.are.equal(0, rc, out)
  return src, dir
end

describe("model=hf:DIR with the model's own tokenizer", function()
  local src, dir
  setup(function()
    -- a model whose directory carries a tokenizer: an export of a bpe run
    -- (8192 tokens, the vocabulary trained on the default corpus)
    src, dir = exported("bpe")
  end)
  teardown(function() u.rm(src); u.rm(dir) end)

  local function run(args)
    local out = u.outdir()
    local text, rc = u.sh(("build/ztrain recipes/single.lua model=hf:%s %s %s out=%s"):format(dir, RUN, args, out))
    local s = rc == 0 and cjson.decode(u.read(out .. "/summary.json")) or nil
    u.rm(out)
    return text, rc, s
  end

  it("is used over the recipe file's tokenizer, and the run says so", function()
    -- recipes/single.lua names data.tokenizer = "bytes" for its own model
    local text, rc, s = run("")
    assert.are.equal(0, rc, text)
    assert.are.equal("hf:" .. dir, s.data.tokenizer)
    assert.matches("data.tokenizer = hf:" .. dir:gsub("%p", "%%%0") .. ", the model's own", text)
  end)

  it("a tokenizer named on the command line wins when its vocabulary is the model's", function()
    local text, rc, s = run("data.tokenizer=bpe")
    assert.are.equal(0, rc, text)
    assert.are.equal("bpe", s.data.tokenizer)
  end)

  it("a named tokenizer with another vocabulary is refused, naming both and the fix", function()
    local text, rc = run("data.tokenizer=bytes")
    assert.are.equal(1, rc, text)
    assert.matches("data.tokenizer = bytes has 256 tokens but the model hf:" .. dir:gsub("%p", "%%%0") ..
                   " was trained with its own tokenizer of 8192", text)
    assert.matches("/vocab.json): its embedding rows stand for those; use data.tokenizer=hf:" .. dir, text, 1, true)
    assert.not_matches("%.lua:%d+:", text)
  end)
end)

describe("model=hf:DIR whose tokenizer is a tokenizer.json (issue 33)", function()
  local src, dir
  setup(function()
    -- an export of a byte-tokenizer run whose vocab.json + merges.txt are replaced by a
    -- tokenizer.json in Llama 3's style (its Split regex, ByteLevel, ignore_merges) over
    -- the 256 byte symbols and no merges: every text gets the byte tokenizer's ids
    src, dir = exported("bytes")
    local llama = cjson.decode(u.read("spec/fixtures/hf_tokenizer/llama3/tokenizer.json"))
    local vocab = {}
    for b = 0, 255 do vocab[bpe.byte_to_unicode(b)] = b end
    llama.model.vocab, llama.model.merges, llama.added_tokens = vocab, setmetatable({}, cjson.array_mt), {}
    os.remove(dir .. "/vocab.json"); os.remove(dir .. "/merges.txt")
    u.write(dir .. "/tokenizer.json", cjson.encode(llama))
  end)
  teardown(function() u.rm(src); u.rm(dir) end)

  it("is the run's tokenizer, its export carries it, and a named one of another size is refused", function()
    local out, ex = u.outdir(), u.outdir()
    local text, rc = u.sh(("build/ztrain recipes/single.lua model=hf:%s %s out=%s export.hf=%s train.ckpt_every=1")
                          :format(dir, RUN, out, ex))
    assert.are.equal(0, rc, text)
    assert.are.equal("hf:" .. dir, cjson.decode(u.read(out .. "/summary.json")).data.tokenizer)
    assert.are.equal(u.read(dir .. "/tokenizer.json"), u.read(ex .. "/tokenizer.json"))
    u.rm(ex)
    text, rc = u.sh(("build/ztrain export %s/checkpoints %s"):format(out, ex)) -- from the checkpoint too
    assert.are.equal(0, rc, text)
    assert.are.equal(u.read(dir .. "/tokenizer.json"), u.read(ex .. "/tokenizer.json"))
    u.rm(out); u.rm(ex)
    text, rc = u.sh(("build/ztrain recipes/single.lua model=hf:%s %s data.tokenizer=bpe out=%s"):format(dir, RUN, out))
    assert.are.equal(1, rc, text)
    assert.matches("/tokenizer.json): its embedding rows stand for those; use data.tokenizer=hf:" .. dir, text, 1, true)
    u.rm(out)
  end)

  it("ztrain generate DIR encodes with it: the text tokenizer=bytes gives", function()
    generates_as_bytes(dir)
  end)
end)

-- `ztrain export CHECKPOINT DIR` with arguments a user may mistype or a
-- hostile one may craft: refused naming the argument, or written exactly
-- where named; nothing run by a shell, nothing written into /.
describe("ztrain export's arguments and messages", function()
  local run, ck
  setup(function()
    run = u.outdir()
    local out, rc = u.sh(("build/ztrain recipes/single.lua model.size=gpt2-tiny data.tokenizer=bytes " ..
                          "data.seq_len=32 batch.micro=2 train.steps=2 train.ckpt_every=1 train.eval_every=0 -q out=%s")
                         :format(run))
    assert.are.equal(0, rc, out)
    ck = run .. "/checkpoints"
  end)
  teardown(function() u.rm(run) end)

  -- export(dir) -> output, exit code of `ztrain export CK DIR`, dir single-quoted
  -- (the test's own shell expands nothing in it)
  local function export(dir, from)
    return u.sh(("build/ztrain export %s '%s'"):format(from or ck, dir))
  end

  it("runs nothing a DIR names as a shell command: $(...) and $HOME stay part of the name", function()
    local base = u.tmpdir()
    local dir = base .. "/d$(touch " .. base .. "/PWNED)"
    local out, rc = export(dir)
    assert.are.equal(0, rc, out)
    assert.is_nil(io.open(base .. "/PWNED"), "the command in the name ran")
    assert.truthy(io.open(dir .. "/config.json"), out)
    -- a non-empty directory whose name holds $HOME is refused as any other
    local full = base .. "/h$HOME"
    assert.are.equal(0, os.execute(("mkdir -p '%s' && touch '%s/x'"):format(full, full)))
    out, rc = export(full)
    assert.are.equal(1, rc, out)
    assert.matches(full .. " is not empty (it holds x)", out, 1, true)
    assert.is_nil(io.open(full .. "/config.json"), out)
    u.rm(base)
  end)

  it("refuses an empty DIR or CHECKPOINT naming it, writing nothing", function()
    local out, rc = export("")
    assert.are.equal(1, rc, out)
    assert.matches("export: DIR is empty ('')", out, 1, true)
    assert.is_nil(out:find("wrote", 1, true), out)
    out, rc = u.sh("build/ztrain export '' " .. u.outdir())
    assert.are.equal(1, rc, out)
    assert.matches("export: CHECKPOINT is empty ('')", out, 1, true)
    assert.not_matches("%.lua:%d+:", out)
  end)

  it("a missing or corrupt checkpoint is met with export's remedy, not a training run's", function()
    local dir = u.outdir()
    local out, rc = export(dir, dir .. "-none")
    assert.are.equal(1, rc, out)
    assert.matches("give export a checkpoint step directory", out, 1, true)
    assert.is_nil(out:find("resume", 1, true), out)
    assert.is_nil(out:find("out=", 1, true), out)
    -- a flipped byte in the weights: its block fails its checksum
    local bad = u.tmpdir()
    assert.are.equal(0, os.execute(("cp -r %s/step-00000002/. %s/"):format(ck, bad)))
    local f = assert(io.open(bad .. "/rank-00000.bin", "r+b"))
    f:seek("set", 5000)
    local b = f:read(1)
    f:seek("set", 5000)
    f:write(string.char((b:byte() + 1) % 256))
    f:close()
    out, rc = export(dir, bad)
    assert.are.equal(1, rc, out)
    assert.matches("fails its checksum", out, 1, true)
    assert.matches("export another step directory of the run", out, 1, true)
    assert.is_nil(out:find("resume", 1, true), out)
    assert.is_nil(io.open(dir .. "/model.safetensors"), out)
    assert.not_matches("%.lua:%d+:", out)
    u.rm(bad); u.rm(dir)
  end)

  it("says the tokenizer files were not written when the run's tokenizer directory is gone", function()
    local step, dir = u.tmpdir(), u.outdir()
    assert.are.equal(0, os.execute(("cp -r %s/step-00000002/. %s/"):format(ck, step)))
    local man = cjson.decode(u.read(step .. "/manifest.json"))
    man.data.tokenizer = "bpe:/nonexistent"
    u.write(step .. "/manifest.json", cjson.encode(man))
    local out, rc = export(dir, step)
    assert.are.equal(0, rc, out)                   -- the weights are fine
    assert.truthy(io.open(dir .. "/model.safetensors"), out)
    assert.is_nil(io.open(dir .. "/vocab.json"), out)
    assert.matches("warning: " .. dir .. ": tokenizer files not written (vocab.json, merges.txt)", out, 1, true)
    assert.matches("/nonexistent/vocab.json: No such file or directory", out, 1, true)
    u.rm(step); u.rm(dir)
  end)
end)
