-- Specs for the dataset sources behind data.open: llm.c token files (tokbin),
-- WikiText raw directories, the tokenisation cache, the tokenizer registry, and
-- the bad inputs of each. Run under LuaJIT:
--   busted --lua=luajit spec/unit/dataset_spec.lua
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local ffi = require "ffi"
local bit = require "bit"
local data = require "ztrain.model.data"
local tokbin = require "ztrain.model.data.tokbin"
local cache = require "ztrain.model.data.cache"
local util = require "helpers.util"

assert(jit, "these specs must run under LuaJIT: busted --lua=luajit spec/unit/dataset_spec.lua")

local read, write, sh = util.read, util.write, util.sh
local bytes = data.tokenizer("bytes")
local WIKI = "spec/fixtures/wikitext"

---------------------------------------------------------------------------
-- helpers

-- little-endian bytes built by hand (independent of tokbin's FFI path)
local function le(v, nbytes)
  local t = {}
  v = v % 2 ^ (8 * nbytes)
  for i = 1, nbytes do t[i] = string.char(v % 256); v = math.floor(v / 256) end
  return table.concat(t)
end
local function header(magic, version, count, extra)
  local t = { le(magic, 4), le(version, 4), le(count, 4) }
  for i = 3, 255 do t[#t + 1] = le(extra and extra[i] or 0, 4) end
  return table.concat(t)
end
local function tokens_le(list, width)
  local t = {}
  for i, v in ipairs(list) do t[i] = le(v, width) end
  return table.concat(t)
end

local function split_bytes(sp) return ffi.string(ffi.cast("const char *", sp.tokens), sp.n * ffi.sizeof(sp.dtype)) end
local function same_split(a, b)
  if a.n ~= b.n then return false end
  for i = 0, a.n - 1 do if a.tokens[i] ~= b.tokens[i] then return false end end
  return true
end
local function text_of(sp) return bytes.decode(sp.tokens, sp.n) end

-- A bytes tokenizer that counts encode calls; cacheable under `key`.
local function counting(key)
  local t = { name = "counting-bytes", vocab_size = 256, calls = 0, cache_key = key or "counting-bytes v1" }
  function t.encode(s, ...)
    if s == t then s = ... end
    t.calls = t.calls + 1
    return bytes.encode(s)
  end
  function t.decode(a, ...) if a == t then return bytes.decode(...) end return bytes.decode(a, ...) end
  return t
end

-- byte tokenizer with an end-of-text id 256
local function with_eot()
  local t = { name = "bytes+eot", vocab_size = 257, eot = 256, cache_key = "bytes+eot v1" }
  function t.encode(s, ...) if s == t then s = ... end return bytes.encode(s) end
  t.decode = bytes.decode
  return t
end

local function old(path) -- mtime well in the past (the cache trusts only entries younger than their file)
  assert(os.execute(("touch -d '2020-01-01 00:00:00' '%s'"):format(path)) == 0)
end

local function is_root() return (sh("id -u")):match("^0") ~= nil end

-- Run a Lua snippet as an unprivileged user (root ignores file modes), printing its result.
local function run_unprivileged(code)
  local f = os.tmpname()
  write(f, 'package.path = "lua/?.lua;lua/?/init.lua;" .. package.path\n' .. code)
  sh("chmod 644 " .. f)
  local cmd = "luajit " .. f
  if is_root() then
    if not (sh("command -v setpriv")):match("/") then os.remove(f); return nil end
    cmd = "setpriv --reuid=65534 --regid=65534 --clear-groups " .. cmd
  end
  local out = sh(cmd)
  os.remove(f)
  return out
end

---------------------------------------------------------------------------
describe("llm.c token files (tokbin)", function()
  local d
  before_each(function() d = util.tmpdir() end)
  after_each(function() util.rm(d) end)

  it("writes exactly llm.c's layout: 256 int32 header (20240520, 1, n), then uint16 little-endian", function()
    local ids = { 0, 1, 255, 256, 50256, 65535 }
    assert(tokbin.write(d .. "/a.bin", ids))
    local want = header(20240520, 1, #ids) .. tokens_le(ids, 2)
    assert.are.equal(want, read(d .. "/a.bin"))
    assert.are.equal(1024 + 12, #want)
  end)

  it("reads a file built by hand, and round-trips cdata arrays", function()
    local ids = { 7, 50256, 3, 65535, 0 }
    write(d .. "/h.bin", header(20240520, 1, #ids) .. tokens_le(ids, 2))
    local t = assert(tokbin.read(d .. "/h.bin"))
    assert.are.equal(#ids, t.n)
    assert.are.equal("uint16_t", t.dtype)
    for i, v in ipairs(ids) do assert.are.equal(v, t.tokens[i - 1]) end
    local arr = ffi.new("int32_t[3]", { 9, 8, 7 })
    assert(tokbin.write(d .. "/c.bin", arr, 3))
    local r = assert(tokbin.read(d .. "/c.bin"))
    assert.are.same({ 9, 8, 7 }, { r.tokens[0], r.tokens[1], r.tokens[2] })
    -- an empty file is valid: header only
    assert(tokbin.write(d .. "/e.bin", {}, 0))
    assert.are.equal(header(20240520, 1, 0), read(d .. "/e.bin"))
    assert.are.equal(0, assert(tokbin.read(d .. "/e.bin")).n)
  end)

  it("uses llm.c's llama-3 layout (20240801, 7, uint32) for ids beyond 16 bits", function()
    local ids = { 1, 70000, 128255 }
    assert(tokbin.write(d .. "/w.bin", ids))
    assert.are.equal(header(20240801, 7, 3) .. tokens_le(ids, 4), read(d .. "/w.bin"))
    local t = assert(tokbin.read(d .. "/w.bin"))
    assert.are.equal("int32_t", t.dtype)
    assert.are.equal(128255, t.tokens[2])
    local ok, err = tokbin.write(d .. "/x.bin", { -1 })
    assert.is_nil(ok)
    assert.matches("token -1 at position 0", err, 1, true)
  end)

  it("agrees with Python's struct (llm.c's write_datafile layout) both ways", function()
    if not (sh("command -v python3")):match("/") then
      pending("python3 is absent: the cross-check with Python's struct module is skipped")
      return
    end
    local py = d .. "/x.py"
    write(py, [[
import struct, sys
path, mode = sys.argv[1], sys.argv[2]
if mode == "write":  # as llm.c dev/data/data_common.py write_datafile: header of 256 int32, uint16 tokens
    toks = [50256, 464, 2068, 7586, 21831, 0, 65535]
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(toks), *toks))
else:
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    toks = struct.unpack("<%dH" % h[2], b[1024:])
    assert len(b) == 1024 + 2 * h[2]
    print(h[0], h[1], h[2], " ".join(map(str, toks)))
]])
    local _, rc = sh(("python3 %s %s/py.bin write"):format(py, d))
    assert.are.equal(0, rc)
    local t = assert(tokbin.read(d .. "/py.bin"))
    local got = {}
    for i = 0, t.n - 1 do got[#got + 1] = t.tokens[i] end
    assert.are.same({ 50256, 464, 2068, 7586, 21831, 0, 65535 }, got)
    assert(tokbin.write(d .. "/ours.bin", { 11, 22, 50256, 33 }))
    local out, rc2 = sh(("python3 %s %s/ours.bin read"):format(py, d))
    assert.are.equal(0, rc2, out)
    assert.matches("^20240520 1 4 11 22 50256 33", out)
  end)

  it("rejects a wrong magic, naming the file, the field, the value and the expected one", function()
    write(d .. "/m.bin", header(12345, 1, 2) .. tokens_le({ 1, 2 }, 2))
    local t, err = tokbin.read(d .. "/m.bin")
    assert.is_nil(t)
    assert.matches(d .. "/m.bin", err, 1, true)
    assert.matches("magic (int32 0) is 12345, expected 20240520", err, 1, true)
    -- the reader's own idea of a version
    write(d .. "/v.bin", header(20240520, 2, 2) .. tokens_le({ 1, 2 }, 2))
    t, err = tokbin.read(d .. "/v.bin")
    assert.is_nil(t)
    assert.matches("version (int32 1) is 2, expected 1", err, 1, true)
  end)

  it("rejects a count that does not match the file size (truncated, padded, odd bytes, no header)", function()
    write(d .. "/t.bin", header(20240520, 1, 10) .. tokens_le({ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 2))
    local t, err = tokbin.read(d .. "/t.bin")
    assert.is_nil(t)
    assert.matches(d .. "/t.bin", err, 1, true)
    assert.matches("token count (int32 2) is 10, expected 9", err, 1, true)
    assert.matches("truncated", err, 1, true)
    write(d .. "/p.bin", header(20240520, 1, 2) .. tokens_le({ 1, 2, 3 }, 2))
    t, err = tokbin.read(d .. "/p.bin")
    assert.matches("is 2, expected 3", err, 1, true)
    write(d .. "/o.bin", header(20240520, 1, 2) .. tokens_le({ 1, 2 }, 2) .. "x")
    t, err = tokbin.read(d .. "/o.bin")
    assert.matches("not a whole number of 2-byte tokens", err, 1, true)
    write(d .. "/s.bin", "short")
    t, err = tokbin.read(d .. "/s.bin")
    assert.matches("5 bytes, too short for the 1024-byte llm.c header", err, 1, true)
    t, err = tokbin.read(d .. "/none.bin")
    assert.matches("cannot open token file " .. d .. "/none.bin: no such file or directory", err, 1, true)
  end)

  it("writes atomically: no temporary left behind, an existing file replaced whole", function()
    assert(tokbin.write(d .. "/r.bin", { 1, 2, 3 }))
    assert(tokbin.write(d .. "/r.bin", { 4 }))
    assert.are.equal(header(20240520, 1, 1) .. tokens_le({ 4 }, 2), read(d .. "/r.bin"))
    local listing = sh("ls -A " .. d)
    assert.are.equal("r.bin\n", listing:gsub("rc=%d+%s*$", ""))
  end)
end)

---------------------------------------------------------------------------
describe("WikiText raw directories", function()
  local function file(name) return read(WIKI .. "/" .. name) end

  it("uses the release's own splits: train, validation and test are exactly the three files", function()
    for _, src in ipairs({ "wikitext:" .. WIKI, WIKI, WIKI .. "/" }) do
      local ds = assert(data.open{ text = src, tokenizer = "bytes", exclude = "*.dat", valid_fraction = 0.5,
                                   cache = false })
      assert.are.equal("wikitext", ds.kind)
      assert.are.equal(file("wiki.train.raw"), text_of(ds.train))
      assert.are.equal(file("wiki.valid.raw"), text_of(ds.valid))
      assert.are.equal(file("wiki.test.raw"), text_of(ds.test))
      assert.are.equal("train", ds.train.name)
      assert.are.equal("validation", ds.valid.name)
      assert.are.equal("test", ds.test.name)
      assert.matches("test 569 tokens", ds:describe(), 1, true)
    end
  end)

  it("appends the tokenizer's eot after each file", function()
    local ds = assert(data.open{ text = WIKI, tokenizer = with_eot(), cache = false })
    local raw = file("wiki.valid.raw")
    assert.are.equal(#raw + 1, ds.valid.n)
    assert.are.equal(256, ds.valid.tokens[#raw])
    assert.are.equal(raw, bytes.decode(ds.valid.tokens, #raw))
  end)

  it("without wiki.valid.raw: an empty validation split, said so; without wiki.test.raw: no test split", function()
    local d = util.tmpdir()
    sh(("cp %s/wiki.train.raw %s/"):format(WIKI, d))
    local ds = assert(data.open{ text = "wikitext:" .. d, tokenizer = "bytes", cache = false })
    assert.are.equal(0, ds.valid.n)
    assert.is_nil(ds.test)
    assert.matches("no wiki.valid.raw", ds:describe(), 1, true)
    util.rm(d)
  end)

  it("a directory without wiki.train.raw is an error naming it and what a WikiText directory holds", function()
    local d = util.tmpdir()
    sh(("cp %s/wiki.valid.raw %s/"):format(WIKI, d))
    local ds, err = data.open{ text = "wikitext:" .. d, tokenizer = "bytes" }
    assert.is_nil(ds)
    assert.matches("no wiki.train.raw in " .. d, err, 1, true)
    assert.matches("wiki.valid.raw and wiki.test.raw", err, 1, true)
    -- the tokenised release is named as such
    write(d .. "/wiki.train.tokens", "x")
    ds, err = data.open{ text = "wikitext:" .. d, tokenizer = "bytes" }
    assert.matches("tokenised release", err, 1, true)
    -- the parent of a WikiText directory: the one inside is suggested
    ds, err = data.open{ text = "wikitext:spec/fixtures", tokenizer = "bytes" }
    assert.matches("did you mean spec/fixtures/wikitext?", err, 1, true)
    ds, err = data.open{ text = "wikitext:" .. d .. "/nope", tokenizer = "bytes" }
    assert.matches("does not exist", err, 1, true)
    util.rm(d)
  end)

  it("rejects a file that is not UTF-8 text, naming it", function()
    local d = util.tmpdir()
    write(d .. "/wiki.train.raw", "good\n\255bad\n")
    local ds, err = data.open{ text = d, tokenizer = "bytes", cache = false }
    assert.is_nil(ds)
    assert.matches(d .. "/wiki.train.raw is not valid UTF-8 (invalid byte 0xFF) at byte offset 5 (line 2, column 1); " ..
                   "only UTF-8 text can be used: convert it, or add it to data.exclude, e.g. exclude = ", err, 1, true)
    util.rm(d)
  end)
end)

---------------------------------------------------------------------------
describe("llm.c token files as a dataset", function()
  local d
  before_each(function() d = util.tmpdir() end)
  after_each(function() util.rm(d) end)

  it("tools/tokenize.lua writes the streams data.open gives; *_train/_val/_test.bin read back equal", function()
    local out, rc = sh(("luajit tools/tokenize.lua tokenizer=bytes cache=off out=%s name=wt %s"):format(d, WIKI))
    assert.are.equal(0, rc, out)
    assert.matches("wt_train.bin: 2312 tokens", out, 1, true)
    local ref = assert(data.open{ text = WIKI, tokenizer = "bytes", cache = false })
    for _, src in ipairs({ d .. "/wt_*.bin", d, { d .. "/wt_train.bin", d .. "/wt_val.bin", d .. "/wt_test.bin" } }) do
      local ds = assert(data.open{ text = src, tokenizer = "bytes" })
      assert.are.equal("bin", ds.kind)
      assert.is_true(same_split(ref.train, ds.train))
      assert.is_true(same_split(ref.valid, ds.valid))
      assert.is_true(same_split(ref.test, ds.test))
    end
    -- the bytes of a split file are the header then the stream, as llm.c reads it
    assert.are.equal(header(20240520, 1, ref.valid.n) .. split_bytes(ref.valid), read(d .. "/wt_val.bin"))
  end)

  it("bin:TRAIN,VALID,TEST lists the splits; an empty item is no such split", function()
    assert(tokbin.write(d .. "/a.bin", { 1, 2, 3, 4 }))
    assert(tokbin.write(d .. "/b.bin", { 5, 6 }))
    assert(tokbin.write(d .. "/c.bin", { 7 }))
    local ds = assert(data.open{ text = ("bin:%s/a.bin,%s/b.bin"):format(d, d), tokenizer = "bytes" })
    assert.are.same({ 4, 2 }, { ds.train.n, ds.valid.n })
    assert.is_nil(ds.test)
    ds = assert(data.open{ text = ("bin:%s/a.bin"):format(d), tokenizer = "bytes" })
    assert.are.equal(0, ds.valid.n)
    assert.matches("no validation files", ds:describe(), 1, true)
    ds = assert(data.open{ text = ("bin:%s/{a,c}.bin,,%s/b.bin"):format(d, d), tokenizer = "bytes" })
    assert.are.same({ 5, 0, 2 }, { ds.train.n, ds.valid.n, ds.test.n }) -- a then c, sorted
    assert.are.equal(7, ds.train.tokens[4])
  end)

  it("a token file with a wrong magic or a bad count stops the load, naming the file", function()
    write(d .. "/x_train.bin", header(20240520, 1, 5) .. tokens_le({ 1, 2, 3 }, 2))
    local ds, err = data.open{ text = d .. "/*.bin", tokenizer = "bytes" }
    assert.is_nil(ds)
    assert.matches("^data: token file " .. d .. "/x_train.bin: header token count %(int32 2%) is 5, expected 3", err)
    write(d .. "/x_train.bin", header(20240519, 1, 3) .. tokens_le({ 1, 2, 3 }, 2))
    ds, err = data.open{ text = d .. "/*.bin", tokenizer = "bytes" }
    assert.matches("magic (int32 0) is 20240519, expected 20240520", err, 1, true)
  end)

  it("a name outside llm.c's *_train / *_val / *_test convention is an error saying how to name it", function()
    assert(tokbin.write(d .. "/shard0.bin", { 1 }))
    local ds, err = data.open{ text = d .. "/*.bin", tokenizer = "bytes" }
    assert.is_nil(ds)
    assert.matches("which split the token file " .. d .. "/shard0.bin", err, 1, true)
    assert.matches("bin:TRAIN,VALID", err, 1, true)
  end)

  it("ids beyond the tokenizer's vocabulary are an error naming the file, the id and what to set", function()
    assert(tokbin.write(d .. "/g_train.bin", { 10, 50256 }))
    local ds, err = data.open{ text = d .. "/g_train.bin", tokenizer = "bytes" }
    assert.is_nil(ds)
    assert.matches("holds id 50256 at position 1, outside the bytes tokenizer's 256 ids", err, 1, true)
    assert.matches("data.tokenizer", err, 1, true)
  end)
end)

---------------------------------------------------------------------------
describe("the tokenisation cache", function()
  local d, c
  local A = "alpha one\n%\nalpha two\n%\nalpha three\n%\nalpha four\n%\n"
  local B = "beta line 1\nbeta line 2\nbeta line 3\nbeta line 4\n"
  before_each(function()
    d = util.tmpdir()
    c = util.tmpdir()
    write(d .. "/a.txt", A); old(d .. "/a.txt")
    write(d .. "/b.txt", B); old(d .. "/b.txt")
  end)
  after_each(function() util.rm(d); util.rm(c) end)

  local function load(tok, extra)
    local o = { text = d .. "/*.txt", tokenizer = tok, valid_fraction = 0.25, cache = c }
    for k, v in pairs(extra or {}) do o[k] = v end
    return assert(data.open(o))
  end
  local function entries() return (sh("ls " .. c .. "/tokens | wc -l")):match("^%s*(%d+)") + 0 end

  it("tokenises once; a second load reads the same tokens back without calling the tokenizer", function()
    local ref = assert(data.text{ text = d .. "/*.txt", tokenizer = "bytes", valid_fraction = 0.25 })
    local t = counting()
    local ds1 = load(t)
    assert.are.equal(4, t.calls) -- two files x (train, valid)
    assert.are.equal(2, entries())
    local ds2 = load(t)
    assert.are.equal(4, t.calls) -- no new call
    assert.are.equal(2, ds2.cache.hits)
    assert.are.equal(0, ds2.cache.misses)
    for _, ds in ipairs({ ds1, ds2 }) do
      assert.is_true(same_split(ref.train, ds.train))
      assert.is_true(same_split(ref.valid, ds.valid))
      assert.are.same(ref.file_info, ds.file_info)
    end
    assert.matches("2 hits, 0 tokenised", ds2:describe(), 1, true)
  end)

  it("a touched or modified file is tokenised again; the others are reused", function()
    local t = counting()
    load(t)
    assert(os.execute(("touch -d '2021-06-01 00:00:00' %s/a.txt"):format(d)) == 0) -- touch: new mtime
    local ds = load(t)
    assert.are.equal(6, t.calls)
    assert.are.same({ 1, 1 }, { ds.cache.hits, ds.cache.misses })
    -- same size, rewritten in place (same inode): the mtime tells (set to another old time)
    write(d .. "/b.txt", (B:gsub("beta", "BETA")))
    assert(os.execute(("touch -d '2019-01-01 00:00:00' %s/b.txt"):format(d)) == 0)
    ds = load(t)
    assert.are.equal(8, t.calls)
    assert.matches("BETA line 1", text_of(ds.train), 1, true)
    write(d .. "/b.txt", B .. "beta line 5\n"); old(d .. "/b.txt") -- size changes, mtime back to the first key's
    ds = load(t)
    assert.are.equal(10, t.calls)
    assert.matches("beta line 5", text_of(ds.valid), 1, true)
  end)

  it("is keyed by the tokenizer and the split rule", function()
    local t = counting()
    load(t)
    load(t, { valid_fraction = 0.5 })
    assert.are.equal(8, t.calls)
    local t2 = counting("counting-bytes v2")
    load(t2)
    assert.are.equal(4, t2.calls)
    load(t2)
    assert.are.equal(4, t2.calls)
  end)

  it("does not trust an entry for a file modified in the same clock tick or later (racy-git rule)", function()
    assert(os.execute(("touch -d '+1 hour' %s/a.txt"):format(d)) == 0) -- mtime newer than any entry
    local t = counting()
    load(t)
    local ds = load(t)
    assert.are.equal(6, t.calls) -- a.txt re-tokenised, b.txt reused
    assert.are.same({ 1, 1 }, { ds.cache.hits, ds.cache.misses })
  end)

  it("detects corrupt entries (truncated, flipped bits, foreign files) and rebuilds them", function()
    local t = counting()
    local ref = load(t)
    local files = {}
    for p in io.popen("ls " .. c .. "/tokens/*.bin"):lines() do files[#files + 1] = p end
    assert.are.equal(2, #files)
    -- truncate one entry, flip a token byte in the other
    local s1 = read(files[1])
    write(files[1], s1:sub(1, #s1 - 1))
    local s2 = read(files[2])
    write(files[2], s2:sub(1, 1030) .. string.char(bit.bxor(s2:byte(1031), 1)) .. s2:sub(1032))
    local ds = load(t)
    assert.are.equal(8, t.calls)
    assert.are.equal(2, ds.cache.rebuilt)
    assert.is_true(same_split(ref.train, ds.train))
    assert.is_true(same_split(ref.valid, ds.valid))
    -- rebuilt entries are good again
    ds = load(t)
    assert.are.equal(8, t.calls)
    assert.are.equal(2, ds.cache.hits)
    -- a valid llm.c file that is not our entry (no ZTC1 mark) is not trusted either
    assert(tokbin.write(files[1], { 1, 2, 3 }))
    ds = load(t)
    assert.are.equal(1, ds.cache.rebuilt)
    assert.is_true(same_split(ref.train, ds.train))
  end)

  it("caches WikiText files too", function()
    local t = counting()
    local ds1 = assert(data.open{ text = WIKI, tokenizer = t, cache = c })
    local n = t.calls
    assert.are.equal(3, n)
    local ds2 = assert(data.open{ text = WIKI, tokenizer = t, cache = c })
    assert.are.equal(n, t.calls)
    assert.are.equal(3, ds2.cache.hits)
    assert.is_true(same_split(ds1.test, ds2.test))
    assert.are.equal(read(WIKI .. "/wiki.test.raw"), text_of(ds2.test))
  end)

  it("a cache directory that cannot be made costs the cache, not the load", function()
    write(c .. "/plainfile", "x")
    local t = counting()
    local ds = assert(data.open{ text = d .. "/*.txt", tokenizer = t, valid_fraction = 0.25, cache = c .. "/plainfile/sub" })
    assert.are.equal(4, t.calls)
    assert.matches("cannot create the cache directory", ds.cache.errors[1], 1, true)
  end)

  it("keys a tokenizer by the contents of its vocabulary files; bytes is not cached", function()
    write(c .. "/vocab.json", '{"a": 0}')
    local tok = { name = "x", vocab_size = 1, cache_files = { c .. "/vocab.json" } }
    local k1 = assert(cache.tokenizer_key(tok))
    assert.are.equal(k1, cache.tokenizer_key(tok))
    write(c .. "/vocab.json", '{"b": 0}')
    assert.are_not.equal(k1, cache.tokenizer_key(tok))
    assert.is_nil(cache.tokenizer_key(bytes))
    local ds = assert(data.open{ text = d .. "/*.txt", tokenizer = "bytes", cache = c })
    assert.is_nil(ds.cache)
  end)

  it("the fortunes corpus: cold vs cached load (bytes tokenizer, forced cacheable)", function()
    local probe = io.open("/usr/share/games/fortunes/fortunes", "rb")
    if not probe then pending("/usr/share/games/fortunes is absent (apt-get install fortunes)"); return end
    probe:close()
    local t = counting("fortunes-bytes")
    local src = { text = "/usr/share/games/fortunes/*", exclude = "*.dat", tokenizer = t, cache = c }
    local t0 = os.clock()
    local cold = assert(data.open(src))
    local t1 = os.clock()
    local warm = assert(data.open(src))
    local t2 = os.clock()
    local none = assert(data.text{ text = src.text, exclude = "*.dat", tokenizer = "bytes" })
    local t3 = os.clock()
    assert.are.equal(#cold.files, warm.cache.hits)
    assert.is_true(same_split(none.train, warm.train))
    assert.is_true(same_split(none.valid, warm.valid))
    print(("\nfortunes (bytes): no cache %.3f s, cold (tokenise + write) %.3f s, cached %.3f s (CPU)")
          :format(t3 - t2, t1 - t0, t2 - t1))
  end)
end)

---------------------------------------------------------------------------
describe("the tokenizer registry", function()
  it("names bytes, bpe, bpe:DIR and hf:DIR", function()
    local names = table.concat(data.tokenizers(), " ")
    assert.are.equal("bytes bpe bpe:DIR hf:DIR", names)
    local ok, err = pcall(data.tokenizer, "gpt9")
    assert.is_false(ok)
    assert.matches("known: bytes, bpe, bpe:DIR, hf:DIR", err, 1, true)
  end)

  it("a directory without vocab.json / merges.txt is an error naming the directory and the files", function()
    local ok, err = pcall(data.tokenizer, "bpe:/nonexistent/dir")
    assert.is_false(ok)
    assert.matches("no vocab.json or merges.txt in /nonexistent/dir", err, 1, true)
    local d = util.tmpdir()
    write(d .. "/tokenizer.json", "{}")
    write(d .. "/vocab.json", "{}")
    ok, err = pcall(data.tokenizer, "bpe:" .. d)
    assert.is_false(ok)
    assert.matches("no merges.txt in " .. d, err, 1, true)
    assert.matches("tokenizer.json only: name it as hf:" .. d, err, 1, true)
    ok, err = pcall(data.tokenizer, "hf:" .. d) -- hf:DIR reads the tokenizer.json
    assert.is_false(ok)
    assert.matches(d .. "/tokenizer.json: no model", err, 1, true)
    util.rm(d)
    ok, err = pcall(data.tokenizer, "hf:")
    assert.matches("needs a directory", err, 1, true)
  end)

  it('"bpe" loads the shipped vocabulary when the tree has it', function()
    local dir = data.home .. "/" .. data.BPE_DEFAULT
    if not io.open(dir .. "/vocab.json") then
      local ok, err = pcall(data.tokenizer, "bpe")
      assert.is_false(ok)
      assert.matches("shipped vocabulary", err, 1, true)
      pending(dir .. " is not in the tree yet")
      return
    end
    local tok = data.tokenizer("bpe")
    assert.is_true(tok.vocab_size > 256)
    assert.is_true(#tok.cache_files >= 3) -- vocab.json, merges.txt, the encoder's source
    assert.matches("vocab.json", tok.cache_files[1], 1, true)
    local ids, n = tok.encode("The history of")
    assert.are.equal("The history of", tok.decode(ids, n))
    assert.is_string(cache.tokenizer_key(tok))
  end)
end)

---------------------------------------------------------------------------
describe("datasets: bad input", function()
  it("a dataset shorter than one sequence: the error names the split, its tokens and seq_len + 1", function()
    local ds, err = data.open{ text = WIKI, tokenizer = "bytes", seq_len = 4096, cache = false }
    assert.is_nil(ds)
    assert.matches("the train split has 2312 tokens (from wiki.train.raw)", err, 1, true)
    assert.matches("data.seq_len + 1 = 4097", err, 1, true)
    assert.matches("lower data.seq_len", err, 1, true)
    -- a short validation split is a warning (it cannot be evaluated), and the loader names it
    ds = assert(data.open{ text = WIKI, tokenizer = "bytes", seq_len = 1024, cache = false })
    assert.matches("validation split has 552 tokens", ds.warnings[1], 1, true)
    local L
    L, err = data.loader{ split = ds.valid, B = 1, T = 1024 }
    assert.is_nil(L)
    assert.matches("the validation split (from wiki.valid.raw) has 552 tokens", err, 1, true)
    assert.matches("T + 1 = 1025", err, 1, true)
    L, err = data.loader{ split = ds.train, B = 8, T = 1024 }
    assert.matches("the train split (from wiki.train.raw) has 2312 tokens, which make 2 windows", err, 1, true)
    assert.matches("lower batch.micro", err, 1, true)
  end)

  it("an unreadable file or directory says permission denied, not 'no file matches'", function()
    local d = util.tmpdir()
    sh("chmod 755 " .. d)
    write(d .. "/ok.txt", "readable\n")
    write(d .. "/secret.txt", "hidden\n")
    sh(("mkdir %s/closed && echo x > %s/closed/x.txt && chmod 000 %s/closed %s/secret.txt"):format(d, d, d, d))
    write(d .. "/wiki.train.raw", "x\n")
    sh("chmod 000 " .. d .. "/wiki.train.raw")
    assert(tokbin.write(d .. "/locked_train.bin", { 1 }))
    sh("chmod 000 " .. d .. "/locked_train.bin")
    local out = run_unprivileged(([[
local data = require "ztrain.model.data"
local function show(src) local ds, err = data.open{ text = src, tokenizer = "bytes", cache = false } print(err) end
show("%s/*.txt")
show("%s/closed/*.txt")
show("wikitext:%s")
show("%s/locked_train.bin")
]]):format(d, d, d, d))
    sh("chmod -R 755 " .. d)
    util.rm(d)
    if not out then pending("running as root without setpriv: file modes cannot be tested"); return end
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.matches("cannot read " .. d .. "/secret.txt: permission denied", lines[1], 1, true)
    assert.matches("data.exclude", lines[1], 1, true)
    assert.matches("data.text: cannot list " .. d .. "/closed (for the pattern ", lines[2], 1, true)
    assert.matches("): permission denied; make the directory readable (chmod a+rx) or point data.text elsewhere",
                   lines[2], 1, true)
    assert.is_nil(lines[2]:find("no file matches", 1, true))
    assert.matches(d .. "/wiki.train.raw: permission denied", lines[3], 1, true)
    assert.matches("cannot open token file " .. d .. "/locked_train.bin: permission denied", lines[4], 1, true)
  end)

  it("a pattern that matches nothing still says so", function()
    local ds, err = data.open{ text = "/nonexistent/*.txt", tokenizer = "bytes" }
    assert.is_nil(ds)
    assert.matches('data.text: no file matches "/nonexistent/*.txt"; check data.text (the glob must name existing files)',
                   err, 1, true)
  end)
end)
