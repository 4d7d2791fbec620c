-- ztrain.model.data.loader: random-access batches of (inputs, targets) over a token stream.
--
--   local L, err = data.loader{ split = ds.train, B = 4, T = 128, seed = 1337, shuffle = true,
--                               vocab_size = 50257 }
--   local x, y = L:batch(i)            -- or L:batch(i, x, y) to fill int32_t[B*T] arrays
--
-- Tokens. With vocab_size, every token the loader can hand out is checked to lie
-- in [0, vocab_size) when the loader is made (one pass over the split): a token
-- outside is an error naming it and its position. This is the token-range check
-- of the whole pipeline: the ops never read token ids on the host (they live on
-- the device), and a kernel that meets a bad id only skips and counts it.
--
-- Windows. The stream (split.tokens[0 .. split.n-1]) is cut into L.windows =
-- floor((n - 1) / T) windows of T + 1 tokens with stride T: window w is tokens
-- [w*T, w*T + T]; its inputs are the first T tokens, its targets the last T. A tail
-- shorter than a window is not used.
--
-- Batches. Batch i (i = 0, 1, 2, ...: the global micro-batch index) is rows
-- k = 0 .. B-1; row k is "slot" g = i*B + k of an endless sequence of epochs:
-- epoch e = floor(g / windows), position j = g mod windows, window perm_e[j].
-- perm_e is a Fisher-Yates shuffle of 0 .. windows-1 driven by splitmix64 seeded
-- from (seed, e); with shuffle = false, perm_e is the identity. So batch i depends
-- on (data, B, T, seed, shuffle, i) only: whoever computes it, in whatever order,
-- gets the same rows. N ranks taking batches s*N + r equal one rank taking
-- s*N + 0 .. N-1, and every window is used exactly once per epoch. Epochs run on
-- across batch boundaries (a batch may hold the last windows of epoch e and the
-- first of e + 1); nothing is dropped.
--
-- Resume. The loader keeps no position: continue from batch index i. L:state(i) ->
-- { batch = i, epoch =, pos = (slot within the epoch), windows = } can be stored in a
-- checkpoint; L:seek(state) returns the batch index to continue from (and checks the
-- state fits this loader).
local ffi = require "ffi"
local bit = require "bit"

local M = {}

local u64 = ffi.typeof("uint64_t")
local i32arr = ffi.typeof("int32_t[?]")

-- splitmix64 (Steele, Lea, Flood 2014). State lives in a uint64_t[1] array so that
-- the JIT keeps the arithmetic unboxed.
local GAMMA = 0x9E3779B97F4A7C15ULL
local function mix64(z)
  z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
  z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(z, bit.rshift(z, 31))
end
M.mix64 = mix64

-- The permutation of 0 .. n-1 for (seed, epoch), as an int32_t[n].
function M.permutation(n, seed, epoch)
  local perm = i32arr(n)
  for j = 0, n - 1 do perm[j] = j end
  local st = ffi.new("uint64_t[1]")
  st[0] = mix64(mix64(u64(seed) + GAMMA) + u64(epoch) * 0xD1B54A32D192ED03ULL)
  for j = n - 1, 1, -1 do
    -- r uniform in [0, j]: reject the 2^64 mod (j+1) lowest outputs
    local m = u64(j + 1)
    local threshold = (0ULL - m) % m
    local x
    repeat
      st[0] = st[0] + GAMMA
      x = mix64(st[0])
    until x >= threshold
    local r = tonumber(x % m)
    perm[j], perm[r] = perm[r], perm[j]
  end
  return perm
end

local Loader = {}
Loader.__index = Loader

local function check_int(v, what, min)
  if type(v) ~= "number" or v % 1 ~= 0 or v < min or v >= 2 ^ 53 then
    error(("data.loader: %s must be an integer >= %d, got %s"):format(what, min, tostring(v)), 3)
  end
  return v
end

function M.loader(opts)
  if type(opts) ~= "table" then error("data.loader: expected a table of options, got " .. type(opts), 2) end
  local known = { split = true, B = true, T = true, seed = true, shuffle = true, vocab_size = true }
  for k in pairs(opts) do
    if not known[k] then
      error(("data.loader: unknown option %q (known: B, T, seed, shuffle, split, vocab_size)")
            :format(tostring(k)), 2)
    end
  end
  local split = opts.split
  if type(split) ~= "table" or type(split.tokens) ~= "cdata" or type(split.n) ~= "number" then
    error("data.loader: split must be a table { tokens = ffi array, n = count } (e.g. ds.train)", 2)
  end
  local n = check_int(split.n, "split.n", 0)
  local B = check_int(opts.B, "B", 1)
  local T = check_int(opts.T, "T", 1)
  local seed = check_int(opts.seed == nil and 0 or opts.seed, "seed", 0)
  local shuffle = opts.shuffle
  if shuffle == nil then shuffle = true end
  if type(shuffle) ~= "boolean" then error("data.loader: shuffle must be a boolean, got " .. type(shuffle), 2) end
  local V = opts.vocab_size ~= nil and check_int(opts.vocab_size, "vocab_size", 1) or nil

  local windows = n >= T + 1 and math.floor((n - 1) / T) or 0
  -- name the split when the dataset named it (data.open / data.text set split.name)
  local what = split.name and ("the %s split%s"):format(split.name,
                 split.source and (" (from %s)"):format(split.source) or "") or "the split"
  if windows < 1 then
    return nil, ("data.loader: too little data: %s has %d tokens, but one window needs T + 1 = %d tokens "
                 .. "(T = data.seq_len); lower data.seq_len or add data"):format(what, n, T + 1)
  end
  if windows < B then
    return nil, ("data.loader: too little data: %s has %d tokens, which make %d windows of T + 1 = %d tokens "
                 .. "(stride %d), fewer than B = %d (batch.micro); lower batch.micro or data.seq_len, or add data")
                :format(what, n, windows, T + 1, T, B)
  end
  if V then
    -- windows cover tokens [0, windows*T]; nothing past them is ever handed out
    local tok = split.tokens
    for j = 0, windows * T do
      local v = tok[j]
      if v < 0 or v >= V then
        return nil, ("data.loader: token %d at position %d of the split is outside the model's "
                     .. "vocabulary [0,%d): the tokenizer and model.vocab_size disagree")
                    :format(tonumber(v), j, V)
      end
    end
  end
  return setmetatable({
    split = split, tokens = split.tokens, n = n, B = B, T = T, seed = seed, shuffle = shuffle,
    vocab_size = V,
    windows = windows, batches_per_epoch = windows / B,
    _cache = {}, -- epoch -> permutation; at most 2 (a batch spans at most 2 epochs)
    _order = {},
  }, Loader)
end

function Loader:_perm(e)
  local p = self._cache[e]
  if p then return p end
  p = M.permutation(self.windows, self.seed, e)
  local order = self._order
  order[#order + 1] = e
  self._cache[e] = p
  if #order > 2 then self._cache[table.remove(order, 1)] = nil end
  return p
end

-- Window index for slot g (= i*B + k).
function Loader:window(g)
  local nw = self.windows
  local e, j = math.floor(g / nw), g % nw
  if not self.shuffle then return j end
  return self:_perm(e)[j]
end

-- Lua list of the B window indices of batch i.
function Loader:windows_of(i)
  check_int(i, "batch index", 0)
  local out = {}
  for k = 0, self.B - 1 do out[k + 1] = self:window(i * self.B + k) end
  return out
end

function Loader:batch(i, inputs, targets)
  check_int(i, "batch index", 0)
  local B, T, tok = self.B, self.T, self.tokens
  if inputs == nil then inputs = i32arr(B * T) end
  if targets == nil then targets = i32arr(B * T) end
  if type(inputs) ~= "cdata" or type(targets) ~= "cdata" then
    error("data.loader: batch(i, inputs, targets) needs ffi int32_t[B*T] arrays (or nil)", 2)
  end
  for k = 0, B - 1 do
    local w = self:window(i * B + k)
    local src, dst = w * T, k * T
    for t = 0, T - 1 do
      inputs[dst + t] = tok[src + t]
      targets[dst + t] = tok[src + t + 1]
    end
  end
  return inputs, targets
end

function Loader:epoch_of(i)
  check_int(i, "batch index", 0)
  return math.floor(i * self.B / self.windows)
end

function Loader:state(i)
  check_int(i, "batch index", 0)
  local g = i * self.B
  return { batch = i, epoch = math.floor(g / self.windows), pos = g % self.windows, windows = self.windows }
end

-- Batch index to continue from, given a state from L:state (or {epoch=, pos=}).
function Loader:seek(st)
  if type(st) ~= "table" then error("data.loader: seek expects a state table from L:state(i)", 2) end
  local e = check_int(st.epoch, "state.epoch", 0)
  local pos = check_int(st.pos, "state.pos", 0)
  if st.windows ~= nil and st.windows ~= self.windows then
    error(("data.loader: state is for %d windows, this loader has %d (different data or T)")
      :format(st.windows, self.windows), 2)
  end
  if pos >= self.windows then error(("data.loader: state.pos %d >= windows %d"):format(pos, self.windows), 2) end
  local g = e * self.windows + pos
  if g % self.B ~= 0 then
    error(("data.loader: state (epoch %d, pos %d) is not at a batch boundary for B = %d"):format(e, pos, self.B), 2)
  end
  local i = g / self.B
  if st.batch ~= nil and st.batch ~= i then
    error(("data.loader: state says batch %d but (epoch, pos) gives batch %d (different B?)"):format(st.batch, i), 2)
  end
  return i
end

return M
