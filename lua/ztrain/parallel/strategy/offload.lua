-- ztrain.parallel.strategy.offload: the optimizer step where the optimizer state
-- lives off the device (ZeRO-Offload on the host, ZeRO-Infinity on NVMe),
-- streamed through a bounded pool of staging buffers.
--
-- The moments (exp_avg, exp_avg_sq) live on the host or nvme tier; the step
-- walks every unit's shard in chunks, all on one copy stream: the gradient
-- chunk comes from the device to a host staging slot, the parameter chunk
-- from wherever the parameters live (device or nvme; host parameters are
-- updated in place), the moments from nvme; the same AdamW kernel updates
-- them on the host; parameters and moments go back. A ring of slots: chunk
-- i+1 is read while chunk i is updated and chunk i-1 is written, so
-- transfers overlap the update; the stream runs in order, so a slot is
-- refilled only after its previous chunk was written out. On nvme the ring
-- has three slots: chunk i+1's reads go to the slot chunk i-2 left, not
-- chunk i-1's, so they start while chunk i-1's writes are still on the
-- disk (with two, each read waited for the write before it: the disk's
-- queue ran dry once per chunk). The update is elementwise: the bits are
-- those of the step on the device, chunk by chunk or whole.
--
-- Memory: 2 slots (3 on nvme) x (gradient, parameter, and with nvme moments
-- two more) chunks of host memory, category "comm" -- the staging pool,
-- sized by the recipe's offload.staging.
--
-- Mixed precision (opts.dtype "bf16"/"f16"; a work entry's M, the fp32
-- master shard, lives with the moments): the update runs on the master
-- chunk, which is then rounded into the slot's low-precision parameter
-- buffer and written to where the stored parameters live. The stored
-- parameters are never read by the step.
local T = require "ztrain.core.tensor"
local stream = require "ztrain.core.stream"
local memory = require "ztrain.core.memory"
local now = require("ztrain.core.ffi").C.zt_now
local fs = require "ztrain.util.fs"
local registry = require "ztrain.job.registry"
local ops = require "ztrain.core.ops"
local aio = require "ztrain.core.aio"
local errors = require "ztrain.core.errors"
local cache = require "ztrain.model.data.cache"

local M = {}

-- with_key(err) -> err, or for the runtime's swap-directory faults (a full
-- disk, EIO, read-only) the same with the recipe key that set the directory
function M.with_key(err)
  if type(err) == "string" and err:find("swap directory", 1, true) and not err:find("offload.nvme_path", 1, true) then
    return err .. " (the swap directory is offload.nvme_path)"
  end
  return err
end
local Off = {}
Off.__index = Off

-- Buffers per slot: gradient and parameter, plus the two moments (and with
-- mixed precision the master weights) when they live on nvme.
local function buffers(opts)
  if opts.tier ~= "nvme" then return 2 end
  return opts.dtype and 5 or 4
end

-- Slots in the ring: 3 on nvme (a chunk's reads never wait for the previous
-- chunk's writes), 2 on the host (device copies run one at a time anyway).
local function nslots(opts) return opts.tier == "nvme" and 3 or 2 end

-- Elements per chunk for a staging budget of `bytes` (slots x nbuf buffers
-- of f32), a multiple of 1024 (4 KiB: chunks never share a page of a swap
-- file, views stay aligned), at least 4096.
function M.chunk_elems(bytes, nbuf, slots)
  local n = math.floor(bytes / ((slots or 2) * (nbuf or 2) * 4) / 1024) * 1024
  return math.max(n, 4096)
end

-- The staging pool's bytes for these options.
function M.pool_bytes(opts)
  local nbuf, k = buffers(opts), nslots(opts)
  return k * nbuf * 4 * M.chunk_elems(opts.staging, nbuf, k)
end

-- new{ tier = "host" | "nvme", staging = bytes } -> off. Allocates the
-- staging slots and a copy stream; :free() releases them.
function M.new(opts)
  local nbuf, k = buffers(opts), nslots(opts)
  local self = setmetatable({ tier = opts.tier or "host", chunk = M.chunk_elems(opts.staging, nbuf, k),
                              dtype = opts.dtype,
                              -- seconds spent: waiting for transfers, updating, the optimizer
                              -- step's wall clock (opt), over `steps` steps; the optimizer's
                              -- bytes read from and written to nvme
                              time = { io_wait = 0, update = 0, fetch_wait = 0, opt = 0, steps = 0 },
                              nvme_bytes = { read = 0, written = 0 },
                              -- the engine's time with blocks in flight during the step, and
                              -- blocks x time (aio.stats' busy_s, depth_s)
                              disk = { busy = 0, depth = 0 } }, Off)
  self.slots = {}
  local names = nbuf == 2 and { "g", "p" } or { "g", "p", "exp_avg", "exp_avg_sq", "master" }
  if nbuf == 4 then names[5] = nil end
  local ok, err = pcall(function()
    for i = 1, k do
      local slot = {}
      self.slots[i] = slot
      for _, k in ipairs(names) do
        slot[k] = T.new({ self.chunk }, { tier = "host", category = "comm", dtype = k == "p" and opts.dtype or nil })
      end
    end
    self.copies = stream.new("copy")     -- nvme <-> host (and set-up copies)
    self.dcopies = stream.new("copy")    -- device <-> host: a device copy on the nvme stream
                                         -- would drain its nvme transfers first
  end)
  if not ok then self:free(); error(err, 0) end
  -- nvme: the slots are where every nvme transfer of the step lands, so
  -- they are registered with the engine (io_uring pins their pages once:
  -- fixed buffers, faulted in anew as they are still zeros -- fresh; a
  -- refusal leaves them unregistered, as fast as before)
  self.registered = {}
  if self.tier == "nvme" then
    for _, slot in ipairs(self.slots) do
      for _, k in ipairs(names) do
        if k ~= "g" then self.registered[#self.registered + 1] = aio.register(slot[k], true) end
      end
    end
  end
  return self
end

-- The chunks of one step: { u, lo (unit element), off (in the shard), len,
-- P, G, moments }, in unit order.
local function plan(self, work)
  local chunks = {}
  for _, w in ipairs(work) do
    for off = 0, w.size - 1, self.chunk do
      chunks[#chunks + 1] = { w = w, off = off, len = math.min(self.chunk, w.size - off) }
    end
  end
  return chunks
end

-- step(optim, work, lr, scale, tail): work is a list of { u, lo, size, P,
-- G, st } per unit: P (params over [lo, lo+size): device, host or nvme), G
-- (the reduced gradient shard, device), st (moments, host or nvme).
-- Returns once every updated parameter and moment is back where it lives.
-- tail (optional) runs once the last chunk's writes are issued, before
-- they are waited for: what it queues on the copy stream (the next
-- forward's first parameter fetches) joins those writes on the disk, and
-- the step does not wait for it.
function Off:step(optim, work, lr, scale, tail)
  local chunks, cs, views = plan(self, work), self.copies, {}
  local function view(t, off, len)
    local v = t:view(off, { len })
    views[#views + 1] = v
    return v
  end
  -- the host tensor holding a chunk of t: t itself on the host, else the
  -- slot's buffer, filled on the copy stream; back = where to write it after
  -- each staging buffer always moves on the same stream (device data on
  -- ds, nvme data on cs), so a slot is refilled only after it was written out
  local ds = self.dcopies
  local function stage_in(c, slot, key, t)
    local src = view(t, c.off, c.len)
    if t:tier() == "host" then return src end
    local buf = view(slot[key], 0, c.len)
    local st = t:tier() == "nvme" and cs or ds
    if st == cs then self.nvme_bytes.read = self.nvme_bytes.read + src:nbytes() end
    st:copy_async(buf, src)
    c.back[#c.back + 1] = { src, buf, st }
    return buf
  end
  local function copy_in(i)
    local c = chunks[i]
    local slot, w = self.slots[(i - 1) % #self.slots + 1], c.w
    c.back = {}
    c.g = view(slot.g, 0, c.len)
    ds:copy_async(c.g, view(w.G, c.off, c.len))
    if w.M then
      -- mixed precision: the master chunk is updated; the stored parameters
      -- are only written (from the slot's low-precision buffer, or in place)
      c.m = stage_in(c, slot, "master", w.M)
      c.pdst = view(w.P, c.off, c.len)
      c.plp = w.P:tier() == "host" and c.pdst or view(slot.p, 0, c.len)
    else
      c.p = stage_in(c, slot, "p", w.P)
    end
    c.mom = {}
    for k, t in pairs(w.st) do c.mom[k] = stage_in(c, slot, k, t) end
    c.ready = { ds:record(), cs:record() }
  end
  local function wait_ready(c)
    for _, ev in ipairs(c.ready) do ev:sync() end
    for _, ev in ipairs(c.ready) do ev:free() end
    c.ready = nil
  end
  local t_start, s0 = now(), aio.stats()             -- nil without an nvme tier
  local ok, err = pcall(function()
    if #chunks > 0 then copy_in(1) end
    for i, c in ipairs(chunks) do
      if chunks[i + 1] then copy_in(i + 1) end       -- the next chunk comes in meanwhile
      local t0 = now()
      wait_ready(c)
      local t1 = now()
      local w = c.w
      optim:update_range(w.u, w.lo + c.off, w.lo + c.off + c.len, c.m or c.p, c.g, c.mom, lr, scale)
      if c.m then
        ops.cast(c.plp, c.m)                         -- rounded
        if c.plp ~= c.pdst then
          local st = w.P:tier() == "nvme" and cs or ds
          c.back[#c.back + 1] = { c.pdst, c.plp, st }
        end
      end
      for _, b in ipairs(c.back) do                 -- written back
        if b[3] == cs then self.nvme_bytes.written = self.nvme_bytes.written + b[1]:nbytes() end
        b[3]:copy_async(b[1], b[2])
      end
      local t2 = now()
      self.time.io_wait, self.time.update = self.time.io_wait + (t1 - t0), self.time.update + (t2 - t1)
    end
    self:finish_step(tail, t_start, s0)
  end)
  if not ok then
    for _, c in ipairs(chunks) do
      for _, ev in ipairs(c.ready or {}) do ev:free() end
    end
    pcall(cs.sync, cs); pcall(ds.sync, ds)
  end
  for _, v in ipairs(views) do v:free() end         -- copies retain what they use
  if not ok then error(M.with_key(err), 0) end
end

-- The step's end: its own transfers waited for -- not what tail queues
-- after them on the copy stream -- and its figures counted (t_start, s0:
-- the step's start time and aio stats).
function Off:finish_step(tail, t_start, s0)
  local t3 = now()
  local written = self.copies:record()
  local tok, terr = pcall(tail or function() end)
  local wok, werr = pcall(written.sync, written)
  written:free()
  if not wok then error(werr, 0) end
  if not tok then error(terr, 0) end
  self.dcopies:sync()
  self.time.io_wait = self.time.io_wait + (now() - t3)
  self.time.opt = self.time.opt + (now() - t_start)
  local s1 = s0 and aio.stats()
  if s1 then
    self.disk.busy, self.disk.depth = self.disk.busy + s1.busy_s - s0.busy_s, self.disk.depth + s1.depth_s - s0.depth_s
  end
  self.time.steps = self.time.steps + 1
end

-- copy(dst, src): a copy between tiers, waited for (set-up). Device and
-- nvme meet through a host buffer (a device cannot read a file).
function Off:copy(dst, src)
  local tmp
  if dst:tier() ~= "host" and src:tier() ~= "host" and dst:tier() ~= src:tier() then
    tmp = T.new({ src:numel() }, { tier = "host", category = "comm", dtype = src:dtype() })
    self.copies:copy_async(tmp, src)
    src = tmp
  end
  self.copies:copy_async(dst, src)
  local ev = self.copies:record()
  local ok, err = pcall(ev.sync, ev)
  ev:free()
  if tmp then tmp:free() end
  if not ok then error(err, 0) end
end

function Off:free()
  if self.copies then pcall(self.copies.sync, self.copies); self.copies:free(); self.copies = nil end
  if self.dcopies then pcall(self.dcopies.sync, self.dcopies); self.dcopies:free(); self.dcopies = nil end
  if self.registered then
    for _, h in ipairs(self.registered) do pcall(aio.unregister, h) end
    self.registered = nil
  end
  for _, slot in ipairs(self.slots or {}) do
    for _, t in pairs(slot) do t:free() end
  end
  self.slots = {}
end

-- parse the recipe's staging size (bytes).
function M.staging_bytes(recipe)
  local o = recipe and recipe.offload
  local b, err = memory.parse_size(o and o.staging or "16MiB")
  if not b then error("offload.staging: " .. err, 0) end
  return b
end

-- The engine's limits (runtime/aio.c's MAX_BLOCK and MAX_DEPTH), checked
-- here so that a bad key is refused naming the key, before the swap
-- directory is made.
local MAX_BLOCK, MAX_DEPTH = 256 * 2 ^ 20, 256

-- block_bytes(v) -> bytes | nil, message: offload.block_size (a size, not
-- "auto") as the engine takes it: whole pages (O_DIRECT's alignment).
local function block_bytes(v)
  local b, err = memory.parse_size(v)
  if not b then return nil, "offload.block_size: " .. err .. ' (or "auto": from a probe of the disk)' end
  if b < aio.PAGE or b % aio.PAGE ~= 0 or b > MAX_BLOCK then
    return nil, ('offload.block_size must be a multiple of %d bytes (4KiB) up to 256MiB, such as "1MiB", ' ..
                 'or "auto" (from a probe of the disk), got %s'):format(aio.PAGE, tostring(v))
  end
  return b
end

-- disk_keys(o) -> { engine, depth, block (bytes), stripes }: the recipe's
-- nvme keys checked ("auto" kept), each refused naming it. ds-config checks
-- DeepSpeed's aio.block_size and aio.queue_depth with it too.
function M.disk_keys(o)
  local k = { engine = o.aio_engine or "auto", depth = o.queue_depth or "auto", block = o.block_size or "auto",
              stripes = o.stripes or "auto" }
  if k.engine ~= "auto" and k.engine ~= "uring" and k.engine ~= "threads" then
    error(("offload.aio_engine must be \"auto\", \"uring\" or \"threads\", got %s"):format(tostring(k.engine)), 0)
  end
  if k.block ~= "auto" then
    local b, err = block_bytes(k.block)
    if not b then error(err, 0) end
    k.block = b
  end
  if k.depth ~= "auto" and (type(k.depth) ~= "number" or k.depth < 1 or k.depth % 1 ~= 0) then
    error(('offload.queue_depth must be a whole number >= 1 or "auto", got %s'):format(tostring(k.depth)), 0)
  end
  if k.depth ~= "auto" and k.depth > MAX_DEPTH then
    error(('offload.queue_depth must be at most %d blocks in flight (the engine\'s limit) or "auto", got %s')
          :format(MAX_DEPTH, tostring(k.depth)), 0)
  end
  if k.stripes ~= "auto" and (type(k.stripes) ~= "number" or k.stripes < 1 or k.stripes > 8 or k.stripes % 1 ~= 0) then
    error(('offload.stripes must be a whole number of files from 1 to 8 or "auto", got %s')
          :format(tostring(k.stripes)), 0)
  end
  return k
end

-- engine_env(engine): offload.aio_engine "auto" defers to
-- $ZTRAIN_AIO_ENGINE (aio.configure); a bad one is refused as such, not
-- as the swap directory's fault
local function engine_env(engine)
  local env = os.getenv("ZTRAIN_AIO_ENGINE")
  if engine == "auto" and env and env ~= "" and not ({ auto = 1, uring = 1, io_uring = 1, threads = 1 })[env] then
    error(("ZTRAIN_AIO_ENGINE=%s is not an engine: use auto, uring or threads (or unset it; offload.aio_engine " ..
           "names one in the recipe)"):format(env), 0)
  end
end

-- The queue depth, block size and files a storage is striped over for
-- the swap directory: the recipe's where given (k: disk_keys), the
-- probe's where "auto" (aio.probe: a short measurement of the directory's
-- disk, kept per device under the cache directory: $ZTRAIN_CACHE, else
-- ~/.cache/ztrain). A probe that fails (a full disk) leaves the engine's
-- defaults (one file) and says why. -> depth, block bytes, stripes, the
-- probe's line for the start-up summary (nil: no probe)
local function disk_settings(k, path)
  local depth, block, stripes = k.depth, k.block, k.stripes
  if depth ~= "auto" and block ~= "auto" and stripes ~= "auto" then return depth, block, stripes end
  local dir = cache.default_dir()
  if dir and not fs.mkdirs(dir, "the cache directory") then dir = nil end
  local ok, p = pcall(aio.probe, { path = path, engine = k.engine, cache_dir = dir })
  local line
  if not ok then
    line = "nvme probe failed, defaults kept: " .. errors.message(p)
    p = { queue_depth = aio.DEFAULT_DEPTH, block_bytes = aio.DEFAULT_BLOCK, stripes = 1 }
  elseif p.note ~= "" then
    line = "nvme " .. p.note .. "; defaults kept"
  else
    line = ("nvme probe of %s (%s): %d x %s, %d file%s a storage, write %.2f / read %.2f GB/s " ..
            "(8 x 1 MiB: %.2f / %.2f), %s%s"):format(
      p.device, p.engine, p.queue_depth, memory.format(p.block_bytes), p.stripes, p.stripes > 1 and "s" or "",
      p.write_gbs, p.read_gbs,
      p.default_write_gbs, p.default_read_gbs,
      p.cached and "as measured before" or ("measured in %.1f s"):format(p.seconds),
      p.cache_path ~= "" and (", kept in " .. p.cache_path) or "")
  end
  return depth == "auto" and p.queue_depth or depth, block == "auto" and p.block_bytes or block,
         stripes == "auto" and p.stripes or stripes, line
end

-- The aio engine's bounce buffers (queue depth x block bytes, host
-- "other"): the running engine's, else the recipe's, "auto" as the probe
-- kept it for the swap directory's disk (its nearest existing directory;
-- the engine's defaults where nothing is kept): a plan made without running.
function M.aio_bounce_bytes(recipe)
  local i = aio.info()
  if i then return i.queue_depth * i.block_bytes end
  local o = recipe and recipe.offload or {}
  local depth = type(o.queue_depth) == "number" and o.queue_depth or aio.DEFAULT_DEPTH
  local block = (o.block_size and o.block_size ~= "auto") and memory.parse_size(o.block_size) or aio.DEFAULT_BLOCK
  local cdir = cache.default_dir()
  if cdir and (o.queue_depth == "auto" or o.block_size == "auto") then
    local dir = (o.nvme_path and o.nvme_path ~= "") and o.nvme_path or "."
    while not fs.exists(dir) and dir:find("/[^/]+$") do dir = dir:gsub("/[^/]+$", "") end
    local e = o.aio_engine or "auto"
    if e == "auto" then e = os.getenv("ZTRAIN_AIO_ENGINE") or "auto" end
    e = (e == "uring" or e == "io_uring") and "io_uring" or e == "threads" and "threads" or aio.engines()[1]
    local p = aio.probe_cached(dir ~= "" and dir or "/", e, cdir)
    if p and o.queue_depth == "auto" then depth = p.queue_depth end
    if p and o.block_size == "auto" then block = p.block_bytes end
  end
  return depth * block
end

-- swap_dir(o, out_dir) -> the swap directory, and whether this call made it:
-- offload.nvme_path as given (it must exist: a typo must not become a new
-- directory), else OUT/nvme, made here.
local function swap_dir(o, out_dir)
  if o.nvme_path and o.nvme_path ~= "" then
    local path = o.nvme_path
    local f, ferr = io.open(path)
    if not f and tostring(ferr):find("No such file", 1, true) then
      error(("offload.nvme_path %s does not exist; create it (a directory on a fast local disk) or " ..
             "leave offload.nvme_path empty for the run's OUT/nvme"):format(path), 0)
    end
    if f then f:close() end
    return path, false
  end
  local path = (out_dir or "runs/offload") .. "/nvme"
  local existed = fs.exists(path)
  local ok, merr = fs.mkdirs(path, "output directory")
  if not ok then error("offload.nvme_path: " .. tostring(merr), 0) end
  return path, not existed
end

-- open_nvme(o, k, path) -> aio info: the engine on the swap directory
local function open_nvme(o, k, path)
  local depth, block, stripes, line = disk_settings(k, path)
  local ok, info = pcall(aio.configure, { path = path, block_bytes = block, queue_depth = depth, stripes = stripes,
                                          checksum = o.checksum or false, engine = k.engine })
  -- the keys were checked (disk_keys): what is left is the directory's
  -- (permissions, a file system without O_DIRECT ...), said without the
  -- engine's function names
  if not ok then
    local why = errors.message(info):gsub("^aio%.configure: ", ""):gsub("^zt_aio_[%w_]+: ", ""):gsub(" %[E%u+%]$", "")
    error(("offload.nvme_path=%s: %s"):format(path, why), 0)
  end
  if line then info.probe, info.summary = line, info.summary .. "\n" .. line end
  return info
end

-- nvme(recipe, out_dir) -> aio info: the nvme tier configured from the
-- recipe's offload keys (nvme_path, default OUT/nvme; block_size,
-- queue_depth, stripes: "auto" from a probe; checksum; aio_engine). The keys
-- are checked first; OUT/nvme is made if missing, and removed again when
-- the engine cannot use it (an empty directory left would look like a run's
-- swap space). info.probe: the probe's line (nil without one).
function M.configure_nvme(recipe, out_dir)
  local o = recipe and recipe.offload or {}
  local k = M.disk_keys(o)
  engine_env(k.engine)
  local path, made = swap_dir(o, out_dir)
  -- the launcher removes these swap files if this rank is killed (launch.run)
  registry.note("nvme " .. path)
  local ok, info = pcall(open_nvme, o, k, path)
  if not ok then
    if made then os.remove(path) end        -- only if still empty: nothing of anyone else's goes
    error(info, 0)
  end
  return info
end

return M
