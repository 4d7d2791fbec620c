-- ztrain.model.data.hf_tokenizer: Hugging Face `tokenizer.json` BPE tokenizers, byte-level
-- (Llama 3, Qwen 2.5, SmolLM, GPT-2 saved by `tokenizers`) and SentencePiece-style with
-- byte_fallback (Llama 2, Mistral, TinyLlama: ztrain.model.data.spm_bpe), encoding to the ids that
-- Hugging Face's `tokenizers` gives with add_special_tokens=False (the post_processor,
-- which would put <|begin_of_text|> first, is not applied: ztrain's data adds no tokens;
-- tok.bos is the id its template puts first, for whoever wants it: a prompt, a document).
--
--   local hft = require "ztrain.model.data.hf_tokenizer"
--   local tok, err = hft.load("DIR/tokenizer.json")  -- nil, message on a file it cannot use
--   local ids, n = tok.encode("<|im_start|>héllo")    -- int32_t[n] (0-based), n
--   local s = tok.decode(ids, n)                       -- "<|im_start|>héllo"
--
-- Encoding, as `tokenizers` does it:
--  1. The added tokens (added_tokens: special or not) with normalized false are found in
--     the text, leftmost first, the longest at one place; each becomes its id. Their
--     flags as tokenizers' AddedVocabulary: single_word (a match with a word character
--     just before or after it is passed over), lstrip / rstrip (the match takes in the
--     whitespace before / after it).
--  2. The normalizer (none; NFC: Qwen 2.5, ztrain.model.data.unorm; Prepend and Replace
--     of a String: Llama 2's "▁") is applied to each piece between them; then the added tokens with normalized true are found in
--     the normalized pieces (as normalized themselves).
--  3. Pre-tokenization: the pre_tokenizer's splitting steps in order, each splitting every
--     piece of the one before (behaviour Isolated: matches and the gaps between them are
--     pieces): Split with a Regex (Llama 3's and Qwen's patterns) or a String, ByteLevel
--     with use_regex (GPT-2's pattern, bpe.PATTERN), Digits (\p{N} or \p{N}+). Patterns
--     go through PCRE2 as bpe.lua's does (\s as \p{White_Space}; see bpe.PCRE2_PATTERN);
--     invalid UTF-8 (which `tokenizers` never sees) is split as bpe.lua splits it.
--     SentencePiece-style: no splitting (the Metaspace pre-tokenizer without split, or
--     none); each piece is one word for spm_bpe, which ends here.
--  4. Each pre-token: with model.ignore_merges (Llama 3), a pre-token that is itself in
--     the vocabulary is that one id; otherwise BPE with the merges (both the "a b" and the
--     ["a", "b"] forms), by bpe.lua's merge loop and its per-pre-token cache.
-- Decoding: each id's bytes (byte-level symbols back to bytes; an added token is its
-- text), concatenated; nothing is skipped. decode(encode(s)) == s when the normalizer
-- leaves s alone (no normalizer, or s in NFC) and no added token strips whitespace,
-- valid UTF-8 or not (SentencePiece-style: see spm_bpe).
--
-- Refused, with a message naming the field (load returns nil, message): a model other
-- than BPE (Unigram: T5, ALBERT; WordPiece, WordLevel), a byte-level pre_tokenizer
-- without ByteLevel, ByteLevel add_prefix_space, Split behaviours other than Isolated
-- or inverted, Metaspace with split or another replacement, dropout, subword
-- prefixes/suffixes, normalizers other than NFC, Prepend, Replace of a String.
local ffi = require "ffi"
local cjson = require "cjson"
local bpe = require "ztrain.model.data.bpe"
local pcre2 = require "ztrain.model.data.pcre2"
local unorm = require "ztrain.model.data.unorm"
local spm = require "ztrain.model.data.spm_bpe"

local M = {}

M.EOT_NAMES = { "<|endoftext|>", "<|end_of_text|>", "</s>" } -- the first one present is tok.eot
M.CACHE_MAX = bpe.CACHE_MAX
local SUPPORTED = "ztrain reads byte-level BPE (Llama 3, Qwen 2.5, SmolLM, GPT-2) and SentencePiece-style " ..
  "BPE with byte_fallback (Llama 2, Mistral, TinyLlama)"

local i32arr = ffi.typeof("int32_t[?]")
local u8ptr = ffi.typeof("const uint8_t *")
local null = cjson.null

local function is_set(v) return v ~= nil and v ~= null end

-- a pattern in Oniguruma's syntax (tokenizers) for PCRE2: \s and \S as White_Space (see
-- bpe.PCRE2_PATTERN); other escapes as they are
local function to_pcre2(re)
  return (re:gsub("\\(.)", function(c)
    if c == "s" then return "\\p{White_Space}" elseif c == "S" then return "\\P{White_Space}" end
    return "\\" .. c
  end))
end

local regexes = {} -- pattern -> compiled, per Lua state
local function compile(pattern)
  if regexes[pattern] then return regexes[pattern] end
  local opts = { utf = true, ucp = true, invalid_utf = true }
  local ok, re = pcall(pcre2.compile, to_pcre2(pattern), opts)
  if not ok then ok, re = pcall(pcre2.compile, pattern, opts) end
  if not ok then return nil, re end
  if re:find("", 0, 0) then return nil, "it matches the empty string" end
  regexes[pattern] = re
  return re
end

-- the splitting steps of a pre_tokenizer (appended to `steps`); st.byte_level set when
-- a ByteLevel step is there. -> true or nil, message
local function pre_steps(pre, where, steps, st)
  local t = type(pre) == "table" and pre.type
  local function add(pattern)
    local re, err = compile(pattern)
    if not re then return nil, ("%s: pattern %q: %s"):format(where, pattern, tostring(err)) end
    steps[#steps + 1] = re
    return true
  end
  if t == "Sequence" then
    for i, p in ipairs(pre.pretokenizers or {}) do
      local ok, err = pre_steps(p, ("%s.pretokenizers[%d]"):format(where, i - 1), steps, st)
      if not ok then return nil, err end
    end
    return true
  elseif t == "Split" then
    if pre.behavior ~= "Isolated" or pre.invert == true then
      return nil, ("%s: Split with behavior %s%s; only Isolated, not inverted, is supported")
        :format(where, tostring(pre.behavior), pre.invert == true and ", inverted" or "")
    end
    local pat = type(pre.pattern) == "table" and pre.pattern or {}
    if type(pat.Regex) == "string" then return add(pat.Regex) end
    if type(pat.String) == "string" then return add("\\Q" .. pat.String:gsub("\\E", "\\E\\\\E\\Q") .. "\\E") end
    return nil, where .. ": Split without a Regex or String pattern"
  elseif t == "ByteLevel" then
    if pre.add_prefix_space == true then
      return nil, where .. ": ByteLevel with add_prefix_space true is not supported (Llama 3, Qwen 2.5 and GPT-2 set it false)"
    end
    st.byte_level = true
    if pre.use_regex ~= false then return add(bpe.PATTERN) end
    return true
  elseif t == "Digits" then
    return add(pre.individual_digits == true and "\\p{N}" or "\\p{N}+")
  end
  return nil, ("%s: pre-tokenizer %s is not supported (known: Sequence, Split, ByteLevel, Digits)"):format(where, tostring(t))
end

-- normalizer -> function(s) -> s, or false for none; or nil, message. NFC; and
-- SentencePiece's Prepend and Replace of a String (Llama 2: "▁" first, spaces as "▁")
local function normalizer_of(n, where)
  if not is_set(n) then return false end
  local list = n.type == "Sequence" and (n.normalizers or {}) or { n }
  local fns = {}
  for i, x in ipairs(list) do
    local w = n.type == "Sequence" and ("%s.normalizers[%d]"):format(where, i - 1) or where
    local t = type(x) == "table" and x.type
    if t == "NFC" then
      local ok, err = unorm.available()
      if not ok then return nil, w .. ": NFC: " .. err end
      fns[#fns + 1] = unorm.nfc
    elseif t == "Prepend" and type(x.prepend) == "string" then
      fns[#fns + 1] = function(s) return s ~= "" and x.prepend .. s or s end
    elseif t == "Replace" and type(x.pattern) == "table" and type(x.pattern.String) == "string" and x.pattern.String ~= ""
        and type(x.content) == "string" then
      local from, to = x.pattern.String:gsub("%p", "%%%0"), x.content:gsub("%%", "%%%%")
      fns[#fns + 1] = function(s) return (s:gsub(from, to)) end
    else
      return nil, ("%s: normalizer %s is not supported (ztrain applies NFC, Prepend, Replace of a String, or none)")
        :format(w, tostring(t))
    end
  end
  if #fns == 0 then return false end
  if #fns == 1 then return fns[1] end
  return function(s)
    for _, f in ipairs(fns) do s = f(s) end
    return s
  end
end

-- the added tokens' flags, as tokenizers' AddedVocabulary::find_matches: single_word
-- (no word character just before or after: Rust regex's \w), lstrip and rstrip (the
-- match takes in the whitespace before / after it)
local flag_res
local function flag_regexes()
  if not flag_res then
    flag_res = { space = compile("\\G\\p{White_Space}"), spaces = compile("\\G\\p{White_Space}+"),
                 word = compile("\\G[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]") }
  end
  return flag_res
end

local function char_before(s, i) -- 0-based start of the character that ends at byte i
  local j = i - 1
  while j > 0 and s:byte(j + 1) >= 0x80 and s:byte(j + 1) < 0xC0 do j = j - 1 end
  return j
end

-- apply t's flags to the match [x, stop) of s[.., lim) after the previous one ended at
-- pos: -> start, stop, or nil when single_word discards it
local function flagged(t, s, pos, x, stop, lim)
  local re = flag_regexes()
  if t.single_word then
    if x > 0 and re.word:find(s, x, char_before(s, x)) then return nil end
    if stop < lim and re.word:find(s, lim, stop) then return nil end
  end
  if t.lstrip then
    while x > pos do
      local c = char_before(s, x)
      if not re.space:find(s, x, c) then break end
      x = c
    end
  end
  if t.rstrip then
    local _, e = re.spaces:find(s, lim, stop)
    if e then stop = e end
  end
  return x, stop
end

-- a matcher of a list of added tokens { {match, id, flags}, ... }: match(s, pos, lim) ->
-- 0-based start, exclusive end and id of the leftmost (then longest) one in s[pos, lim)
local function matcher(list)
  if #list == 0 then return nil end
  local root, firsts, seen = {}, {}, {}
  for _, t in ipairs(list) do
    local node = root
    for i = 1, #t.match do
      local b = t.match:byte(i)
      node[b] = node[b] or {}
      node = node[b]
    end
    node.tok = t
    local c = t.match:sub(1, 1)
    if not seen[c] then -- each first byte once: the class is tested at every byte of the text
      seen[c] = true
      firsts[#firsts + 1] = c == "\0" and "%z" or (c:match("%w") and c or "%" .. c)
    end
  end
  local class = "[" .. table.concat(firsts) .. "]"
  return function(s, pos, lim)
    local from = pos
    while true do
      local x = s:find(class, from + 1)
      if not x or x > lim then return nil end
      local node, tok, stop = root, nil, nil
      for i = x, lim do
        node = node[s:byte(i)]
        if not node then break end
        if node.tok then tok, stop = node.tok, i end
      end
      if tok then
        if not tok.flags then return x - 1, stop, tok.id end
        local a, b = flagged(tok, s, pos, x - 1, stop, lim)
        if a then return a, b, tok.id end
        from = stop -- discarded (single_word): the search goes on after it
      else
        from = x
      end
    end
  end
end

-- model.merges -> { {left, right, number}, ... } or nil, message
local function merges_of(list, where)
  local out = {}
  for i, m in ipairs(list) do
    local a, b
    if type(m) == "string" then a, b = m:match("^([^ ]+) ([^ ]+)$")
    elseif type(m) == "table" and #m == 2 and type(m[1]) == "string" and type(m[2]) == "string" then a, b = m[1], m[2] end
    if not a then
      return nil, ("%s[%d]: malformed merge %s: expected \"a b\" or [\"a\", \"b\"]"):format(where, i - 1, cjson.encode(m))
    end
    out[i] = { a, b, i - 1 }
  end
  return out
end

-- check(spec, path) -> the model's fields checked, or nil, message (what is refused)
local function check_model(m, path)
  if type(m) ~= "table" then return nil, path .. ": no model (a Hugging Face tokenizer.json has model, pre_tokenizer, added_tokens)" end
  local kind = m.type or (m.merges and "BPE")
  if kind ~= "BPE" then
    return nil, ("%s: model.type is %s; ztrain reads byte-level BPE only (%s)"):format(path, tostring(kind),
      kind == "Unigram" and "Unigram is SentencePiece's model: T5, ALBERT, XLNet" or "Llama 3, Qwen 2.5, SmolLM, GPT-2")
  end
  if is_set(m.dropout) and m.dropout ~= 0 then return nil, path .. ": model.dropout is set (BPE dropout is for training the tokenizer); save it with dropout null" end
  for _, f in ipairs({ "continuing_subword_prefix", "end_of_word_suffix" }) do
    if is_set(m[f]) and m[f] ~= "" then return nil, ("%s: model.%s %q is not supported (byte-level BPE has none)"):format(path, f, m[f]) end
  end
  if type(m.vocab) ~= "table" or type(m.merges) ~= "table" then return nil, path .. ": model.vocab or model.merges is missing" end
  return true
end

-- added_tokens -> raw list, normalized list, {[id] = content}, or nil, message
local function added_of(list, path)
  local raw, norm, bytes = {}, {}, {}
  for i, t in ipairs(is_set(list) and list or {}) do
    local where = ("%s: added_tokens[%d]"):format(path, i - 1)
    if type(t) ~= "table" or type(t.content) ~= "string" or type(t.id) ~= "number" then
      return nil, where .. ": expected {id, content, ...}"
    end
    if t.content ~= "" then
      local into = t.normalized == true and norm or raw
      local lstrip, rstrip, single_word = t.lstrip == true, t.rstrip == true, t.single_word == true
      into[#into + 1] = { content = t.content, match = t.content, id = t.id, special = t.special == true,
                          lstrip = lstrip, rstrip = rstrip, single_word = single_word,
                          flags = lstrip or rstrip or single_word }
      bytes[t.id] = t.content
    end
  end
  return raw, norm, bytes
end

-- the id the post_processor's template puts first (Llama 3: <|begin_of_text|>; Llama 2,
-- Mistral: <s>), or nil
local function bos_of(pp)
  if type(pp) ~= "table" then return nil end
  if pp.type == "Sequence" then
    for _, x in ipairs(pp.processors or {}) do
      local b = bos_of(x)
      if b then return b end
    end
    return nil
  end
  if pp.type ~= "TemplateProcessing" or type(pp.single) ~= "table" then return nil end
  local st = type(pp.single[1]) == "table" and pp.single[1].SpecialToken
  local entry = type(st) == "table" and type(pp.special_tokens) == "table" and pp.special_tokens[st.id]
  return type(entry) == "table" and type(entry.ids) == "table" and #entry.ids == 1 and entry.ids[1] or nil
end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, ("%s: cannot read: %s"):format(path, tostring(err)) end
  local text = f:read("*a")
  f:close()
  local ok, spec = pcall(cjson.new().decode, text)
  if not ok or type(spec) ~= "table" then
    return nil, ("%s: not a JSON object (%s); a Hugging Face tokenizer.json is one"):format(path, tostring(spec))
  end
  return spec
end

---------------------------------------------------------------------------
-- Encoding

-- encode(self, s) -> int32_t[n] of ids (0-based), n
local function encode(self, s)
  if type(s) ~= "string" then error("hf_tokenizer.encode: expected a string, got " .. type(s), 0) end
  local cap, k = math.floor(#s / 2) + 64, 0
  local out = i32arr(cap)
  local function push(id)
    if k >= cap then
      cap = 2 * cap
      local bigger = i32arr(cap)
      ffi.copy(bigger, out, k * 4)
      out = bigger
    end
    out[k] = id; k = k + 1
  end
  local core, cache, whole = self._core, self._cache, self._ignore_merges and self._raw_vocab
  local steps, nsteps = self._steps, #self._steps
  local p, at0 -- the buffer of the normalized piece being pre-tokenized; it starts the text
  local word = self._word -- SentencePiece-style BPE (spm_bpe): a whole piece, not cached
  local function piece(a, b) -- one pre-token: its ids (cached)
    if word then
      local v = word(p, a, b, at0 and a == 0)
      for i = 1, #v do push(v[i]) end
      return
    end
    local key = ffi.string(p + a, b - a)
    local v = cache[key]
    if v == nil then
      v = whole and whole[key] or core:_bpe(p, a, b)
      if self._cached >= M.CACHE_MAX then cache = {}; self._cache = cache; self._cached = 0 end
      cache[key] = v
      self._cached = self._cached + 1
    end
    if type(v) == "number" then push(v) else for i = 1, #v do push(v[i]) end end
  end
  local function split(level, a, b) -- step `level` over p[a, b), then the next steps
    if level > nsteps then return piece(a, b) end
    local re, pos = steps[level], a
    while pos < b do
      local ms, me = re:find(p, b, pos)
      if not ms then split(level + 1, pos, b); return end
      if me == ms then error(("hf_tokenizer: the pattern %q matched the empty string at byte %d (%s)"):format(re.pattern, ms, self.name), 0) end
      if ms > pos then split(level + 1, pos, ms) end
      split(level + 1, ms, me)
      pos = me
    end
  end
  local nmatch, normalize = self._norm_match, self._normalize
  local function part(t, first) -- text between the raw added tokens, normalized
    at0 = first
    if normalize then t = normalize(t) end
    p = ffi.cast(u8ptr, t) -- `t` stays alive for this call
    local pos, n = 0, #t
    while pos < n do
      local sa, sb, id
      if nmatch then sa, sb, id = nmatch(t, pos, n) end
      if not sa then split(1, pos, n); break end
      if sa > pos then split(1, pos, sa) end
      push(id); pos = sb; at0 = false
    end
  end
  local rmatch, pos, n = self._raw_match, 0, #s
  while pos < n do
    local sa, sb, id
    if rmatch then sa, sb, id = rmatch(s, pos, n) end
    if not sa then part(pos == 0 and s or s:sub(pos + 1), pos == 0); break end
    if sa > pos then part(s:sub(pos + 1, sa), pos == 0) end
    push(id); pos = sb
  end
  local res = i32arr(k)
  ffi.copy(res, out, k * 4)
  return res, k
end

-- load(path, opts) -> tokenizer { name, vocab_size, eot, bos, encode, decode, token_bytes,
-- specials, added, path, dir }, or nil, message naming the file and the field.
-- opts.name: its name in reports (default "hf:" .. its directory).
function M.load(path, opts)
  local spec, err = read_json(path)
  if not spec then return nil, err end
  return M.from_spec(spec, path, opts)
end
M.read = read_json -- read(path) -> the decoded JSON, or nil, message

-- gpt2_like(spec) -> true when the tokenizer.json describes GPT-2's own pipeline (no
-- normalizer, ByteLevel with GPT-2's pattern and no prefix space, BPE without
-- ignore_merges, no added token but <|endoftext|>): the vocab.json + merges.txt beside
-- it, read by bpe.lua, give the same ids
function M.gpt2_like(spec)
  local pre, m = spec.pre_tokenizer, spec.model
  if is_set(spec.normalizer) or type(pre) ~= "table" or type(m) ~= "table" then return false end
  if pre.type ~= "ByteLevel" or pre.use_regex == false or pre.add_prefix_space == true then return false end
  if m.type ~= "BPE" or m.ignore_merges == true or m.byte_fallback == true then return false end
  for _, t in ipairs(is_set(spec.added_tokens) and spec.added_tokens or {}) do
    if t.content ~= bpe.EOT then return false end
  end
  return true
end

-- from_spec(spec, path, opts): load's work on the decoded JSON (path names it in messages)
function M.from_spec(spec, path, opts)
  opts = opts or {}
  local ok, merr = check_model(spec.model, path)
  if not ok then return nil, merr end
  local steps, st, sentencepiece = {}, {}, spm.applies(spec)
  if not sentencepiece then
    if not is_set(spec.pre_tokenizer) then return nil, path .. ": no pre_tokenizer; " .. SUPPORTED end
    ok, merr = pre_steps(spec.pre_tokenizer, path .. ": pre_tokenizer", steps, st)
    if not ok then return nil, merr end
    if not st.byte_level then return nil, path .. ": the pre_tokenizer has no ByteLevel step and the model no byte_fallback; " .. SUPPORTED end
  end
  local normalize, nerr = normalizer_of(spec.normalizer, path .. ": normalizer")
  if normalize == nil then return nil, nerr end
  local raw, norm, added_bytes = added_of(spec.added_tokens, path)
  if not raw then return nil, norm end
  for _, t in ipairs(norm) do -- matched in the normalized text as normalized (AddedVocabulary)
    if normalize then t.match = normalize(t.content) end
  end
  local merges, gerr = merges_of(spec.model.merges, path .. ": model.merges")
  if not merges then return nil, gerr end
  local dir = path:match("^(.*)/[^/]*$") or "."
  local name = opts.name or ("hf:" .. dir)
  local core, cerr
  if sentencepiece then
    core, cerr = spm.build(spec, path, added_bytes, merges)
    if not core then return nil, cerr end
  else
    local cok, c = pcall(bpe.new, { vocab = spec.model.vocab, merges = merges, specials = {}, name = name,
      extra_bytes = added_bytes, vocab_path = path .. " (model.vocab)", merges_path = path .. " (model.merges)" })
    if not cok then return nil, tostring(c) end
    core = c
  end
  local self = { name = name, vocab_size = core.vocab_size, path = path, dir = dir, decode = core.decode,
                 _core = core, _steps = steps, _normalize = normalize, _cache = {}, _cached = 0, _word = sentencepiece and core.word or nil,
                 _raw_match = matcher(raw), _norm_match = matcher(norm), _ignore_merges = spec.model.ignore_merges == true }
  self.specials, self.added = {}, {}
  for _, list in ipairs({ raw, norm }) do
    for _, t in ipairs(list) do
      self.added[t.content] = t.id
      if t.special then self.specials[#self.specials + 1] = t.content end
    end
  end
  for _, e in ipairs(M.EOT_NAMES) do
    local id = self.added[e] or spec.model.vocab[e]
    if id then self.eot = id; break end
  end
  self.bos = bos_of(spec.post_processor)
  if self._ignore_merges then
    local whole = {}
    for tok, id in pairs(spec.model.vocab) do
      local b = bpe.from_unicode(tok)
      if b then whole[b] = id end
    end
    self._raw_vocab = whole
  end
  self.encode = function(a, ...) if a == self then return encode(self, ...) end return encode(self, a, ...) end
  self.token_bytes = function(a, id)
    if a ~= self then id = a end
    if sentencepiece then return core.token_bytes(id) end
    return core:token_bytes(id)
  end
  return self
end

return M
