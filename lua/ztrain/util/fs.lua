-- ztrain.util.fs: the file helpers every layer uses, one copy each.
--
-- Expected failures come back as nil, err (a message naming the path and
-- the reason); nothing here raises for a missing or unwritable file.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"

local M = {}

-- read_file(path) -> the file's bytes, or nil, "cannot read PATH: REASON".
function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, ("cannot read %s: %s"):format(path, tostring(err):match(":%s*([^:]+)$") or err) end
  local s = f:read("*a")
  f:close()
  if s == nil then return nil, ("cannot read %s"):format(path) end
  return s
end

-- exists(path) -> whether path names something that opens for reading
-- (a file or a directory).
function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close(); return true end
  return false
end

-- mkdirs(path[, what]) -> true, or nil, "cannot create WHAT PATH: REASON":
-- mkdir -p (0755; existing directories are fine), then a probe file
-- written and removed, so true means the directory exists and takes files.
-- what names the directory in the message ("output directory", ...).
function M.mkdirs(path, what)
  local acc = path:sub(1, 1) == "/" and "/" or ""
  local mkerr
  for part in path:gmatch("[^/]+") do
    acc = acc .. part
    if libc.mkdir(acc, 493) ~= 0 then
      local e = ffi.errno()
      if e ~= 17 then mkerr = ffi.string(libc.strerror(e)) end       -- EEXIST is fine
    end
    acc = acc .. "/"
  end
  local probe = path .. "/.probe"
  local f, err = io.open(probe, "w")
  if not f then
    -- the reason (read-only file system, permission denied, a file in the way)
    local why = mkerr or tostring(err):match(":%s*([^:]+)$") or tostring(err)
    return nil, ("cannot create %s %s: %s"):format(what or "directory", path, why)
  end
  f:close()
  os.remove(probe)
  return true
end

local GLOB_NOSPACE, GLOB_ABORTED, GLOB_NOMATCH = libc.GLOB_NOSPACE, libc.GLOB_ABORTED, libc.GLOB_NOMATCH

-- glob(pattern[, flags]) -> the matching paths in glob(3)'s order (sorted),
-- {} when nothing matches; nil, reason on a read error or no memory.
-- flags: glob(3)'s (libc.GLOB_MARK, GLOB_BRACE, GLOB_TILDE; default 0).
function M.glob(pattern, flags)
  local g = libc.glob_t()
  local rc = libc.glob(pattern, flags or 0, nil, g)
  local out = {}
  if rc == 0 then
    for i = 0, tonumber(g.gl_pathc) - 1 do out[#out + 1] = ffi.string(g.gl_pathv[i]) end
  end
  libc.globfree(g)
  if rc == 0 or rc == GLOB_NOMATCH then return out end
  if rc == GLOB_ABORTED then return nil, "read error while matching" end
  if rc == GLOB_NOSPACE then return nil, "out of memory while matching" end
  return nil, "glob() failed with code " .. rc
end

-- entries(dir) -> the paths in dir, dotfiles too, by glob(3) (no shell:
-- $(...), $HOME and quotes in dir stay literal); dir's own glob characters
-- are escaped (DIR[1] lists DIR[1], not DIR1). {} for a missing or
-- unreadable directory.
function M.entries(dir)
  local out, esc = {}, dir:gsub("[%[%]%*%?\\]", "\\%0")
  for _, pat in ipairs({ "/*", "/.[!.]*", "/..?*" }) do
    for _, p in ipairs(M.glob(esc .. pat) or {}) do out[#out + 1] = p end
  end
  return out
end

return M
