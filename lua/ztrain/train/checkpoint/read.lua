-- ztrain.train.checkpoint.read: checkpoint.open and checkpoint.resolve, per rank
-- (the layout: checkpoint/format.lua).
--
-- The manifest and every rank's index are read (small) and checked field
-- by field; `read(kind, unit, lo, hi, dst)` then reads only the byte ranges
-- that overlap what this rank asks for, in whole 1 MiB blocks whose
-- checksums it verifies before using a byte. So a strategy on M ranks
-- loads a checkpoint saved on N ranks by another strategy, reading only its
-- shard (strategy/state.lua's import asks for exactly the ranges it holds).
local ffi = require "ffi"
local json = require "ztrain.util.json"
local libc = require "ztrain.core.libc"
local state = require "ztrain.parallel.strategy.state"
local format = require "ztrain.train.checkpoint.format"

local M = {}

local CHUNK = format.CHUNK
local errno_text, sha_hex = format.errno_text, format.sha_hex

local function fail(msg) error(msg, 0) end

local function read_text(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

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
  local nblocks = math.ceil(f.bytes / format.BLOCK)
  if not is_list(idx.blocks) or #idx.blocks ~= nblocks then
    bad_field(ipath, ('"blocks" is not a list of %d checksums (one per %d bytes of %d)'):format(nblocks, format.BLOCK,
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

-- the rank files the manifest lists: each index read, checked and matched
-- to the manifest, each .bin opened; on a failure the files opened so far
-- are closed
local function open_files(dir, man)
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
    if format.blocks_sha(idx.blocks) ~= f.blocks_sha256 then
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
  return files
end

-- read bytes [off, off + n) of rank file f of checkpoint dir into p,
-- verifying the blocks they touch
local function read_verified(dir, f, off, n, p)
  local B = format.BLOCK
  local b0, b1 = math.floor(off / B), math.floor((off + n - 1) / B)
  local blk = ffi.new("uint8_t[?]", B)
  for b = b0, b1 do
    local start = b * B
    local len = math.min(B, f.bytes - start)
    local got = libc.pread(f.fd, blk, len, start)
    if got ~= len then
      fail(("checkpoint %s: %s is truncated or unreadable at block %d (bytes %d..%d; the index says %d bytes); " ..
            "resume from an older checkpoint")
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

-- reader(dir, man, files) -> read(kind, unit, lo, hi, dst, want_numel): dst
-- filled with elements [lo, hi) of `kind` of `unit` from every rank file
-- holding a part of them; an error names what is missing or differs
local function reader(dir, man, files)
  local numel = {}
  for _, u in ipairs((man.model or {}).units or {}) do numel[u.name] = u.numel end
  local staging = ffi.new("float[?]", CHUNK)
  return function(kind, unit, lo, hi, dst, want_numel)
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
            read_verified(dir, f, e.offset + 4 * (at - e.lo), 4 * cnt, ffi.cast("uint8_t *", staging))
            local d = dst:view(at - lo, { cnt })
            local ok, err = pcall(d.write, d, staging)
            d:free()
            if not ok then error(err, 0) end
          end
          if b > a then spans[#spans + 1] = { a, b } end
        end
      end
    end
    local reach = state.reach(spans, lo)
    if reach < hi then
      fail(("checkpoint %s: %s of %s [%d, %d) is not in it (elements from %d are missing): a rank's " ..
            "shard is missing or the checkpoint holds no %s"):format(dir, kind, unit, lo, hi, reach, kind))
    end
  end
end

-- open(path) -> ck: { dir, manifest, read = fn(kind, unit, lo, hi, dst, numel), close() }
function M.open(path)
  local dir = M.resolve(path)
  local mpath = dir .. "/manifest.json"
  local man = decode(mpath, assert(read_text(mpath)))
  if man.format ~= format.FORMAT then
    fail(("checkpoint: %s is not a ztrain checkpoint manifest"):format(mpath))
  end
  if man.version ~= format.VERSION then
    fail(("checkpoint: %s has format version %s; this ztrain reads version %d"):format(mpath,
         tostring(man.version), format.VERSION))
  end
  check_manifest(mpath, man)
  local files = open_files(dir, man)
  local ck = { dir = dir, manifest = man, files = files, step = man.step }
  ck.read = reader(dir, man, files)
  function ck.close()
    for _, f in ipairs(files) do if f.fd then libc.close(f.fd); f.fd = nil end end
  end
  return ck
end

return M
