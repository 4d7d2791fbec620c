-- Specs for ztrain.model.data.bpe (GPT-2 byte-level BPE), ztrain.model.data.pcre2 and
-- ztrain.model.data.bpe_train. Run under LuaJIT:
--   busted --lua=luajit spec/unit/bpe_spec.lua
-- The reference is Hugging Face's `tokenizers`, through spec/fixtures/bpe/expected.json
-- (made by tools/make_bpe_fixture.py; no Python needed here).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local ffi = require "ffi"
local util = require "helpers.util"
local cjson = require("cjson").new()
local bpe = require "ztrain.model.data.bpe"
local pcre2 = require "ztrain.model.data.pcre2"
local train = require "ztrain.model.data.bpe_train"
local errors = require "ztrain.core.errors"

assert(jit, "these specs must run under LuaJIT: busted --lua=luajit spec/unit/bpe_spec.lua")

local FIX = "spec/fixtures/bpe"
local SHIPPED = "data/bpe/fortunes"

local read = util.read

local expected = cjson.decode(read(FIX .. "/expected.json"))

local function ids_table(ids, n)
  local t = {}
  for i = 0, n - 1 do t[i + 1] = ids[i] end
  return t
end

-- 32-bit FNV-1a over integers, as tools/make_bpe_fixture.py computes it
local function fnv(get, n)
  local h = 2166136261
  for i = 0, n - 1 do
    h = bit.bxor(h, get(i)) % 4294967296
    local lo = h % 65536
    local hi = (h - lo) / 65536
    h = (lo * 16777619 + ((hi * 16777619) % 65536) * 65536) % 4294967296
  end
  return h
end

-- a fresh temporary directory with a writer; removed by :clean()
local tmpdir = util.scratch

-- the raised error, checked to be a user error (no Lua location)
local function user_error(fn, ...)
  local ok, e = pcall(fn, ...)
  assert(not ok, "expected an error")
  assert(errors.is_user(e), "expected a user error (level 0), got: " .. tostring(e))
  return errors.message(e)
end

describe("bpe: the pcre2 binding its pre-tokenizer runs on", function()
  it("is PCRE2 >= 10.34 with Unicode, and JIT-compiles the GPT-2 pattern where it can", function()
    local major, minor = pcre2.version():match("^(%d+)%.(%d+)")
    assert.is_true(tonumber(major) > 10 or tonumber(minor) >= 34, pcre2.version())
    assert.is_true(pcre2.has_unicode)
    assert.equal(pcre2.has_jit, bpe.regex().jit)
  end)

  it("finds matches as 0-based [s, e) and names a bad pattern's offset", function()
    local re = pcre2.compile("\\p{L}+")
    local s, e = re:find("12 héllo 3")
    assert.same({ 3, 9 }, { s, e })
    assert.is_nil(re:find("123 456"))
    local msg = user_error(pcre2.compile, "a(b")
    assert.truthy(msg:find("offset 3", 1, true), msg)
    re:free()
  end)
end)

describe("bpe: bytes_to_unicode", function()
  it("maps bytes as GPT-2 does, in GPT-2's vocabulary order", function()
    assert.equal("Ġ", bpe.byte_to_unicode(32))
    assert.equal("Ċ", bpe.byte_to_unicode(10))
    assert.equal("Ā", bpe.byte_to_unicode(0))
    assert.equal("A", bpe.byte_to_unicode(65))
    -- the unprintable bytes, in order, get U+0100...: 0..32, then 127..160, then 173
    assert.equal("ġ", bpe.byte_to_unicode(127)) -- U+0121
    assert.equal("ł", bpe.byte_to_unicode(160)) -- U+0142
    assert.equal("Ń", bpe.byte_to_unicode(173)) -- U+0143
    assert.equal("®", bpe.byte_to_unicode(174)) -- printable: itself
    local order = bpe.byte_symbols()
    -- GPT-2's vocab.json: "!" = 0, "A" = 32, "Ā" (byte 0) = 188, "Ġ" (space) = 220
    assert.equal(33, order[1]); assert.equal(65, order[33])
    assert.equal(0, order[189]); assert.equal(32, order[221])
    local seen = {}
    for b = 0, 255 do
      local c = bpe.byte_to_unicode(b)
      assert.is_nil(seen[c]); seen[c] = true
      assert.equal(string.char(b), bpe.from_unicode(c))
    end
  end)
end)

describe("bpe: the pre-tokenizer", function()
  it("splits as GPT-2's pattern does", function()
    assert.same({ "Hello", ",", " world", "!", " It", "'s", " 2024", "  ", " x" },
                bpe.split("Hello, world! It's 2024   x"))
    -- \s+(?!\S) leaves the last space to the next word; trailing spaces stay whole
    assert.same({ "a", "  ", " b", "\n\n", " c", "   " }, bpe.split("a   b\n\n c   "))
    assert.same({ "they", "'re", " I", "'m", " we", "'ll", " '", "S" }, bpe.split("they're I'm we'll 'S"))
    assert.same({ "δ日本語", " 😀", "\t", "\t", "x" }, bpe.split("δ日本語 😀\t\tx"))
  end)

  it("splits as tokenizers' ByteLevel pre-tokenizer does", function()
    local n = 0
    for _, c in ipairs(expected.cases) do
      if c.pre then
        local got = {}
        for i, p in ipairs(bpe.split(c.text)) do got[i] = bpe.to_unicode(p) end
        assert.same(c.pre, got, c.name)
        n = n + 1
      end
    end
    assert.is_true(n >= 10)
  end)

  it("gives bytes that are not UTF-8 their own pre-token", function()
    assert.same({ " a", "\xff\xfe", "b", "\xc3" }, bpe.split(" a\xff\xfeb\xc3"))
  end)
end)

describe("bpe: encoding (the shipped vocabulary)", function()
  local tok = bpe.load(SHIPPED)

  it("matches tokenizers token for token", function()
    assert.is_true(#expected.cases >= 10)
    for _, c in ipairs(expected.cases) do
      local ids, n = tok.encode(c.text)
      assert.same(c.ids, ids_table(ids, n), c.name)
      assert.equal(c.text, tok.decode(ids, n), c.name)
    end
  end)

  it("gives the same ids through the scan and the heap merge", function()
    local saved = bpe.HEAP_MIN
    for _, hm in ipairs { 1, 1e9 } do
      bpe.HEAP_MIN = hm
      local fresh = bpe.load(SHIPPED) -- an empty cache
      for _, c in ipairs(expected.cases) do
        local ids, n = fresh.encode(c.text)
        assert.same(c.ids, ids_table(ids, n), c.name .. " HEAP_MIN=" .. hm)
      end
    end
    bpe.HEAP_MIN = saved
  end)

  it("holds the tokenizer contract", function()
    assert.equal(8192, tok.vocab_size)
    assert.equal(8191, tok.eot)
    assert.equal("bpe:" .. SHIPPED, tok.name)
    local a, n = tok.encode("Hello there")
    local b, m = tok:encode("Hello there")
    assert.is_true(ffi.istype(ffi.typeof("int32_t[?]"), a))
    assert.same(ids_table(a, n), ids_table(b, m))
    assert.equal("Hello there", tok:decode(ids_table(a, n)))
    assert.equal("Hello there", tok.decode(a, n))
    local e, k = tok.encode("")
    assert.equal(0, k)
    assert.equal("", tok.decode(e, k))
    assert.equal("<|endoftext|>", tok.decode({ tok.eot }))
    assert.truthy(user_error(tok.decode, { 5, 8192 }):find("id 8192 at position 2", 1, true))
    assert.truthy(user_error(tok.encode, 42):find("expected a string", 1, true))
  end)

  it("round-trips any byte string, UTF-8 or not", function()
    math.randomseed(7)
    local pool = { "a", "Z", " ", "  ", "\t", "\n", "'s", "'", "0", "9", "é", "日", "😀", "\xe2\x80\x8b",
                   "\xff", "\xc3", "\x80", "\0", "<|endoftext|>", "<|", "-", "Ġ" }
    for _ = 1, 300 do
      local parts = {}
      for i = 1, math.random(0, 40) do
        parts[i] = math.random() < 0.3 and string.char(math.random(0, 255)) or pool[math.random(#pool)]
      end
      local s = table.concat(parts)
      local ids, n = tok.encode(s)
      assert.equal(s, tok.decode(ids, n))
      assert.is_true(n <= #s)
    end
  end)

  it("encodes text with more tokens than half its bytes (the output grows)", function()
    math.randomseed(3)
    local t = {}
    for i = 1, 5000 do t[i] = string.char(math.random(128, 255)) end
    local s = table.concat(t) .. ("<|endoftext|>x"):rep(300)
    local ids, n = tok.encode(s)
    assert.is_true(n > #s / 2)
    assert.equal(s, tok.decode(ids, n))
    assert.equal(tok.eot, ids[n - 2])
  end)

  local corpus = expected.corpus
  local have_corpus = corpus and io.open(corpus.dir .. "/" .. corpus.files[1].name, "rb")
  if have_corpus then have_corpus:close() end
  -- (its speed is make bench's: tools/bench_data.lua)
  ;(have_corpus and it or pending)("matches tokenizers on every file of the corpus", function()
    local fresh = bpe.load(SHIPPED)
    local checked, skipped, tokens, bytes, secs = 0, {}, 0, 0, 0
    for _, f in ipairs(corpus.files) do
      local s = read(corpus.dir .. "/" .. f.name)
      local p = ffi.cast("const uint8_t *", s)
      if #s ~= f.bytes or fnv(function(i) return p[i] end, #s) ~= f.bytes_hash then
        skipped[#skipped + 1] = f.name -- another version of the fortunes package
      else
        local t0 = os.clock()
        local ids, n = fresh.encode(s)
        secs = secs + os.clock() - t0
        assert.equal(f.tokens, n, f.name)
        assert.equal(f.ids_hash, fnv(function(i) return ids[i] end, n), f.name)
        assert.equal(s, fresh.decode(ids, n))
        checked, tokens, bytes = checked + 1, tokens + n, bytes + #s
      end
    end
    assert.is_true(checked >= #corpus.files / 2, "most corpus files changed: " .. table.concat(skipped, " "))
    print(("\n  bpe: %d files, %.2f MB -> %d tokens in %.2f s: %.2f M tokens/s (cold cache)%s")
      :format(checked, bytes / 1e6, tokens, secs, tokens / secs / 1e6,
              #skipped > 0 and (", skipped (changed): " .. table.concat(skipped, " ")) or ""))
  end)
end)

describe("bpe: encoding (a hand-made vocabulary where the merge order matters)", function()
  local tok = bpe.load(FIX .. "/tiny")

  it("matches tokenizers (leftmost lowest rank, one merge at a time)", function()
    for _, hm in ipairs { 1, 64, 1e9 } do
      local saved = bpe.HEAP_MIN
      bpe.HEAP_MIN = hm
      local fresh = bpe.load(FIX .. "/tiny")
      bpe.HEAP_MIN = saved
      for _, c in ipairs(expected.tiny.cases) do
        local ids, n = fresh.encode(c.text)
        assert.same(c.ids, ids_table(ids, n), c.name .. " HEAP_MIN=" .. hm)
      end
    end
    -- "aaaa": "aa a" outranks "a a", so one merge at a time gives "aaa" "a" (GPT-2's
    -- encoder.py, merging every "a a" at once, would give "aa" "aa")
    local ids, n = tok.encode("aaaa")
    assert.same({ "aaa", "a" }, { tok:token_bytes(ids[0]), tok:token_bytes(ids[1]) })
    assert.equal(2, n)
  end)

  it("scan and heap agree on random words", function()
    math.randomseed(11)
    local alpha = { "a", "b", "c", "x", "y", " " }
    for _ = 1, 500 do
      local t = {}
      for i = 1, math.random(1, 90) do t[i] = alpha[math.random(#alpha)] end
      local w = table.concat(t)
      local p = ffi.cast("const uint8_t *", w)
      local s1, s2 = {}, {}
      for i = 1, #w do s1[i] = tok._byte_id[p[i - 1]]; s2[i] = s1[i] end
      local n1 = bpe._merge_scan(s1, #w, tok._rank_of, tok._new_of)
      local n2 = bpe._merge_heap(s2, #w, tok._rank_of, tok._new_of)
      assert.equal(n1, n2, w)
      assert.same(s1, s2, w)
    end
  end)
end)

describe("bpe: training a vocabulary (bpe_train)", function()
  it("learns the merges tokenizers' BpeTrainer learns (ties included)", function()
    local t = expected.train
    local v = train.train { texts = { t.text }, vocab_size = t.vocab_size, min_frequency = t.min_frequency }
    local got = {}
    for i, m in ipairs(v.merges) do got[i] = m[1] .. " " .. m[2] end
    assert.same(t.merges, got)
  end)

  it("learns the merges a hand computation gives", function()
    -- "aaabdaaabac" is one pre-token. Pairs: aa 4 (overlapping), ab 2, bd da ba ac 1.
    -- 1. "a a" -> aa a b d aa a b a c; pairs: (aa,a) 2, (a,b) 2, others 1; the tie goes
    --    to the smaller pair of ids: a = 64 < aa = 256, so
    -- 2. "a b" -> aa ab d aa ab a c; (aa,ab) 2, others 1
    -- 3. "aa ab"; then every pair occurs once < min_frequency 2: stop.
    local v = train.train { texts = { "aaabdaaabac" }, vocab_size = 1000, min_frequency = 2 }
    assert.same({ { "a", "a" }, { "a", "b" }, { "aa", "ab" } }, v.merges)
    assert.equal("min_frequency", v.stopped)
    assert.equal(260, v.vocab_size)
    assert.equal(256, v.vocab.aa); assert.equal(257, v.vocab.ab); assert.equal(258, v.vocab.aaab)
    assert.equal(259, v.vocab["<|endoftext|>"])
    assert.equal(64, v.vocab.a); assert.equal(220, v.vocab["Ġ"])
    -- words are pre-tokens: "ab" once, " ab" twice; (a, b) 3 beats (Ġ, a) 2, then (Ġ, ab) 2
    local w = train.train { texts = { "ab ab ab" }, vocab_size = 1000, min_frequency = 2 }
    assert.same({ { "a", "b" }, { "Ġ", "ab" } }, w.merges)
  end)

  it("writes files that load back and round-trip the text", function()
    local d = tmpdir()
    local text = expected.train.text
    local v = train.train { texts = { text }, vocab_size = 300 }
    train.write(d.path, v)
    table.insert(d.created, d.path .. "/vocab.json"); table.insert(d.created, d.path .. "/merges.txt")
    assert.equal("#version: 0.2\n", read(d.path .. "/merges.txt"):match("^[^\n]*\n"))
    local vj = cjson.decode(read(d.path .. "/vocab.json"))
    local n = 0
    for _, id in pairs(vj) do n = n + 1; assert.is_true(id >= 0 and id < 300) end
    assert.equal(300, n)
    local tok = bpe.load(d.path)
    local direct = train.tokenizer(v)
    local ids, k = tok.encode(text)
    local ids2, k2 = direct.encode(text)
    assert.same(ids_table(ids, k), ids_table(ids2, k2))
    assert.equal(text, tok.decode(ids, k))
    assert.is_true(k < #text / 2)
    assert.equal(299, tok.eot)
    d:clean()
  end)

  it("rejects bad settings", function()
    assert.truthy(user_error(train.train, { texts = { "x" }, vocab_size = 100 }):find("vocab_size", 1, true))
    assert.truthy(user_error(train.train, { texts = "x", vocab_size = 300 }):find("texts", 1, true))
  end)
end)

describe("bpe: tools/train_bpe.lua", function()
  local sh = util.sh

  it("trains on globs and writes a vocabulary that loads", function()
    local d = tmpdir()
    d:file("a.txt", expected.train.text)
    d:file("b.dat", "not this")
    local out = d.path .. "/out"
    local log, rc = sh(("luajit tools/train_bpe.lua --out %s --vocab-size 300 --exclude '*.dat' '%s/*'")
      :format(out, d.path))
    table.insert(d.created, out .. "/vocab.json"); table.insert(d.created, out .. "/merges.txt")
    assert.equal(0, rc, log)
    assert.truthy(log:find("1 files", 1, true), log)
    local tok = bpe.load(out)
    assert.equal(300, tok.vocab_size)
    local ids, n = tok.encode(expected.train.text)
    assert.equal(expected.train.text, tok.decode(ids, n))
    d:clean()
    os.remove(out); os.remove(d.path)
  end)

  it("refuses bad arguments with a message and exit status 2", function()
    local log, rc = sh("luajit tools/train_bpe.lua --vocab-size 300")
    assert.equal(2, rc); assert.truthy(log:find("--out DIR is required", 1, true), log)
    log, rc = sh("luajit tools/train_bpe.lua --out /tmp/x --vocab-size many")
    assert.equal(2, rc); assert.truthy(log:find("--vocab-size must be a number", 1, true), log)
    log, rc = sh("luajit tools/train_bpe.lua --out /tmp/x /nonexistent/*.txt")
    assert.equal(2, rc); assert.truthy(log:find("no file matches", 1, true), log)
  end)
end)

describe("bpe: the shipped vocabulary", function()
  local corpus = expected.corpus

  it("is small, and is what BpeTrainer learns from the corpus", function()
    local vj, mt = read(SHIPPED .. "/vocab.json"), read(SHIPPED .. "/merges.txt")
    assert.is_true(#vj + #mt < 1024 * 1024)
    local lines = {}
    for l in mt:gmatch("[^\n]+") do if not l:find("^#version") then lines[#lines + 1] = l end end
    local joined = table.concat(lines, "\n")
    local p = ffi.cast("const uint8_t *", joined)
    assert.equal(corpus.train_merges, #lines)
    assert.equal(corpus.train_merges_hash, fnv(function(i) return p[i] end, #joined))
    assert.is_true(corpus.shipped_equal)
  end)

  local have = io.open(corpus.dir .. "/" .. corpus.files[1].name, "rb")
  if have then have:close() end
  ;(have and it or pending)("is what bpe_train learns from the corpus (training parts, as data.text splits)", function()
    local ds = assert(require("ztrain.model.data.text").text {
      text = corpus.dir .. "/*", exclude = "*.dat", tokenizer = require("ztrain.model.data.bytes"),
      valid_fraction = corpus.valid_fraction })
    local texts, at = {}, 0
    local buf = ffi.new("uint8_t[?]", ds.train.n)
    for j = 0, ds.train.n - 1 do buf[j] = ds.train.tokens[j] end
    for j, info in ipairs(ds.file_info) do
      texts[j] = ffi.string(buf + at, info.train_bytes); at = at + info.train_bytes
    end
    -- the fixture holds BpeTrainer's merges for the files as they were then
    for _, f in ipairs(corpus.files) do
      local s = read(corpus.dir .. "/" .. f.name)
      local p = ffi.cast("const uint8_t *", s)
      if #s ~= f.bytes or fnv(function(i) return p[i] end, #s) ~= f.bytes_hash then
        print("\n  skipped: " .. f.name .. " differs from the fixture's (another fortunes package)")
        return
      end
    end
    local t0 = os.clock()
    local v = train.train { texts = texts, vocab_size = corpus.vocab_size, min_frequency = corpus.min_frequency }
    local secs = os.clock() - t0
    local lines = {}
    for i, m in ipairs(v.merges) do lines[i] = m[1] .. " " .. m[2] end
    local joined = table.concat(lines, "\n")
    local p = ffi.cast("const uint8_t *", joined)
    print(("\n  bpe_train: %d bytes, %d distinct pre-tokens -> vocabulary %d in %.2f s")
      :format(ds.train.n, v.words, v.vocab_size, secs))
    assert.equal(corpus.train_merges, #lines)
    assert.equal(corpus.train_merges_hash, fnv(function(i) return p[i] end, #joined))
  end)
end)

describe("bpe: bad input", function()
  local good_vocab = read(FIX .. "/tiny/vocab.json")
  local good_merges = read(FIX .. "/tiny/merges.txt")

  local function dir_with(vocab, merges)
    local d = tmpdir()
    if vocab then d:file("vocab.json", vocab) end
    if merges then d:file("merges.txt", merges) end
    return d
  end

  local function load_error(vocab, merges)
    local d = dir_with(vocab, merges)
    local msg = user_error(bpe.load, d.path)
    d:clean()
    return msg, d.path
  end

  it("loads the good pair (the baseline of what follows)", function()
    local d = dir_with(good_vocab, good_merges)
    assert.equal(bpe.load(d.path).merges_count, 14)
    d:clean()
  end)

  it("names a missing file", function()
    local msg, dir = load_error(nil, good_merges)
    assert.truthy(msg:find(dir .. "/vocab.json", 1, true), msg)
    assert.truthy(msg:find("cannot read", 1, true), msg)
    msg, dir = load_error(good_vocab, nil)
    assert.truthy(msg:find(dir .. "/merges.txt", 1, true), msg)
    msg = user_error(bpe.load, "/nonexistent/bpe")
    assert.truthy(msg:find("/nonexistent/bpe/vocab.json", 1, true), msg)
  end)

  it("names the file and line of a malformed merge", function()
    for _, bad in ipairs { "a b c", "ab", "", "a\tb", "a  b" } do
      local merges = "#version: 0.2\naa a\n" .. bad .. "\nb c\n"
      local msg, dir = load_error(good_vocab, merges)
      assert.truthy(msg:find(dir .. "/merges.txt:3: malformed merge", 1, true), msg)
    end
    -- a final newline, CRLF endings and no version line are fine
    local d = dir_with(good_vocab, "aa a\r\nb c\r\n")
    assert.equal(2, bpe.load(d.path).merges_count)
    d:clean()
  end)

  it("names a merge whose parts, or whose result, are not in the vocabulary", function()
    local msg, dir = load_error(good_vocab, "#version: 0.2\naa a\nb qq\n")
    assert.truthy(msg:find(dir .. "/merges.txt:3: merge \"b qq\": the token \"qq\" is not in the vocabulary", 1, true), msg)
    msg, dir = load_error(good_vocab, "#version: 0.2\nq r\n")
    assert.truthy(msg:find(dir .. "/merges.txt:2: merge \"q r\": the merged token \"qr\" is not in the vocabulary", 1, true), msg)
  end)

  it("refuses a vocab.json that is not an object of token -> distinct integer id", function()
    local msg, dir = load_error('{"a": 1,\n "b": }', good_merges)
    assert.truthy(msg:find(dir .. "/vocab.json:2: not valid JSON", 1, true), msg)
    msg = load_error('[1, 2, 3]', good_merges)
    assert.truthy(msg:find("expected a JSON object", 1, true), msg)
    msg = load_error('"vocab"', good_merges)
    assert.truthy(msg:find("expected a JSON object", 1, true), msg)
    msg = load_error('{}', good_merges)
    assert.truthy(msg:find("empty", 1, true), msg)
    for _, v in ipairs { '1.5', '"7"', '-1', 'true', '1e12' } do
      msg = load_error(good_vocab:gsub('"aa": %d+', '"aa": ' .. v), good_merges)
      assert.truthy(msg:find('token "aa" has id', 1, true), v .. ": " .. msg)
    end
    msg = load_error(good_vocab:gsub('"aa": %d+', '"aa": 0'), good_merges)
    assert.truthy(msg:find("share the id 0", 1, true), msg)
  end)

  it("refuses a vocabulary without the 256 byte symbols", function()
    local msg = load_error(good_vocab:gsub('"Ġ": %d+,', ''), good_merges)
    assert.truthy(msg:find('lacks the byte symbol "Ġ" (byte 0x20)', 1, true), msg)
  end)
end)
