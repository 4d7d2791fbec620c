-- ztrain.model.data.cache: the tokenisation cache. A corpus is tokenised once per
-- (file, tokenizer, split rule); later loads read the tokens back.
--
--   local cache = require "ztrain.model.data.cache"
--   local dir = cache.dir(opt)            -- nil/"" = the default dir, false/"off" = no cache
--   local c = cache.open(dir, tok)        -- nil, reason when tok cannot be keyed
--   local e, st = c:lookup(path, rule)    -- path resolved; stat taken BEFORE the file is read
--   -- e = { tokens = uint16_t*/int32_t*, n, a, b, a_bytes, b_bytes } (part A = tokens[0..a-1],
--   --     part B = tokens[a..n-1]); on a miss: nil, st -- read and tokenise the file, then
--   c:put(path, st, rule, { a_ids, a_n, b_ids, b_n, a_bytes, b_bytes })
--   -- (c:get(path, st, rule) -> e | nil, why ("miss", "racy", "corrupt: ...") is the lookup alone)
--   c:warning()                           -- one line when entries could not be written, else nil
--
-- Where. One file per entry: DIR/tokens/<16 hex digits>.bin, the FNV-1a 64 hash of the
-- key. DIR is the `dir` argument; the default is $ZTRAIN_CACHE, else
-- $XDG_CACHE_HOME/ztrain, else $HOME/.cache/ztrain. Entries are never evicted:
-- deleting DIR is always safe (everything is rebuilt on demand).
--
-- Key. The entry of an input file is keyed by
--   * the file: its resolved path, size, mtime (seconds and nanoseconds), device and
--     inode, from one statx() taken before the file is read. Not a content hash: a hit
--     must not read the corpus at all (for a large corpus, reading it is most of the
--     cost of tokenising it with a fast tokenizer); any write, touch, copy-over or
--     rename-over changes mtime or the inode, so it is a miss.
--     Timestamps are coarse (a kernel tick), so a file written in the same tick as
--     its entry could change again without a new mtime: as git's "racy clean" rule, an
--     entry is trusted only when the file's mtime is strictly older than the entry's
--     own; otherwise it is re-tokenised (and re-written, so it settles next time).
--   * the tokenizer: tok.cache_key when the object has one; else its name, vocab_size,
--     eot and the FNV-1a 64 hash of the contents of tok.cache_files (data.tokenizer sets
--     these: vocab.json, merges.txt and the tokenizer's own Lua source, so a fix to the
--     encoder invalidates its old tokens). A tokenizer with neither is not cached.
--   * the split rule: a string from the caller (e.g. "fraction 0.05 v1": where a file is
--     cut into train and validation text) and this module's FORMAT version.
--
-- Entry. An llm.c .bin file (tokbin.lua; uint16, or uint32 for vocabularies over
-- 65536) whose spare header slots hold: [3] "ZTC1", [4] a, [5] b (token counts of the
-- two parts), [6..7] a_bytes, [8..9] b_bytes, [10..11] the key hash, [12..13] the
-- FNV-1a 64 of the token bytes. An entry is written to a temporary name and renamed
-- into place (concurrent ranks writing one entry are safe: last rename wins, same
-- bytes). A read checks the llm.c header and size (tokbin.read), the ZTC1 mark, the key
-- hash, a + b = n and the checksum; any failure is reported as "corrupt", and the
-- caller re-tokenises and overwrites the entry: nothing in the cache is trusted unchecked.
local ffi = require "ffi"
local bit = require "bit"
local tokbin = require "ztrain.model.data.tokbin"
local fs = require "ztrain.util.fs"

local M = {}

M.FORMAT = 1
local ZTC1 = 0x5A544331 -- "ZTC1"

---------------------------------------------------------------------------
-- FNV-1a 64 (http://www.isthe.com/chongo/tech/comp/fnv/): about 1 GB/s under LuaJIT.

local FNV_OFFSET, FNV_PRIME = 0xcbf29ce484222325ULL, 0x100000001b3ULL
local u8ptr = ffi.typeof("const uint8_t *")

-- fnv64(s) or fnv64(ptr, n [, h]) -> uint64_t
function M.fnv64(p, n, h)
  if type(p) == "string" then n = n or #p end
  p = ffi.cast(u8ptr, p)
  h = h or FNV_OFFSET
  for i = 0, n - 1 do h = bit.bxor(h, p[i]) * FNV_PRIME end
  return h
end

function M.hex(h) return bit.tohex(tonumber(bit.rshift(h, 32)), 8) .. bit.tohex(tonumber(bit.band(h, 0xffffffffULL)), 8) end

local function split64(h)
  return bit.tobit(tonumber(bit.band(h, 0xffffffffULL))), bit.tobit(tonumber(bit.rshift(h, 32)))
end
local function join64(lo, hi)
  return bit.bor(bit.lshift(ffi.cast("uint64_t", ffi.cast("uint32_t", hi)), 32), ffi.cast("uint64_t", ffi.cast("uint32_t", lo)))
end
local function split_n(v) -- non-negative integer < 2^53 -> lo, hi int32 slots
  return bit.tobit(v % 2 ^ 32), bit.tobit(math.floor(v / 2 ^ 32))
end
local function join_n(lo, hi)
  return (lo < 0 and lo + 2 ^ 32 or lo) + hi * 2 ^ 32
end

---------------------------------------------------------------------------
-- statx(2): arch-independent layout (struct stat differs between x86-64 and arm64).
-- Declared under a private name with an asm label, as ztrain.libc does.

if not pcall(ffi.typeof, "ztrain_data_statx_t") then
  ffi.cdef [[
  typedef struct { int64_t tv_sec; uint32_t tv_nsec; int32_t reserved; } ztrain_data_statx_ts;
  typedef struct ztrain_data_statx_t {
    uint32_t stx_mask, stx_blksize; uint64_t stx_attributes;
    uint32_t stx_nlink, stx_uid, stx_gid; uint16_t stx_mode, spare0;
    uint64_t stx_ino, stx_size, stx_blocks, stx_attributes_mask;
    ztrain_data_statx_ts stx_atime, stx_btime, stx_ctime, stx_mtime;
    uint32_t stx_rdev_major, stx_rdev_minor, stx_dev_major, stx_dev_minor;
    uint64_t spare2[14];
  } ztrain_data_statx_t;
  int ztrain_data_statx(int dirfd, const char *path, int flags, unsigned int mask, ztrain_data_statx_t *buf)
    __asm__("statx");
  char *ztrain_data_strerror(int errnum) __asm__("strerror");
  ]]
end
local AT_FDCWD, STATX_BASIC_STATS = -100, 0x7ff
local S_IFMT, S_IFREG, S_IFDIR = 0xF000, 0x8000, 0x4000
local statx_t = ffi.typeof("ztrain_data_statx_t")

-- stat(path) -> { size, mtime_s, mtime_ns, dev, ino, kind = "file"|"dir"|"other" } | nil, err
-- (symlinks followed)
function M.stat(path)
  local st = statx_t()
  if ffi.C.ztrain_data_statx(AT_FDCWD, path, 0, STATX_BASIC_STATS, st) ~= 0 then
    local e = ffi.errno()
    return nil, ffi.string(ffi.C.ztrain_data_strerror(e)):lower(), e
  end
  local fmt = bit.band(st.stx_mode, S_IFMT)
  return {
    size = tonumber(st.stx_size), mtime_s = tonumber(st.stx_mtime.tv_sec), mtime_ns = tonumber(st.stx_mtime.tv_nsec),
    dev = st.stx_dev_major * 65536 + st.stx_dev_minor, ino = tonumber(st.stx_ino),
    kind = fmt == S_IFREG and "file" or fmt == S_IFDIR and "dir" or "other",
  }
end

local function older(a, b) -- a's mtime strictly before b's
  return a.mtime_s < b.mtime_s or (a.mtime_s == b.mtime_s and a.mtime_ns < b.mtime_ns)
end

---------------------------------------------------------------------------
-- the directory

function M.default_dir()
  local d = os.getenv("ZTRAIN_CACHE")
  if d and d ~= "" then return d end
  d = os.getenv("XDG_CACHE_HOME")
  if d and d ~= "" then return d .. "/ztrain" end
  d = os.getenv("HOME")
  if d and d ~= "" then return d .. "/.cache/ztrain" end
  return nil
end

-- dir(opt) -> directory or nil (no caching). opt: nil or "" = the default;
-- false or "off" = none; else a directory path.
function M.dir(opt)
  if opt == false or opt == "off" then return nil end
  if opt == nil or opt == "" or opt == true then return M.default_dir() end
  if type(opt) ~= "string" then
    error("data: cache must be a directory, \"off\" or false, got " .. type(opt), 0)
  end
  return opt
end

-- mkdir -p (util/fs: made and writable), and a directory at that path
local function mkdirs(path)
  local ok, err = fs.mkdirs(path, "the cache directory")
  if not ok then return nil, err end
  local st = M.stat(path)
  if not st or st.kind ~= "dir" then return nil, ("cache path %s is not a directory"):format(path) end
  return true
end

---------------------------------------------------------------------------
-- tokenizer identity

local function file_hash(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return M.hex(M.fnv64(s)) .. ":" .. #s
end

-- tokenizer_key(tok) -> string | nil, reason
function M.tokenizer_key(tok)
  if type(tok.cache_key) == "string" then return tok.cache_key end
  if type(tok.cache_files) ~= "table" or #tok.cache_files == 0 then
    return nil, ("tokenizer %s has neither cache_key nor cache_files"):format(tostring(tok.name))
  end
  local parts = { ("%s V=%d eot=%s"):format(tostring(tok.name), tok.vocab_size, tostring(tok.eot)) }
  for _, p in ipairs(tok.cache_files) do
    local h, err = file_hash(p)
    if not h then return nil, "cannot hash " .. tostring(err) end
    parts[#parts + 1] = p:match("[^/]*$") .. "=" .. h
  end
  return table.concat(parts, " ")
end

---------------------------------------------------------------------------
-- entries

local Cache = {}
Cache.__index = Cache

-- open(dir, tok) -> cache | nil, reason (no dir, or a tokenizer that cannot be keyed)
function M.open(dir, tok)
  if not dir then return nil, "caching is off" end
  local tkey, why = M.tokenizer_key(tok)
  if not tkey then return nil, why end
  return setmetatable({ dir = dir, tokdir = dir .. "/tokens", tkey = tkey,
                        wide = tok.vocab_size > 65536,
                        hits = 0, misses = 0, rebuilt = 0, errors = {} }, Cache)
end

function Cache:key(path, st, rule)
  return ("ztrain-tokcache %d\ntokenizer %s\nrule %s\nfile %s\nsize %d mtime %d.%09d dev %d ino %d")
         :format(M.FORMAT, self.tkey, rule, path, st.size, st.mtime_s, st.mtime_ns, st.dev, st.ino)
end

function Cache:path_of(key) return ("%s/%s.bin"):format(self.tokdir, M.hex(M.fnv64(key))) end

-- get(path, st, rule) -> entry | nil, why
function Cache:get(path, st, rule)
  local key = self:key(path, st, rule)
  local epath = self:path_of(key)
  local est = M.stat(epath)
  if not est then return nil, "miss" end
  if not older(st, est) then return nil, "racy" end
  local t, err = tokbin.read(epath)
  if not t then return nil, "corrupt: " .. err end
  local h = t.header
  if h[3] ~= ZTC1 then return nil, "corrupt: not a ztrain cache entry (header slot 3)" end
  local klo, khi = split64(M.fnv64(key))
  if h[10] ~= klo or h[11] ~= khi then return nil, "corrupt: key hash differs" end
  local a, b = h[4], h[5]
  if a < 0 or b < 0 or a + b ~= t.n then
    return nil, ("corrupt: parts %d + %d do not add up to %d tokens"):format(a, b, t.n)
  end
  local sum = M.fnv64(t.tokens, t.n * t.width)
  if sum ~= join64(h[12], h[13]) then return nil, "corrupt: token checksum differs" end
  return { tokens = t.tokens, n = t.n, a = a, b = b, a_bytes = join_n(h[6], h[7]), b_bytes = join_n(h[8], h[9]),
           path = epath }
end

-- lookup(path, rule) -> entry | nil, st: get() with the file's stat taken here and
-- the counts kept (hits, misses, rebuilt). On a miss, st (nil when the file cannot
-- be stat'ed: then it is not cached) is what put() must be given after the caller
-- read and tokenised the file.
function Cache:lookup(path, rule)
  local st = M.stat(path)
  if not st then self.misses = self.misses + 1; return nil end
  local e, why = self:get(path, st, rule)
  if e then self.hits = self.hits + 1; return e end
  self.misses = self.misses + 1
  if why:sub(1, 7) == "corrupt" then self.rebuilt = self.rebuilt + 1 end
  return nil, st
end

-- put(path, st, rule, e) -> true | nil, err. e = { a_ids, a_n, b_ids, b_n, a_bytes, b_bytes }
-- (ids: 0-based int arrays). A failure to write is not fatal to the caller: the
-- tokens are in memory; it is recorded in c.errors, and c:warning() says it.
function Cache:put(path, st, rule, e)
  local ok, err = mkdirs(self.tokdir)
  if not ok then self.errors[#self.errors + 1] = err; return nil, err end
  local n = e.a_n + e.b_n
  local arr = ffi.new(self.wide and "uint32_t[?]" or "uint16_t[?]", math.max(n, 1))
  for i = 0, e.a_n - 1 do arr[i] = e.a_ids[i] end
  for i = 0, e.b_n - 1 do arr[e.a_n + i] = e.b_ids[i] end
  local key = self:key(path, st, rule)
  local h = {}
  h[3] = ZTC1
  h[4], h[5] = e.a_n, e.b_n
  h[6], h[7] = split_n(e.a_bytes)
  h[8], h[9] = split_n(e.b_bytes)
  h[10], h[11] = split64(M.fnv64(key))
  h[12], h[13] = split64(M.fnv64(arr, n * (self.wide and 4 or 2)))
  ok, err = tokbin.write(self:path_of(key), arr, n, { wide = self.wide, header = h })
  if not ok then self.errors[#self.errors + 1] = err; return nil, err end
  return true
end

-- warning() -> one line for the run's warnings when entries could not be
-- written (nil when all were): the run goes on from the tokens in memory,
-- but nothing is cached, so every run tokenises again; said once, with the
-- first reason, however many files failed.
function Cache:warning()
  local first, n = self.errors[1], #self.errors
  if not first then return nil end
  return ("data.cache %s is not used: %s%s; every run tokenises the text again (give a writable directory, " ..
          "or data.cache=off)"):format(self.dir, first, n > 1 and (" (%d entries not written)"):format(n) or "")
end

function Cache:describe()
  return ("cache %s: %d hits, %d tokenised%s"):format(self.dir, self.hits, self.misses,
    self.rebuilt > 0 and (", %d corrupt entries rebuilt"):format(self.rebuilt) or "")
end

return M
