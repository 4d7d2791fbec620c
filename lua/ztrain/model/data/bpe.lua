-- ztrain.model.data.bpe: GPT-2's byte-level BPE tokenizer, reading Hugging Face's
-- vocab.json + merges.txt.
--
--   local bpe = require "ztrain.model.data.bpe"
--   local tok = bpe.load("data/bpe/fortunes")   -- dir with vocab.json and merges.txt
--   local ids, n = tok.encode("héllo wörld")     -- int32_t[n] (0-based), n
--   local s = tok.decode(ids, n)                 -- "héllo wörld"
--   tok.vocab_size, tok.eot                      -- max id + 1; id of "<|endoftext|>" or nil
--
-- Encoding, exactly as GPT-2 and Hugging Face `tokenizers` (ByteLevel pre-tokenizer, no
-- prefix space; BPE model) do it:
--  1. The text is split on the special tokens (by default "<|endoftext|>" when the
--     vocabulary has it), which become their ids; the pieces between them go on.
--  2. Pre-tokenization: GPT-2's pattern (M.PATTERN) through PCRE2 in UTF + UCP mode
--     (\p{L}, \p{N}, \s from the library's Unicode tables; \s as White_Space, see
--     M.PCRE2_PATTERN), JIT-compiled. Each match is a pre-token. Bytes that are not
--     valid UTF-8 match nothing; each such gap between matches becomes a pre-token of
--     its own, so any byte string encodes. Characters newer than the library's Unicode
--     version (pcre2.unicode_version(): 14.0 for Debian 12's PCRE2 10.42) are neither
--     letters nor digits here, as in any regex engine of that Unicode version; a
--     reference built on a later Unicode (tokenizers 0.23: 16.0) splits text holding
--     them differently (9392 code points, all added in Unicode 15.0 or later).
--  3. Each pre-token's bytes start as byte symbols (vocab[bytes_to_unicode(b)]) and are
--     merged by BPE: repeatedly the adjacent pair with the lowest merge rank (its line
--     in merges.txt), the leftmost one on ties, until no pair has a rank. This is the
--     order of tokenizers' Word::merge_all and of tiktoken; for vocabularies that BPE
--     training produced it equals GPT-2's encoder.py (which merges all occurrences of
--     the best pair at once). Short pre-tokens use a scan, long ones a heap (O(n log n)).
--     Results are cached per pre-token (the cache is emptied when it grows past
--     M.CACHE_MAX entries).
-- Decoding concatenates each id's bytes (special tokens decode to their text; nothing is
-- skipped), so decode(encode(s)) == s for every byte string s, valid UTF-8 or not.
--
-- Input rules (bad input raises error(msg, 0) naming the file, and the line where there
-- is one): the two files are read by ztrain.model.data.bpe_vocab (read_vocab, read_merges:
-- a JSON object of token -> distinct id in [0, 2^26); one merge a line); the vocabulary
-- holds all 256 byte symbols. Both parts of every merge and their concatenation are in
-- the vocabulary (as tokenizers requires). A merge listed twice takes its later rank (as
-- tokenizers and encoder.py do).
local ffi = require "ffi"
local pcre2 = require "ztrain.model.data.pcre2"
local vocab_files = require "ztrain.model.data.bpe_vocab"

local M = {}

-- GPT-2's pre-tokenization pattern (openai/gpt-2 src/encoder.py; tokenizers' ByteLevel).
M.PATTERN = [['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]]
M.EOT = "<|endoftext|>"
M.CACHE_MAX = 262144 -- pre-tokens cached per tokenizer
M.HEAP_MIN = 64       -- pre-tokens at least this many bytes long merge through a heap

local K = vocab_files.ID_LIMIT -- 2^26: pair key = left id * K + right id (exact in a double)
local json_str = vocab_files.quote

local i32arr = ffi.typeof("int32_t[?]")
local u8ptr = ffi.typeof("const uint8_t *")

---------------------------------------------------------------------------
-- GPT-2's bytes_to_unicode: every byte gets a printable Unicode character. Bytes
-- 33..126, 161..172, 174..255 map to themselves; the other 68, in increasing order,
-- to U+0100, U+0101, ... (space 0x20 -> U+0120 "Ġ", newline 0x0A -> U+010A "Ċ").

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) -- cp < 0x800 here
end

local byte_char, char_byte, byte_order = {}, {}, {}
do
  local n = 0
  for b = 0, 255 do
    local cp
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then
      cp = b
    else
      cp = 256 + n; n = n + 1
    end
    byte_char[b] = utf8_char(cp)
    char_byte[byte_char[b]] = b
  end
  -- GPT-2's vocabulary lists the byte symbols in code point order of their characters
  -- ("!" = 0, ..., "Ā" (byte 0) = 188, ..., "Ġ" (space) = 220).
  for b = 0, 255 do byte_order[b + 1] = b end
  table.sort(byte_order, function(x, y)
    local cx = #byte_char[x] == 1 and byte_char[x]:byte() or (byte_char[x]:byte(1) % 32) * 64 + byte_char[x]:byte(2) % 64
    local cy = #byte_char[y] == 1 and byte_char[y]:byte() or (byte_char[y]:byte(1) % 32) * 64 + byte_char[y]:byte(2) % 64
    return cx < cy
  end)
end

-- byte_to_unicode(b) -> the 1-character UTF-8 string of byte b (0..255)
function M.byte_to_unicode(b) return byte_char[b] end

-- byte_symbols() -> list of the 256 bytes in GPT-2's vocabulary order (code point order)
function M.byte_symbols()
  local t = {}
  for i = 1, 256 do t[i] = byte_order[i] end
  return t
end

-- to_unicode(bytes) -> the token string in vocab.json's form ("Ġhello" for " hello")
function M.to_unicode(s)
  return (s:gsub(".", function(c) return byte_char[c:byte()] end))
end

-- from_unicode(token) -> bytes, or nil when a character is not a byte symbol
function M.from_unicode(tok)
  local out, i, n = {}, 1, #tok
  while i <= n do
    local c = tok:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC0 and c < 0xE0) and 2 or 0
    if len == 0 then return nil end
    local b = char_byte[tok:sub(i, i + len - 1)]
    if b == nil then return nil end
    out[#out + 1] = string.char(b)
    i = i + len
  end
  return table.concat(out)
end

---------------------------------------------------------------------------
-- Pre-tokenization

-- The pattern as compiled. With PCRE2_UCP, \s is \p{Z} plus \h and \v, which adds
-- U+180E (MONGOLIAN VOWEL SEPARATOR, a space until Unicode 6.3) to Unicode's
-- White_Space; Oniguruma (tokenizers) and Python's regex (GPT-2's encoder.py) take \s
-- as White_Space. So \s and \S are spelled \p{White_Space} and \P{White_Space}
-- (Boolean properties: PCRE2 >= 10.40); an older PCRE2 gets GPT-2's text as is and
-- differs on U+180E only.
M.PCRE2_PATTERN = M.PATTERN:gsub("\\s", "\\p{White_Space}"):gsub("\\S", "\\P{White_Space}")

local regex -- compiled once per Lua state, on first use
local function get_regex()
  if not regex then
    local opts = { utf = true, ucp = true, invalid_utf = true }
    local ok, re = pcall(pcre2.compile, M.PCRE2_PATTERN, opts)
    regex = ok and re or pcre2.compile(M.PATTERN, opts)
  end
  return regex
end
M.regex = get_regex

-- pretokenize(s, fn): calls fn(p, a, b) for each pre-token of the byte string s in
-- order, where p is s as a const uint8_t * and [a, b) 0-based byte offsets. Special
-- tokens are not looked for here (see encode). Gaps of invalid UTF-8 come as pre-tokens.
local function pretokenize_range(p, a0, b0, fn)
  local re = get_regex()
  local pos = a0
  while pos < b0 do
    local s, e = re:find(p, b0, pos)
    if not s then fn(p, pos, b0); return end
    if s > pos then fn(p, pos, s) end
    fn(p, s, e)
    pos = e
  end
end

function M.pretokenize(s, fn)
  pretokenize_range(ffi.cast(u8ptr, s), 0, #s, fn)
end

-- split(s) -> list of the pre-token strings of s (for tests and inspection)
function M.split(s)
  local t = {}
  M.pretokenize(s, function(p, a, b) t[#t + 1] = ffi.string(p + a, b - a) end)
  return t
end

---------------------------------------------------------------------------
-- BPE on one pre-token

-- Scan form: symbols in a Lua array; each round finds the lowest-ranked pair
-- (leftmost on ties) and merges it. O(n^2) worst case: for short pre-tokens.
local function merge_scan(syms, n, rank_of, new_of)
  while n > 1 do
    local best, at = 1 / 0, 0
    local left = syms[1]
    for i = 1, n - 1 do
      local right = syms[i + 1]
      local r = rank_of[left * K + right]
      if r and r < best then best, at = r, i end
      left = right
    end
    if at == 0 then break end
    syms[at] = new_of[syms[at] * K + syms[at + 1]]
    for i = at + 1, n - 1 do syms[i] = syms[i + 1] end
    syms[n] = nil
    n = n - 1
  end
  return n
end

-- Heap form, as tokenizers' Word::merge_all: a min-heap of (rank, position) packed in
-- one number (rank * 2^32 + position: the lowest rank, then the leftmost); symbols in
-- a linked list; an entry whose pair has changed since it was pushed is dropped.
local P32 = 4294967296
local function merge_heap(syms, n, rank_of, new_of)
  local nxt, prv, heap, hn = {}, {}, {}, 0
  local function push(v)
    hn = hn + 1
    local i = hn
    while i > 1 do
      local parent = math.floor(i / 2)
      if heap[parent] <= v then break end
      heap[i] = heap[parent]; i = parent
    end
    heap[i] = v
  end
  local function pop()
    local top, last = heap[1], heap[hn]
    heap[hn] = nil
    hn = hn - 1
    if hn > 0 then
      local i = 1
      while true do
        local c = 2 * i
        if c > hn then break end
        if c < hn and heap[c + 1] < heap[c] then c = c + 1 end
        if heap[c] >= last then break end
        heap[i] = heap[c]; i = c
      end
      heap[i] = last
    end
    return top
  end
  for i = 1, n do nxt[i] = i + 1; prv[i] = i - 1 end
  nxt[n] = 0
  for i = 1, n - 1 do
    local r = rank_of[syms[i] * K + syms[i + 1]]
    if r then push(r * P32 + i) end
  end
  while hn > 0 do
    local v = pop()
    local r = math.floor(v / P32)
    local i = v - r * P32
    local j = nxt[i]
    if syms[i] and j ~= 0 then
      local key = syms[i] * K + syms[j]
      if rank_of[key] == r then
        syms[i] = new_of[key]
        local k = nxt[j]
        nxt[i] = k
        if k ~= 0 then prv[k] = i end
        syms[j] = false -- removed
        local p = prv[i]
        if p ~= 0 then
          local rp = rank_of[syms[p] * K + syms[i]]
          if rp then push(rp * P32 + p) end
        end
        if k ~= 0 then
          local rk = rank_of[syms[i] * K + syms[k]]
          if rk then push(rk * P32 + i) end
        end
      end
    end
  end
  local m, i = 0, 1
  while i ~= 0 do
    m = m + 1
    syms[m] = syms[i]
    i = nxt[i]
  end
  for x = m + 1, n do syms[x] = nil end
  return m
end

M._merge_scan, M._merge_heap = merge_scan, merge_heap -- for specs
M.merge_scan, M.merge_heap = merge_scan, merge_heap -- (syms, n, rank_of, new_of) -> n: for spm_bpe too

-- read_vocab(path) -> vocab (token string -> id), max id; read_merges(path) -> list of
-- { left, right, line } (ztrain.model.data.bpe_vocab)
M.read_vocab, M.read_merges = vocab_files.read_vocab, vocab_files.read_merges

---------------------------------------------------------------------------
-- The tokenizer

local Tok = {}
Tok.__index = Tok

-- new{ vocab = {token -> id}, merges = {{left, right[, line]}, ...}, name =,
--      specials = {token, ...} (default: { "<|endoftext|>" } when in vocab),
--      extra_bytes = {[id] = text} (ids that decode to text, in the vocabulary or past it),
--      vocab_path =, merges_path = (for messages) } -> tokenizer
function M.new(o)
  local vocab, merges = o.vocab, o.merges
  local vpath = o.vocab_path or "vocab.json"
  local mpath = o.merges_path or "merges.txt"
  local max_id = -1
  for _, id in pairs(vocab) do if id > max_id then max_id = id end end
  local self = setmetatable({ name = o.name or "bpe", vocab_size = max_id + 1 }, Tok)

  -- byte symbols
  local byte_id = {}
  for b = 0, 255 do
    local id = vocab[byte_char[b]]
    if id == nil then
      error(("bpe: %s lacks the byte symbol %s (byte 0x%02X): not a GPT-2 byte-level vocabulary " ..
             "(it must hold all 256 byte symbols of bytes_to_unicode)"):format(vpath, json_str(byte_char[b]), b), 0)
    end
    byte_id[b] = id
  end

  -- merges: pair key -> rank (0-based line among merges), -> merged id
  local rank_of, new_of = {}, {}
  for r, m in ipairs(merges) do
    local a, b, line = m[1], m[2], m[3] or r
    local ia, ib = vocab[a], vocab[b]
    local bad = (ia == nil and a) or (ib == nil and b)
    if bad then
      error(("bpe: %s:%d: merge %s: the token %s is not in the vocabulary %s")
        :format(mpath, line, json_str(a .. " " .. b), json_str(bad), vpath), 0)
    end
    local inew = vocab[a .. b]
    if inew == nil then
      error(("bpe: %s:%d: merge %s: the merged token %s is not in the vocabulary %s")
        :format(mpath, line, json_str(a .. " " .. b), json_str(a .. b), vpath), 0)
    end
    rank_of[ia * K + ib] = r - 1
    new_of[ia * K + ib] = inew
  end

  -- special tokens
  local specials = o.specials
  if specials == nil then specials = vocab[M.EOT] and { M.EOT } or {} end
  local special_ids = {}
  for i, s in ipairs(specials) do
    if type(s) ~= "string" or s == "" or vocab[s] == nil then
      error(("bpe: special token %s is not in the vocabulary %s"):format(json_str(tostring(s)), vpath), 0)
    end
    special_ids[i] = vocab[s]
  end
  self.eot = vocab[M.EOT]

  -- id -> bytes (a token that is not all byte symbols decodes to its own text, as
  -- tokenizers' ByteLevel decoder does)
  local id_bytes = {}
  for tok, id in pairs(vocab) do
    local is_special = false
    for _, s in ipairs(specials) do if s == tok then is_special = true end end
    id_bytes[id] = (not is_special and M.from_unicode(tok)) or tok
  end
  for id, text in pairs(o.extra_bytes or {}) do -- added tokens (tokenizer.json: hf_tokenizer)
    id_bytes[id] = text
    if id >= self.vocab_size then self.vocab_size = id + 1 end
  end

  self._byte_id, self._rank_of, self._new_of = byte_id, rank_of, new_of
  self._specials, self._special_ids, self._id_bytes = specials, special_ids, id_bytes
  self._cache, self._cached = {}, 0
  self.merges_count = #merges
  self.specials = specials

  -- tok.encode / tok.decode work with "." and ":"
  local enc, dec = Tok.encode, Tok.decode
  self.encode = function(a, ...) if a == self then return enc(self, ...) end return enc(self, a, ...) end
  self.decode = function(a, ...) if a == self then return dec(self, ...) end return dec(self, a, ...) end
  return self
end

-- load(dir, opts) -> tokenizer from dir/vocab.json and dir/merges.txt. opts.name
-- (default "bpe:" .. dir), opts.specials (see new).
function M.load(dir, opts)
  opts = opts or {}
  if type(dir) ~= "string" or dir == "" then
    error("bpe.load: expected a directory holding vocab.json and merges.txt, got " .. tostring(dir), 0)
  end
  dir = dir:gsub("/+$", "")
  if dir == "" then dir = "/" end
  local vpath, mpath = dir .. "/vocab.json", dir .. "/merges.txt"
  local vocab = M.read_vocab(vpath)
  local merges = M.read_merges(mpath)
  local tok = M.new { vocab = vocab, merges = merges, name = opts.name or ("bpe:" .. dir),
                      specials = opts.specials, vocab_path = vpath, merges_path = mpath }
  tok.dir = dir
  return tok
end

-- ids of one pre-token (bytes p[a..b)): a number (one token) or a list
function Tok:_bpe(p, a, b)
  local byte_id = self._byte_id
  local n = b - a
  local syms = {}
  for i = 1, n do syms[i] = byte_id[p[a + i - 1]] end
  if n >= M.HEAP_MIN then
    n = merge_heap(syms, n, self._rank_of, self._new_of)
  else
    n = merge_scan(syms, n, self._rank_of, self._new_of)
  end
  if n == 1 then return syms[1] end
  return syms
end

-- encode(s) -> int32_t[n] of ids (0-based), n
function Tok:encode(s)
  if type(s) ~= "string" then
    error("bpe.encode: expected a string, got " .. type(s), 0)
  end
  local len = #s
  local cap = math.floor(len / 2) + 64 -- grown as needed (English: ~4 bytes a token)
  local out = i32arr(cap)
  local k = 0
  local p = ffi.cast(u8ptr, s) -- `s` stays alive for the whole call
  local cache = self._cache
  local re = get_regex()
  local specials, special_ids = self._specials, self._special_ids

  local function piece(a, b)
    local key = ffi.string(p + a, b - a)
    local v = cache[key]
    if v == nil then
      v = self:_bpe(p, a, b)
      if self._cached >= M.CACHE_MAX then
        cache = {}; self._cache = cache; self._cached = 0
      end
      cache[key] = v
      self._cached = self._cached + 1
    end
    local m = type(v) == "number" and 1 or #v
    if k + m > cap then
      cap = math.max(2 * cap, k + m)
      local bigger = i32arr(cap)
      ffi.copy(bigger, out, k * 4)
      out = bigger
    end
    if m == 1 and type(v) == "number" then
      out[k] = v; k = k + 1
    else
      for i = 1, m do out[k] = v[i]; k = k + 1 end
    end
  end

  local pos = 0
  while pos < len do
    -- next special token (the earliest; the longest at the same place)
    local sa, sb, sid = len, len, nil
    for i = 1, #specials do
      local x, y = s:find(specials[i], pos + 1, true)
      if x and (x - 1 < sa or (x - 1 == sa and y > sb)) then sa, sb, sid = x - 1, y, special_ids[i] end
    end
    -- GPT-2's pattern over [pos, sa)
    while pos < sa do
      local ms, me = re:find(p, sa, pos)
      if not ms then piece(pos, sa); break end
      if ms > pos then piece(pos, ms) end
      piece(ms, me)
      pos = me
    end
    if sid then
      if k + 1 > cap then
        cap = 2 * cap
        local bigger = i32arr(cap)
        ffi.copy(bigger, out, k * 4)
        out = bigger
      end
      out[k] = sid; k = k + 1
    end
    pos = sb
  end
  local res = i32arr(k)
  ffi.copy(res, out, k * 4)
  return res, k
end

-- decode(ids, n) -> string. ids: a 0-based cdata array/pointer of ids (n required) or a
-- 1-based Lua table (n defaults to #ids).
function Tok:decode(a, n)
  local id_bytes = self._id_bytes
  local parts = {}
  if type(a) == "table" then
    n = n or #a
    for i = 1, n do
      local s = id_bytes[a[i]]
      if s == nil then
        error(("bpe.decode: id %s at position %d is not in the vocabulary (%s)"):format(
          tostring(a[i]), i, self.name), 0)
      end
      parts[i] = s
    end
  elseif type(a) == "cdata" then
    if type(n) ~= "number" or n < 0 then
      error("bpe.decode: n (token count) required with a cdata array", 0)
    end
    for i = 0, n - 1 do
      local s = id_bytes[tonumber(a[i])]
      if s == nil then
        error(("bpe.decode: id %s at index %d is not in the vocabulary (%s)"):format(
          tostring(a[i]), i, self.name), 0)
      end
      parts[i + 1] = s
    end
  else
    error("bpe.decode: expected a cdata array or a table of ids, got " .. type(a), 0)
  end
  return table.concat(parts)
end

-- token_bytes(id) -> the bytes of token `id`, or nil
function Tok:token_bytes(id) return self._id_bytes[id] end

return M
