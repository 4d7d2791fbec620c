-- ztrain.util.host: facts about this machine that several layers ask for.
local M = {}

-- mem_available() -> bytes of MemAvailable (/proc/meminfo), or nil where
-- the kernel gives none.
function M.mem_available()
  local f = io.open("/proc/meminfo")
  if not f then return nil end
  local avail
  for line in f:lines() do
    local kb = line:match("^MemAvailable:%s+(%d+) kB")
    if kb then avail = tonumber(kb) * 1024 end
  end
  f:close()
  return avail
end

return M
