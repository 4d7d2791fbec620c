-- Specs for ztrain.model.data.hf_tokenizer (Hugging Face tokenizer.json byte-level BPE)
-- and its wiring as data.tokenizer("hf:DIR"). Run under LuaJIT:
--   busted --lua=luajit spec/unit/hf_tokenizer_spec.lua
-- The reference is Hugging Face's `tokenizers`, through spec/fixtures/hf_tokenizer/
-- (tokenizer.json files in the Llama 3, Qwen 2.5, SmolLM and GPT-2 styles, and the ids
-- tokenizers gives for hostile texts; made by tools/hf_tokenizer_fixture.py).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local util = require "helpers.util"
local cjson = require("cjson").new()
local hft = require "ztrain.model.data.hf_tokenizer"
local data = require "ztrain.model.data"
local unorm = require "ztrain.model.data.unorm"

assert(jit, "these specs must run under LuaJIT: busted --lua=luajit spec/unit/hf_tokenizer_spec.lua")

local FIX = "spec/fixtures/hf_tokenizer"
local STYLES = { "llama3", "qwen2", "smollm", "gpt2", "flags", "llama2", "mistral", "spm_unk" }
-- decode(encode(text)) is the text (the normalized text for Qwen) in these styles: the
-- flags style's lstrip / rstrip tokens take in the whitespace beside them, and the
-- SentencePiece ones put a "▁" (a space) before each piece between added tokens
local ROUND_TRIP = { llama3 = true, qwen2 = true, smollm = true, gpt2 = true }
local expected = cjson.decode(util.read(FIX .. "/expected.json"))

local function ids_table(ids, n)
  local t = {}
  for i = 0, n - 1 do t[i + 1] = ids[i] end
  return t
end

local function load(style)
  return assert(hft.load(FIX .. "/" .. style .. "/tokenizer.json"))
end

-- a copy of a fixture's tokenizer.json, changed by fn(spec), in a fresh directory
local function variant(style, fn)
  local spec = cjson.decode(util.read(FIX .. "/" .. style .. "/tokenizer.json"))
  fn(spec)
  local d = util.tmpdir()
  util.write(d .. "/tokenizer.json", cjson.encode(spec))
  return d
end

describe("hf_tokenizer against Hugging Face tokenizers", function()
  for _, style in ipairs(STYLES) do
    it(style .. ": the ids of every hostile text, and decode gives the text back", function()
      local tok = load(style)
      local cases = expected.styles[style].cases
      assert.is_true(#cases >= 20)
      -- the id the post_processor would put first (Llama 3's and Llama 2's templates), not put
      assert.are.equal(expected.styles[style].bos ~= cjson.null and expected.styles[style].bos or nil, tok.bos)
      for _, c in ipairs(cases) do
        local ids, n = tok.encode(c.text)
        assert.are.same(c.ids, ids_table(ids, n), style .. " " .. c.name)
        local back = tok.decode(ids, n)
        -- (Qwen's added "Cafe\u0301s" decodes to itself, not to the NFC text it matched)
        if ROUND_TRIP[style] and not (style == "qwen2" and c.name == "nfc_added") then
          assert.are.equal(c.normalized or c.text, back, style .. " " .. c.name)
        end
        -- tokenizers' own decode agrees, but where it puts Qwen's added tokens "Ångström"
        -- and "Cafe\u0301s" through the ByteLevel decoder (Å, é, ö are byte symbols: U+FFFD)
        if not (style == "qwen2" and (c.name == "combining" or c.name == "nfc_added")) then
          assert.are.equal(c.decoded, back, style .. " " .. c.name)
        end
      end
    end)
  end

  it("special tokens in the text are their ids; merges in both forms; ignore_merges", function()
    local llama, qwen = load("llama3"), load("qwen2")
    local ids, n = llama.encode("<|begin_of_text|>Hi<|eot_id|>")
    assert.are.equal(llama.added["<|begin_of_text|>"], ids[0])
    assert.are.equal(llama.added["<|eot_id|>"], ids[n - 1])
    assert.are.equal(llama.added["<|end_of_text|>"], llama.eot)
    assert.are.equal(qwen.added["<|endoftext|>"], qwen.eot)
    assert.are.equal(1211, llama.vocab_size)
    -- " hostile" is in Llama's vocabulary with no merge that makes it: one id
    ids, n = llama.encode(" hostile")
    assert.are.equal(1, n)
    -- the same file without ignore_merges merges it into pieces
    local d = variant("llama3", function(s) s.model.ignore_merges = false end)
    local plain = assert(hft.load(d .. "/tokenizer.json"))
    ids, n = plain.encode(" hostile")
    assert.is_true(n > 1)
    assert.are.equal(" hostile", plain.decode(ids, n))
    util.rm(d)
  end)

  it("invalid UTF-8 (which tokenizers never sees) encodes and decodes to the same bytes", function()
    local s = "\255abc\192 \195\169\128\n<|eot_id|>\237\160\128 x\240\159\152 1234\226\130"
    for _, style in ipairs(STYLES) do
      if style ~= "spm_unk" then -- (<unk> stands for what it replaced)
        local tok = load(style)
        local ids, n = tok.encode(s)
        assert.are.equal(s, tok.decode(ids, n), style)
      end
    end
    assert.are.equal("Caf\195\169\255\195\169", unorm.nfc("Cafe\204\129\255e\204\129"))
  end)

  it("long inputs: linear time (the per-pre-token cache and bpe.lua's heap merge)", function()
    local tok = load("llama3")
    local unit = "The 12345 quick <|eot_id|> brown   fox\n\n日本語 😀 " .. ("z"):rep(300) .. " "
    local function cost(reps)
      local s = unit:rep(reps)
      local t0 = os.clock()
      local ids, n = tok.encode(s)
      local dt = os.clock() - t0
      assert.are.equal(s, tok.decode(ids, n))
      return dt
    end
    cost(50) -- warm the cache and the JIT
    local small, big = cost(200), cost(1600)
    assert.is_true(big < 25 * math.max(small, 1e-3), ("200 units %.3fs, 1600 units %.3fs"):format(small, big))
  end)

  it("Llama 3's 256 added tokens cost about what 6 do (one look per byte of the text)", function()
    local d = variant("llama3", function(s)
      for i = 1, 250 do
        s.added_tokens[#s.added_tokens + 1] = { id = 1210 + i, content = ("<|reserved_special_token_%d|>"):format(i),
          special = true, normalized = false, lstrip = false, rstrip = false, single_word = false }
      end
    end)
    local many, few = assert(hft.load(d .. "/tokenizer.json")), load("llama3")
    util.rm(d)
    local s = ("a <b> c <|eot_id <| 1 "):rep(20000) .. "<|reserved_special_token_250|>"
    local function cost(tok)
      tok.encode(s)
      local t0 = os.clock()
      local ids, n = tok.encode(s)
      return os.clock() - t0, ids[n - 1]
    end
    local t_few = cost(few)
    local t_many, last = cost(many)
    assert.are.equal(1460, last)
    assert.is_true(t_many < 3 * math.max(t_few, 1e-3), ("6 added tokens %.3fs, 256 %.3fs"):format(t_few, t_many))
  end)
end)

describe("hf_tokenizer refuses what it does not read, naming the field", function()
  local cases = {
    { "Unigram", function(s) s.model.type = "Unigram" end, "model.type is Unigram" },
    { "byte fallback with a byte-level pre-tokenizer", function(s) s.model.byte_fallback = true end,
      "pre_tokenizer: pre-tokenizer Sequence with a SentencePiece-style BPE is not supported" },
    { "Metaspace with another replacement", function(s) s.pre_tokenizer = { type = "Metaspace", replacement = "_" } end,
      "pre_tokenizer: Metaspace replacement \"_\" is not supported" },
    { "no ByteLevel", function(s) s.pre_tokenizer = s.pre_tokenizer.pretokenizers[1] end, "has no ByteLevel step" },
    { "prefix space", function(s) s.pre_tokenizer.pretokenizers[2].add_prefix_space = true end,
      "pre_tokenizer.pretokenizers[1]: ByteLevel with add_prefix_space true" },
    { "Removed", function(s) s.pre_tokenizer.pretokenizers[1].behavior = "Removed" end,
      "pre_tokenizer.pretokenizers[0]: Split with behavior Removed" },
    { "a bad pattern", function(s) s.pre_tokenizer.pretokenizers[1].pattern.Regex = "(" end, "pattern \"(\"" },
    { "Lowercase", function(s) s.normalizer = { type = "Lowercase" } end, "normalizer Lowercase is not supported" },
    { "a malformed merge", function(s) s.model.merges[3] = "a b c" end, "model.merges[2]: malformed merge" },
    { "a merge of unknown tokens", function(s) s.model.merges[1] = { "Q", "zzz" } end, "the token \"zzz\" is not in" },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local d = variant("llama3", c[2])
      local tok, err = hft.load(d .. "/tokenizer.json")
      assert.is_nil(tok)
      assert.matches(d .. "/tokenizer.json", err, 1, true)
      assert.matches(c[3], err, 1, true)
      local ok, gerr = pcall(data.tokenizer, "hf:" .. d)
      assert.is_false(ok)
      assert.matches(c[3], gerr, 1, true)
      util.rm(d)
    end)
  end
end)

describe("data.tokenizer hf:DIR", function()
  it("reads tokenizer.json; keeps GPT-2's vocab.json + merges.txt where the pipeline is GPT-2's", function()
    local tok = data.tokenizer("hf:" .. FIX .. "/qwen2")
    assert.are.equal("hf:" .. FIX .. "/qwen2", tok.name)
    assert.are.equal(FIX .. "/qwen2/tokenizer.json", tok.cache_files[1])
    local ids, n = tok.encode("<|im_start|>user")
    assert.are.equal(tok.added["<|im_start|>"], ids[0])
    assert.are.equal("<|im_start|>user", tok.decode(ids, n))
    -- a directory with all three files: GPT-2's pipeline -> bpe.lua with vocab.json
    local d = util.tmpdir()
    util.sh(("cp %s/gpt2/tokenizer.json spec/fixtures/bpe/tiny/vocab.json spec/fixtures/bpe/tiny/merges.txt %s/"):format(FIX, d))
    local g = data.tokenizer("hf:" .. d)
    assert.are.equal(d .. "/vocab.json", g.cache_files[1])
    -- Qwen's own directories hold all three too: its pipeline is not GPT-2's
    util.sh(("cp %s/qwen2/tokenizer.json %s/"):format(FIX, d))
    local q = data.tokenizer("hf:" .. d)
    assert.are.equal(d .. "/tokenizer.json", q.cache_files[1])
    util.rm(d)
  end)
end)
