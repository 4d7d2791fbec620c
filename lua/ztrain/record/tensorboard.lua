-- ztrain.record.tensorboard: TensorBoard event files, written by hand.
--
--   local w = tensorboard.open(dir[, { resume = true }]) -> writer | nil, err
--   w:scalars(step, wall_time, { { "loss", 2.5 }, ... }) -> true | nil, err
--   w:resume_at(step) -> true | nil, err;  w:close() -> true | nil, err
--
-- An events file (events.out.tfevents.TIME.HOST.PID.ztrain: TensorBoard reads
-- every file whose name holds "tfevents") is a TFRecord file: each record is
--   uint64 length, uint32 masked CRC32C of those 8 bytes,
--   the data, uint32 masked CRC32C of the data
-- (little-endian; mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8),
-- as tensorflow/core/lib/io/record_writer.cc writes it, the format comment
-- of tensorflow/python/lib/io/python_io.py states it, and tensorboardX's
-- record_writer.py (struct.pack('Q', len), masked_crc32c of the header,
-- the data, masked_crc32c of the data) does it. The data is a serialized
-- Event (tensorboard/compat/proto/event.proto, tensorflow/core/util/event.proto):
--   double wall_time = 1; int64 step = 2;
--   oneof what { string file_version = 3; ... Summary summary = 5; ... }
-- the first record carrying file_version "brain.Event:2" (what TensorFlow's
-- and tensorboardX's writers put first), the rest a Summary
-- (tensorboard/compat/proto/summary.proto):
--   message Summary { repeated Value value = 1; }
--   message Value { string tag = 1; oneof value { float simple_value = 2; ... } }
-- The field numbers were checked against those files (and TensorBoardLogger.jl's
-- and MindInsight's copies of event.proto). Protobuf's wire format: a key
-- is varint(field << 3 | wire type); 1 = fixed64, 5 = fixed32, 2 = a varint
-- length then the bytes, 0 = a varint.
--
-- Each record goes out in one write through durable.appender, so the file
-- holds whole records (a write that fails is cut back, as metrics.jsonl's
-- lines are). A resumed run keeps the records up to its checkpoint's step
-- (resume_at) and appends to the same file: no step twice.
local ffi = require "ffi"
local bit = require "bit"
local durable = require "ztrain.util.durable"
local fs = require "ztrain.util.fs"
local libc = require "ztrain.core.libc"
local host = require "ztrain.util.host"

local M = {}

assert(ffi.abi("le"), "tensorboard: event files are little-endian; this writer assumes a little-endian host")

-- CRC32C (Castagnoli, reflected polynomial 0x82F63B78), one table of 256
local CRC_TABLE = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if bit.band(c, 1) ~= 0 then c = bit.bxor(bit.rshift(c, 1), 0x82F63B78) else c = bit.rshift(c, 1) end
  end
  CRC_TABLE[i] = c
end

-- crc32c(s) -> the CRC32C of string s, as a number in [0, 2^32)
function M.crc32c(s)
  local crc = -1
  for i = 1, #s do
    crc = bit.bxor(bit.rshift(crc, 8), CRC_TABLE[bit.band(bit.bxor(crc, s:byte(i)), 0xff)])
  end
  return bit.bnot(crc) % 2 ^ 32
end

-- masked_crc(s) -> the masked CRC32C TFRecord stores (in [0, 2^32))
function M.masked_crc(s)
  return (bit.ror(M.crc32c(s), 15) % 2 ^ 32 + 0xa282ead8) % 2 ^ 32
end

local u32, u64 = ffi.new("uint32_t[1]"), ffi.new("uint64_t[1]")
local f32, f64 = ffi.new("float[1]"), ffi.new("double[1]")
local function fixed32(n) u32[0] = n; return ffi.string(u32, 4) end
local function fixed64(n) u64[0] = n; return ffi.string(u64, 8) end

-- varint(n) -> protobuf's base-128 varint of a whole number 0 <= n < 2^53
function M.varint(n)
  local out = {}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  return table.concat(out)
end
local varint = M.varint

-- a length-delimited field (wire type 2)
local function bytes_field(field, s) return varint(field * 8 + 2) .. varint(#s) .. s end

-- event(wall_time, step, what) -> a serialized Event: what.file_version
-- (a string), or what.scalars ({ { tag, value } ... }: one Summary.Value
-- each, simple_value as a 32-bit float, as TensorBoard stores scalars)
function M.event(wall_time, step, what)
  f64[0] = wall_time
  local parts = { varint(1 * 8 + 1), ffi.string(f64, 8), varint(2 * 8 + 0), varint(step) }
  if what.file_version then parts[#parts + 1] = bytes_field(3, what.file_version) end
  if what.scalars then
    local values = {}
    for _, tv in ipairs(what.scalars) do
      f32[0] = tv[2]
      values[#values + 1] = bytes_field(1, bytes_field(1, tv[1]) .. varint(2 * 8 + 5) .. ffi.string(f32, 4))
    end
    parts[#parts + 1] = bytes_field(5, table.concat(values))
  end
  return table.concat(parts)
end

-- record(data) -> data framed as one TFRecord
function M.record(data)
  local len = fixed64(#data)
  return len .. fixed32(M.masked_crc(len)) .. data .. fixed32(M.masked_crc(data))
end

local function le(s, i, n)      -- an unsigned little-endian integer of n bytes at i
  local v = 0
  for k = n - 1, 0, -1 do v = v * 256 + s:byte(i + k) end
  return v
end

-- records(s) -> the whole records of a file's bytes, in order ({ data,
-- start, stop }); reading ends at the first record cut short or whose
-- CRCs do not match (a run killed mid-write leaves at most that one)
function M.records(s)
  local out, i = {}, 1
  while i + 11 <= #s do
    local head = s:sub(i, i + 7)
    local n = le(s, i, 8)
    if le(s, i + 8, 4) ~= M.masked_crc(head) or i + 15 + n > #s then break end
    local data = s:sub(i + 12, i + 11 + n)
    if le(s, i + 12 + n, 4) ~= M.masked_crc(data) then break end
    out[#out + 1] = { data = data, start = i, stop = i + 15 + n }
    i = i + 16 + n
  end
  return out
end

-- step_of(data) -> an Event's step (0 when absent), whether it is the
-- file_version record: the fields this writer puts first (wall_time, step)
function M.step_of(data)
  local i, step = 1, 0
  while i <= #data do
    local key = data:byte(i)
    if key == 0x09 then i = i + 9                                -- wall_time
    elseif key == 0x10 then                                      -- step
      local v, mul = 0, 1
      repeat
        i = i + 1
        local b = data:byte(i)
        v, mul = v + (b % 128) * mul, mul * 128
      until b < 128
      step, i = v, i + 1
    else return step, key == 0x1A end                            -- 0x1A: file_version
  end
  return step, false
end

local Writer = {}
Writer.__index = Writer

-- the newest events file this writer made in dir (names sort by their
-- start time), or nil; another tool's files there are left alone
local function newest(dir)
  local files = fs.glob(dir .. "/events.out.tfevents.*.ztrain") or {}
  return files[#files]
end

-- open(dir, opts) -> a writer appending to a new events file in dir (the
-- run's own: earlier files of this writer there are removed, as a new run
-- truncates its CSV; other tools' files stay), or with opts.resume to the
-- newest one there (a new one if none)
function M.open(dir, opts)
  local ok, err = fs.mkdirs(dir, "directory")
  if not ok then return nil, err end
  local resume = opts and opts.resume
  if not resume then
    for _, old in ipairs(fs.glob(dir .. "/events.out.tfevents.*.ztrain") or {}) do os.remove(old) end
  end
  local path = resume and newest(dir)
  if not path then
    path = ("%s/events.out.tfevents.%010d.%s.%d.ztrain"):format(dir, math.floor(libc.now()), host.hostname(),
                                                                 libc.getpid())
  end
  local a, aerr = durable.appender(path, { append = true })
  if not a then return nil, aerr end
  local w = setmetatable({ a = a, path = path }, Writer)
  if a.size == 0 then
    local okw, werr = a:append(M.record(M.event(libc.now(), 0, { file_version = "brain.Event:2" })))
    if not okw then a:close(); return nil, werr end
  end
  return w
end

-- scalars(step, wall_time, list) -> true | nil, err: one Event holding
-- every { tag, value } of the step, in one record
function Writer:scalars(step, wall_time, list)
  return self.a:append(M.record(M.event(wall_time, step, { scalars = list })))
end

-- resume_at(step) -> true | nil, err: keep the file's records up to
-- `step` (the file_version record, then steps <= step; anything after a
-- record cut short goes too), rewritten atomically, then append after them
function Writer:resume_at(step)
  local okc, cerr = self.a:close()
  if not okc then return nil, cerr end
  local text = fs.read_file(self.path) or ""
  local kept = {}
  for _, rec in ipairs(M.records(text)) do
    local s, version = M.step_of(rec.data)
    if version or s <= step then kept[#kept + 1] = text:sub(rec.start, rec.stop) end
  end
  local okw, werr = durable.write_atomic(self.path, table.concat(kept))
  if not okw then return nil, werr end
  local a, aerr = durable.appender(self.path, { append = true })
  if not a then return nil, aerr end
  self.a = a
  return true
end

function Writer:close() return self.a:close() end

return M
