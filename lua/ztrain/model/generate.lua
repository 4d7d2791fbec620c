-- ztrain.model.generate: text generation from a GPT-2 model with a KV cache.
--
--   local gen = require "ztrain.model.generate"
--   local ids, text = gen.generate(model, "The history of", { tokenizer = tok,
--                                  max_tokens = 40, temperature = 0.8, top_k = 40, seed = 1 })
--
-- A session keeps, per block, the keys and values of every position fed so
-- far (kcache, vcache: (1, NH, cap, hs) on the model's tier). Feeding n new
-- tokens runs them through the model as the training forward does (the same
-- ops on n rows: layernorm, c_attn, attention, c_proj, residual, MLP), except
-- that attention is zt_attention_decode over the cache: the prompt goes in
-- as one n-row prefill, then each generated token as one row, whose
-- attention costs O(t) for t cached positions -- never a forward over the
-- whole sequence again. The logits are computed for the last row only
-- (ln_f, then one row times wte^T).
--
-- Bits: the prefill's hidden states are those of the training forward over
-- the prompt, bit for bit (same kernels, same shapes; the cached attention
-- rows have the forward's bits, see kernels.h). A one-row step's GEMMs are
-- not: OpenBLAS's sgemm takes another kernel for a call of a few rows, so a
-- row's dot products round differently from the same row inside a many-row
-- call (measured: a few ulp). The step logits equal the full forward's
-- within fp32 rounding (spec/unit/generate_spec.lua bounds the gap).
--
-- Sampling (pick): temperature 0 is greedy, the argmax with ties to the
-- lowest id. Otherwise p ~ exp(logit / temperature), restricted to the top_k
-- largest logits (top_k = 0: all), then to the nucleus: the fewest of those,
-- best first, whose probability (renormalised over the top_k set) reaches
-- top_p. Candidates are ranked by logit, ties to the lower id, so top_k = 1
-- and a tiny top_p are greedy. One draw of a splitmix64 stream seeded by
-- `seed` per token: a seed reproduces a sample.
local ffi = require "ffi"
local bit = require "bit"
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local zffi = require "ztrain.core.ffi"
local data = require "ztrain.model.data"
local Acts = require "ztrain.model.activations"

local M = {}

local function uerr(msg, ...) error(msg:format(...), 0) end

---------------------------------------------------------------------------
-- Session: one sequence, fed a chunk of tokens at a time.

local Session = {}
Session.__index = Session
M.Session = Session

-- Unit u's parameters must all be in place (a sharded strategy keeps only
-- shards: gather them first).
local function check_model(model)
  if type(model) ~= "table" or type(model.units) ~= "table" or not model.cfg then
    uerr("generate: expected a ztrain.model.gpt2 model, got %s", type(model))
  end
  for _, u in ipairs(model.units) do
    if not u.p then
      uerr("generate: unit %s of the model has no parameters in place (a sharded strategy " ..
           "holds only its shard); generate from a model with every unit's full parameters", u.name)
    end
  end
end

-- session(model, cap) -> s: room for `cap` positions (<= the model's maxT).
function M.session(model, cap)
  check_model(model)
  local cfg = model.cfg
  cap = cap or cfg.maxT
  if type(cap) ~= "number" or cap < 1 or cap % 1 ~= 0 or cap > cfg.maxT then
    uerr("generate: cache capacity %s must be a whole number in [1, %d] (the model's context)",
         tostring(cap), cfg.maxT)
  end
  local s = setmetatable({ model = model, cfg = cfg, cap = cap, pos = 0, tier = model.tier,
                           kc = {}, vc = {} }, Session)
  local hs, kvh = cfg.C / cfg.NH, cfg.NKV or cfg.NH      -- key/value heads (Llama's GQA)
  local ok, err = pcall(function()
    -- one slab for every block's caches (category activations: what a
    -- forward keeps), views per block
    local per = kvh * cap * hs
    s.cache = T.new({ 2 * cfg.L * per }, { tier = s.tier, category = "activations" })
    for l = 1, cfg.L do
      s.kc[l] = s.cache:view((2 * l - 2) * per, { 1, kvh, cap, hs })
      s.vc[l] = s.cache:view((2 * l - 1) * per, { 1, kvh, cap, hs })
    end
    s.lnf = T.new({ 1, cfg.C }, { tier = s.tier, category = "activations" })
    s.lnf_stats = T.new({ 2 }, { tier = s.tier, category = "activations" })
    s.lnf_mean, s.lnf_rstd = s.lnf_stats:view(0, { 1 }), s.lnf_stats:view(1, { 1 })
    s.logits = T.new({ 1, cfg.V }, { tier = s.tier, category = "activations" })
    s.host_logits = ffi.new("float[?]", cfg.V)
  end)
  if not ok then s:free(); error(err, 0) end
  return s
end

-- Work buffers for a chunk of n rows: the one-row set of decode steps is
-- kept; a prefill's set is freed once it has run. Widths as the training
-- activations' (Acts.widths: GPT-2's qkv 3C, MLP 4C; a Llama's its own,
-- fch then holding [gate | up] and fch_gelu the SwiGLU's out).
local ROWS = { { "x", "C" }, { "y", "C" }, { "ln", "C" }, { "qkv", "qkv" }, { "atty", "C" },
               { "proj", "C" }, { "resid2", "C" }, { "fch", "ffn_in" }, { "fch_gelu", "ffn" } }

local function free_work(w)
  for _, v in ipairs(w.views) do v:free() end
  if w.slab then w.slab:free() end
  if w.tokens then w.tokens:free() end
end

local function new_work(tier, cfg, n)
  local C, W = cfg.C, Acts.widths(cfg)
  local total = 2 * n + 16
  for _, r in ipairs(ROWS) do total = total + math.ceil(n * W[r[2]] / 16) * 16 end
  local w = { n = n, views = {} }
  local ok, err = pcall(function()
    w.slab = T.new({ total }, { tier = tier, category = "activations" })
    local off = 0
    local function add(key, shape, k)
      local v = w.slab:view(off, shape)
      w[key], w.views[#w.views + 1] = v, v
      off = off + math.ceil(k / 16) * 16
    end
    for _, r in ipairs(ROWS) do add(r[1], { 1, n, W[r[2]] }, n * W[r[2]]) end
    add("mean", { n }, n); add("rstd", { n }, n)
    -- the last row of x and of y: the blocks' output ends in one of them
    w.last = { [w.x] = w.x:view((n - 1) * C, { 1, C }), [w.y] = w.y:view((n - 1) * C, { 1, C }) }
    for _, v in pairs(w.last) do w.views[#w.views + 1] = v end
    w.tokens = T.new({ 1, n }, { dtype = "i32", tier = tier, category = "activations" })
  end)
  if not ok then free_work(w); error(err, 0) end
  return w
end

-- The model over the n tokens in w.tokens at positions [pos, pos+n).
function Session:run(w, n)
  local cfg, model = self.cfg, self.model
  if model.decode_run then return model:decode_run(self, w, n) end     -- the Llama family's blocks
  -- embedding: wpe from row pos on
  local embed = model.embed
  local wpe = embed.p.wpe:view(self.pos * cfg.C, { cfg.maxT - self.pos, cfg.C })
  local ok, err = pcall(ops.encoder_forward, w.x, w.tokens, embed.p.wte, wpe)
  wpe:free()
  if not ok then error(err, 0) end
  local x, y = w.x, w.y
  for l = 1, cfg.L do
    local u = model.units[1 + l]
    local P, pre = u.p, "h." .. u.layer .. "."
    ops.layernorm_forward(w.ln, w.mean, w.rstd, x, P[pre .. "ln_1.weight"], P[pre .. "ln_1.bias"])
    ops.matmul_forward(w.qkv, w.ln, P[pre .. "attn.c_attn.weight"], P[pre .. "attn.c_attn.bias"])
    ops.attention_decode(w.atty, self.kc[l], self.vc[l], w.qkv, cfg.NH, self.pos)
    ops.matmul_forward(w.proj, w.atty, P[pre .. "attn.c_proj.weight"], P[pre .. "attn.c_proj.bias"])
    ops.add3(w.resid2, x, w.proj)
    ops.layernorm_forward(w.ln, w.mean, w.rstd, w.resid2, P[pre .. "ln_2.weight"], P[pre .. "ln_2.bias"])
    ops.matmul_forward(w.fch, w.ln, P[pre .. "mlp.c_fc.weight"], P[pre .. "mlp.c_fc.bias"])
    ops.gelu_forward(w.fch_gelu, w.fch)
    ops.matmul_forward(w.proj, w.fch_gelu, P[pre .. "mlp.c_proj.weight"], P[pre .. "mlp.c_proj.bias"])
    ops.add3(y, w.resid2, w.proj)
    x, y = y, x
  end
  -- x holds the output; its last row through ln_f and the tied head
  local hp = model.head.p
  ops.layernorm_forward(self.lnf, self.lnf_mean, self.lnf_rstd, w.last[x], hp["ln_f.weight"], hp["ln_f.bias"])
  ops.matmul_forward(self.logits, self.lnf, embed.p.wte, nil)
end

-- feed(ids[, n]) -> the logits (1, V) tensor of the last fed position.
-- ids: a Lua list (1-based) of token ids, or an int32 cdata array with n.
-- Positions [pos, pos + n) are added to the cache. Checked before anything
-- runs; after a failure the session stays at its position.
function Session:feed(ids, n)
  local cfg = self.cfg
  if type(ids) == "table" then n = n or #ids end
  if type(n) ~= "number" or n < 1 then uerr("generate: nothing to feed (no token ids)") end
  if self.pos + n > self.cap then
    uerr("generate: %d more token(s) at position %d exceed the cache's %d positions (the model's " ..
         "context is %d)", n, self.pos, self.cap, cfg.maxT)
  end
  local ht = ffi.new("int32_t[?]", n)
  for i = 0, n - 1 do
    local id = type(ids) == "table" and ids[i + 1] or ids[i]
    id = tonumber(id)
    if id == nil or id % 1 ~= 0 or id < 0 or id >= cfg.V then
      uerr("generate: token id %s (position %d) is outside the model's vocabulary [0, %d)",
           tostring(id), self.pos + i, cfg.V)
    end
    ht[i] = id
  end
  local w = n == 1 and self.step or new_work(self.tier, cfg, n)
  if n == 1 then self.step = w end
  local ok, err = pcall(function()
    w.tokens:write(ht)
    self:run(w, n)
  end)
  if n > 1 then free_work(w) end
  if not ok then error(err, 0) end
  self.pos = self.pos + n
  return self.logits
end

-- rewind(pos): forget positions [pos, ...): the next feed goes on at pos
-- (the cache keeps rows [0, pos); later rows are overwritten).
function Session:rewind(pos)
  if type(pos) ~= "number" or pos % 1 ~= 0 or pos < 0 or pos > self.pos then
    uerr("generate: cannot rewind to position %s (the sequence has %d)", tostring(pos), self.pos)
  end
  self.pos = pos
end

-- The last logits as a float[V] cdata on the host (read from the tier).
function Session:host()
  self.logits:read(self.host_logits)
  return self.host_logits
end

function Session:free()
  if self.step then free_work(self.step); self.step = nil end
  for l = 1, #self.kc do self.kc[l]:free() end
  for l = 1, #self.vc do self.vc[l]:free() end
  self.kc, self.vc = {}, {}
  for _, k in ipairs({ "lnf_mean", "lnf_rstd", "lnf_stats", "lnf", "logits", "cache" }) do
    if self[k] then self[k]:free(); self[k] = nil end
  end
end

---------------------------------------------------------------------------
-- Sampling.

-- rng(seed) -> a function returning uniform doubles in [0, 1): splitmix64
-- (Steele et al.), the top 53 bits of each output.
function M.rng(seed)
  local st = ffi.new("uint64_t[1]", ffi.cast("uint64_t", seed or 0))
  local golden = 0x9E3779B97F4A7C15ULL
  return function()
    st[0] = st[0] + golden
    local z = st[0]
    z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
    z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
    z = bit.bxor(z, bit.rshift(z, 31))
    return tonumber(bit.rshift(z, 11)) * 2 ^ -53
  end
end

-- Options checked once: temperature >= 0, top_k whole >= 0, top_p in (0, 1].
function M.sampling(opts)
  opts = opts or {}
  local t = opts.temperature == nil and 1 or opts.temperature
  local k = opts.top_k == nil and 0 or opts.top_k
  local p = opts.top_p == nil and 1 or opts.top_p
  if type(t) ~= "number" or t ~= t or t < 0 or t == math.huge then
    uerr("generate: temperature=%s must be a number >= 0 (0: greedy)", tostring(t))
  end
  if type(k) ~= "number" or k < 0 or k % 1 ~= 0 then
    uerr("generate: top_k=%s must be a whole number >= 0 (0: no top-k cut)", tostring(k))
  end
  if type(p) ~= "number" or not (p > 0 and p <= 1) then
    uerr("generate: top_p=%s must be in (0, 1] (1: no nucleus cut)", tostring(p))
  end
  local seed = opts.seed == nil and 0 or opts.seed
  if type(seed) ~= "number" or seed < 0 or seed % 1 ~= 0 or seed >= 2 ^ 53 then
    uerr("generate: seed=%s must be a whole number in [0, 2^53)", tostring(seed))
  end
  return { temperature = t, top_k = k, top_p = p, seed = seed }
end

-- Max-heap of ids over logits l (better: larger logit, then lower id).
local function better(l, a, b)
  local x, y = l[a], l[b]
  return x > y or (x == y and a < b)
end

local function sift(h, l, i, n)
  while true do
    local c = 2 * i + 1
    if c >= n then return end
    if c + 1 < n and better(l, h[c + 1], h[c]) then c = c + 1 end
    if not better(l, h[c], h[i]) then return end
    h[i], h[c] = h[c], h[i]
    i = c
  end
end

-- pick(l, V, sp, u) -> id. l: float logits (0-based, V of them), sp from
-- M.sampling, u: a uniform draw in [0, 1) (ignored when greedy).
function M.pick(l, V, sp, u)
  local best = 0
  for i = 0, V - 1 do
    local v = l[i]
    if v ~= v then uerr("generate: the logits hold NaN (at id %d): the model's weights are not finite", i) end
    if v > l[best] then best = i end
  end
  local t = sp.temperature
  if t == 0 or sp.top_k == 1 then return best end
  local m, exp = l[best], math.exp
  local k = (sp.top_k > 0 and sp.top_k < V) and sp.top_k or V
  if k == V and sp.top_p >= 1 then
    -- plain sampling: weights in id order
    local z = 0
    for i = 0, V - 1 do z = z + exp((l[i] - m) / t) end
    local r, last = u * z, 0
    for i = 0, V - 1 do
      local w = exp((l[i] - m) / t)
      if w > 0 then
        last = i
        r = r - w
        if r < 0 then return i end
      end
    end
    return last
  end
  -- ranked candidates, best first, popped from a heap as needed
  local h = ffi.new("int32_t[?]", V)
  for i = 0, V - 1 do h[i] = i end
  for i = math.floor(V / 2) - 1, 0, -1 do sift(h, l, i, V) end
  local ranked, n = {}, V
  local function pop()
    local top = h[0]
    n = n - 1
    h[0] = h[n]
    sift(h, l, 0, n)
    ranked[#ranked + 1] = top
    return top
  end
  local z = 0
  if k < V then
    for _ = 1, k do z = z + exp((l[pop()] - m) / t) end
  else
    for i = 0, V - 1 do z = z + exp((l[i] - m) / t) end
  end
  -- the nucleus: the fewest best candidates whose mass reaches top_p
  local keep, mass = 0, 0
  while keep < k do
    keep = keep + 1
    local id = ranked[keep] or pop()
    mass = mass + exp((l[id] - m) / t)
    if mass >= sp.top_p * z then break end
  end
  local r = u * mass
  for i = 1, keep do
    r = r - exp((l[ranked[i]] - m) / t)
    if r < 0 then return ranked[i] end
  end
  return ranked[keep]
end

---------------------------------------------------------------------------
-- generate's steps, in its order

-- tokenizer_for(opts, model) -> opts.tokenizer or the model's (a name resolved),
-- or nil; one with more ids than the model's vocabulary is refused
local function tokenizer_for(opts, model)
  local cfg = model.cfg
  local tok = opts.tokenizer or model.tokenizer
  if type(tok) == "string" then tok = data.tokenizer(tok) end
  if tok ~= nil and (type(tok) ~= "table" or type(tok.encode) ~= "function") then
    uerr("generate: tokenizer must be a tokenizer object or name, got %s", type(tok))
  end
  if tok and type(tok.vocab_size) == "number" and tok.vocab_size > cfg.V then
    uerr("generate: the tokenizer %s has %d ids, more than the model's vocabulary of %d: " ..
         "use the tokenizer the model was trained with", tostring(tok.name), tok.vocab_size, cfg.V)
  end
  return tok
end

-- prompt_ids(prompt, tok, V) -> the prompt as a list of ids, each in [0, V)
local function prompt_ids(prompt, tok, V)
  local ids = {}
  if type(prompt) == "string" then
    if not tok then
      uerr("generate: a text prompt needs a tokenizer (opts.tokenizer, e.g. \"bytes\" or \"hf:DIR\"), " ..
           "or give the prompt as a list of token ids")
    end
    local arr, n = tok.encode(prompt)
    for i = 0, n - 1 do ids[i + 1] = tonumber(arr[i]) end
  elseif type(prompt) == "table" then
    for i, v in ipairs(prompt) do ids[i] = v end
  else
    uerr("generate: prompt must be a string or a list of token ids, got %s", type(prompt))
  end
  if #ids == 0 then uerr("generate: the prompt is empty: give at least one token") end
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id % 1 ~= 0 or id < 0 or id >= V then
      uerr("generate: prompt token %d is %s, outside the model's vocabulary [0, %d)",
           i, tostring(id), V)
    end
  end
  return ids
end

-- max_tokens_for(opts, n, maxT) -> opts.max_tokens (default 64), checked: the
-- prompt's n tokens and the new ones must fit the model's context of maxT
local function max_tokens_for(opts, n, maxT)
  local max_tokens = opts.max_tokens == nil and 64 or opts.max_tokens
  if type(max_tokens) ~= "number" or max_tokens < 0 or max_tokens % 1 ~= 0 then
    uerr("generate: max_tokens=%s must be a whole number >= 0", tostring(max_tokens))
  end
  if n > maxT then
    uerr("generate: the prompt has %d tokens, more than the model's context of %d; shorten it",
         n, maxT)
  end
  if n + max_tokens > maxT then
    uerr("generate: the prompt's %d tokens + max_tokens=%d exceed the model's context of %d; " ..
         "lower max_tokens to %d or less", n, max_tokens, maxT, maxT - n)
  end
  return max_tokens
end

-- sample(model, ids, max_tokens, V, sp, eot, info) -> the new ids: the prompt fed,
-- then up to max_tokens picked among ids [0, V), stopping after eot; info gets
-- stopped, prefill_ms and ms_per_token
local function sample(model, ids, max_tokens, V, sp, eot, info)
  local out = {}
  local s = M.session(model, #ids + max_tokens)
  local ok, err = pcall(function()
    local draw = M.rng(sp.seed)
    local t0 = zffi.C.zt_now()
    s:feed(ids)
    local t1 = zffi.C.zt_now()
    info.prefill_ms = (t1 - t0) * 1000
    for i = 1, max_tokens do
      local id = M.pick(s:host(), V, sp, draw())
      out[i] = id
      if id == eot then info.stopped = "eot"; break end
      if i < max_tokens then s:feed({ id }) end
    end
    local steps = #out - 1
    info.ms_per_token = steps > 0 and (zffi.C.zt_now() - t1) * 1000 / steps or nil
  end)
  s:free()
  if not ok then error(err, 0) end
  return out
end

---------------------------------------------------------------------------
-- generate(model, prompt, opts) -> ids, text, info
--   prompt      a string (encoded by opts.tokenizer, or model.tokenizer) or a
--               list of token ids (0-based ids in a 1-based Lua list)
--   opts        max_tokens (default 64), temperature (default 1; 0 greedy),
--               top_k (default 0: off), top_p (default 1: off), seed (default
--               0), tokenizer (an object or a name for data.tokenizer),
--               stop_at_eot (default true: stop after the tokenizer's
--               end-of-text id, or opts.eot)
--   ids         the new token ids (a Lua list); text: their decoding when
--               a tokenizer is known; info: { prompt = ids, stopped =
--               "max_tokens" | "eot", prefill_ms, ms_per_token }
-- The prompt and the new tokens together must fit the model's context:
-- a request beyond it is refused before anything runs (lower max_tokens).
-- With a tokenizer whose vocabulary is smaller than the model's (a padded
-- embedding), only ids the tokenizer can decode are sampled.
function M.generate(model, prompt, opts)
  opts = opts or {}
  if type(opts) ~= "table" then uerr("generate: opts must be a table, got %s", type(opts)) end
  check_model(model)
  local cfg = model.cfg
  local sp = M.sampling(opts)
  local tok = tokenizer_for(opts, model)
  local ids = prompt_ids(prompt, tok, cfg.V)
  local max_tokens = max_tokens_for(opts, #ids, cfg.maxT)
  local V = cfg.V
  if tok and tok.vocab_size and tok.vocab_size < V then V = tok.vocab_size end
  local eot = opts.eot
  if eot == nil and tok then eot = tok.eot end
  if opts.stop_at_eot == false then eot = nil end

  local out, info = {}, { prompt = ids, stopped = "max_tokens" }
  if max_tokens > 0 then out = sample(model, ids, max_tokens, V, sp, eot, info) end
  local text
  if tok then
    local arr = ffi.new("int32_t[?]", math.max(#out, 1))
    for i = 1, #out do arr[i - 1] = out[i] end
    text = tok.decode(arr, #out)
  end
  return out, text, info
end

return M
