-- spec/helpers/util.lua -- small things the specs share.
local M = {}

-- sh(cmd) -> output (stdout and stderr), exit code
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a"); p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

function M.read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end

function M.write(path, s)
  local f = assert(io.open(path, "wb")); f:write(s); f:close()
end

-- tmpdir() -> a new empty directory (remove it with rmdir_all)
function M.tmpdir()
  local d = os.tmpname(); os.remove(d)
  assert(os.execute("mkdir -p " .. d) == 0, "cannot make " .. d)
  return d
end

function M.rm(path) M.sh("rm -rf " .. path) end

-- a scratch path for a run's out= (not made: the run makes it)
function M.outdir() local d = os.tmpname(); os.remove(d); return d end

return M
