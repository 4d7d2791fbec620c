-- ztrain.train.checkpoint.write: checkpoint.save, every rank writing at once
-- (the layout: checkpoint/format.lua).
--
-- Every rank writes its files into ROOT/.step-NNNNNNNN.tmp and fsyncs them;
-- rank 0 gathers every rank's outcome, and only when all succeeded writes
-- the manifest, fsyncs it and the directory, renames the directory into
-- place, fsyncs ROOT, then replaces `latest` the same way (temporary file,
-- fsync, rename) and removes checkpoints beyond the newest `keep`. A
-- failure anywhere (a full disk) removes the temporary directory and
-- raises the same error on every rank: the previous checkpoint and
-- `latest` are untouched. A crash at any point leaves at most a stale .tmp
-- directory (removed by the next save).
local ffi = require "ffi"
local json = require "ztrain.util.json"
local libc = require "ztrain.core.libc"
local zffi = require "ztrain.core.ffi"
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local durable = require "ztrain.util.durable"
local format = require "ztrain.train.checkpoint.format"
local registry = require "ztrain.job.registry"
local C = zffi.C

local M = {}

local CHUNK = format.CHUNK
local errno_text = format.errno_text
local fsync_dir = durable.fsync_dir   -- fsync a directory (so a rename in it is durable)

local function fail(msg) error(msg, 0) end

local write_file = durable.write_synced   -- write text to path, fsync (the directory is renamed into place)

-- remove a directory and the files in it (one level: what save writes)
local function remove_dir(path)
  local g = libc.glob_t()
  if libc.glob(path .. "/*", 0, nil, g) == 0 then
    for i = 0, tonumber(g.gl_pathc) - 1 do libc.unlink(g.gl_pathv[i]) end
  end
  libc.globfree(g)
  libc.rmdir(path)
end

local function list_steps(root)
  local out = {}
  local g = libc.glob_t()
  if libc.glob(root .. "/step-*", libc.GLOB_MARK, nil, g) == 0 then
    for i = 0, tonumber(g.gl_pathc) - 1 do
      local p = ffi.string(g.gl_pathv[i])
      local n = p:match("/step%-(%d+)/$")
      if n then out[#out + 1] = { step = tonumber(n), path = p:sub(1, -2) } end
    end
  end
  libc.globfree(g)
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

---------------------------------------------------------------------------
-- Writing one rank's file.

-- A file written in order, with a running SHA-256 of each 1 MiB block.
local function block_writer(path)
  local fd = libc.open(path, libc.O_WRONLY + libc.O_CREAT + libc.O_TRUNC + libc.O_CLOEXEC, ffi.cast("int", 420))
  if fd < 0 then fail(("cannot create %s: %s"):format(path, errno_text())) end
  local w = { fd = fd, path = path, off = 0, blocks = {}, st = ffi.new("zt_sha256"), inblock = 0 }
  C.zt_sha256_init(w.st)
  local hex = ffi.new("char[65]")
  local function close_block()
    C.zt_sha256_hex(w.st, hex)
    w.blocks[#w.blocks + 1] = ffi.string(hex, 64)
    C.zt_sha256_init(w.st)
    w.inblock = 0
  end
  function w.write(p, n)
    local done = 0
    while done < n do
      local k = libc.pwrite(fd, p + done, n - done, w.off + done)
      if k <= 0 then fail(("cannot write %s: %s"):format(path, k < 0 and errno_text() or "no progress")) end
      done = done + tonumber(k)
    end
    -- checksum in block-sized pieces
    local q = 0
    while q < n do
      local take = math.min(n - q, format.BLOCK - w.inblock)
      C.zt_sha256_update(w.st, p + q, take)
      w.inblock = w.inblock + take
      q = q + take
      if w.inblock == format.BLOCK then close_block() end
    end
    w.off = w.off + n
  end
  function w.finish()
    if w.inblock > 0 then close_block() end
    local rc = libc.fsync(fd)
    local err = rc ~= 0 and ("cannot fsync %s: %s"):format(path, errno_text()) or nil
    libc.close(fd); w.fd = nil
    if err then fail(err) end
  end
  function w.abort() if w.fd then libc.close(w.fd); w.fd = nil end end
  return w
end

-- write_rank(dir, rank, export) -> index table. Streams each entry's tensor
-- (any tier) through a host buffer into dir/rank-RRRRR.bin.
local function write_rank(dir, rank, ex)
  local name = ("rank-%05d"):format(rank)
  local w = block_writer(dir .. "/" .. name .. ".bin")
  local buf = ffi.new("float[?]", CHUNK)
  local index = { rank = rank, file = name .. ".bin", block = format.BLOCK, entries = {} }
  local ok, err = pcall(function()
    for _, e in ipairs(ex.entries) do
      index.entries[#index.entries + 1] = { kind = e.kind, unit = e.unit, lo = e.lo, hi = e.hi, dtype = "f32",
                                            offset = w.off }
      local n = e.hi - e.lo
      for at = 0, n - 1, CHUNK do
        local cnt = math.min(CHUNK, n - at)
        local v = e.tensor:view(at, { cnt })
        local okr, rerr = pcall(v.read, v, buf)
        v:free()
        if not okr then error(rerr, 0) end
        w.write(ffi.cast("const uint8_t *", buf), 4 * cnt)
      end
    end
    w.finish()
  end)
  if not ok then w.abort(); error(err, 0) end
  index.bytes, index.blocks = w.off, w.blocks
  local text = json.encode(index)
  local okw, werr = write_file(dir .. "/" .. name .. ".json", text)
  if not okw then fail(werr) end
  return index
end

---------------------------------------------------------------------------
-- rank 0 prepares the temporary directory tmp under root (the others
-- wait for it): "" or the error every rank raises
local noted = {}     -- the roots noted in the job's registry (once each)

local function prepare(world, root, tmp)
  local prep_err = ""
  if world.rank == 0 then
    -- a job ended at once (a second stop signal) leaves tmp: its launcher removes it
    if not noted[root] then registry.note("ckpt " .. root); noted[root] = true end
    local ok, err = fs.mkdirs(root, "output directory")
    if not ok then prep_err = "checkpoint: " .. tostring(err)
    else
      remove_dir(tmp)
      if libc.mkdir(tmp, 493) ~= 0 then prep_err = ("checkpoint: cannot create %s: %s"):format(tmp, errno_text()) end
    end
  end
  local prep = world:gather_strings(prep_err)
  for _, e in ipairs(prep) do if e ~= "" then fail(errors.all_ranks(e)) end end
end

-- rank 0, once every rank wrote its files (all: their outcomes): the
-- manifest, the directory renamed into place, `latest` replaced, the
-- newest `keep` kept. Raises on a failure (save removes tmp).
local function publish(args, all, tmp, final, name)
  local world, root = args.world, args.root
  local files = {}
  for rk, s in ipairs(all) do
    local o = json.decode(s)
    files[rk] = { bin = ("rank-%05d.bin"):format(rk - 1), index = ("rank-%05d.json"):format(rk - 1),
                  bytes = o.bytes, blocks_sha256 = o.sha }
  end
  local man = { format = format.FORMAT, version = format.VERSION, step = args.step, world_size = world.size,
                files = files, created = os.date("!%Y-%m-%dT%H:%M:%SZ") }
  for k, v in pairs(args.meta or {}) do man[k] = v end
  local okm, merr = write_file(tmp .. "/manifest.json", json.encode(man))
  if not okm then error(merr, 0) end
  local okd, derr = fsync_dir(tmp)
  if not okd then error(derr, 0) end
  remove_dir(final)          -- a checkpoint of the same step from an earlier attempt
  local okr, rerr = os.rename(tmp, final)
  if not okr then error(("cannot rename %s to %s: %s"):format(tmp, final, tostring(rerr)), 0) end
  local okf, ferr = fsync_dir(root)
  if not okf then error(ferr, 0) end
  -- the latest pointer, replaced atomically
  local okl, lerr = write_file(root .. "/.latest.tmp", name .. "\n")
  if not okl then error(lerr, 0) end
  local oklr, lrerr = os.rename(root .. "/.latest.tmp", root .. "/latest")
  if not oklr then error(("cannot rename %s/.latest.tmp: %s"):format(root, tostring(lrerr)), 0) end
  fsync_dir(root)
  -- keep the newest `keep`
  local keep = args.keep or 0
  if keep > 0 then
    local steps = list_steps(root)
    for i = 1, #steps - keep do remove_dir(steps[i].path) end
  end
end

-- save(args) -> path of the checkpoint. Collective over args.world.
--   args: { world, root, step, export (this rank's strategy export), keep,
--           meta = { ... } (rank 0's: model, strategy, data, extra; JSON-able) }
function M.save(args)
  local world, root, step = args.world, args.root, args.step
  local name = ("step-%08d"):format(step)
  local final, tmp = root .. "/" .. name, root .. "/." .. name .. ".tmp"
  prepare(world, root, tmp)
  -- every rank writes its own files
  local ok, res = pcall(write_rank, tmp, world.rank, args.export)
  local outcome = ok and json.encode({ ok = true, bytes = res.bytes, sha = format.blocks_sha(res.blocks or {}) })
                  or json.encode({ ok = false, err = errors.message(res) })
  local all = world:gather_strings(outcome)
  local first_err
  for rk, s in ipairs(all) do
    local o = json.decode(s)
    if not o.ok and not first_err then first_err = ("checkpoint %s: rank %d: %s"):format(final, rk - 1, o.err) end
  end
  local final_err = ""
  if world.rank == 0 then
    if first_err then
      remove_dir(tmp)
      final_err = first_err .. "; the previous checkpoint is intact"
    else
      local okc, cerr = pcall(publish, args, all, tmp, final, name)
      if not okc then
        remove_dir(tmp)
        final_err = ("checkpoint %s: %s; the previous checkpoint is intact"):format(final, errors.message(cerr))
      end
    end
  end
  local fin = world:gather_strings(final_err)
  if fin[1] ~= "" then fail(errors.all_ranks(fin[1])) end
  return final
end

return M
