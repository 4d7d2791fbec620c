-- ztrain.model.data.tokbin: llm.c's pre-tokenised token files (.bin), read and written.
--
--   local tokbin = require "ztrain.model.data.tokbin"
--   local t, err = tokbin.read("data/tiny_shakespeare_val.bin")
--   -- t = { tokens = uint16_t[n] (int32_t[n] for 32-bit files), n =, dtype =, header = int32_t[256], path = }
--   assert(tokbin.write("out.bin", ids, n))               -- ids: any 0-based cdata array of ints
--
-- Format (llm.c dev/data/data_common.py write_datafile, little-endian):
--   header: 256 int32: [0] magic, [1] version, [2] token count; the rest zero (llm.c ignores them)
--   then the tokens:   magic 20240520, version 1: uint16 (GPT-2; ids < 65536)
--                      magic 20240801, version 7: uint32 (llm.c's llama-3 files)
-- write() picks uint16 unless opts.wide or an id >= 65536 needs uint32. The file is
-- written to a temporary name in the same directory and renamed into place, so a
-- reader never sees half a file (no fsync: a cache entry cut short by a crash
-- fails the size check on its next read and is rebuilt).
--
-- read() checks, before trusting anything: the header fits, the magic and the
-- version, and that 1024 + count * width equals the file size. Each failure returns
-- nil and a message naming the file, the field, the value found and the value
-- expected. Header slots 3..255 are returned as they are (ztrain's tokenisation cache
-- keeps its own fields there; see cache.lua).
local ffi = require "ffi"
local bit = require "bit"

local M = {}

M.HEADER_INTS = 256
M.HEADER_BYTES = 1024
M.formats = {
  [20240520] = { version = 1, width = 2, ctype = "uint16_t", name = "GPT-2 (uint16 tokens)" },
  [20240801] = { version = 7, width = 4, ctype = "uint32_t", name = "llama-3 (uint32 tokens)" },
}
M.MAGIC16, M.MAGIC32 = 20240520, 20240801

local CHUNK = 4 * 1024 * 1024 -- bytes per read/write: bounds the extra memory for big shards

if not ffi.abi("le") then
  -- the format is little-endian and we copy bytes as they are
  error("ztrain.model.data.tokbin: llm.c token files are little-endian; this host is big-endian", 0)
end

local i32arr = ffi.typeof("int32_t[?]")
local u16arr = ffi.typeof("uint16_t[?]")
local u32arr = ffi.typeof("uint32_t[?]")

-- header(path) -> header int32_t[256], fmt, size (bytes) | nil, err. The checks above,
-- without reading the tokens.
local function open_checked(path)
  local f, oerr = io.open(path, "rb")
  if not f then
    local why = tostring(oerr):match(": ([^:]+)$") or tostring(oerr)
    return nil, ("cannot open token file %s: %s"):format(path, why:lower())
  end
  local size = f:seek("end")
  if not size then f:close(); return nil, ("cannot read token file %s: it is not a regular file"):format(path) end
  f:seek("set", 0)
  if size < M.HEADER_BYTES then
    f:close()
    return nil, ("token file %s: %d bytes, too short for the 1024-byte llm.c header (256 int32): "
                 .. "not an llm.c .bin token file, or truncated"):format(path, size)
  end
  local s = f:read(M.HEADER_BYTES)
  if not s or #s ~= M.HEADER_BYTES then
    f:close()
    return nil, ("token file %s: cannot read its 1024-byte header"):format(path)
  end
  local h = i32arr(M.HEADER_INTS)
  ffi.copy(h, s, M.HEADER_BYTES)
  local magic, version, count = h[0], h[1], h[2]
  local fmt = M.formats[magic]
  if not fmt then
    f:close()
    return nil, ("token file %s: header magic (int32 0) is %d, expected %d (llm.c GPT-2 tokens) or %d "
                 .. "(llm.c llama-3 tokens): not an llm.c .bin token file"):format(path, magic, M.MAGIC16, M.MAGIC32)
  end
  if version ~= fmt.version then
    f:close()
    return nil, ("token file %s: header version (int32 1) is %d, expected %d for magic %d")
                :format(path, version, fmt.version, magic)
  end
  local body = size - M.HEADER_BYTES
  if count < 0 or count * fmt.width ~= body then
    f:close()
    local expected = body % fmt.width == 0 and tostring(body / fmt.width)
                     or ("none (%d bytes after the header is not a whole number of %d-byte tokens)")
                        :format(body, fmt.width)
    return nil, ("token file %s: header token count (int32 2) is %d, expected %s from the file size "
                 .. "(%d bytes = 1024-byte header + %d bytes of tokens): the file is truncated or was not "
                 .. "written whole; re-create it"):format(path, count, expected, size, body)
  end
  return f, h, fmt, size
end

-- header(path) -> { magic, version, n, width, header = int32_t[256], size } | nil, err
function M.header(path)
  local f, h, fmt, size = open_checked(path)
  if not f then return nil, h end
  f:close()
  return { magic = h[0], version = h[1], n = h[2], width = fmt.width, header = h, size = size, path = path }
end

-- read(path) -> { tokens, n, dtype, width, header, path } | nil, err
-- tokens: uint16_t[n] for 16-bit files, int32_t[n] for 32-bit ones (ids >= 2^31 are
-- refused: no vocabulary is that large, and the loaders work in int32).
function M.read(path)
  local f, h, fmt, size = open_checked(path)
  if not f then return nil, h end
  local n = h[2]
  local wide = fmt.width == 4
  -- 32-bit files land in int32_t: the same bytes; an id >= 2^31 shows as negative
  local tokens = wide and i32arr(math.max(n, 1)) or u16arr(math.max(n, 1))
  local dst = ffi.cast("uint8_t *", tokens)
  local left, off = n * fmt.width, 0
  while left > 0 do
    local s = f:read(math.min(CHUNK, left))
    if not s or #s == 0 then
      f:close()
      return nil, ("token file %s: read stopped at byte %d of %d (file changed while reading?)")
                  :format(path, M.HEADER_BYTES + off, size)
    end
    ffi.copy(dst + off, s, #s)
    off, left = off + #s, left - #s
  end
  f:close()
  if wide then
    for i = 0, n - 1 do
      if tokens[i] < 0 then
        return nil, ("token file %s: token %.0f at position %d does not fit an int32 id")
                    :format(path, tokens[i] + 2 ^ 32, i)
      end
    end
  end
  return { tokens = tokens, n = n, dtype = wide and "int32_t" or "uint16_t", width = fmt.width, header = h,
           path = path }
end

local function tmpname(path)
  -- unique per process and call: ranks writing the same entry at once never share a temp file
  M._seq = (M._seq or 0) + 1
  local pid = 0
  local ok, libc = pcall(require, "ztrain.core.libc")
  if ok then pid = libc.getpid() end
  return ("%s.tmp.%d.%d.%d"):format(path, pid, M._seq, math.random(0, 2 ^ 30))
end

-- write(path, tokens, n, opts) -> true | nil, err. tokens: a 0-based cdata array (any
-- integer type) or a 1-based Lua table (n defaults to #tokens).
-- opts.wide = true: uint32 tokens (magic 20240801) even when every id fits 16 bits.
-- opts.header = { [slot] = int32 value } for slots 3..255 (llm.c ignores them).
-- Every id is checked to fit the chosen width (an error names it and its position).
function M.write(path, tokens, n, opts)
  opts = opts or {}
  if type(path) ~= "string" or path == "" then error("tokbin.write: path must be a non-empty string", 2) end
  if type(tokens) == "table" then
    n = n or #tokens
    local arr = i32arr(math.max(n, 1))
    for i = 1, n do arr[i - 1] = tokens[i] end
    tokens = arr
  elseif type(tokens) ~= "cdata" then
    error("tokbin.write: tokens must be a cdata array or a table of ids, got " .. type(tokens), 2)
  end
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 or n >= 2 ^ 31 then
    error("tokbin.write: n must be a token count in [0, 2^31), got " .. tostring(n), 2)
  end
  local wide = opts.wide and true or false
  if not wide then
    for i = 0, n - 1 do
      if tokens[i] > 65535 then wide = true; break end
    end
  end
  local magic = wide and M.MAGIC32 or M.MAGIC16
  local fmt = M.formats[magic]
  local limit = wide and 2 ^ 32 or 2 ^ 16
  for i = 0, n - 1 do
    local v = tonumber(tokens[i])
    if v < 0 or v >= limit then
      return nil, ("token file %s: token %d at position %d does not fit %s"):format(path, v, i, fmt.name)
    end
  end
  local h = i32arr(M.HEADER_INTS)
  h[0], h[1], h[2] = magic, fmt.version, n
  for k, v in pairs(opts.header or {}) do
    if type(k) ~= "number" or k < 3 or k > 255 or k % 1 ~= 0 then
      error("tokbin.write: opts.header slots must be 3..255, got " .. tostring(k), 2)
    end
    h[k] = bit.tobit(v)
  end
  local tmp = tmpname(path)
  local f, oerr = io.open(tmp, "wb")
  if not f then return nil, ("cannot write token file %s: %s"):format(path, tostring(oerr)) end
  local ok, werr = f:write(ffi.string(h, M.HEADER_BYTES))
  local per = math.min(CHUNK / fmt.width, math.max(n, 1))
  local buf = wide and u32arr(per) or u16arr(per)
  local i = 0
  while ok and i < n do
    local m = math.min(per, n - i)
    for j = 0, m - 1 do buf[j] = tokens[i + j] end
    ok, werr = f:write(ffi.string(buf, m * fmt.width))
    i = i + m
  end
  local cok, cerr = f:close()
  if not ok or not cok then
    os.remove(tmp)
    return nil, ("cannot write token file %s: %s"):format(path, tostring(werr or cerr))
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    return nil, ("cannot write token file %s: rename failed: %s"):format(path, tostring(rerr))
  end
  return true
end

return M
