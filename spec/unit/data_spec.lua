-- Specs for ztrain.model.data (tokenizer, text dataset, loader). Run under LuaJIT:
--   busted --lua=luajit spec/unit/data_spec.lua
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local ffi = require "ffi"
local util = require "helpers.util"
local data = require "ztrain.model.data"
local utf8 = require "ztrain.model.data.utf8"
local loader_mod = require "ztrain.model.data.loader"

assert(jit, "these specs must run under LuaJIT: busted --lua=luajit spec/unit/data_spec.lua")


---------------------------------------------------------------------------
-- helpers

-- A fresh temporary directory; every path created through it is removed by :clean().
local tmpdir = util.scratch

local read = util.read

local function arr_equal(a, b, n)
  for i = 0, n - 1 do if a[i] ~= b[i] then return false end end
  return true
end

local bytes = data.tokenizer("bytes")
local function text_of(split) return bytes.decode(split.tokens, split.n) end

-- int32 stream whose token at position p is p: a window's first input names it.
local function iota_split(n)
  local t = ffi.new("int32_t[?]", n)
  for i = 0, n - 1 do t[i] = i end
  return { tokens = t, n = n }
end

local function batch_table(L, i)
  local x, y = L:batch(i)
  local n = L.B * L.T
  local tx, ty = {}, {}
  for j = 0, n - 1 do tx[j + 1], ty[j + 1] = x[j], y[j] end
  return { x = tx, y = ty }
end

---------------------------------------------------------------------------
describe("ztrain.model.data.tokenizer", function()
  it("bytes: vocab 256, no eot", function()
    assert.are.equal("bytes", bytes.name)
    assert.are.equal(256, bytes.vocab_size)
    assert.is_nil(bytes.eot)
  end)

  it("round-trips all 256 byte values", function()
    local t = {}
    for b = 0, 255 do t[#t + 1] = string.char(b) end
    local s = table.concat(t) .. table.concat(t):reverse()
    local ids, n = bytes.encode(s)
    assert.are.equal(512, n)
    assert.is_true(ffi.istype("int32_t[?]", ids))
    for i = 0, 255 do
      assert.are.equal(i, ids[i])
      assert.are.equal(255 - i, ids[256 + i])
    end
    assert.are.equal(s, bytes.decode(ids, n))
  end)

  it("encodes UTF-8 text as its bytes and decodes it back", function()
    local s = "héllo, wörld — 世界 🙂\n"
    local ids, n = bytes.encode(s)
    assert.are.equal(#s, n)
    assert.are.equal(0xC3, ids[1]) -- é = C3 A9
    assert.are.equal(0xA9, ids[2])
    assert.are.equal(s, bytes.decode(ids, n))
    assert.are.equal("hé", bytes.decode(ids, 3))
    -- colon calls, Lua tables, empty strings
    local ids2, n2 = bytes:encode(s)
    assert.are.equal(n, n2)
    assert.are.equal(s, bytes:decode(ids2, n2))
    assert.are.equal("AB", bytes.decode({ 65, 66 }))
    local e, ne = bytes.encode("")
    assert.are.equal(0, ne)
    assert.are.equal("", bytes.decode(e, 0))
  end)

  it("rejects ids that are not bytes and non-string input", function()
    assert.has_error(function() bytes.decode({ 65, 256 }) end)
    local a = ffi.new("int32_t[2]", { 65, -1 })
    assert.has_error(function() bytes.decode(a, 2) end)
    assert.has_error(function() bytes.encode(42) end)
  end)

  it("errors on an unknown tokenizer, naming it and the known ones", function()
    local ok, err = pcall(data.tokenizer, "gpt9")
    assert.is_false(ok)
    assert.matches('unknown tokenizer "gpt9"', err, 1, true)
    assert.matches("known: bytes", err, 1, true)
    assert.has_error(function() data.tokenizer(nil) end)
  end)
end)

---------------------------------------------------------------------------
describe("ztrain.model.data.utf8", function()
  it("sanitize replaces each invalid byte with U+FFFD and keeps valid text", function()
    local u = require "ztrain.model.data.utf8"
    assert.are.equal("ab\239\191\189c\239\191\189", u.sanitize("ab\255c\195"))
    assert.are.equal("h\195\169llo", u.sanitize("h\195\169llo"))
    assert.are.equal("", u.sanitize(""))
    assert.is_true(u.check(u.sanitize("\240\159\152\128\240\159\152")))   -- an emoji, then a cut one
  end)

  it("accepts valid UTF-8 (1- to 4-byte sequences, limits)", function()
    assert.is_true(utf8.check(""))
    assert.is_true(utf8.check("ascii\t\b\a\n"))
    assert.is_true(utf8.check("é世🙂"))
    assert.is_true(utf8.check("\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF")) -- U+D7FF, U+E000, U+10FFFF
    assert.is_true(utf8.check("a\0b")) -- NUL is UTF-8 ...
  end)

  it("rejects bad sequences with the offset of the first bad byte", function()
    local cases = {
      { "ab\x80", 2, "continuation" },
      { "a\xC0\xAF", 1, "overlong" },        -- overlong '/'
      { "a\xE0\x80\xAF", 1, "overlong" },
      { "\xF0\x80\x80\xAF", 0, "overlong" },
      { "xx\xED\xA0\x80", 2, "surrogate" },
      { "\xF4\x90\x80\x80", 0, "U+10FFFF" },
      { "\xF5\x80\x80\x80", 0, "invalid byte" },
      { "abc\xFF", 3, "invalid byte" },
      { "ok\xE4\xB8", 2, "truncated" },       -- cut at end
      { "ok\xE4\xB8x", 2, "truncated" },      -- cut by an ASCII byte
    }
    for _, c in ipairs(cases) do
      local ok, off, why = utf8.check(c[1])
      assert.is_false(ok, c[1])
      assert.are.equal(c[2], off)
      assert.matches(c[3], why, 1, true)
    end
    local ok, off, why = utf8.check("a\0b", 3, { nul = false }) -- ... but means binary
    assert.is_false(ok)
    assert.are.equal(1, off)
    assert.are.equal("NUL byte", why)
  end)

  it("maps an offset to line and column", function()
    local l, c = utf8.line_col("ab\ncd\nef", 7)
    assert.are.equal(3, l)
    assert.are.equal(2, c)
  end)
end)

---------------------------------------------------------------------------
describe("ztrain.model.data.text", function()
  local d
  local A = "alpha one\n%\nalpha two\n%\nalpha three\n%\nalpha four\n%\n"
  local Bt = "beta line 1\nbeta line 2\nbeta line 3\nbeta line 4\nbeta line 5\n" -- no separators
  local Cm = "gamma: héllo wörld\n%\n世界\n%\n"

  before_each(function()
    d = tmpdir()
    d:file("a.txt", A)
    d:file("b.txt", Bt)
    d:file("c.md", Cm)
    d:file("index.dat", "\0\0\0\2binary index")
    d:dir("sub")
    d:file("sub/nested.txt", "not matched by *\n")
    d:symlink("a.txt", "a.txt.u8") -- same file under a second name
  end)
  after_each(function() d:clean() end)

  local function load(opts)
    opts.tokenizer = opts.tokenizer or bytes
    return data.text(opts)
  end

  it("reads matching files sorted, skips directories, excluded files and second names", function()
    local ds = assert(load{ text = d.path .. "/*", exclude = "*.dat", valid_fraction = 0.25 })
    assert.are.same({ d.path .. "/a.txt", d.path .. "/b.txt", d.path .. "/c.md" }, ds.files)
    local reasons = {}
    for _, s in ipairs(ds.skipped) do reasons[s.path:match("[^/]*/?$")] = s.reason end
    assert.are.equal("directory", reasons["sub/"])
    assert.are.equal("excluded by *.dat", reasons["index.dat"])
    assert.are.equal("same file as " .. d.path .. "/a.txt", reasons["a.txt.u8"])
    assert.are.equal(#A + #Bt + #Cm, ds.bytes)
    assert.are.equal(256, ds.vocab_size)
    assert.are.equal("uint16_t", ds.train.dtype)
    assert.is_true(ffi.istype("uint16_t[?]", ds.train.tokens))
    assert.is_string(ds:describe())
  end)

  it("splits each file at a document boundary near the last valid_fraction", function()
    local ds = assert(load{ text = d.path .. "/*", exclude = "*.dat", valid_fraction = 0.25 })
    local info = ds.file_info
    -- a.txt: 25% from the end lands inside "alpha three"; the split moves to the next "%" line end
    assert.are.equal("alpha four\n%\n", A:sub(info[1].train_bytes + 1))
    -- b.txt has no "%" lines: the split moves to the next line start
    assert.are.equal("beta line 5\n", Bt:sub(info[2].train_bytes + 1))
    -- c.md: 25% from the end lands inside "世界"; the only later "%" line ends the
    -- file, so the next line start is used
    assert.are.equal("%\n", Cm:sub(info[3].train_bytes + 1))
    local tr, va = 0, 0
    for _, fi in ipairs(info) do
      assert.are.equal(fi.bytes, fi.train_bytes + fi.valid_bytes)
      assert.are.equal(fi.train_bytes, fi.train_tokens) -- bytes tokenizer
      tr, va = tr + fi.train_tokens, va + fi.valid_tokens
    end
    assert.are.equal(tr, ds.train.n)
    assert.are.equal(va, ds.valid.n)
  end)

  it("keeps train and validation disjoint: together they are exactly the files", function()
    local ds = assert(load{ text = d.path .. "/*", exclude = "*.dat", valid_fraction = 0.25 })
    local train, valid = text_of(ds.train), text_of(ds.valid)
    local tpos, vpos = 1, 1
    for i, p in ipairs(ds.files) do
      local fi = ds.file_info[i]
      local t = train:sub(tpos, tpos + fi.train_bytes - 1)
      local v = valid:sub(vpos, vpos + fi.valid_bytes - 1)
      assert.are.equal(read(p), t .. v)
      tpos, vpos = tpos + fi.train_bytes, vpos + fi.valid_bytes
    end
    assert.are.equal(#train + 1, tpos)
    assert.are.equal(#valid + 1, vpos)
  end)

  it("is deterministic", function()
    local opts = { text = { d.path .. "/*.txt", d.path .. "/*.md" }, valid_fraction = 0.3 }
    local a = assert(load(opts))
    local b = assert(load(opts))
    assert.are.same(a.files, b.files)
    assert.are.equal(a.train.n, b.train.n)
    assert.are.equal(a.valid.n, b.valid.n)
    assert.is_true(arr_equal(a.train.tokens, b.train.tokens, a.train.n))
    assert.is_true(arr_equal(a.valid.tokens, b.valid.tokens, a.valid.n))
  end)

  it("valid_fraction = 0 puts everything in train", function()
    local ds = assert(load{ text = d.path .. "/a.txt", valid_fraction = 0 })
    assert.are.equal(0, ds.valid.n)
    assert.are.equal(A, text_of(ds.train))
  end)

  it("supports exclusion by base name, by path, and lists of patterns", function()
    local ds = assert(load{ text = d.path .. "/*", exclude = { "*.dat", "b.*" } })
    assert.are.same({ d.path .. "/a.txt", d.path .. "/c.md" }, ds.files)
    ds = assert(load{ text = d.path .. "/*", exclude = { "*.dat", d.path .. "/c.*" } })
    assert.are.same({ d.path .. "/a.txt", d.path .. "/b.txt" }, ds.files)
    -- excluding a file also excludes it when reached through a symlink
    ds = assert(load{ text = { d.path .. "/a.txt.u8", d.path .. "/b.txt" }, exclude = "a.txt" })
    assert.are.same({ d.path .. "/b.txt" }, ds.files)
  end)

  it("rejects a binary file, naming it and suggesting an exclude", function()
    local ds, err = load{ text = d.path .. "/*" }
    assert.is_nil(ds)
    assert.matches(d.path .. "/index.dat", err, 1, true)
    assert.matches("NUL", err, 1, true)
    assert.matches("byte offset 0", err, 1, true)
    assert.matches('exclude = "*.dat"', err, 1, true)
  end)

  it("rejects invalid UTF-8 with file, byte offset and line", function()
    d:file("latin1.txt", "caf\xE9 ok\nna\xEFve\n")
    local ds, err = load{ text = d.path .. "/latin1.txt" }
    assert.is_nil(ds)
    assert.matches(d.path .. "/latin1.txt", err, 1, true)
    assert.matches("not valid UTF-8", err, 1, true)
    assert.matches("byte offset 3 (line 1, column 4)", err, 1, true)
    assert.matches("data.exclude", err, 1, true)
  end)

  it("returns an error when a pattern matches nothing, or everything is excluded", function()
    local ds, err = load{ text = d.path .. "/*.nope" }
    assert.is_nil(ds)
    assert.matches("no file matches", err, 1, true)
    assert.matches(d.path .. "/*.nope", err, 1, true)
    ds, err = load{ text = { d.path .. "/a.txt", d.path .. "/missing.txt" } }
    assert.is_nil(ds)
    assert.matches("missing.txt", err, 1, true)
    ds, err = load{ text = d.path .. "/*.dat", exclude = "*.dat" }
    assert.is_nil(ds)
    assert.matches("no file left", err, 1, true)
  end)

  it("raises on misuse", function()
    assert.has_error(function() data.text("x") end)
    assert.has_error(function() data.text{ text = 42, tokenizer = bytes } end)
    assert.has_error(function() data.text{ text = {}, tokenizer = bytes } end)
    assert.has_error(function() data.text{ text = "x", exclude = 1, tokenizer = bytes } end)
    assert.has_error(function() data.text{ text = "x" } end)
    assert.has_error(function() data.text{ text = "x", tokenizer = "nope" } end)
    assert.has_error(function() data.text{ text = "x", tokenizer = bytes, valid_fraction = 1 } end)
    assert.has_error(function() data.text{ text = "x", tokenizer = bytes, valid_fraction = "0.1" } end)
    assert.has_error(function() data.text{ text = "x", tokenizer = bytes, vaild_fraction = 0.1 } end)
  end)

  it("accepts a recipe data block as is (tokenizer by name, seq_len ignored)", function()
    local ds = assert(data.text{ text = d.path .. "/*", exclude = "*.dat", tokenizer = "bytes",
                                 seq_len = 128, valid_fraction = 0.05 })
    assert.are.equal(3, #ds.files)
  end)

  it("appends the tokenizer's eot after each part, and widens storage for big vocabularies", function()
    local function fake(vocab, eot)
      return { name = "fake", vocab_size = vocab, eot = eot, encode = bytes.encode, decode = bytes.decode }
    end
    local ds = assert(load{ text = { d.path .. "/a.txt", d.path .. "/b.txt" }, valid_fraction = 0.25,
                            tokenizer = fake(257, 256) })
    local fa, fb = ds.file_info[1], ds.file_info[2]
    assert.are.equal(fa.train_tokens + fb.train_tokens + 2, ds.train.n)
    assert.are.equal(256, ds.train.tokens[fa.train_tokens])
    assert.are.equal(256, ds.train.tokens[ds.train.n - 1])
    assert.are.equal("uint16_t", ds.train.dtype)
    ds = assert(load{ text = d.path .. "/a.txt", tokenizer = fake(70000, 69999) })
    assert.are.equal("int32_t", ds.train.dtype)
    assert.are.equal(69999, ds.train.tokens[ds.train.n - 1])
  end)

  it("data.open on text globs gives data.text's streams, cached or not (eot, wide storage included)", function()
    local cdir = os.tmpname(); os.remove(cdir)
    -- files older than their cache entries (the cache does not trust an entry made in the same clock
    -- tick as its file's last change)
    assert(os.execute("touch -d '2020-01-01 00:00:00' " .. d.path .. "/*.txt " .. d.path .. "/c.md") == 0)
    for _, tok in ipairs({ bytes, { name = "fake", vocab_size = 70000, eot = 69999, cache_key = "fake 70000",
                                    encode = bytes.encode, decode = bytes.decode } }) do
      local block = { text = d.path .. "/*", exclude = "*.dat", tokenizer = tok, valid_fraction = 0.25, seq_len = 8 }
      local ref = assert(data.text{ text = block.text, exclude = block.exclude, tokenizer = tok, valid_fraction = 0.25 })
      for pass = 1, 2 do -- the second pass reads the cache (for the cacheable tokenizer)
        block.cache = cdir
        local ds = assert(data.open(block))
        assert.are.equal("text", ds.kind)
        assert.are.same(ref.files, ds.files)
        assert.are.same(ref.file_info, ds.file_info)
        for _, k in ipairs({ "train", "valid" }) do
          assert.are.equal(ref[k].n, ds[k].n)
          assert.are.equal(ref[k].dtype, ds[k].dtype)
          assert.is_true(arr_equal(ref[k].tokens, ds[k].tokens, ref[k].n), k)
        end
        assert.is_nil(ds.test)
        if tok ~= bytes and pass == 2 then assert.are.equal(#ref.files, ds.cache.hits) end
      end
    end
    os.execute("rm -rf " .. cdir)
  end)

  it("a cache that cannot be written says so once, naming data.cache, the path and the reason", function()
    local tok = { name = "fake", vocab_size = 300, eot = 299, cache_key = "fake 300", encode = bytes.encode,
                  decode = bytes.decode }
    local afile = d.path .. "/a.txt"                 -- a regular file where the cache directory should be
    local ds = assert(data.text{ text = d.path .. "/*", exclude = "*.dat", tokenizer = tok, cache = afile })
    assert.are.equal(3, #ds.cache.errors)             -- one failure a file, none fatal
    assert.are.equal("data.cache " .. afile .. " is not used: cannot create the cache directory " .. afile ..
                     "/tokens: Not a directory (3 entries not written); every run tokenises the text again " ..
                     "(give a writable directory, or data.cache=off)", ds.cache:warning())
    -- the run's data (source.open) carries it among its warnings, which rank 0 prints
    local opened = assert(data.open{ text = d.path .. "/*", exclude = "*.dat", tokenizer = tok, cache = afile,
                                     seq_len = 4 })
    assert.are.same({ "data.cache " .. afile .. " is not used: cannot create the cache directory " .. afile ..
                      "/tokens: Not a directory (3 entries not written); every run tokenises the text again " ..
                      "(give a writable directory, or data.cache=off)" }, opened.warnings)
    local cdir = d.path .. "/cache"                    -- a cache that works: nothing to say
    ds = assert(data.text{ text = d.path .. "/*", exclude = "*.dat", tokenizer = tok, cache = cdir })
    assert.is_nil(ds.cache:warning())
  end)
end)

---------------------------------------------------------------------------
describe("ztrain.model.data.loader", function()
  it("cuts windows of T+1 tokens with stride T; targets are inputs shifted by one", function()
    local L = assert(data.loader{ split = iota_split(103), B = 2, T = 10, seed = 1 })
    assert.are.equal(10, L.windows) -- floor((103-1)/10); the 2-token tail is unused
    for i = 0, 9 do
      local x, y = L:batch(i)
      local ws = L:windows_of(i)
      for k = 0, 1 do
        assert.are.equal(ws[k + 1] * 10, x[k * 10])
        for t = 0, 9 do
          assert.are.equal(x[k * 10] + t, x[k * 10 + t])
          assert.are.equal(x[k * 10 + t] + 1, y[k * 10 + t])
        end
      end
    end
    -- the last window reaches the last used token: 9*10 + 10 = 100
    local L2 = assert(data.loader{ split = iota_split(101), B = 1, T = 10, shuffle = false })
    local _, y = L2:batch(9)
    assert.are.equal(100, y[9])
  end)

  it("fills caller-provided int32 arrays", function()
    local L = assert(data.loader{ split = iota_split(50), B = 2, T = 4 })
    local x, y = ffi.new("int32_t[8]"), ffi.new("int32_t[8]")
    local rx, ry = L:batch(3, x, y)
    assert.are.equal(x, rx)
    assert.are.equal(y, ry)
    assert.are.equal(x[0] + 1, y[0])
  end)

  it("with shuffle = false takes windows in order, across epochs", function()
    local L = assert(data.loader{ split = iota_split(71), B = 3, T = 10, shuffle = false })
    assert.are.equal(7, L.windows)
    local seen = {}
    for i = 0, 4 do for _, w in ipairs(L:windows_of(i)) do seen[#seen + 1] = w end end
    assert.are.same({ 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0 }, seen)
  end)

  it("is deterministic for a seed; different seeds differ", function()
    local s = iota_split(2001)
    local a = assert(data.loader{ split = s, B = 4, T = 8, seed = 1337 })
    local b = assert(data.loader{ split = s, B = 4, T = 8, seed = 1337 })
    local c = assert(data.loader{ split = s, B = 4, T = 8, seed = 1338 })
    local differ = false
    for i = 0, 20 do
      assert.are.same(batch_table(a, i), batch_table(b, i))
      if not differ and not arr_equal(a:batch(i), c:batch(i), 32) then differ = true end
    end
    assert.is_true(differ)
    -- the permutation is fixed by (seed, epoch). Pinned: changing the PRNG would make
    -- saved loader states (checkpoints) resume onto different batches.
    local function list(p, n) local t = {} for j = 0, n - 1 do t[j + 1] = p[j] end return t end
    assert.are.same({ 6, 8, 5, 7, 1, 4, 3, 9, 2, 0 }, list(loader_mod.permutation(10, 1337, 0), 10))
    assert.are.same({ 5, 0, 3, 9, 1, 8, 4, 6, 2, 7 }, list(loader_mod.permutation(10, 1337, 1), 10))
  end)

  it("uses every window exactly once per epoch, with a new order each epoch", function()
    local B, T = 3, 5
    local L = assert(data.loader{ split = iota_split(11 * T + 1), B = B, T = T, seed = 7 })
    assert.are.equal(11, L.windows)
    local per_epoch, order = {}, {}
    for i = 0, 32 - 1 do -- 96 slots: epochs 0..7 complete, plus part of 8
      local ws = L:windows_of(i)
      for k = 0, B - 1 do
        local g = i * B + k
        local e = math.floor(g / L.windows)
        per_epoch[e] = per_epoch[e] or {}
        order[e] = order[e] or {}
        local w = ws[k + 1]
        assert.is_nil(per_epoch[e][w], "window repeated within an epoch")
        per_epoch[e][w] = true
        order[e][#order[e] + 1] = w
      end
    end
    for e = 0, 7 do
      local n = 0
      for w in pairs(per_epoch[e]) do assert.is_true(w >= 0 and w < 11); n = n + 1 end
      assert.are.equal(11, n)
    end
    assert.are_not.same(order[0], order[1])
    assert.are.equal(0, L:epoch_of(3))  -- slots 9..11: first row still in epoch 0
    assert.are.equal(1, L:epoch_of(4))  -- slot 12
  end)

  it("gives random access: batch i is the same whoever computes it, in any order", function()
    local s = iota_split(1000)
    local cfg = { split = s, B = 4, T = 7, seed = 99 }
    local seq = assert(data.loader(cfg))
    local in_order = {}
    for i = 0, 99 do in_order[i] = batch_table(seq, i) end -- crosses several epochs (35 windows)
    for _, i in ipairs({ 97, 3, 50, 0, 99, 17, 18, 64 }) do
      local fresh = assert(data.loader(cfg))
      assert.are.same(in_order[i], batch_table(fresh, i))
    end
    -- N ranks taking s*N + r equal one rank taking s*N + 0..N-1
    local N = 3
    local ranks = {}
    for r = 0, N - 1 do ranks[r] = assert(data.loader(cfg)) end
    for step = 0, 30 do
      for r = 0, N - 1 do
        assert.are.same(in_order[step * N + r], batch_table(ranks[r], step * N + r))
      end
    end
  end)

  it("resumes from a saved state", function()
    local cfg = { split = iota_split(500), B = 4, T = 6, seed = 5 }
    local L1 = assert(data.loader(cfg))
    for i = 0, 40 do L1:batch(i) end -- "train" 41 batches
    local st = L1:state(41)
    assert.are.equal(41, st.batch)
    assert.are.equal(math.floor(41 * 4 / L1.windows), st.epoch)
    assert.are.equal(41 * 4 % L1.windows, st.pos)
    -- a new process: same config, continue from the state
    local L2 = assert(data.loader(cfg))
    local i = L2:seek(st)
    assert.are.equal(41, i)
    for j = 0, 10 do assert.are.same(batch_table(L1, 41 + j), batch_table(L2, i + j)) end
    assert.are.equal(41, L2:seek{ epoch = st.epoch, pos = st.pos })
    -- a state from a different data set / batch size is refused
    local L3 = assert(data.loader{ split = iota_split(400), B = 4, T = 6, seed = 5 })
    assert.has_error(function() L3:seek(st) end)
    local L4 = assert(data.loader{ split = iota_split(500), B = 3, T = 6, seed = 5 })
    assert.has_error(function() L4:seek(st) end)
  end)

  it("returns an error with the numbers when there is too little data", function()
    local L, err = data.loader{ split = iota_split(10), B = 1, T = 10 }
    assert.is_nil(L)
    assert.matches("10 tokens", err, 1, true)
    assert.matches("T + 1 = 11", err, 1, true)
    L, err = data.loader{ split = iota_split(31), B = 4, T = 10 }
    assert.is_nil(L)
    assert.matches("3 windows", err, 1, true)
    assert.matches("B = 4", err, 1, true)
    assert.truthy(data.loader{ split = iota_split(31), B = 3, T = 10 })
  end)

  it("raises on misuse", function()
    local s = iota_split(100)
    assert.has_error(function() data.loader{ split = s, B = 0, T = 4 } end)
    assert.has_error(function() data.loader{ split = s, B = 1.5, T = 4 } end)
    assert.has_error(function() data.loader{ split = s, B = 1 } end)
    assert.has_error(function() data.loader{ split = {}, B = 1, T = 4 } end)
    assert.has_error(function() data.loader{ split = s, B = 1, T = 4, shuffle = 1 } end)
    assert.has_error(function() data.loader{ split = s, B = 1, T = 4, bs = 2 } end)
    local L = assert(data.loader{ split = s, B = 1, T = 4 })
    assert.has_error(function() L:batch(-1) end)
    assert.has_error(function() L:batch(0, {}, {}) end)
  end)

  it("permutation() is a permutation for many sizes and epochs", function()
    for _, n in ipairs({ 1, 2, 3, 17, 1000 }) do
      for e = 0, 3 do
        local p = loader_mod.permutation(n, 42, e)
        local seen = {}
        for j = 0, n - 1 do
          assert.is_nil(seen[p[j]])
          seen[p[j]] = true
          assert.is_true(p[j] >= 0 and p[j] < n)
        end
      end
    end
  end)
end)

---------------------------------------------------------------------------
describe("the fortunes corpus", function()
  local dir = "/usr/share/games/fortunes"

  it("loads with the default recipe data block", function()
    local probe = io.open(dir .. "/fortunes", "rb")
    if not probe then
      pending(dir .. " is absent: install Debian's `fortunes` package (apt-get install fortunes) to run this spec")
      return
    end
    probe:close()
    -- (the load's time is make bench's: tools/bench_data.lua)
    local ds, err = data.text{ text = dir .. "/*", exclude = "*.dat", tokenizer = "bytes", valid_fraction = 0.05 }
    assert.is_nil(err)
    assert.is_true(#ds.files > 0)
    local total = 0
    for _, p in ipairs(ds.files) do
      assert.is_nil(p:match("%.dat$"), p)
      assert.is_nil(p:match("%.u8$"), p) -- the .u8 names are symlinks to the plain files
      local s = read(p)
      assert.is_true((utf8.check(s, #s, { nul = false })), p)
      total = total + #s
    end
    assert.are.equal(total, ds.bytes)
    assert.are.equal(ds.bytes, ds.train.n + ds.valid.n) -- bytes tokenizer, no eot
    local frac = ds.valid.n / ds.bytes
    assert.is_true(frac > 0.04 and frac < 0.06, "valid fraction " .. frac)
    local L = assert(data.loader{ split = ds.train, B = 4, T = 128, seed = 1337 })
    local V = assert(data.loader{ split = ds.valid, B = 4, T = 128, seed = 1337, shuffle = false })
    local x, y = L:batch(0)
    assert.are.equal(x[1], y[0])
    print(("\nfortunes: %s; %d train / %d valid windows of T=128"):format(ds:describe(), L.windows, V.windows))
  end)
end)
