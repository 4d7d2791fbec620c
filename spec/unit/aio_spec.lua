-- The nvme tier and the aio engine from Lua: nvme tensors written from host
-- and read back bit for bit (through a copy stream and synchronously, with
-- checksums), accounted on tier nvme; a swap file changed underneath is an
-- error naming it; bad paths are clear errors; the raw engine's requests
-- polled and waited; swap files gone after shutdown. Everything runs on
-- each engine that opens here (io_uring, where this build and kernel have
-- it, and libuv's thread pool), forced by the engine option.
local ffi = require "ffi"
local zt = require "ztrain"
local T, ops = zt.tensor, zt.ops
local stream = require "ztrain.core.stream"
local aio = require "ztrain.core.aio"
local memory = require "ztrain.core.memory"
local libc = require "ztrain.core.libc"
local home = require("ztrain.core.ffi").home
local fs = require "ztrain.util.fs"
local offload = require "ztrain.parallel.strategy.offload"
local util = require "helpers.util"

ffi.cdef [[ int memcmp(const void *a, const void *b, size_t n); ]]

local function raises(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function tmpdir()
  local buf = ffi.new("char[64]", "/tmp/zt_aio_spec_XXXXXX")
  assert(libc.mkdtemp(buf) ~= nil, "mkdtemp failed")
  return ffi.string(buf)
end

local function entries(dir)
  local out = {}
  local p = io.popen("ls -A '" .. dir .. "' 2>/dev/null")
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- A host tensor of n f32 with values from f(i).
local function host(n, f)
  local t = T.new({ n }, { tier = "host" })
  local p = t:ptr()
  for i = 0, n - 1 do p[i] = f(i) end
  return t
end

local engines, no_uring = aio.engines()
if not engines[2] then print(("aio_spec: io_uring skipped (%s)"):format(no_uring)) end

for _, engine in ipairs(engines) do
local E = engine == "io_uring" and "uring" or "threads"
-- aio.configure / aio.open with this pass's engine forced
local function conf(t) t.engine = E; return aio.configure(t) end
local function open(t) t.engine = E; return aio.open(t) end

describe(("the nvme tier (%s)"):format(engine), function()
  local dir

  before_each(function() dir = tmpdir() end)
  after_each(function()
    pcall(aio.shutdown)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("an nvme tensor written from host reads back bit-exact, with checksums", function()
    local info = conf { path = dir, checksum = true, block_bytes = "64KiB", queue_depth = 4 }
    assert.is_string(info.mode)
    assert.is_true(info.checksum)
    assert.are.equal(65536, info.block_bytes)
    assert.are.equal(4, info.queue_depth)
    assert.are.equal(engine, info.engine)
    assert.matches(engine .. " (asked for)", info.summary, 1, true)
    assert.matches(dir, info.dir, 1, true)
    assert.matches("nvme: " .. info.mode, info.summary, 1, true)

    local n = 100003                                    -- not a page multiple
    local nv = T.new({ n }, { tier = "nvme", category = "optim" })
    assert.are.equal("nvme", nv:tier())
    assert.are.equal(n * 4, memory.current("nvme", "optim"))
    local src = host(n, function(i) return math.sin(i) * 1e3 + i end)
    local dst = T.new({ n }, { tier = "host" })

    local cs = stream.new("copy")
    cs:copy_async(nv, src)
    cs:copy_async(dst, nv)                              -- in order on one stream
    local ev = cs:record()
    ev:sync()
    assert.are.equal(0, ffi.C.memcmp(dst:ptr(), src:ptr(), n * 4))

    -- synchronously, through a view at an unaligned offset
    local v = nv:view(7, { 1000 })
    local vals = ffi.new("float[1000]")
    for i = 0, 999 do vals[i] = -i - 0.25 end
    v:write(vals)
    local back = ffi.new("float[?]", n)
    nv:read(back)
    for i = 0, n - 1 do
      local want = (i >= 7 and i < 1007) and vals[i - 7] or src:ptr()[i]
      if back[i] ~= want then error(("element %d: %g, want %g"):format(i, back[i], want)) end
    end
    local st = aio.stats()
    assert.is_true(st.bytes_written >= n * 4 and st.bytes_read >= n * 4)
    assert.are.equal(0, st.errors)

    local path, off = aio.path_of(v)
    assert.are.equal(28, off)
    assert.is_true(exists(path))
    v:free(); nv:free(); src:free(); dst:free(); ev:free(); cs:free()
    assert.are.equal(0, memory.current("nvme"))
    assert.is_false(exists(path))
  end)

  it("a registered host tensor moves the same bytes (io_uring: as a fixed buffer)", function()
    conf { path = dir, checksum = true }
    local n = 262144                                    -- 1 MiB: one block
    local nv = T.new({ n }, { tier = "nvme" })
    local src = host(n, function(i) return i * 0.5 - 7 end)
    local dst = T.new({ n }, { tier = "host" })
    local hs, why = aio.register(src)
    if not hs and why:find("RLIMIT_MEMLOCK", 1, true) then   -- not root, a small locked-memory limit
      pending("io_uring cannot register memory here: " .. why)
      nv:free(); src:free(); dst:free()
      return
    end
    local hd = assert(aio.register(dst))
    local before = aio.stats().registered
    nv:write(src:ptr())
    nv:read(dst:ptr())
    assert.are.equal(0, ffi.C.memcmp(dst:ptr(), src:ptr(), n * 4))
    assert.are.equal(engine == "io_uring" and 2 or 0, aio.stats().registered - before)
    aio.unregister(hs); aio.unregister(hd)
    local err = raises(aio.unregister, hd)
    assert.matches("not registered", err, 1, true)
    nv:free(); src:free(); dst:free()
  end)

  it("a swap file changed underneath fails the copy with the file and offset", function()
    conf { path = dir, checksum = true }
    local n = 4096
    local nv = T.new({ n }, { tier = "nvme" })
    local src = host(n, function(i) return i end)
    nv:write(src:ptr())
    local path = aio.path_of(nv)
    local f = assert(io.open(path, "r+b"))
    f:seek("set", 5000)
    f:write("\255")
    f:close()
    local cs = stream.new("copy")
    cs:copy_async(src, nv)
    local ev = cs:record()
    local err = raises(ev.sync, ev)
    assert.matches("checksum mismatch", err, 1, true)
    assert.matches(path, err, 1, true)
    assert.matches("offset 4096", err, 1, true)
    err = raises(cs.sync, cs)                           -- the stream reports it too
    assert.matches("checksum mismatch", err, 1, true)
    cs:sync()                                           -- reported once, then cleared
    ev:free(); cs:free(); nv:free(); src:free()
  end)

  it("ops refuse nvme tensors; bytes move only to and from host", function()
    conf { path = dir }
    local nv = T.new({ 8 }, { tier = "nvme" })
    local d = T.new({ 8 }, { tier = "device" })
    local err = raises(ops.add, nv, nv)
    assert.matches("nvme", err, 1, true)
    err = raises(stream.copy_async, d, nv)
    assert.matches("through a host tensor", err, 1, true)
    err = raises(nv.ptr, nv)
    assert.matches("nvme tier", err, 1, true)
    err = raises(conf, { path = dir })
    assert.matches("still exist", err, 1, true)
    nv:free(); d:free()
  end)

  it("bad paths and options are clear errors", function()
    local err = raises(conf, { path = dir .. "/no/such" })
    assert.matches(dir .. "/no/such", err, 1, true)
    assert.matches("does not exist", err, 1, true)
    local file = dir .. "/plain"
    io.open(file, "w"):close()
    err = raises(conf, { path = file })
    assert.matches("not a directory", err, 1, true)
    -- the runtime names its own thing; the offload strategy adds the recipe key
    assert.matches("point the swap directory at a directory", err, 1, true)
    assert.is_nil(err:find("offload.nvme_path", 1, true))
    err = raises(conf, { path = dir, block_bytes = 1000 })
    assert.matches("multiple of 4096", err, 1, true)
    err = raises(conf, { path = dir, queue_dpeth = 4 })
    assert.matches("unknown option \"queue_dpeth\"", err, 1, true)
    err = raises(conf, { path = dir, block_bytes = "1 Mib-ish" })
    assert.matches("block_bytes", err, 1, true)
    err = raises(T.new, { 4 }, { tier = "nvme" })      -- nothing configured
    assert.matches("zt_nvme_configure", err, 1, true)
    assert.is_nil(aio.info())
  end)

  it("shutdown removes the swap directory; a new configure cleans a dead run's files", function()
    local info = conf { path = dir }
    local nv = T.new({ 1024 }, { tier = "nvme" })
    assert.are.equal(2, #entries(info.dir))             -- owner + one swap file
    local err = raises(aio.shutdown)
    assert.matches("still exist", err, 1, true)
    nv:free()
    aio.shutdown()
    assert.are.equal(0, #entries(dir))

    -- a run killed with its files on disk: a child process, SIGKILLed
    local cmd = ("ZTRAIN_HOME=%s luajit -e 'package.path=%q..package.path; "
                 .. "local zt=require\"ztrain\"; local aio=require\"ztrain.core.aio\"; "
                 .. "aio.configure{path=%q, engine=%q}; local t=zt.tensor.new({4096},{tier=\"nvme\"}); "
                 .. "os.execute(\"kill -9 \"..require\"ztrain.core.libc\".getpid())' 2>/dev/null")
                :format(home, home .. "/lua/?.lua;" .. home .. "/lua/?/init.lua;", dir, E)
    os.execute(cmd)
    assert.are.equal(1, #entries(dir))                  -- its directory stayed behind
    info = conf { path = dir }
    assert.matches("removed 1 swap files", info.notes, 1, true)
    assert.matches("dead run", info.summary, 1, true)
    assert.are.equal(1, #entries(dir))                  -- only ours now
  end)

  it("remove_files() takes the swap files away before an abort", function()
    local info = conf { path = dir }
    local nv = T.new({ 1024 }, { tier = "nvme" })
    local path = aio.path_of(nv)
    assert.is_true(exists(path))
    aio.remove_files()
    assert.is_false(exists(path))
    assert.are.equal(0, #entries(dir))
    nv:free()                                           -- still safe to free
    aio.shutdown()
    assert.is_nil(aio.info())
    assert.is_string(info.dir)
  end)
end)

describe(("the raw aio engine (%s)"):format(engine), function()
  it("requests are polled and waited; buffers come back bit-exact", function()
    local dir = tmpdir()
    local e = open { path = dir, block_bytes = 65536, queue_depth = 8 }
    local n = 1048576
    local id = e:file(8 * n)
    local src = ffi.new("uint8_t[?]", 8 * n)
    for i = 0, 8 * n - 1 do src[i] = (i * 131 + 7) % 251 end
    local reqs = {}
    for k = 0, 7 do reqs[#reqs + 1] = e:write(id, k * n, src + k * n, n) end
    local pending = #reqs
    while pending > 0 do                                -- polling, as a strategy would
      pending = 0
      for _, r in ipairs(reqs) do if not r:done() then pending = pending + 1 end end
    end
    for _, r in ipairs(reqs) do r:wait() end
    local dst = ffi.new("uint8_t[?]", 8 * n)
    local r = e:read(id, 0, dst, 8 * n)
    r:wait()
    assert.are.equal(0, ffi.C.memcmp(src, dst, 8 * n))
    local err = raises(r.wait, r)
    assert.matches("already waited", err, 1, true)
    err = raises(e.read, e, id, 8 * n - 1, dst, 2)
    assert.matches("outside", err, 1, true)
    local st = e:stats()
    assert.are.equal(9, st.requests)                    -- 8 writes + 1 read
    assert.are.equal(8 * 16 + 128, st.blocks)           -- 64 KiB blocks
    e:close()
    assert.are.equal(0, #entries(dir))
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)
end

describe("choosing the aio engine", function()
  it("a misspelt engine is an error naming the setting; auto names what it chose", function()
    local buf = ffi.new("char[64]", "/tmp/zt_aio_spec_XXXXXX")
    assert(libc.mkdtemp(buf) ~= nil)
    local dir = ffi.string(buf)
    local err = raises(aio.configure, { path = dir, engine = "uringg" })
    assert.matches('engine must be "auto", "uring" or "threads" (offload.aio_engine), got uringg', err, 1, true)
    local info = aio.configure { path = dir }
    local want = os.getenv("ZTRAIN_AIO_ENGINE")
    if want == nil or want == "" or want == "auto" then
      assert.are.equal(engines[1], info.engine)        -- io_uring where it opens
      assert.matches(info.engine == "io_uring" and "io_uring (auto)" or "threads: io_uring unavailable",
                     info.summary, 1, true)
    end
    aio.shutdown()
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

-- The disk probe (offload.queue_depth / offload.block_size = "auto"): what
-- it measures is kept per device (the directory's st_dev, as stat(1) gives
-- it) and read back; an explicit setting is never probed for.
describe("the disk probe", function()
  local function devkey(dir)
    local p = io.popen("stat -c '%Hd-%Ld' '" .. dir .. "'")
    local k = p:read("*l")
    p:close()
    return k
  end

  it("measures once per device and engine, then reads the pick back from its cache", function()
    local dir, cdir = tmpdir(), tmpdir()
    local p = aio.probe { path = dir, cache_dir = cdir .. "/c" }
    assert.is_false(p.cached)
    assert.is_true(p.rounds >= 2 and p.seconds < 10, "rounds " .. p.rounds .. ", " .. p.seconds .. " s")
    assert.is_true(p.queue_depth >= 4 and p.queue_depth <= 32 and p.block_bytes % 1048576 == 0)
    assert.is_true(p.write_gbs > 0 and p.read_gbs > 0)
    local file = ("%s/c/aio-probe.%s.%s"):format(cdir, devkey(dir), p.engine)
    assert.are.equal(file, p.cache_path)
    local text = assert(fs.read_file(file))
    assert.matches("queue_depth " .. p.queue_depth .. "\n", text, 1, true)
    assert.matches("block_bytes " .. p.block_bytes .. "\n", text, 1, true)
    assert.is_true(p.stripes == 1 or p.stripes == 2 or p.stripes == 4, "stripes " .. p.stripes)
    assert.matches("stripes " .. p.stripes .. "\n", text, 1, true)
    -- the next probe measures nothing: a pick edited into the file comes back
    util.write(file, text:gsub("queue_depth %d+", "queue_depth 24"):gsub("block_bytes %d+", "block_bytes 2097152")
                         :gsub("stripes %d+", "stripes 3"))
    local q = aio.probe { path = dir, cache_dir = cdir .. "/c" }
    assert.is_true(q.cached)
    assert.are.equal(24, q.queue_depth)
    assert.are.equal(2097152, q.block_bytes)
    assert.are.equal(3, q.stripes)
    -- a pick kept before the probe measured stripes is measured again
    util.write(file, (text:gsub("stripes %d+\n", "")))
    q = aio.probe { path = dir, cache_dir = cdir .. "/c" }
    assert.is_false(q.cached)
    assert.matches("stripes " .. q.stripes .. "\n", assert(fs.read_file(file)), 1, true)
    assert.same({}, entries(dir))                 -- its scratch files are gone
    os.execute("rm -rf '" .. dir .. "' '" .. cdir .. "'")
  end)

  it("offload's auto settings come from it; an explicit depth, block size or stripe count wins", function()
    local dir, cdir = tmpdir(), tmpdir()
    local old = os.getenv("ZTRAIN_CACHE")
    libc.setenv("ZTRAIN_CACHE", cdir, 1)
    local eng = engines[1]
    -- a pick kept for this device: auto takes it without measuring
    util.write(("%s/aio-probe.%s.%s"):format(cdir, devkey(dir), eng),
          "queue_depth 24\nblock_bytes 2097152\nstripes 2\nwrite_gbs 1.5\nread_gbs 0.75\n")
    local function conf(o)
      o.nvme_path = dir
      o.aio_engine = eng == "io_uring" and "uring" or "threads"
      local info = offload.configure_nvme({ offload = o })
      aio.shutdown()
      return info
    end
    local i = conf { queue_depth = "auto", block_size = "auto" }
    assert.are.equal(24, i.queue_depth)
    assert.are.equal(2097152, i.block_bytes)
    assert.are.equal(2, i.stripes)
    assert.matches("24 x 2.00 MiB, 2 files a storage, write 1.50 / read 0.75 GB/s", i.probe, 1, true)
    assert.matches("striped over 2 files", i.summary, 1, true)
    assert.matches("as measured before, kept in " .. cdir, i.probe, 1, true)
    assert.matches(i.probe, i.summary, 1, true)   -- the start-up line says so
    i = conf { queue_depth = 4, block_size = "auto" }
    assert.are.equal(4, i.queue_depth)
    assert.are.equal(2097152, i.block_bytes)
    i = conf { queue_depth = 4, block_size = "256KiB" }   -- stripes: auto
    assert.are.equal(2, i.stripes)
    i = conf { queue_depth = 4, block_size = "256KiB", stripes = 3 }
    assert.are.equal(4, i.queue_depth)
    assert.are.equal(262144, i.block_bytes)
    assert.are.equal(3, i.stripes)
    assert.is_nil(i.probe)
    local err = raises(conf, { queue_depth = "deep", block_size = "auto" })
    assert.matches('offload.queue_depth must be a whole number >= 1 or "auto", got deep', err, 1, true)
    err = raises(conf, { queue_depth = 4, block_size = "1MiB", stripes = 9 })
    assert.matches('offload.stripes must be a whole number of files from 1 to 8 or "auto", got 9', err, 1, true)
    libc.setenv("ZTRAIN_CACHE", old or "", 1)
    os.execute("rm -rf '" .. dir .. "' '" .. cdir .. "'")
  end)

  it("the recipe takes auto or a number for offload.queue_depth", function()
    local recipe = require "ztrain.train.recipe"
    assert.are.equal("auto", recipe.resolve({}, {}).offload.queue_depth)
    assert.are.equal(32, recipe.resolve({}, { "offload.queue_depth=32" }).offload.queue_depth)
    assert.are.equal(16, recipe.resolve({ offload = { queue_depth = 16 } }, {}).offload.queue_depth)
    local r, err = recipe.resolve({}, { "offload.queue_depth=0" })
    assert.is_nil(r)
    assert.matches('offload.queue_depth must be an integer in [1, 256] or "auto", got 0', err, 1, true)
    assert.are.equal("auto", recipe.resolve({}, {}).offload.stripes)
    assert.are.equal(2, recipe.resolve({}, { "offload.stripes=2" }).offload.stripes)
    r, err = recipe.resolve({}, { "offload.stripes=9" })
    assert.is_nil(r)
    assert.matches('offload.stripes must be an integer in [1, 8] or "auto", got 9', err, 1, true)
  end)
end)
