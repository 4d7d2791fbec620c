-- ztrain.checkpoint: a run's state on disk, written by every rank at once,
-- read back by any strategy on any number of ranks.
--
-- A checkpoint is a directory ROOT/step-NNNNNNNN/ holding
--   manifest.json      what was saved: the model's units and their element
--                      counts, the strategy, world size, step, optimizer
--                      step count, data position, extra state (loss scaler,
--                      RNG), and every rank file with its size and SHA-256
--   rank-RRRRR.bin     one rank's ranges of its state (strategy/state.lua's
--                      export: kind, unit, [lo, hi) of the unit's unpadded
--                      flat buffer), raw little-endian fp32, back to back
--   rank-RRRRR.json    that file's index: each range's kind, unit, lo, hi,
--                      dtype and byte offset, and a SHA-256 per 1 MiB block
-- and ROOT/latest names the newest complete one.
--
-- Writing (save, collective): every rank writes its files into
-- ROOT/.step-NNNNNNNN.tmp and fsyncs them; rank 0 gathers every rank's
-- outcome, and only when all succeeded writes the manifest, fsyncs it and
-- the directory, renames the directory into place, fsyncs ROOT, then
-- replaces `latest` the same way (temporary file, fsync, rename) and
-- removes checkpoints beyond the newest `keep`. A failure anywhere (a full
-- disk) removes the temporary directory and raises the same error on every
-- rank: the previous checkpoint and `latest` are untouched. A crash at any
-- point leaves at most a stale .tmp directory (removed by the next save).
--
-- Reading (open, per rank): the manifest and every rank's index are read
-- (small); `read(kind, unit, lo, hi, dst)` then reads only the byte ranges
-- that overlap what this rank asks for, in whole 1 MiB blocks whose
-- checksums it verifies before using a byte. So a strategy on M ranks
-- loads a checkpoint saved on N ranks by another strategy, reading only its
-- shard (strategy/state.lua's import asks for exactly the ranges it holds).
local ffi = require "ffi"
local json = require "ztrain.util.json"
local libc = require "ztrain.libc"
local zffi = require "ztrain.ffi"
local errors = require "ztrain.errors"
local fs = require "ztrain.util.fs"
local C = zffi.C

local M = {}

M.FORMAT, M.VERSION = "ztrain-checkpoint", 1
M.BLOCK = 1048576                    -- bytes per checksummed block
local CHUNK = 1048576                -- elements staged per copy (4 MiB)

local function fail(msg) error(msg, 0) end

local function errno_text()
  local e = ffi.errno()
  return ffi.string(libc.strerror(e)), e
end

-- hex SHA-256 of n bytes at p
local function sha_hex(p, n)
  local st = ffi.new("zt_sha256")
  C.zt_sha256_init(st)
  C.zt_sha256_update(st, p, n)
  local hex = ffi.new("char[65]")
  C.zt_sha256_hex(st, hex)
  return ffi.string(hex, 64)
end

-- fsync a directory (so a rename in it is durable)
local function fsync_dir(path)
  local fd = libc.open(path, libc.O_RDONLY + libc.O_DIRECTORY + libc.O_CLOEXEC)
  if fd < 0 then return nil, ("cannot open %s: %s"):format(path, errno_text()) end
  local rc = libc.fsync(fd)
  local msg = rc ~= 0 and ("cannot fsync %s: %s"):format(path, errno_text()) or nil
  libc.close(fd)
  if msg then return nil, msg end
  return true
end

-- write text to path durably (fsync), or nil, err
local function write_file(path, text)
  local fd = libc.open(path, libc.O_WRONLY + libc.O_CREAT + libc.O_TRUNC + libc.O_CLOEXEC, ffi.cast("int", 420))
  if fd < 0 then return nil, ("cannot create %s: %s"):format(path, errno_text()) end
  local n = libc.pwrite(fd, text, #text, 0)
  local err
  if n ~= #text then err = ("cannot write %s: %s"):format(path, n < 0 and errno_text() or "short write")
  elseif libc.fsync(fd) ~= 0 then err = ("cannot fsync %s: %s"):format(path, errno_text()) end
  libc.close(fd)
  if err then return nil, err end
  return true
end

local function read_text(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

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
      local take = math.min(n - q, M.BLOCK - w.inblock)
      C.zt_sha256_update(w.st, p + q, take)
      w.inblock = w.inblock + take
      q = q + take
      if w.inblock == M.BLOCK then close_block() end
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
  local index = { rank = rank, file = name .. ".bin", block = M.BLOCK, entries = {} }
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
-- save(args) -> path of the checkpoint. Collective over args.world.
--   args: { world, root, step, export (this rank's strategy export), keep,
--           meta = { ... } (rank 0's: model, strategy, data, extra; JSON-able) }
function M.save(args)
  local world, root, step = args.world, args.root, args.step
  local name = ("step-%08d"):format(step)
  local final, tmp = root .. "/" .. name, root .. "/." .. name .. ".tmp"
  -- rank 0 prepares the temporary directory; the others wait for it
  local prep_err = ""
  if world.rank == 0 then
    local ok, err = fs.mkdirs(root, "output directory")
    if not ok then prep_err = "checkpoint: " .. tostring(err)
    else
      remove_dir(tmp)
      if libc.mkdir(tmp, 493) ~= 0 then prep_err = ("checkpoint: cannot create %s: %s"):format(tmp, errno_text()) end
    end
  end
  local prep = world:gather_strings(prep_err)
  for _, e in ipairs(prep) do if e ~= "" then fail(errors.all_ranks(e)) end end
  -- every rank writes its own files
  local ok, res = pcall(write_rank, tmp, world.rank, args.export)
  local outcome = ok and json.encode({ ok = true, bytes = res.bytes, sha = sha_hex(res.blocks and
                  table.concat(res.blocks) or "", #table.concat(res.blocks or {})) })
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
      local okc, cerr = pcall(function()
        local files = {}
        for rk, s in ipairs(all) do
          local o = json.decode(s)
          files[rk] = { bin = ("rank-%05d.bin"):format(rk - 1), index = ("rank-%05d.json"):format(rk - 1),
                        bytes = o.bytes, blocks_sha256 = o.sha }
        end
        local man = { format = M.FORMAT, version = M.VERSION, step = step, world_size = world.size,
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
      end)
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

---------------------------------------------------------------------------
-- Reading.

-- resolve(path) -> directory of a checkpoint: a checkpoint directory, or a
-- root whose `latest` names one.
function M.resolve(path)
  if read_text(path .. "/manifest.json") then return path end
  local latest = read_text(path .. "/latest")
  if latest then
    local name = latest:match("^%s*(%S+)%s*$")
    if name and read_text(path .. "/" .. name .. "/manifest.json") then return path .. "/" .. name end
    fail(("checkpoint: %s/latest names %q, which is not a complete checkpoint"):format(path, tostring(name)))
  end
  fail(("checkpoint: %s is neither a checkpoint (no manifest.json) nor a checkpoint directory with a " ..
        "`latest` file; resume=latest reads OUT/checkpoints (or train.ckpt_dir) of the run to continue: give " ..
        "that run's out=, and train.ckpt_every > 0 writes checkpoints"):format(path))
end

local function decode(path, text)
  local ok, v = pcall(json.decode, text)
  if not ok or type(v) ~= "table" then fail(("checkpoint: %s is not valid JSON"):format(path)) end
  return v
end

-- The manifest and the indexes are trusted only after these checks (a
-- corrupt or hand-edited file must end in a message naming the file and the
-- field, not in an index of nil deep inside read).
local function is_count(x) return type(x) == "number" and x >= 0 and x == math.floor(x) and x < 2 ^ 53 end
local function is_list(x) return type(x) == "table" and (next(x) == nil or x[1] ~= nil) end
local function bad_field(path, what)
  fail(("checkpoint: %s: %s; the checkpoint is corrupt (resume from an older one)"):format(path, what))
end

local function check_manifest(mpath, man)
  if not is_count(man.step) then bad_field(mpath, '"step" is not a whole number') end
  if man.files ~= nil and not is_list(man.files) then bad_field(mpath, '"files" is not a list') end
  for i, f in ipairs(man.files or {}) do
    local what = ("files[%d] (rank %d)"):format(i, i - 1)
    if type(f) ~= "table" then bad_field(mpath, what .. " is not an object") end
    -- plain names in the checkpoint's directory: a manifest never points elsewhere
    for _, k in ipairs { "index", "bin" } do
      if type(f[k]) ~= "string" or not f[k]:match("^[%w_%-][%w_%.%-]*$") then
        bad_field(mpath, ("%s: %q is not a file name in the checkpoint directory"):format(what, k))
      end
    end
    if not is_count(f.bytes) then bad_field(mpath, ('%s: "bytes" is not a whole number'):format(what)) end
    if type(f.blocks_sha256) ~= "string" then bad_field(mpath, ('%s: no "blocks_sha256"'):format(what)) end
  end
  -- what load_run reads besides the shards
  for _, k in ipairs { "data", "optim" } do
    if man[k] ~= nil and type(man[k]) ~= "table" then bad_field(mpath, ('"%s" is not an object'):format(k)) end
  end
  if man.optim and man.optim.t ~= nil and not is_count(man.optim.t) then
    bad_field(mpath, '"optim.t" is not a whole number')
  end
  if man.data and man.data.next_batch ~= nil and not is_count(man.data.next_batch) then
    bad_field(mpath, '"data.next_batch" is not a whole number')
  end
  if man.data and man.data.tokenizer ~= nil and type(man.data.tokenizer) ~= "string" then
    bad_field(mpath, '"data.tokenizer" is not a string')
  end
  if man.model ~= nil then
    if type(man.model) ~= "table" or (man.model.units ~= nil and not is_list(man.model.units)) then
      bad_field(mpath, '"model" is not an object with a list of "units"')
    end
    for i, u in ipairs(man.model.units or {}) do
      if type(u) ~= "table" or type(u.name) ~= "string" or not is_count(u.numel) then
        bad_field(mpath, ('model.units[%d] is not { "name": string, "numel": whole number }'):format(i))
      end
    end
  end
end

-- an index (rank-RRRRR.json) against its manifest entry f
local function check_index(ipath, idx, f)
  local nblocks = math.ceil(f.bytes / M.BLOCK)
  if not is_list(idx.blocks) or #idx.blocks ~= nblocks then
    bad_field(ipath, ('"blocks" is not a list of %d checksums (one per %d bytes of %d)'):format(nblocks, M.BLOCK,
              f.bytes))
  end
  for i = 1, nblocks do
    if type(idx.blocks[i]) ~= "string" then bad_field(ipath, ("blocks[%d] is not a checksum"):format(i)) end
  end
  if not is_list(idx.entries) then bad_field(ipath, '"entries" is not a list') end
  for i, e in ipairs(idx.entries) do
    if type(e) ~= "table" or type(e.kind) ~= "string" or type(e.unit) ~= "string" or not is_count(e.lo) or
       not is_count(e.hi) or not is_count(e.offset) or e.hi < e.lo then
      bad_field(ipath, ('entries[%d] is not { kind, unit, lo <= hi, offset } (whole numbers)'):format(i))
    end
    if e.offset + 4 * (e.hi - e.lo) > f.bytes then
      bad_field(ipath, ("entries[%d] (%s of %s [%.0f, %.0f)) ends at byte %.0f, past the %.0f bytes of %s")
                :format(i, e.kind, e.unit, e.lo, e.hi, e.offset + 4 * (e.hi - e.lo), f.bytes, f.bin))
    end
  end
end

-- open(path) -> ck: { dir, manifest, read = fn(kind, unit, lo, hi, dst, numel), close() }
function M.open(path)
  local dir = M.resolve(path)
  local mpath = dir .. "/manifest.json"
  local man = decode(mpath, assert(read_text(mpath)))
  if man.format ~= M.FORMAT then fail(("checkpoint: %s is not a ztrain checkpoint manifest"):format(mpath)) end
  if man.version ~= M.VERSION then
    fail(("checkpoint: %s has format version %s; this ztrain reads version %d"):format(mpath,
         tostring(man.version), M.VERSION))
  end
  check_manifest(mpath, man)
  local files = {}
  local function close_all() for _, g in ipairs(files) do libc.close(g.fd) end end
  for i, f in ipairs(man.files or {}) do
    local ipath = dir .. "/" .. f.index
    local text = read_text(ipath)
    if not text then
      close_all()
      fail(("checkpoint %s: rank file index %s is missing (a shard of rank %d)"):format(dir, f.index, i - 1))
    end
    local ok, idx = pcall(function()
      local v = decode(ipath, text)
      check_index(ipath, v, f)
      return v
    end)
    if not ok then close_all(); error(idx, 0) end
    if sha_hex(table.concat(idx.blocks), #table.concat(idx.blocks)) ~= f.blocks_sha256 then
      close_all()
      fail(("checkpoint %s: %s does not match the manifest (block checksums differ)"):format(dir, f.index))
    end
    local bpath = dir .. "/" .. f.bin
    local fd = libc.open(bpath, libc.O_RDONLY + libc.O_CLOEXEC)
    if fd < 0 then
      close_all()
      fail(("checkpoint %s: cannot open %s: %s (a shard of rank %d)"):format(dir, f.bin, errno_text(), i - 1))
    end
    files[i] = { fd = fd, path = bpath, index = idx, bytes = f.bytes }
  end
  local ck = { dir = dir, manifest = man, files = files, step = man.step }

  -- read bytes [off, off + n) of file f into p, verifying the blocks they touch
  local function read_verified(f, off, n, p)
    local B = M.BLOCK
    local b0, b1 = math.floor(off / B), math.floor((off + n - 1) / B)
    local blk = ffi.new("uint8_t[?]", B)
    for b = b0, b1 do
      local start = b * B
      local len = math.min(B, f.bytes - start)
      local got = libc.pread(f.fd, blk, len, start)
      if got ~= len then
        fail(("checkpoint %s: %s is truncated or unreadable at block %d (bytes %d..%d; the index says %d bytes)")
             :format(dir, f.path:match("[^/]+$"), b, start, start + len, f.bytes))
      end
      if sha_hex(blk, len) ~= f.index.blocks[b + 1] then
        fail(("checkpoint %s: %s block %d (bytes %d..%d) fails its checksum: the file is corrupt; resume " ..
              "from an older checkpoint"):format(dir, f.path:match("[^/]+$"), b, start, start + len))
      end
      local a, z = math.max(off, start), math.min(off + n, start + len)
      ffi.copy(p + (a - off), blk + (a - start), z - a)
    end
  end

  local numel = {}
  for _, u in ipairs((man.model or {}).units or {}) do numel[u.name] = u.numel end
  local staging = ffi.new("float[?]", CHUNK)
  function ck.read(kind, unit, lo, hi, dst, want_numel)
    if want_numel and numel[unit] and numel[unit] ~= want_numel then
      fail(("checkpoint %s: unit %s has %d elements in the checkpoint but %d in this model: it was saved " ..
            "from another model size or vocabulary"):format(dir, unit, numel[unit], want_numel))
    end
    local spans = {}
    for _, f in ipairs(files) do
      for _, e in ipairs(f.index.entries) do
        if e.kind == kind and e.unit == unit then
          local a, b = math.max(lo, e.lo), math.min(hi, e.hi)
          for at = a, b - 1, CHUNK do
            local cnt = math.min(CHUNK, b - at)
            read_verified(f, e.offset + 4 * (at - e.lo), 4 * cnt, ffi.cast("uint8_t *", staging))
            local d = dst:view(at - lo, { cnt })
            local ok, err = pcall(d.write, d, staging)
            d:free()
            if not ok then error(err, 0) end
          end
          if b > a then spans[#spans + 1] = { a, b } end
        end
      end
    end
    local reach = require("ztrain.strategy.state").reach(spans, lo)
    if reach < hi then
      fail(("checkpoint %s: %s of %s [%d, %d) is not in it (elements from %d are missing): a rank's " ..
            "shard is missing or the checkpoint holds no %s"):format(dir, kind, unit, lo, hi, reach, kind))
    end
  end
  function ck.close()
    for _, f in ipairs(files) do if f.fd then libc.close(f.fd); f.fd = nil end end
  end
  return ck
end

---------------------------------------------------------------------------
-- A run's checkpoints (the trainer's side).

-- The model's units and shape, as the manifest records them.
local function model_meta(tr)
  local units = {}
  for _, u in ipairs(tr.model.units) do units[#units + 1] = { name = u.name, numel = u.numel } end
  local c = tr.cfg
  return { name = c.name, L = c.L, C = c.C, NH = c.NH, V = c.V, maxT = c.maxT, units = units }
end

-- save_run(tr, root, keep) -> path: every rank's state at tr.step.
-- Collective over the world.
function M.save_run(tr, root, keep)
  local ex = tr:state()
  local G = tr.recipe.batch.micro * tr.accumulate * tr.dp.size
  local ok, res = pcall(M.save, {
    world = tr.world, root = root, step = tr.step, export = ex, keep = keep,
    meta = { model = model_meta(tr), strategy = tr.strategy.name, dp = tr.dp.size,
             pp = tr.pp and tr.pp.size or 1,
             optim = { t = tr.optim.t },
             -- the next global micro-batch index of the training data, and
             -- the global batch that reached it
             data = { next_batch = tr:next_batch(), global_batch = G, seed = tr.recipe.data.seed,
                      tokenizer = type(tr.recipe.data.tokenizer) == "string" and tr.recipe.data.tokenizer or nil,
                      eot = tr.tokenizer and tr.tokenizer.eot },
             -- no random state to keep: initialisation and data order are
             -- functions of the seeds and the step
             rng = "none",
             precision = tr.recipe.precision,
             loss_scaler = tr.ctx.loss_scaler and { scale = tr.ctx.loss_scaler.scale, good = tr.ctx.loss_scaler.good,
                                                    left = tr.ctx.loss_scaler.left,
                                                    skipped = tr.ctx.loss_scaler.skipped } or "none" },
  })
  ex.free()
  if not ok then error(res, 0) end
  return res
end

-- resume_run(tr, path): load the checkpoint at path (a checkpoint or a root
-- with `latest`) into this run, whatever strategy and world size saved it.
-- Every rank reads only its ranges. Raises a user error naming what does
-- not match (model shape, a missing shard, a corrupt block) -- on every
-- rank alike (a collective: the first failing rank's message).
function M.resume_run(tr, path)
  local ok, dir, man = pcall(M.load_run, tr, path)
  local msg = errors.agree(tr.world, ok and "" or ("rank %d: %s"):format(tr.rank, errors.message(dir)))
  if msg ~= "" then fail(errors.all_ranks(tr.world_size > 1 and msg or msg:gsub("^rank %d+: ", ""))) end
  tr:finish_load()                               -- e.g. low-precision parameters from the master weights
  if tr.tied then tr.tied:sync_params() end      -- the head's replica of the embedding (a collective)
  return dir, man
end

-- load_run(tr, path) -> dir, manifest: this rank's part of resume_run.
function M.load_run(tr, path)
  local ck = M.open(path)
  local man = ck.manifest
  local ok, err = pcall(function()
    local mine = model_meta(tr)
    local saved = man.model or {}
    if saved.C and (saved.C ~= mine.C or saved.L ~= mine.L or saved.V ~= mine.V or saved.NH ~= mine.NH) then
      fail(("checkpoint %s holds a model of %s layers, %s channels, %s heads and %s tokens, but this run's " ..
            "model has %d, %d, %d and %d (model.size, model.vocab_size or data.tokenizer differ)"):format(ck.dir,
            tostring(saved.L), tostring(saved.C), tostring(saved.NH), tostring(saved.V), mine.L, mine.C, mine.NH,
            mine.V))
    end
    -- the same tokenizer: the embedding's rows mean the same tokens
    local tok = type(tr.recipe.data.tokenizer) == "string" and tr.recipe.data.tokenizer or nil
    local saved_tok = man.data and man.data.tokenizer
    if tok and saved_tok and tok ~= saved_tok then
      fail(("checkpoint %s was trained with data.tokenizer = %q, this run uses %q: its embedding rows " ..
            "stand for other tokens; set data.tokenizer=%s"):format(ck.dir, saved_tok, tok, saved_tok))
    end
    if man.step >= tr.recipe.train.steps then
      fail(("checkpoint %s is at step %d and train.steps is %d: nothing is left to train; raise train.steps")
           :format(ck.dir, man.step, tr.recipe.train.steps))
    end
    tr:import_state(ck.read, man.step)
    tr.optim.t = man.optim and man.optim.t or man.step
    if man.data and man.data.next_batch then tr:set_next_batch(man.data.next_batch) end
    -- fp16's loss scaler goes on where it was (a run in another precision starts its own)
    local LS = tr.ctx.loss_scaler
    if LS and type(man.loss_scaler) == "table" then
      LS.scale, LS.good, LS.left, LS.skipped = man.loss_scaler.scale, man.loss_scaler.good, man.loss_scaler.left,
                                                man.loss_scaler.skipped
    end
  end)
  ck.close()
  if not ok then error(err, 0) end
  return ck.dir, man
end

-- export(path, dir) -> dir: the parameters of the checkpoint at path,
-- consolidated from every rank's shard, written as a Hugging Face GPT-2
-- directory (config.json + model.safetensors, F32; with vocab.json and
-- merges.txt when the run's tokenizer was a BPE vocabulary). Needs no
-- ranks, no strategy: `ztrain export CKPT DIR`.
function M.export(path, dir)
  local T = require "ztrain.tensor"
  local gpt2 = require "ztrain.nn.gpt2"
  local hf = require "ztrain.nn.hf"
  local ck = M.open(path)
  local man, model = ck.manifest, nil
  local ok, err = pcall(function()
    local m = man.model or {}
    local cfg = gpt2.custom({ name = m.name, L = m.L, C = m.C, NH = m.NH, maxT = m.maxT, V = m.V },
                            "checkpoint " .. ck.dir .. " manifest")
    model = gpt2.new(cfg, { tier = "host", alloc = false })
    for _, u in ipairs(model.units) do
      local t = T.new({ u.padded }, { tier = "host", category = "params" })
      model:set_params(u, t)
      t:fill(0)
      local v = t:view(0, { u.numel })
      local okr, rerr = pcall(ck.read, "params", u.name, 0, u.numel, v, u.numel)
      v:free()
      if not okr then error(rerr, 0) end
    end
    local tok = man.data and man.data.tokenizer
    local tdir
    if tok == "bpe" then tdir = require("ztrain.data").home .. "/" .. require("ztrain.data").BPE_DEFAULT
    elseif type(tok) == "string" then tdir = tok:match("^hf:(.+)$") or tok:match("^bpe:(.+)$") end
    local oks, serr = hf.save(model, dir, { eot = man.data and man.data.eot, tokenizer_dir = tdir })
    if not oks then error(serr, 0) end
  end)
  ck.close()
  if model then model:free() end
  if not ok then error(err, 0) end
  return dir
end

return M
