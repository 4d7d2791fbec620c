-- ztrain.util.durable: output files that never lie.
--
--   durable.write_atomic(path, text)   -> true | nil, err
--   durable.write_synced(path, text)   -> true | nil, err
--   local a = durable.appender(path[, { append = true }]) -> appender | nil, err
--   a:append(text) -> true | nil, err; a:close() -> true | nil, err
--   durable.fsync_dir(dir)             -> true | nil, err
--
-- write_atomic writes a temporary file beside `path` (a name no other run or
-- rank uses), checks every write, fsyncs it, renames it over `path` and
-- fsyncs the directory. On any failure (ENOSPC, EIO, EFBIG, a name too long)
-- it removes the temporary file, leaves the previous `path` as it was, and
-- returns "cannot write PATH: REASON" -- a run turns that into an I/O error
-- (errors.io), never an exit 0 over an empty file.
--
-- write_synced is its first half alone: create or truncate `path`, write
-- every byte (EINTR and short writes retried), fsync, close; for a file in
-- a directory that is itself renamed into place (a checkpoint's files).
--
-- An appender (metrics.jsonl) writes whole lines: a write that fails or
-- comes up short is cut back to the last whole line (ftruncate), so the file
-- stays parseable, and the error names the file.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"

local M = {}

local function reason() return ffi.string(libc.strerror(ffi.errno())) end

-- write all n bytes of buf at offset off; returns true or nil, reason
local function pwrite_all(fd, buf, n, off)
  local p, done = ffi.cast("const char *", buf), 0
  while done < n do
    local w = tonumber(libc.pwrite(fd, p + done, n - done, off + done))
    if w < 0 then
      if ffi.errno() ~= 4 then return nil, reason() end           -- EINTR: again
    elseif w == 0 then return nil, "short write"
    else done = done + w end
  end
  return true
end

-- fsync a directory, so that a rename in it is durable
function M.fsync_dir(dir)
  local fd = libc.open(dir, libc.O_RDONLY + libc.O_DIRECTORY + libc.O_CLOEXEC)
  if fd < 0 then return nil, ("cannot open %s: %s"):format(dir, reason()) end
  local rc = libc.fsync(fd)
  local err = rc ~= 0 and ("cannot fsync %s: %s"):format(dir, reason()) or nil
  libc.close(fd)
  if err then return nil, err end
  return true
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end
local function basename(path) return path:match("[^/]*$") end

local seq = 0
-- a temporary name beside path that no other process (or rank) uses
local function tmp_name(path)
  seq = seq + 1
  return ("%s/.%s.tmp.%d.%d"):format(dirname(path), basename(path), libc.getpid(), seq)
end

-- write_file(path, text) -> true | nil, reason: create or truncate, write
-- all, fsync, close (the file stays, whole or not, for the caller to remove)
local function write_file(path, text)
  local fd = libc.open(path, libc.O_WRONLY + libc.O_CREAT + libc.O_TRUNC + libc.O_CLOEXEC,
                       ffi.cast("int", 420))   -- 0644
  if fd < 0 then return nil, reason(), "open" end
  local ok, why = pwrite_all(fd, text, #text, 0)
  if ok and libc.fsync(fd) ~= 0 then ok, why = nil, reason() end
  if libc.close(fd) ~= 0 and ok then ok, why = nil, reason() end
  return ok, why
end

function M.write_synced(path, text)
  local ok, why = write_file(path, text)
  if not ok then return nil, ("cannot write %s: %s"):format(path, why) end
  return true
end

function M.write_atomic(path, text)
  local tmp = tmp_name(path)
  local ok, why, stage = write_file(tmp, text)
  -- the name may be the problem (too long, a missing directory): say the real path
  if not ok and stage == "open" then return nil, ("cannot write %s: %s"):format(path, why) end
  if ok then
    local rok, rerr = os.rename(tmp, path)
    if not rok then ok, why = nil, tostring(rerr):match(":%s*([^:]+)$") or tostring(rerr) end
  end
  if not ok then
    libc.unlink(tmp)
    return nil, ("cannot write %s: %s"):format(path, why)
  end
  return M.fsync_dir(dirname(path))
end

local Appender = {}
Appender.__index = Appender

-- appender(path[, opts]) -> a line appender over a new (truncated) file,
-- or with opts.append over the file as it is (created if missing): its
-- lines stay and new ones follow
function M.appender(path, opts)
  local append = opts and opts.append
  local fd = libc.open(path, libc.O_WRONLY + libc.O_CREAT + (append and 0 or libc.O_TRUNC) + libc.O_CLOEXEC,
                       ffi.cast("int", 420))
  if fd < 0 then return nil, ("cannot write %s: %s"):format(path, reason()) end
  local size = 0
  if append then
    local st = libc.stat_t()
    if libc.stat(path, st) ~= 0 then
      local why = reason()
      libc.close(fd)
      return nil, ("cannot write %s: %s"):format(path, why)
    end
    size = tonumber(st.st_size)
  end
  return setmetatable({ fd = fd, path = path, size = size }, Appender)
end

local st_now = libc.stat_t()

function Appender:append(text)
  if not self.fd then return nil, ("cannot write %s: closed"):format(self.path) end
  -- a file deleted under the run (its directory removed) takes writes and
  -- keeps none: said, not lost in silence
  if libc.fstat(self.fd, st_now) == 0 and st_now.st_nlink == 0 then
    return nil, ("cannot write %s: the file was deleted while the run wrote it (its directory removed?)")
                :format(self.path)
  end
  local ok, why = pwrite_all(self.fd, text, #text, self.size)
  if not ok then
    -- keep only whole lines: cut back what part of this one got written
    libc.ftruncate(self.fd, self.size)
    return nil, ("cannot write %s: %s"):format(self.path, why)
  end
  self.size = self.size + #text
  return true
end

-- close() fsyncs: a run that ends well has its metrics on disk
function Appender:close()
  if not self.fd then return true end
  local fd = self.fd
  self.fd = nil
  local err
  if libc.fsync(fd) ~= 0 then err = reason() end
  if libc.close(fd) ~= 0 and not err then err = reason() end
  if err then return nil, ("cannot write %s: %s"):format(self.path, err) end
  return true
end

return M
