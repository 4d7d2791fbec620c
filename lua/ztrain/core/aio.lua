-- ztrain.core.aio: the nvme tier and the asynchronous file I/O engine under it
-- (contracts in runtime/zt_aio.h).
--
--   local aio = require "ztrain.core.aio"
--   local info = aio.configure{ path = "out/nvme", checksum = true }
--   print(info.summary)                         -- mode (O_DIRECT or why not), and
--                                               -- what start-up cleaned up: print it once
--   local nv = tensor.new({ n }, { tier = "nvme", category = "optim" })
--   local cs = stream.new("copy")
--   cs:copy_async(nv, host_t)                   -- host -> nvme on the copy stream
--   local ev = cs:record()                      -- completes once the bytes are written
--   ...
--   nv:free(); aio.shutdown()                   -- the swap files go
--
-- The tier: one engine per process; each nvme tensor storage is one swap
-- file under PATH/ztrain-aio.HOST.PID.N/. Bytes move only between nvme and
-- host tensors (stream.copy_async, or Tensor:read/:write synchronously);
-- ops refuse nvme tensors. Swap files are removed by aio.shutdown(), at
-- process exit, and (for a run that was killed) by the next run that
-- configures the same PATH.
--
-- The raw engine (aio.open) is for benchmarks and tools: files by id,
-- requests polled with req:done() or waited with req:wait(). Nothing calls
-- back into Lua: completions are polled.
local ffi = require "ffi"
local bit = require "bit"
local zffi = require "ztrain.core.ffi"
local memory = require "ztrain.core.memory"
local libc = require "ztrain.core.libc"
local C, check = zffi.C, zffi.check

local M = {}
local Engine, Request = {}, {}
Engine.__index, Request.__index = Engine, Request
M.Engine, M.Request = Engine, Request

M.PAGE = tonumber(C.ZT_AIO_PAGE)
M.DEFAULT_BLOCK = tonumber(C.ZT_AIO_DEFAULT_BLOCK)
M.DEFAULT_DEPTH = tonumber(C.ZT_AIO_DEFAULT_DEPTH)

local abuf = ffi.new("zt_aio*[1]")
local rbuf = ffi.new("zt_aio_req*[1]")
local ibuf = ffi.new("int[1]")
local sbuf = ffi.new("size_t[1]")

-- A host buffer: a cdata pointer/array, or a host-tier tensor (its bytes).
local function host_ptr(buf, what)
  if type(buf) == "cdata" then return buf end
  if type(buf) == "table" and buf.c ~= nil and buf.ptr then return buf:ptr() end
  error(what .. ": buffer must be a cdata pointer or a host tensor", 3)
end

local KNOWN = { path = true, block_bytes = true, queue_depth = true, checksum = true,
                buffered = true, sparse = true, engine = true, stripes = true }
-- engine = "auto" (the default: io_uring where it works, else the thread
-- pool; $ZTRAIN_AIO_ENGINE may name one), "uring" (an error where io_uring
-- is missing or refused) or "threads" (libuv's thread pool)
local ENGINES = { auto = 0, uring = 0, io_uring = 0, threads = 0 }

-- Options -> dir, block_bytes, queue_depth, flags (errors name the option).
local function options(what, opts)
  if type(opts) ~= "table" then
    error(what .. ": expected a table { path = DIR, block_bytes =, queue_depth =, checksum =, "
          .. "buffered =, sparse =, engine = }", 3)
  end
  for k in pairs(opts) do
    if not KNOWN[k] then
      error(("%s: unknown option %q (known: block_bytes, buffered, checksum, engine, path, "
             .. "queue_depth, sparse, stripes)"):format(what, tostring(k)), 3)
    end
  end
  local st = opts.stripes or 1
  if type(st) ~= "number" or st % 1 ~= 0 or st < 1 or st > C.ZT_AIO_MAX_STRIPES then
    error(("%s: stripes must be a whole number of files from 1 to %d (offload.stripes), got %s")
          :format(what, C.ZT_AIO_MAX_STRIPES, tostring(opts.stripes)), 3)
  end
  if type(opts.path) ~= "string" or opts.path == "" then
    error(what .. ": path must be a directory name (offload.nvme_path)", 3)
  end
  local block = 0
  if opts.block_bytes ~= nil then
    local b, err = memory.parse_size(opts.block_bytes)
    if not b then error(what .. ": block_bytes: " .. err, 3) end
    block = b
  end
  local depth = opts.queue_depth or 0
  if type(depth) ~= "number" or depth % 1 ~= 0 then
    error(what .. ": queue_depth must be a whole number (default 8)", 3)
  end
  local flags = 0
  if opts.checksum then flags = flags + C.ZT_AIO_CHECKSUM end
  if opts.buffered then flags = flags + C.ZT_AIO_BUFFERED end
  if opts.sparse then flags = flags + C.ZT_AIO_SPARSE end
  local engine = opts.engine or "auto"
  if ENGINES[engine] == nil then
    error(("%s: engine must be \"auto\", \"uring\" or \"threads\" (offload.aio_engine), got %s")
          :format(what, tostring(engine)), 3)
  end
  if engine == "uring" or engine == "io_uring" then flags = flags + C.ZT_AIO_URING end
  if engine == "threads" then flags = flags + C.ZT_AIO_THREADS end
  return opts.path, block, depth, flags
end

local function stats_of(a)
  local s = ffi.new("zt_aio_stats")
  check(C.zt_aio_get_stats(a, s), "aio.stats")
  return { bytes_read = tonumber(s.bytes_read), bytes_written = tonumber(s.bytes_written),
           requests = tonumber(s.requests), blocks = tonumber(s.blocks),
           bounced = tonumber(s.bounced), errors = tonumber(s.errors),
           host_bytes = tonumber(s.host_bytes), peak_inflight = tonumber(s.peak_inflight),
           registered = tonumber(s.registered),
           busy_s = tonumber(s.busy_ns) / 1e9,       -- time with a block in flight
           depth_s = tonumber(s.depth_ns) / 1e9 }    -- blocks in flight x time: / busy_s = mean depth
end

-- Mode, directory, sizes and start-up notes of an engine.
local function info_of(a)
  local notes = ffi.string(C.zt_aio_notes(a))
  local i = {
    mode = ffi.string(C.zt_aio_mode(a)),
    direct = C.zt_aio_direct(a) ~= 0,
    dir = ffi.string(C.zt_aio_dir(a)),
    block_bytes = tonumber(C.zt_aio_block_bytes(a)),
    queue_depth = tonumber(C.zt_aio_queue_depth(a)),
    stripes = tonumber(C.zt_aio_stripes(a)),             -- files a storage is striped over
    checksum = bit.band(C.zt_aio_flags(a), C.ZT_AIO_CHECKSUM) ~= 0,
    engine = ffi.string(C.zt_aio_engine(a)),            -- "io_uring" or "threads"
    engine_note = ffi.string(C.zt_aio_engine_note(a)),  -- how it was chosen
    notes = notes,
  }
  i.summary = ("nvme: %s, %s, %s blocks, queue depth %d%s%s, in %s%s"):format(
    i.mode, i.engine_note, memory.format(i.block_bytes), i.queue_depth,
    i.stripes > 1 and (", striped over " .. i.stripes .. " files") or "",
    i.checksum and ", checksummed" or "", i.dir, notes ~= "" and ("\n" .. notes) or "")
  return i
end

-- ---- the nvme tier ------------------------------------------------------------------

-- configure{ path = DIR, block_bytes = "1MiB", queue_depth = 8, stripes = 1, checksum = false,
--            buffered = false, sparse = false, engine = "auto" } -> info
-- Opens the tier's engine over DIR (made if its parent exists; an error if it
-- is not a directory or not writable) and removes files left there by dead
-- runs. info = { mode, direct, dir, block_bytes, queue_depth, checksum,
-- engine ("io_uring" | "threads"), engine_note (how it was chosen), notes,
-- summary }; print info.summary once. Configuring again moves the tier (an
-- error while nvme tensors exist).
function M.configure(opts)
  local dir, block, depth, flags = options("aio.configure", opts)
  check(C.zt_nvme_configure(dir, block, depth, flags), "aio.configure")
  check(C.zt_aio_set_stripes(C.zt_nvme_engine(), opts.stripes or 1), "aio.configure")
  return info_of(C.zt_nvme_engine())
end

-- info() -> the tier's info (as configure returns), or nil if not configured.
function M.info()
  local a = C.zt_nvme_engine()
  if a == nil then return nil end
  return info_of(a)
end

-- stats() -> { bytes_read, bytes_written, requests, blocks, bounced, errors,
-- host_bytes, peak_inflight, registered, busy_s, depth_s } of the tier's
-- engine, or nil if not configured.
function M.stats()
  local a = C.zt_nvme_engine()
  if a == nil then return nil end
  return stats_of(a)
end

-- register(t, fresh) -> handle | nil, why: host tensor t (a staging buffer
-- that many nvme transfers use) registered with the tier's engine: with
-- io_uring its pages are pinned once (fixed buffers); fresh: t was just
-- made (zeros), its pages may be dropped and faulted in anew by the pinning
-- (ZT_AIO_REG_FRESH: laid out together, fewer segments per transfer; the
-- bytes stay zeros); nil, why where the engine refuses
-- (its table of 16 is full, RLIMIT_MEMLOCK) -- transfers work either way.
-- unregister(handle) after the last transfer on t and before t is freed; a
-- handle of an engine since closed or replaced is ignored.
function M.register(t, fresh)
  local a = C.zt_nvme_engine()
  if a == nil then return nil, "the nvme tier is not configured" end
  local p = host_ptr(t, "aio.register")
  local n = type(t) == "table" and t.nbytes and t:nbytes() or error("aio.register: expected a host tensor", 2)
  if C.zt_aio_register(a, p, n, fresh and C.ZT_AIO_REG_FRESH or 0, ibuf) ~= 0 then
    return nil, ffi.string(C.zt_last_error())
  end
  return { engine = a, index = ibuf[0] }
end

function M.unregister(h)
  if h == nil then return end
  if C.zt_nvme_engine() ~= h.engine then return end      -- that engine is gone
  check(C.zt_aio_unregister(h.engine, h.index), "aio.unregister")
end

-- shutdown(): close the tier's engine and remove its swap files (an error
-- while nvme tensors exist). Harmless when not configured.
function M.shutdown() check(C.zt_nvme_shutdown(), "aio.shutdown") end

-- remove_files(): remove every engine's swap files now, for a process about
-- to die without exit handlers (call it before comm.abort). The engines
-- (and nvme tensors) are unusable afterwards.
function M.remove_files() C.zt_aio_remove_files() end

-- path_of(t) -> the swap file holding nvme tensor t, and t's byte offset in it
-- (striped: the first of its files, and the offset in the storage).
function M.path_of(t)
  if type(t) ~= "table" or t.c == nil then error("aio.path_of: expected a live tensor", 2) end
  local p = C.zt_nvme_path(t.c, sbuf)
  if p == nil then error("aio.path_of: " .. tostring(t) .. " is not on the nvme tier", 2) end
  return ffi.string(p), tonumber(sbuf[0])
end

-- engines() -> { "io_uring", "threads" } or { "threads" }, and why io_uring
-- is missing (nil if not): the engines that open here (io_uring needs
-- liburing at build time and a kernel that lets this process set up a
-- ring), probed once in a fresh scratch directory.
local engines_here, no_uring
function M.engines()
  if engines_here then return engines_here, no_uring end
  local tmpl = ffi.new("char[?]", 300, (os.getenv("TMPDIR") or "/tmp") .. "/zt_aio_probe_XXXXXX")
  engines_here = {}
  if libc.mkdtemp(tmpl) == nil then
    no_uring = "cannot make a scratch directory to probe io_uring in"
  elseif C.zt_aio_open(abuf, tmpl, 0, 1, C.ZT_AIO_URING) == 0 then
    C.zt_aio_close(abuf[0])
    engines_here[1] = "io_uring"
  else
    no_uring = ffi.string(C.zt_last_error())
  end
  libc.rmdir(tmpl)
  engines_here[#engines_here + 1] = "threads"
  return engines_here, no_uring
end

local probe_result

-- probe{ path = DIR, engine = "auto", cache_dir = DIR } -> { queue_depth,
-- block_bytes, stripes, write_gbs, read_gbs, default_write_gbs, default_read_gbs,
-- rounds, cached, seconds, device, engine, cache_path, note }: the queue depth,
-- block size and files a storage is striped over that the engine moves bytes
-- fastest with on DIR's disk (a 64 MiB scratch file, about 2.5 s; zt_aio.h's
-- zt_aio_probe), kept per device in
-- cache_dir (nil: measured every time) and read back from there.
function M.probe(opts)
  if type(opts) ~= "table" or type(opts.path) ~= "string" or opts.path == "" then
    error("aio.probe: expected { path = DIR (the swap directory), engine =, cache_dir = }", 2)
  end
  local _, _, _, flags = options("aio.probe", { path = opts.path, engine = opts.engine })
  local r = ffi.new("zt_aio_probe_result")
  check(C.zt_aio_probe(opts.path, flags, opts.cache_dir, r), "aio.probe")
  return probe_result(r)
end

-- probe_cached(dir, engine, cache_dir) -> what aio.probe keeps for dir's
-- device and engine ("io_uring" or "threads") in cache_dir, or nil:
-- nothing measured, nothing written (a plan made without running).
function M.probe_cached(dir, engine, cache_dir)
  local r = ffi.new("zt_aio_probe_result")
  check(C.zt_aio_probe_cached(dir, engine, cache_dir, r), "aio.probe_cached")
  return r.queue_depth > 0 and probe_result(r) or nil
end

function probe_result(r)
  return { queue_depth = r.queue_depth, block_bytes = tonumber(r.block_bytes), write_gbs = r.write_gbs,
           read_gbs = r.read_gbs, default_write_gbs = r.default_write_gbs, default_read_gbs = r.default_read_gbs,
           rounds = r.rounds, cached = r.cached ~= 0, stripes = r.stripes, seconds = r.seconds, device = ffi.string(r.device),
           engine = ffi.string(r.engine), cache_path = ffi.string(r.cache_path), note = ffi.string(r.note) }
end

-- ---- the raw engine --------------------------------------------------------------------

-- open(opts) -> an engine of its own (same options as configure).
function M.open(opts)
  local dir, block, depth, flags = options("aio.open", opts)
  check(C.zt_aio_open(abuf, dir, block, depth, flags), "aio.open")
  local a = abuf[0]
  ffi.gc(a, C.zt_aio_close)
  check(C.zt_aio_set_stripes(a, opts.stripes or 1), "aio.open")
  -- reqs: every request not yet waited, held strongly so its buffer outlives
  -- the I/O even if the caller drops the request
  return setmetatable({ c = a, reqs = {} }, Engine)
end

local function live(e, what)
  if getmetatable(e) ~= Engine then error(what .. ": expected an engine from aio.open", 3) end
  if e.c == nil then error(what .. ": use of a closed engine", 3) end
  return e.c
end

function Engine:info() return info_of(live(self, "engine:info")) end
function Engine:stats() return stats_of(live(self, "engine:stats")) end

-- e:file(nbytes) -> id of a new zero-filled swap file (space reserved).
function Engine:file(nbytes)
  check(C.zt_aio_file_new(live(self, "engine:file"), nbytes, ibuf), "engine:file")
  return ibuf[0]
end
function Engine:free_file(id) check(C.zt_aio_file_free(live(self, "engine:free_file"), id), "engine:free_file") end
function Engine:path(id)
  local p = C.zt_aio_file_path(live(self, "engine:path"), id)
  return p ~= nil and ffi.string(p) or nil
end

local function submit(self, fn, what, id, offset, buf, nbytes)
  local a = live(self, what)
  check(fn(a, id, offset, host_ptr(buf, what), nbytes, rbuf), what)
  -- No ffi.gc on the request: a request never waited is freed by the
  -- engine's close (a finalizer could run after the engine's). The request
  -- keeps buf alive until it is waited.
  local req = setmetatable({ c = rbuf[0], buf = buf, what = what, engine = self }, Request)
  self.reqs[req] = true
  return req
end

-- e:write(id, offset, buf, nbytes) / e:read(...) -> a request. Keep buf
-- untouched until req:wait() (the request holds a reference to it).
function Engine:write(id, offset, buf, nbytes)
  return submit(self, C.zt_aio_write, "engine:write", id, offset, buf, nbytes)
end
function Engine:read(id, offset, buf, nbytes)
  return submit(self, C.zt_aio_read, "engine:read", id, offset, buf, nbytes)
end

-- e:close(): finish what is in flight, remove the engine's files. Requests
-- not yet waited are dropped (their handles die with the engine).
function Engine:close()
  local a = self.c
  if a == nil then return end
  self.c = nil
  ffi.gc(a, nil)
  C.zt_aio_close(a)   -- finishes the I/O in flight, whose buffers self.reqs holds
  for req in pairs(self.reqs) do req.c = nil; req.closed = true end
  self.reqs = {}
end

-- req:done() -> true once the request has finished (never blocks).
function Request:done()
  if self.c == nil then return true end
  check(C.zt_aio_test(self.c, ibuf), self.what)
  return ibuf[0] ~= 0
end

-- req:wait(): block until it has finished; raises its error (naming the
-- file, the operation, the offset and what to do). Once only.
function Request:wait()
  local r = self.c
  if r == nil then
    if self.closed then error(self.what .. ": its engine was closed before the wait", 2) end
    error(self.what .. ": request already waited", 2)
  end
  self.c = nil
  self.buf = nil
  self.engine.reqs[self] = nil
  check(C.zt_aio_wait(r), self.what)
end

return M
