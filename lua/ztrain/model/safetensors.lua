-- ztrain.model.safetensors: read and write Hugging Face safetensors files.
--
-- Format (https://github.com/huggingface/safetensors): an 8-byte
-- little-endian header length N, N bytes of JSON
--   { "__metadata__": { str: str }?,
--     NAME: { "dtype": "F32", "shape": [d0, ...], "data_offsets": [lo, hi] }, ... }
-- then the data: tensor NAME's bytes are [8 + N + lo, 8 + N + hi) of the
-- file, row-major, little-endian.
--
--   local st = require "ztrain.model.safetensors"
--   local f = st.open(path)            -- every entry checked (below)
--   f.tensors[name] -> { name, dtype, shape, numel, lo, hi }
--   f:read_f32(name, dst)              -- float* of numel: F32/F16/BF16 as fp32
--   local w = st.writer(path, { { name, shape }, ... }, { metadata = {...} })
--   w:write(ptr, nbytes) ... w:commit()  -- F32 tensors in the listed order
--
-- open() trusts nothing in the file: the header length must fit in the
-- file, the header must be a JSON object of well-formed entries, every
-- dtype known, every shape's element count times its dtype's size must
-- equal its byte span, every span must lie inside the data, and no two
-- spans may overlap. Each failure is a user error (error(msg, 0)) naming
-- the file, the tensor and the inconsistency. Values are read with pread
-- into the caller's memory; a file that shrank since open() is caught too.
--
-- Writing is atomic: a temporary file in the same directory, fsync, rename,
-- fsync of the directory. A failed or abandoned write leaves the old file
-- (or none), never half of one.
local ffi = require "ffi"
local bit = require "bit"
local cjson = require "cjson.safe"

local M = {}

-- bytes per element of every dtype the format defines
M.DTYPE_SIZE = { F64 = 8, F32 = 4, F16 = 2, BF16 = 2, I64 = 8, I32 = 4, I16 = 2, I8 = 1,
                 U64 = 8, U32 = 4, U16 = 2, U8 = 1, BOOL = 1, F8_E4M3 = 1, F8_E5M2 = 1 }
-- the ones read_f32 converts
M.READABLE = { F32 = true, F16 = true, BF16 = true }
-- safetensors' own reader refuses headers above 100 MB; so do we (a corrupt
-- length would otherwise ask for gigabytes)
M.MAX_HEADER = 100 * 1000 * 1000

-- libc, under private names (no clash with a user's own cdef of open() etc.)
if not pcall(function() return ffi.C.ztrain_st_open end) then
  ffi.cdef [[
  int ztrain_st_open(const char *path, int flags, ...) __asm__("open");
  int ztrain_st_close(int fd) __asm__("close");
  int64_t ztrain_st_pread(int fd, void *buf, size_t n, int64_t off) __asm__("pread64");
  int64_t ztrain_st_write(int fd, const void *buf, size_t n) __asm__("write");
  int64_t ztrain_st_lseek(int fd, int64_t off, int whence) __asm__("lseek64");
  int ztrain_st_fsync(int fd) __asm__("fsync");
  int ztrain_st_unlink(const char *path) __asm__("unlink");
  int ztrain_st_rename(const char *from, const char *to) __asm__("rename");
  char *ztrain_st_strerror(int errnum) __asm__("strerror");
  int ztrain_st_getpid(void) __asm__("getpid");
  ]]
end
local C = ffi.C
local O_RDONLY, O_WRONLY, O_CREAT, O_TRUNC, O_CLOEXEC = 0, 1, 0x40, 0x200, 0x80000
local SEEK_END = 2

local function fail(msg) error(msg, 0) end
local function syserr() return ffi.string(C.ztrain_st_strerror(ffi.errno())) end

-- open_fd(path, flags, mode) -> fd | nil, err
local function open_fd(path, flags, mode)
  local fd = C.ztrain_st_open(path, flags, ffi.new("int", mode or 0))
  if fd < 0 then return nil, syserr() end
  return fd
end

local function file_size(fd) return tonumber(C.ztrain_st_lseek(fd, 0, SEEK_END)) end

-- pread exactly n bytes at off into buf, or nil, err
local function pread_all(fd, buf, n, off)
  local p, done = ffi.cast("uint8_t*", buf), 0
  while done < n do
    local got = tonumber(C.ztrain_st_pread(fd, p + done, n - done, off + done))
    if got < 0 then return nil, syserr() end
    if got == 0 then return nil, ("the file ends %d bytes early"):format(n - done) end
    done = done + got
  end
  return true
end

local function write_all(fd, buf, n)
  local p, done = ffi.cast("const uint8_t*", buf), 0
  while done < n do
    local put = tonumber(C.ztrain_st_write(fd, p + done, n - done))
    if put < 0 then return nil, syserr() end
    done = done + put
  end
  return true
end

local function shape_text(shape)
  local s = {}
  for i, d in ipairs(shape) do s[i] = tostring(d) end
  return "[" .. table.concat(s, ", ") .. "]"
end
M.shape_text = shape_text

local function is_count(x) return type(x) == "number" and x >= 0 and x == math.floor(x) and x < 2 ^ 53 end

---------------------------------------------------------------------------
-- Reading

local File = {}
File.__index = File

-- read_header(path) -> { size = file bytes, n = header bytes, text = the header }:
-- the header length checked against the file's size and the limit
local function read_header(path)
  local fd, err = open_fd(path, O_RDONLY + O_CLOEXEC)
  if not fd then fail(("cannot open %s: %s"):format(path, err)) end
  local ok, res = pcall(function()
    local size = file_size(fd)
    if size < 8 then
      fail(("%s: %d bytes, too short for a safetensors file (it starts with an 8-byte header length); " ..
            "the file is truncated or not safetensors"):format(path, size))
    end
    local lenbuf = ffi.new("uint8_t[8]")
    assert(pread_all(fd, lenbuf, 8, 0))
    local n = 0
    for i = 7, 0, -1 do n = n * 256 + lenbuf[i] end   -- u64 LE (exact below 2^53)
    if n > size - 8 then
      fail(("%s: header length %.0f runs past the end of the file (%d bytes, %d after the length); " ..
            "the file is truncated or not safetensors"):format(path, n, size, size - 8))
    end
    if n > M.MAX_HEADER then
      fail(("%s: header length %.0f is above safetensors' limit of %d bytes; the file is corrupt")
           :format(path, n, M.MAX_HEADER))
    end
    if n < 2 then fail(("%s: header length %d cannot hold a JSON object; the file is corrupt"):format(path, n)) end
    local hbuf = ffi.new("uint8_t[?]", n)
    assert(pread_all(fd, hbuf, n, 8))
    return { size = size, n = n, text = ffi.string(hbuf, n) }
  end)
  C.ztrain_st_close(fd)
  if not ok then error(res, 0) end
  return res
end

-- check_entry(self, name, e, header_len) -> { name, dtype, shape, numel, lo, hi }:
-- header entry e of tensor `name` well-formed, its span inside self's data and
-- as long as its shape and dtype say
local function check_entry(self, name, e, header_len)
  local function bad(what) fail(("%s: tensor %s: %s"):format(self.path, name, what)) end
  if type(e) ~= "table" then bad("the entry is not an object") end
  if type(e.dtype) ~= "string" then bad('no "dtype"') end
  local esize = M.DTYPE_SIZE[e.dtype]
  if not esize then bad(("unknown dtype %q"):format(e.dtype)) end
  if type(e.shape) ~= "table" then bad('no "shape" list') end
  -- a JSON object decodes to a table too: {"rows": 3} is no shape
  local entries = 0
  for _ in pairs(e.shape) do entries = entries + 1 end
  if entries ~= #e.shape then bad('"shape" must be a list of sizes, as [768, 3072]') end
  local numel = 1
  for i = 1, #e.shape do
    if not is_count(e.shape[i]) then bad(("shape entry %s is not a whole number >= 0"):format(tostring(e.shape[i]))) end
    numel = numel * e.shape[i]
  end
  local off = e.data_offsets
  if type(off) ~= "table" or #off ~= 2 or not is_count(off[1]) or not is_count(off[2]) then
    bad('"data_offsets" must be two whole numbers [begin, end]')
  end
  local lo, hi = off[1], off[2]
  if lo > hi then bad(("data_offsets [%.0f, %.0f] end before they begin"):format(lo, hi)) end
  if hi > self.data_size then
    bad(("data_offsets [%.0f, %.0f] reach past the end of the data (%d bytes after the %d-byte header); " ..
         "the file is truncated or corrupt"):format(lo, hi, self.data_size, header_len))
  end
  if numel * esize ~= hi - lo then
    bad(("shape %s is %.0f elements = %.0f bytes of %s, but data_offsets [%.0f, %.0f] span %.0f bytes")
        :format(shape_text(e.shape), numel, numel * esize, e.dtype, lo, hi, hi - lo))
  end
  return { name = name, dtype = e.dtype, shape = e.shape, numel = numel, lo = lo, hi = hi }
end

-- check_overlaps(self): no two tensors may share bytes (a writer bug or a crafted file)
local function check_overlaps(self)
  local spans = {}
  for _, name in ipairs(self.names) do
    local t = self.tensors[name]
    if t.hi > t.lo then spans[#spans + 1] = t end
  end
  table.sort(spans, function(a, b) return a.lo < b.lo or (a.lo == b.lo and a.name < b.name) end)
  for i = 2, #spans do
    if spans[i].lo < spans[i - 1].hi then
      fail(("%s: tensors %s [%.0f, %.0f] and %s [%.0f, %.0f] overlap; the file is corrupt")
           :format(self.path, spans[i - 1].name, spans[i - 1].lo, spans[i - 1].hi, spans[i].name, spans[i].lo, spans[i].hi))
    end
  end
end

-- open(path) -> file: the header parsed and every entry checked against
-- the file's size and each other. The file is not held open.
function M.open(path)
  local res = read_header(path)
  local header, jerr = cjson.decode(res.text)
  if type(header) ~= "table" or res.text:match("^%s*%[") then
    fail(("%s: the header is not a JSON object (%s); the file is corrupt or not safetensors")
         :format(path, jerr or ("a " .. type(header))))
  end
  local self = setmetatable({ path = path, size = res.size, data_start = 8 + res.n,
                              data_size = res.size - 8 - res.n, tensors = {}, names = {} }, File)
  if header.__metadata__ ~= nil then
    if type(header.__metadata__) ~= "table" then
      fail(("%s: __metadata__ must be a JSON object of strings"):format(path))
    end
    self.metadata = header.__metadata__
    header.__metadata__ = nil
  end
  for name, e in pairs(header) do
    self.tensors[name] = check_entry(self, name, e, res.n)
    self.names[#self.names + 1] = name
  end
  check_overlaps(self)
  table.sort(self.names)
  return self
end

-- F16 -> fp32 for every bit pattern (exact: every half is a float)
local f16_table
local function f16_to_f32()
  if f16_table then return f16_table end
  f16_table = ffi.new("float[65536]")
  for h = 0, 65535 do
    local s = h >= 0x8000 and -1 or 1
    local e = bit.band(bit.rshift(h, 10), 0x1f)
    local m = bit.band(h, 0x3ff)
    local v
    if e == 0 then v = m * 2 ^ -24                      -- zero and subnormals
    elseif e == 31 then v = m == 0 and math.huge or 0 / 0
    else v = (1024 + m) * 2 ^ (e - 25) end
    f16_table[h] = s * v
  end
  return f16_table
end

-- Elements per read: the raw bytes of a slice go through this scratch (so
-- a 300 MB embedding never needs a second copy of itself).
local SLICE = 1024 * 1024

-- read_f32(name, dst[, first, count]): elements [first, first + count) of
-- tensor `name` (default: all of it) into dst (float* of count), as fp32.
function File:read_f32(name, dst, first, count)
  local t = self.tensors[name]
  if not t then fail(("%s: no tensor %s"):format(self.path, name)) end
  if not M.READABLE[t.dtype] then
    fail(("%s: tensor %s has dtype %s; ztrain reads F32, F16 and BF16 tensors (convert the checkpoint, " ..
          "e.g. model.float().save_pretrained(DIR))"):format(self.path, name, t.dtype))
  end
  local fd, err = open_fd(self.path, O_RDONLY + O_CLOEXEC)
  if not fd then fail(("cannot open %s: %s"):format(self.path, err)) end
  local ok, rerr = pcall(function()
    local size = file_size(fd)
    if size ~= self.size then
      fail(("%s changed while it was read (%d bytes, was %d): reading tensor %s"):format(self.path, size, self.size, name))
    end
    dst = ffi.cast("float*", dst)
    first = first or 0
    count = count or t.numel - first
    assert(first >= 0 and count >= 0 and first + count <= t.numel, "read_f32: range outside the tensor")
    local esize = M.DTYPE_SIZE[t.dtype]
    local base = self.data_start + t.lo + first * esize
    if t.dtype == "F32" then
      local okr, e = pread_all(fd, dst, count * 4, base)
      if not okr then fail(("%s: reading tensor %s: %s"):format(self.path, name, e)) end
      return
    end
    local raw = ffi.new("uint16_t[?]", math.min(SLICE, math.max(count, 1)))
    local tab = t.dtype == "F16" and f16_to_f32() or nil
    local i32 = ffi.cast("int32_t*", dst)
    for off = 0, count - 1, SLICE do
      local n = math.min(SLICE, count - off)
      local okr, e = pread_all(fd, raw, n * 2, base + off * 2)
      if not okr then fail(("%s: reading tensor %s: %s"):format(self.path, name, e)) end
      if tab then
        for i = 0, n - 1 do dst[off + i] = tab[raw[i]] end
      else                                   -- bf16: the high half of an fp32
        for i = 0, n - 1 do i32[off + i] = bit.lshift(raw[i], 16) end
      end
    end
  end)
  C.ztrain_st_close(fd)
  if not ok then error(rerr, 0) end
end

-- read_raw(name) -> Lua string of the tensor's bytes (any dtype; for checks).
function File:read_raw(name)
  local t = self.tensors[name]
  if not t then fail(("%s: no tensor %s"):format(self.path, name)) end
  local fd, err = open_fd(self.path, O_RDONLY + O_CLOEXEC)
  if not fd then fail(("cannot open %s: %s"):format(self.path, err)) end
  local n = t.hi - t.lo
  local buf = ffi.new("uint8_t[?]", math.max(n, 1))
  local ok, e = pread_all(fd, buf, n, self.data_start + t.lo)
  C.ztrain_st_close(fd)
  if not ok then fail(("%s: reading tensor %s: %s"):format(self.path, t.name, e)) end
  return ffi.string(buf, n)
end

---------------------------------------------------------------------------
-- Writing (F32 only: what ztrain's parameters are)

local Writer = {}
Writer.__index = Writer

local function fsync_dir(path)
  local dir = path:match("^(.*)/[^/]*$") or "."
  if dir == "" then dir = "/" end
  local fd = open_fd(dir, O_RDONLY + O_CLOEXEC)
  if fd then C.ztrain_st_fsync(fd); C.ztrain_st_close(fd) end
end

-- header_text(entries, metadata) -> JSON text padded with spaces to a
-- multiple of 8 bytes (the data then starts 8-aligned), total data bytes
function M.header_text(entries, metadata)
  local parts, off = {}, 0
  if metadata then
    local keys = {}
    for k in pairs(metadata) do keys[#keys + 1] = k end
    table.sort(keys)
    local kv = {}
    for _, k in ipairs(keys) do kv[#kv + 1] = cjson.encode(tostring(k)) .. ":" .. cjson.encode(tostring(metadata[k])) end
    parts[#parts + 1] = '"__metadata__":{' .. table.concat(kv, ",") .. "}"
  end
  for _, e in ipairs(entries) do
    local n = 1
    for _, d in ipairs(e.shape) do n = n * d end
    local dims = {}
    for i, d in ipairs(e.shape) do dims[i] = ("%d"):format(d) end
    e.lo, e.hi = off, off + 4 * n
    parts[#parts + 1] = ('%s:{"dtype":"F32","shape":[%s],"data_offsets":[%.0f,%.0f]}')
                        :format(cjson.encode(e.name), table.concat(dims, ","), e.lo, e.hi)
    off = e.hi
  end
  local text = "{" .. table.concat(parts, ",") .. "}"
  text = text .. (" "):rep((8 - #text % 8) % 8)
  return text, off
end

-- writer(path, entries, {metadata=}) -> w. entries: { { name=, shape= }, ... }
-- in file order; w:write(ptr, nbytes) appends their fp32 bytes in that order;
-- w:commit() checks the count, fsyncs and renames into place; w:abort()
-- removes the temporary file. Nothing appears at `path` before commit.
function M.writer(path, entries, opts)
  opts = opts or {}
  local header, total = M.header_text(entries, opts.metadata)
  local tmp = ("%s.tmp-%d"):format(path, C.ztrain_st_getpid())
  local fd, err = open_fd(tmp, O_WRONLY + O_CREAT + O_TRUNC + O_CLOEXEC, 420)  -- 0644
  if not fd then fail(("cannot write %s: %s"):format(tmp, err)) end
  local self = setmetatable({ path = path, tmp = tmp, fd = fd, total = total, written = 0 }, Writer)
  local len = ffi.new("uint8_t[8]")
  local n = #header
  for i = 0, 7 do len[i] = n % 256; n = math.floor(n / 256) end
  local ok, werr = write_all(fd, len, 8)
  if ok then ok, werr = write_all(fd, header, #header) end
  if not ok then self:abort(); fail(("cannot write %s: %s"):format(tmp, werr)) end
  return self
end

function Writer:write(ptr, nbytes)
  if not self.fd then fail("safetensors writer: write after commit or abort") end
  if self.written + nbytes > self.total then
    fail(("safetensors writer %s: %d bytes more than the header's %d"):format(self.path, self.written + nbytes - self.total,
         self.total))
  end
  local ok, err = write_all(self.fd, ptr, nbytes)
  if not ok then fail(("cannot write %s: %s"):format(self.tmp, err)) end
  self.written = self.written + nbytes
end

function Writer:commit()
  if self.written ~= self.total then
    fail(("safetensors writer %s: %d of the header's %d data bytes written"):format(self.path, self.written, self.total))
  end
  if C.ztrain_st_fsync(self.fd) ~= 0 then fail(("cannot write %s: fsync: %s"):format(self.tmp, syserr())) end
  local rc = C.ztrain_st_close(self.fd)
  self.fd = nil
  if rc ~= 0 then local e = syserr(); C.ztrain_st_unlink(self.tmp); fail(("cannot write %s: %s"):format(self.tmp, e)) end
  if C.ztrain_st_rename(self.tmp, self.path) ~= 0 then
    local e = syserr()
    C.ztrain_st_unlink(self.tmp)
    fail(("cannot rename %s to %s: %s"):format(self.tmp, self.path, e))
  end
  fsync_dir(self.path)
end

function Writer:abort()
  if self.fd then C.ztrain_st_close(self.fd); self.fd = nil end
  C.ztrain_st_unlink(self.tmp)
end

-- write_file_atomic(path, text): a small file (config.json) the same way.
function M.write_file_atomic(path, text)
  local tmp = ("%s.tmp-%d"):format(path, C.ztrain_st_getpid())
  local fd, err = open_fd(tmp, O_WRONLY + O_CREAT + O_TRUNC + O_CLOEXEC, 420)
  if not fd then fail(("cannot write %s: %s"):format(tmp, err)) end
  local ok, werr = write_all(fd, text, #text)
  if ok and C.ztrain_st_fsync(fd) ~= 0 then ok, werr = nil, syserr() end
  C.ztrain_st_close(fd)
  if ok and C.ztrain_st_rename(tmp, path) ~= 0 then ok, werr = nil, syserr() end
  if not ok then C.ztrain_st_unlink(tmp); fail(("cannot write %s: %s"):format(path, werr)) end
  fsync_dir(path)
end

return M
