-- ztrain.model.data.spm_bpe: the SentencePiece-style BPE of Hugging Face tokenizer.json
-- files (Llama 2, Mistral, TinyLlama: model BPE with byte_fallback), for hf_tokenizer,
-- which finds the added tokens and applies the normalizer first.
--
-- A word (the whole text between added tokens: these tokenizers have no splitting
-- pre-tokenizer) is encoded as tokenizers' BPE::merge_word does: its characters are
-- looked up in the vocabulary; a character that is not there becomes the tokens of its
-- bytes, "<0xE6>" ... (byte_fallback), or the unk token when one of those is missing too
-- (consecutive ones fused into one with fuse_unk); then merged by bpe.lua's merge loop
-- (lowest rank, leftmost; a heap for long runs). Bytes that are not valid UTF-8 are
-- characters of their own, so they take the byte tokens too. The whole text being one
-- word, it is cut first where no merge can cross (see `joins`: before each "▁" in real
-- SentencePiece vocabularies), and the runs' ids are cached: the same ids, in linear time.
-- The Metaspace pre-tokenizer without split (Mistral v0.3) replaces each space with
-- "▁" and prepends one ("always", or "first": to the word at the start of the text).
--
-- Decoding, as the decoders these files declare (Replace "▁" -> " ", ByteFallback, Fuse,
-- Strip; or Metaspace): the tokens' texts with "▁" as a space, the byte tokens as their
-- bytes (raw: where tokenizers writes U+FFFD for bytes that are not UTF-8), less one
-- leading space when the decoder strips it.
local ffi = require "ffi"
local bpe = require "ztrain.model.data.bpe"
local vocab_files = require "ztrain.model.data.bpe_vocab"

local M = {}

M.SPACE = "\226\150\129" -- U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space
local K = vocab_files.ID_LIMIT
local u8ptr = ffi.typeof("const uint8_t *")

local function is_set(v) return v ~= nil and type(v) ~= "userdata" end

-- applies(spec) -> true when spec's model is SentencePiece-style BPE (byte fallback, or
-- the Metaspace pre-tokenizer)
function M.applies(spec)
  local m, pre = spec.model, spec.pre_tokenizer
  return type(m) == "table" and (m.byte_fallback == true or (type(pre) == "table" and pre.type == "Metaspace"))
end

-- the pre_tokenizer: none, or Metaspace without split -> prepend scheme or false; or nil, message
local function metaspace_of(pre, where)
  if not is_set(pre) then return false end
  if pre.type ~= "Metaspace" then
    return nil, ("%s: pre-tokenizer %s with a SentencePiece-style BPE is not supported (none, or Metaspace)"):format(where, tostring(pre.type))
  end
  if pre.split == true then return nil, where .. ": Metaspace with split true is not supported (Mistral's has split false)" end
  if pre.replacement ~= nil and pre.replacement ~= M.SPACE then
    return nil, ("%s: Metaspace replacement %q is not supported (only \"\\u2581\")"):format(where, tostring(pre.replacement))
  end
  local scheme = pre.prepend_scheme or (pre.add_prefix_space == false and "never" or "always")
  if scheme ~= "always" and scheme ~= "first" and scheme ~= "never" then
    return nil, ("%s: Metaspace prepend_scheme %q is not known"):format(where, tostring(scheme))
  end
  return scheme
end

-- how many leading spaces the decoder strips (Strip's start; Metaspace's one), and
-- whether it turns byte tokens into bytes (ByteFallback)
local function decoder_of(dec)
  if not is_set(dec) then return 0, false end
  if dec.type == "Metaspace" then return dec.prepend_scheme == "never" and 0 or 1, false end
  if dec.type == "Strip" then return dec.content == " " and (dec.start or 0) or 0, false end
  if dec.type == "ByteFallback" then return 0, true end
  local n, bytes = 0, false
  if dec.type == "Sequence" then
    for _, d in ipairs(dec.decoders or {}) do
      local k, b = decoder_of(d)
      n, bytes = n + k, bytes or b
    end
  end
  return n, bytes
end

-- the code point of the UTF-8 character at q[i] (0-based, before n) and its length; an
-- invalid byte is a character of its own, code point -1 - byte
local function char_at(q, i, n)
  local c = q[i]
  if c < 0x80 then return c, 1 end
  local l = c < 0xC2 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or c < 0xF5 and 4 or 1
  if l == 1 or i + l > n then return -1 - c, 1 end
  local cp = c % (l == 2 and 32 or l == 3 and 16 or 8)
  for j = i + 1, i + l - 1 do
    local d = q[j]
    if d < 0x80 or d > 0xBF then return -1 - c, 1 end
    cp = cp * 64 + d % 64
  end
  return cp, l
end
local CP = 2097152 -- a pair of code points as one key: a * CP + b

local function char_len(s, i) -- bytes of the UTF-8 character at i (1 for an invalid byte)
  local c = s:byte(i)
  local l = c < 0xC2 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or c < 0xF5 and 4 or 1
  for j = i + 1, i + l - 1 do
    local d = s:byte(j)
    if not d or d < 0x80 or d > 0xBF then return 1 end
  end
  return l
end

-- merges -> rank_of, new_of (pair key -> rank, merged id), or nil, message
local function merge_tables(vocab, merges, path)
  local rank_of, new_of = {}, {}
  for r, mg in ipairs(merges) do
    local ia, ib, inew = vocab[mg[1]], vocab[mg[2]], vocab[mg[1] .. mg[2]]
    if not (ia and ib and inew) then
      local bad = (not ia and mg[1]) or (not ib and mg[2]) or (mg[1] .. mg[2])
      return nil, ("%s: model.merges[%d]: merge %s: the token %s is not in model.vocab")
        :format(path, r - 1, vocab_files.quote(mg[1] .. " " .. mg[2]), vocab_files.quote(bad))
    end
    rank_of[ia * K + ib], new_of[ia * K + ib] = r - 1, inew
  end
  return rank_of, new_of
end

-- Where a word may be cut: between two characters that are tokens themselves and that no
-- token holds side by side. No merge can join symbols across such a place, and merges on
-- one side never wait on the other, so the pieces' ids are the word's (real SentencePiece
-- vocabularies: a cut before each "▁"). -> joins (pairs of code points inside a token,
-- a * CP + b), single (code points that are one-character tokens)
local function cut_tables(vocab)
  local joins, single = {}, {}
  for tok in pairs(vocab) do
    local q, n, i, prev = ffi.cast(u8ptr, tok), #tok, 0, nil
    while i < n do
      local cp, l = char_at(q, i, n)
      if prev then joins[prev * CP + cp] = true end
      if l == n then single[cp] = true end
      prev, i = cp, i + l
    end
  end
  return joins, single
end

-- decode(ids, n), token_bytes(id) as the decoder says
local function decoding(spec, text_of, byte_id, path)
  local strip, byte_decoder = decoder_of(spec.decoder)
  local function token_bytes(id) -- a token's bytes: "▁" as a space, a byte token its byte
    local t = text_of[id]
    if t == nil then return nil end
    local hex = byte_decoder and t:match("^<0x(%x%x)>$")
    if hex and byte_id[tonumber(hex, 16)] == id then return string.char(tonumber(hex, 16)) end
    return (t:gsub(M.SPACE, " "))
  end
  local function decode(ids, n)
    local parts = {}
    local function add(id, at)
      local t = token_bytes(id)
      if t == nil then error(("hf_tokenizer.decode: id %s at %s is not in the vocabulary (%s)"):format(tostring(id), at, path), 0) end
      parts[#parts + 1] = t
    end
    if type(ids) == "table" then
      for i = 1, n or #ids do add(ids[i], "position " .. i) end
    else
      for i = 0, n - 1 do add(tonumber(ids[i]), "index " .. i) end
    end
    local out = table.concat(parts)
    for _ = 1, strip do
      if out:sub(1, 1) ~= " " then break end
      out = out:sub(2)
    end
    return out
  end
  return decode, token_bytes
end

-- build(spec, path, added_text, merges) -> { word = function(p, a, b, first) -> list of ids,
-- decode = function(ids, n), token_bytes = function(id), vocab_size }, or nil, message.
-- added_text: {[id] = content} of the added tokens; merges: { {left, right}, ... } in rank order.
function M.build(spec, path, added_text, merges)
  local m = spec.model
  local scheme, err = metaspace_of(spec.pre_tokenizer, path .. ": pre_tokenizer")
  if scheme == nil then return nil, err end
  local vocab, text_of, max_id = m.vocab, {}, -1
  for tok, id in pairs(vocab) do
    text_of[id] = tok
    if id > max_id then max_id = id end
  end
  local byte_id, fallback = {}, m.byte_fallback == true
  for b = 0, 255 do byte_id[b] = vocab[("<0x%02X>"):format(b)] end
  local unk = is_set(m.unk_token) and vocab[m.unk_token] or nil
  local fuse = m.fuse_unk == true
  local rank_of, new_of = merge_tables(vocab, merges, path)
  if not rank_of then return nil, new_of end
  for id, t in pairs(added_text) do
    text_of[id] = t
    if id > max_id then max_id = id end
  end

  -- ids of a run of text that no merge crosses out of (its characters looked up, then merged)
  local function chunk_ids(s)
    local syms, n, i, len, last_unk = {}, 0, 1, #s, false
    while i <= len do
      local l = char_len(s, i)
      local id = vocab[s:sub(i, i + l - 1)]
      if id then
        n = n + 1; syms[n] = id; last_unk = false
      else
        local all = fallback
        for j = i, i + l - 1 do if not byte_id[s:byte(j)] then all = false end end
        if all then
          for j = i, i + l - 1 do n = n + 1; syms[n] = byte_id[s:byte(j)] end
          last_unk = false
        elseif unk and not (fuse and last_unk) then
          n = n + 1; syms[n] = unk; last_unk = true
        end
      end
      i = i + l
    end
    n = (n >= bpe.HEAP_MIN and bpe.merge_heap or bpe.merge_scan)(syms, n, rank_of, new_of)
    return syms
  end

  local joins, single = cut_tables(vocab)
  local cache, cached = {}, 0
  local function word(p, a, b, first) -- a word cut where no merge crosses; the pieces cached
    local s = ffi.string(p + a, b - a)
    if scheme then
      s = s:gsub(" ", M.SPACE)
      if (scheme == "always" or (scheme == "first" and first)) and s:sub(1, 3) ~= M.SPACE then s = M.SPACE .. s end
    end
    local out, start, i, len, prev = {}, 1, 0, #s, nil
    local q = ffi.cast(u8ptr, s) -- `s` stays alive for this call
    local function flush(stop)
      local c = s:sub(start, stop)
      local v = cache[c]
      if v == nil then
        v = chunk_ids(c)
        if cached >= bpe.CACHE_MAX then cache, cached = {}, 0 end
        cache[c], cached = v, cached + 1
      end
      for k = 1, #v do out[#out + 1] = v[k] end
    end
    while i < len do -- 0-based here
      local cp, l = char_at(q, i, len)
      if prev and single[prev] and single[cp] and not joins[prev * CP + cp] then flush(i); start = i + 1 end
      prev, i = cp, i + l
    end
    if len > 0 then flush(len) end
    return out
  end

  local decode, token_bytes = decoding(spec, text_of, byte_id, path)
  return { word = word, decode = decode, token_bytes = token_bytes, vocab_size = max_id + 1 }
end

return M
