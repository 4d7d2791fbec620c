-- ztrain.model.data.bpe_train: learn a GPT-2 byte-level BPE vocabulary from text, and write it
-- as Hugging Face's vocab.json + merges.txt (which ztrain.model.data.bpe and tokenizers read).
--
--   local train = require "ztrain.model.data.bpe_train"
--   local v = train.train{ texts = { s1, s2, ... }, vocab_size = 8192 }
--   train.write("data/bpe/mine", v)          -- vocab.json + merges.txt
--   local tok = train.tokenizer(v)           -- the same vocabulary as a tokenizer
--
-- The algorithm is the standard byte-level BPE, as tokenizers' BpeTrainer runs it:
--  * Each text is cut on the special tokens (their text is not learned from), the
--    pieces pre-tokenized with GPT-2's pattern (ztrain.model.data.bpe.pretokenize) and each
--    distinct pre-token ("word") counted.
--  * Symbols start as the 256 byte symbols, with ids in GPT-2's order (the code point
--    order of bytes_to_unicode's characters: "!" = 0, ..., "Ġ" = 220).
--  * Repeatedly: the adjacent symbol pair with the highest count over all words (each
--    word weighted by its count; in "aaa" the pair (a, a) counts twice) is merged into
--    a new symbol, left to right without overlap inside each word ("aaa" -> "aa" "a").
--    Ties go to the smallest pair (left id, then right id), which is BpeTrainer's
--    tie-break too, so both learn the same merges from the same words. A merge whose
--    text already names a symbol (reached by another pair: "a"+"bc" and "ab"+"c")
--    reuses that symbol's id.
--  * It stops when the vocabulary (bytes + new symbols + special tokens) reaches
--    vocab_size, or when the best count is below min_frequency (or zero).
-- The vocabulary written: byte symbols 0..255, new symbols in the order learned, then
-- the special tokens (GPT-2's layout: "<|endoftext|>" last).
--
-- Cost: each merge visits only the words that hold its pair (an index pair -> words)
-- and the best pair comes from a lazy max-heap (a pair's count only falls once it
-- exists, so a stale entry is re-pushed with its current count when it surfaces).
local ffi = require "ffi"
local bpe = require "ztrain.model.data.bpe"
local durable = require "ztrain.util.durable"

local M = {}

local K = 67108864 -- 2^26: pair key = left id * K + right id, as in bpe.lua

-- count_words(texts, specials) -> words (pre-token bytes -> count), number of pre-tokens
function M.count_words(texts, specials, words)
  words = words or {}
  local total = 0
  local function add(p, a, b)
    local w = ffi.string(p + a, b - a)
    words[w] = (words[w] or 0) + 1
    total = total + 1
  end
  for _, text in ipairs(texts) do
    -- cut on special tokens, then pre-tokenize the pieces
    local pos = 1
    while pos <= #text do
      local sa, sb = #text + 1, #text
      for _, sp in ipairs(specials) do
        local x, y = text:find(sp, pos, true)
        if x and x < sa then sa, sb = x, y end
      end
      if sa > pos then bpe.pretokenize(text:sub(pos, sa - 1), add) end
      pos = sb + 1
    end
  end
  return words, total
end

-- A max-heap of (count, pair key): the highest count first, then the smallest key.
local function heap_new() return { c = {}, k = {}, n = 0 } end
local function above(c1, k1, c2, k2) return c1 > c2 or (c1 == c2 and k1 < k2) end
local function heap_push(h, c, k)
  local hc, hk = h.c, h.k
  local n = h.n + 1
  h.n = n
  local i = n
  while i > 1 do
    local p = math.floor(i / 2)
    if not above(c, k, hc[p], hk[p]) then break end
    hc[i], hk[i] = hc[p], hk[p]
    i = p
  end
  hc[i], hk[i] = c, k
end
local function heap_pop(h)
  local hc, hk = h.c, h.k
  local n = h.n
  local tc, tk = hc[1], hk[1]
  local lc, lk = hc[n], hk[n]
  hc[n], hk[n] = nil, nil
  n = n - 1
  h.n = n
  if n > 0 then
    local i = 1
    while true do
      local c = 2 * i
      if c > n then break end
      if c < n and above(hc[c + 1], hk[c + 1], hc[c], hk[c]) then c = c + 1 end
      if not above(hc[c], hk[c], lc, lk) then break end
      hc[i], hk[i] = hc[c], hk[c]
      i = c
    end
    hc[i], hk[i] = lc, lk
  end
  return tc, tk
end

-- check_options(o) -> specials, vocab_size, min_frequency; raises (level 0) naming
-- the option that is wrong
local function check_options(o)
  if type(o) ~= "table" then error("bpe_train.train: expected a table of options", 0) end
  local specials = o.specials or { bpe.EOT }
  local vocab_size = o.vocab_size
  if type(vocab_size) ~= "number" or vocab_size % 1 ~= 0 or vocab_size < 256 + #specials or vocab_size >= K then
    error(("bpe_train: vocab_size must be an integer in [%d, %d) (256 bytes + %d special tokens at least), got %s")
      :format(256 + #specials, K, #specials, tostring(vocab_size)), 0)
  end
  local min_frequency = o.min_frequency or 2
  if type(min_frequency) ~= "number" or min_frequency < 0 then
    error("bpe_train: min_frequency must be a number >= 0, got " .. tostring(min_frequency), 0)
  end
  return specials, vocab_size, min_frequency
end

-- note_word(where, key, wi): word wi holds pair key (a word is listed once per pair:
-- words are indexed in ascending order, so its index is the list's last if there)
local function note_word(where, key, wi)
  local wl = where[key]
  if not wl then wl = {}; where[key] = wl end
  if wl[#wl] ~= wi then wl[#wl + 1] = wi end
end

-- new_state(words) -> the trainer's state: symbols (sym: id -> bytes; id_of: bytes ->
-- id; nsym) starting as the 256 bytes, the words as arrays of symbol ids (wsyms, wfreq,
-- in sorted order for a reproducible index order; nwords), each pair's count and the
-- words holding it (counts, where: by pair key), and the heap of pairs by count
local function new_state(words)
  local sym, id_of = {}, {}
  for i, b in ipairs(bpe.byte_symbols()) do
    sym[i - 1] = string.char(b); id_of[string.char(b)] = i - 1
  end
  local list = {}
  for w in pairs(words) do list[#list + 1] = w end
  table.sort(list)
  local wsyms, wfreq = {}, {}
  local counts, where = {}, {}
  for wi, w in ipairs(list) do
    local f = words[w]
    local s = {}
    for i = 1, #w do s[i] = id_of[w:sub(i, i)] end
    wsyms[wi], wfreq[wi] = s, f
    for i = 1, #s - 1 do
      local key = s[i] * K + s[i + 1]
      counts[key] = (counts[key] or 0) + f
      note_word(where, key, wi)
    end
  end
  local heap = heap_new()
  for key, c in pairs(counts) do heap_push(heap, c, key) end
  return { sym = sym, id_of = id_of, nsym = 256, wsyms = wsyms, wfreq = wfreq, nwords = #list,
           counts = counts, where = where, heap = heap, seen = {}, stamp = 0 }
end

-- symbol_for(st, a, b) -> the id of symbol a's bytes followed by b's: an existing
-- symbol with that text (reached by another pair), else a new one
local function symbol_for(st, a, b)
  local text = st.sym[a] .. st.sym[b]
  local nid = st.id_of[text]
  if nid == nil then
    nid = st.nsym; st.nsym = st.nsym + 1
    st.sym[nid] = text; st.id_of[text] = nid
  end
  return nid
end

-- merged(s, a, b, nid) -> t, m: word s with each (a, b) replaced by nid, left to
-- right without overlap, and t's length
local function merged(s, a, b, nid)
  local n = #s
  local t, m, i = {}, 0, 1
  while i <= n do
    if i < n and s[i] == a and s[i + 1] == b then
      m = m + 1; t[m] = nid; i = i + 2
    else
      m = m + 1; t[m] = s[i]; i = i + 1
    end
  end
  return t, m
end

-- merge_pair(st, key, a, b, nid) -> touched, tn: the pair (a, b) merged into nid in
-- every word holding it, the pair counts and index updated; touched lists the tn pairs
-- with nid in them
local function merge_pair(st, key, a, b, nid)
  local wsyms, wfreq, counts, where, seen = st.wsyms, st.wfreq, st.counts, st.where, st.seen
  st.stamp = st.stamp + 1
  local stamp = st.stamp
  local touched, tset, tn = {}, {}, 0
  for _, wi in ipairs(where[key]) do
    if seen[wi] ~= stamp then
      seen[wi] = stamp
      local s, f = wsyms[wi], wfreq[wi]
      local n = #s
      local t, m = merged(s, a, b, nid)
      if m < n then
        for x = 1, n - 1 do
          local k2 = s[x] * K + s[x + 1]
          counts[k2] = counts[k2] - f
        end
        for x = 1, m - 1 do
          local l, r = t[x], t[x + 1]
          local k2 = l * K + r
          counts[k2] = (counts[k2] or 0) + f
          if l == nid or r == nid then
            note_word(where, k2, wi)
            if not tset[k2] then tset[k2] = true; tn = tn + 1; touched[tn] = k2 end
          end
        end
        wsyms[wi] = t
      end
    end
  end
  where[key], counts[key] = nil, nil
  return touched, tn
end

-- vocab_form(st, merges, specials) -> vocab, merges in vocab.json's form: byte
-- symbols, new symbols in the order learned, then the special tokens
local function vocab_form(st, merges, specials)
  local vocab, out_merges = {}, {}
  for id = 0, st.nsym - 1 do vocab[bpe.to_unicode(st.sym[id])] = id end
  for i, s in ipairs(specials) do vocab[s] = st.nsym + i - 1 end
  for i, m in ipairs(merges) do out_merges[i] = { bpe.to_unicode(st.sym[m[1]]), bpe.to_unicode(st.sym[m[2]]) } end
  return vocab, out_merges
end

-- train{ texts = {string, ...} | words = {pre-token bytes -> count}, vocab_size = n
--        (>= 256 + #specials), min_frequency = 2, specials = { "<|endoftext|>" },
--        progress = function(merges_done, vocab_now, count) or nil }
-- -> { vocab = {token (vocab.json form) -> id}, merges = {{left, right}, ...} (vocab.json
--      form), vocab_size, words (distinct pre-tokens), pretokens, seconds, stopped =
--      "vocab_size" | "min_frequency" }
function M.train(o)
  local t0 = os.clock()
  local specials, vocab_size, min_frequency = check_options(o)
  local words, pretokens = o.words, nil
  if not words then
    if type(o.texts) ~= "table" then error("bpe_train: texts must be a list of strings", 0) end
    words, pretokens = M.count_words(o.texts, specials)
  end
  local st = new_state(words)
  local heap, counts = st.heap, st.counts
  local merges, stopped = {}, "vocab_size"
  while st.nsym + #specials < vocab_size do
    if heap.n == 0 then stopped = "no pairs left"; break end
    local c, key = heap_pop(heap)
    local cur = counts[key] or 0
    if cur ~= c then
      if cur > 0 then heap_push(heap, cur, key) end
    else
      if c < 1 or c < min_frequency then stopped = "min_frequency"; break end
      local a = math.floor(key / K)
      local b = key - a * K
      local nid = symbol_for(st, a, b)
      merges[#merges + 1] = { a, b }
      local touched, tn = merge_pair(st, key, a, b, nid)
      -- pairs with the new symbol: their counts are final now (they only fall later).
      -- When the symbol existed already (reached by another pair), such a pair may be
      -- in the heap with a lower count: the entry pushed here supersedes it.
      for x = 1, tn do
        local k2 = touched[x]
        if counts[k2] > 0 then heap_push(heap, counts[k2], k2) end
      end
      if o.progress then o.progress(#merges, st.nsym + #specials, c) end
    end
  end
  local vocab, out_merges = vocab_form(st, merges, specials)
  return { vocab = vocab, merges = out_merges, vocab_size = st.nsym + #specials, specials = specials,
           words = st.nwords, pretokens = pretokens, seconds = os.clock() - t0, stopped = stopped }
end

-- JSON string: escapes only what JSON requires; other UTF-8 is written as is.
local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- write(dir, v): dir/vocab.json (one "token": id per line, ids ascending) and
-- dir/merges.txt ("#version: 0.2", then one "left right" per line). The directory must
-- exist. Raises (level 0) naming the file on a write error.
function M.write(dir, v)
  local ids = {}
  for tok, id in pairs(v.vocab) do ids[id + 1] = tok end
  local lines = {}
  for i, tok in ipairs(ids) do lines[i] = json_string(tok) .. ": " .. (i - 1) end
  local function put(path, text)
    local ok, err = durable.write_atomic(path, text)
    if not ok then error("bpe_train: " .. err, 0) end
  end
  put(dir .. "/vocab.json", "{\n" .. table.concat(lines, ",\n") .. "\n}\n")
  local m = { "#version: 0.2" }
  for i, mg in ipairs(v.merges) do m[i + 1] = mg[1] .. " " .. mg[2] end
  put(dir .. "/merges.txt", table.concat(m, "\n") .. "\n")
end

-- tokenizer(v) -> a ztrain.model.data.bpe tokenizer over the trained vocabulary
function M.tokenizer(v, name)
  return bpe.new { vocab = v.vocab, merges = v.merges, specials = v.specials, name = name or "bpe (trained)" }
end

return M
