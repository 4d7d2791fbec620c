-- The TensorBoard writer (record/tensorboard.lua, issue 29 "Tracking
-- tools"), checked from outside: CRC32C against RFC 3720's test vectors and
-- a bit-at-a-time CRC written here, the TFRecord framing and the Event and
-- Summary protobufs decoded by a minimal decoder of this spec's own (any
-- field, any wire type), a resumed file cut back to its checkpoint's step,
-- and the file read by TensorBoard's own EventAccumulator when a venv with
-- PyPI's tensorboard is at /tmp/tbvenv (else pending, saying how to make it).
local ffi = require "ffi"
local bit = require "bit"
local tb = require "ztrain.record.tensorboard"
local util = require "helpers.util"

local TBVENV = os.getenv("ZTRAIN_TBVENV") or "/tmp/tbvenv"

-- CRC32C one bit at a time (no table), for comparison
local function crc_bits(s)
  local crc = 0xFFFFFFFF
  for i = 1, #s do
    crc = bit.bxor(crc, s:byte(i))
    for _ = 1, 8 do
      local low = bit.band(crc, 1)
      crc = bit.rshift(crc, 1)
      if low == 1 then crc = bit.bxor(crc, 0x82F63B78) end
    end
  end
  return bit.bxor(crc, 0xFFFFFFFF) % 2 ^ 32
end

local function masked(s)
  local c = crc_bits(s)
  local rot = (math.floor(c / 2 ^ 15) + (c % 2 ^ 15) * 2 ^ 17) % 2 ^ 32
  return (rot + 0xa282ead8) % 2 ^ 32
end

local function le(s, i, n)
  local v = 0
  for k = n - 1, 0, -1 do v = v * 256 + s:byte(i + k) end
  return v
end

-- frames(s) -> the records' data; every length and CRC checked
local function frames(s)
  local out, i = {}, 1
  while i <= #s do
    assert(i + 11 <= #s, "a header cut short at byte " .. i)
    local n = le(s, i, 8)
    assert.are.equal(masked(s:sub(i, i + 7)), le(s, i + 8, 4), "length CRC at byte " .. i)
    local data = s:sub(i + 12, i + 11 + n)
    assert.are.equal(n, #data, "data cut short at byte " .. i)
    assert.are.equal(masked(data), le(s, i + 12 + n, 4), "data CRC at byte " .. i)
    out[#out + 1] = data
    i = i + 16 + n
  end
  return out
end

-- fields(s) -> { { field, wire type, value } ... }: varints as numbers,
-- fixed64/fixed32 as their 8/4 bytes, length-delimited as the bytes
local function fields(s)
  local out, i = {}, 1
  local function varint()
    local v, mul = 0, 1
    repeat
      local b = s:byte(i)
      i = i + 1
      v, mul = v + (b % 128) * mul, mul * 128
    until b < 128
    return v
  end
  while i <= #s do
    local key = varint()
    local f, wt = math.floor(key / 8), key % 8
    local v
    if wt == 0 then v = varint()
    elseif wt == 1 then v = s:sub(i, i + 7); i = i + 8
    elseif wt == 5 then v = s:sub(i, i + 3); i = i + 4
    elseif wt == 2 then local n = varint(); v = s:sub(i, i + n - 1); i = i + n
    else error("wire type " .. wt) end
    out[#out + 1] = { f, wt, v }
  end
  return out
end

local function as(ctype, bytes)
  local p = ffi.new(ctype .. "[1]")
  ffi.copy(p, bytes, #bytes)
  return tonumber(p[0])
end
local function f32(x) return tonumber(ffi.new("float[1]", x)[0]) end

-- event(data) -> { wall_time, step, file_version, values = { tag = value } }
local function event(data)
  local e = { values = {} }
  for _, fv in ipairs(fields(data)) do
    local f, wt, v = fv[1], fv[2], fv[3]
    if f == 1 then assert.are.equal(1, wt); e.wall_time = as("double", v)
    elseif f == 2 then assert.are.equal(0, wt); e.step = v
    elseif f == 3 then assert.are.equal(2, wt); e.file_version = v
    elseif f == 5 then
      assert.are.equal(2, wt)
      for _, val in ipairs(fields(v)) do
        assert.are.same({ 1, 2 }, { val[1], val[2] })          -- Summary.value
        local tag, num
        for _, tf in ipairs(fields(val[3])) do
          if tf[1] == 1 then assert.are.equal(2, tf[2]); tag = tf[3] end
          if tf[1] == 2 then assert.are.equal(5, tf[2]); num = as("float", tf[3]) end
        end
        e.values[tag] = num
      end
    else error("unexpected Event field " .. f) end
  end
  return e
end

local function events_in(dir)
  local files = {}
  for name in util.sh("ls " .. dir):gmatch("[^\n]+") do
    if name:match("tfevents") then files[#files + 1] = dir .. "/" .. name end
  end
  return files
end

describe("tensorboard: CRC32C", function()
  it("matches RFC 3720's test vectors (B.4) and the check value of \"123456789\"", function()
    assert.are.equal(0x8A9136AA, tb.crc32c(("\0"):rep(32)))
    assert.are.equal(0x62A8AB43, tb.crc32c(("\255"):rep(32)))
    local up, down = {}, {}
    for i = 0, 31 do up[#up + 1] = string.char(i); down[#down + 1] = string.char(31 - i) end
    assert.are.equal(0x46DD794E, tb.crc32c(table.concat(up)))
    assert.are.equal(0x113FDB5C, tb.crc32c(table.concat(down)))
    assert.are.equal(0xE3069283, tb.crc32c("123456789"))
  end)

  it("equals a bit-at-a-time CRC32C on other inputs, and masks as TFRecord does", function()
    for _, s in ipairs({ "", "a", "brain.Event:2", ("xyz\0\255"):rep(50) }) do
      assert.are.equal(crc_bits(s), tb.crc32c(s), s)
      assert.are.equal(masked(s), tb.masked_crc(s), s)
    end
  end)
end)

describe("tensorboard: the encoding", function()
  it("varints are protobuf's (300 is AC 02)", function()
    assert.are.equal("\0", tb.varint(0))
    assert.are.equal("\127", tb.varint(127))
    assert.are.equal("\172\2", tb.varint(300))
    local f = fields("\16" .. tb.varint(2 ^ 40 + 3))
    assert.are.equal(2 ^ 40 + 3, f[1][3])
  end)

  it("a record frames an Event with wall_time, step and the Summary's tagged simple_values", function()
    local data = frames(tb.record(tb.event(1700000000.25, 42, { scalars = { { "loss", 2.5 }, { "lr", 3e-4 } } })))
    assert.are.equal(1, #data)
    local e = event(data[1])
    assert.are.equal(1700000000.25, e.wall_time)
    assert.are.equal(42, e.step)
    assert.are.same({ loss = 2.5, lr = f32(3e-4) }, e.values)
  end)
end)

describe("tensorboard: the writer", function()
  local dir
  before_each(function() dir = util.tmpdir() end)
  after_each(function() util.rm(dir) end)

  local function write_steps(w, a, b)
    for s = a, b do assert(w:scalars(s, 1000 + s, { { "loss", 10 - s }, { "step_ms", s * 1.5 } })) end
  end

  it("starts a file with the brain.Event:2 record, then one event per step", function()
    local w = assert(tb.open(dir .. "/tb"))
    write_steps(w, 1, 3)
    assert(w:close())
    local files = events_in(dir .. "/tb")
    assert.are.equal(1, #files)
    assert.matches("/events%.out%.tfevents%.%d+%..+%.ztrain$", files[1])
    local data = frames(util.read(files[1]))
    assert.are.equal(4, #data)
    assert.are.equal("brain.Event:2", event(data[1]).file_version)
    for s = 1, 3 do
      local e = event(data[s + 1])
      assert.are.same({ s, 1000 + s, { loss = 10 - s, step_ms = s * 1.5 } }, { e.step, e.wall_time, e.values })
    end
  end)

  it("a new run's writer replaces this writer's earlier file in the directory, not another tool's", function()
    util.write(dir .. "/events.out.tfevents.1.other.1", "x")
    for _ = 1, 2 do
      local w = assert(tb.open(dir))
      write_steps(w, 1, 2)
      assert(w:close())
    end
    local files = events_in(dir)
    assert.are.equal(2, #files)
    assert.are.equal(dir .. "/events.out.tfevents.1.other.1", files[1])
    assert.are.equal(3, #frames(util.read(files[2])))
  end)

  it("a resumed writer keeps steps up to the checkpoint, drops a torn record, appends to the same file", function()
    local w = assert(tb.open(dir))
    write_steps(w, 1, 5)
    assert(w:close())
    local path = events_in(dir)[1]
    local f = assert(io.open(path, "ab"))
    f:write(tb.record(tb.event(1, 6, { scalars = { { "loss", 1 } } })):sub(1, 20))   -- killed mid-write
    f:close()
    w = assert(tb.open(dir, { resume = true }))
    assert(w:resume_at(3))
    write_steps(w, 4, 4)
    assert(w:close())
    assert.are.same({ path }, events_in(dir))
    local steps = {}
    for i, d in ipairs(frames(util.read(path))) do steps[i] = event(d).step end
    assert.are.same({ 0, 1, 2, 3, 4 }, steps)
  end)
end)

describe("tensorboard: read back by TensorBoard itself", function()
  local have = util.sh(TBVENV .. "/bin/python -c 'import tensorboard' >/dev/null 2>&1; echo $?"):match("^0")
  if not have then
    pending(("TensorBoard's EventAccumulator: no venv with tensorboard at %s (python3 -m venv %s && " ..
             "%s/bin/pip install tensorboard; or set ZTRAIN_TBVENV)"):format(TBVENV, TBVENV, TBVENV))
    return
  end

  it("EventAccumulator sees every tag's steps and values", function()
    local dir = util.tmpdir()
    local w = assert(tb.open(dir))
    for s = 1, 4 do
      assert(w:scalars(s, 1000 + s, { { "loss", 5 - s / 4 }, { "lr", s * 1e-4 } }))
    end
    assert(w:scalars(4, 1004.5, { { "eval_loss", 4.25 } }))
    assert(w:close())
    local py = ([[
from tensorboard.backend.event_processing import event_accumulator as ea
a = ea.EventAccumulator(%q, size_guidance={ea.SCALARS: 0})
a.Reload()
print("version", a.file_version)
for t in sorted(a.Tags()["scalars"]):
    print(t, " ".join("%%d:%%.9g" %% (e.step, e.value) for e in a.Scalars(t)))
]]):format(dir)
    util.write(dir .. "/read.py", py)
    local out, rc = util.sh(TBVENV .. "/bin/python " .. dir .. "/read.py")
    util.rm(dir)
    assert.are.equal(0, rc, out)
    assert.matches("version 2.0\n", out, 1, true)
    local function g(x) return ("%.9g"):format(f32(x)) end
    assert.matches("eval_loss 4:4.25\n", out, 1, true)
    assert.matches("loss 1:4.75 2:4.5 3:4.25 4:4\n", out, 1, true)
    assert.matches(("lr 1:%s 2:%s 3:%s 4:%s\n"):format(g(1e-4), g(2e-4), g(3e-4), g(4e-4)), out, 1, true)
  end)
end)
