-- ztrain.plan.headroom: how much of this machine's memory a run may plan to
-- fill when no device.memory_limit is set (the pre-flight, plan/preflight.lua,
-- and `ztrain plan`'s limit per rank).
--
-- Not all of MemAvailable: a rank's share is device.memory_fraction of it
-- (0.9 by default: the page cache, other processes and the predictor's
-- error keep the rest), less what this process holds beyond the tensors the
-- planner predicts -- its code and libraries, the dataset, the Lua heap --
-- measured as its resident size (VmRSS) less the bytes the runtime accounts
-- on the device and host tiers. Measured on an idle ztrain at the
-- pre-flight (model described, data loaded, no tensor yet): 17 MiB for
-- gpt2-mini and gpt2 on the fortunes corpus, 27 MiB for gpt2-tiny with the
-- same corpus held as its bytes.
local memory = require "ztrain.core.memory"

local M = {}

-- rss() -> this process's resident bytes (VmRSS), or 0 where unknown
function M.rss()
  local f = io.open("/proc/self/status", "rb")
  if not f then return 0 end
  local s = f:read("*a")
  f:close()
  return (tonumber(s:match("VmRSS:%s*(%d+) kB")) or 0) * 1024
end

-- overhead() -> bytes this process holds that the planner does not predict
function M.overhead()
  return math.max(0, M.rss() - memory.current("device") - memory.current("host"))
end

-- share(r, avail, local_ranks) -> bytes one rank may plan to fill, and the
-- overhead taken off: avail x device.memory_fraction / local_ranks, less
-- this process's overhead (each local rank has its own).
function M.share(r, avail, local_ranks)
  local over = M.overhead()
  local frac = r.device.memory_fraction or 0.9
  return math.max(0, math.floor(avail * frac / math.max(local_ranks or 1, 1)) - over), over
end

-- describe(r, avail, local_ranks, over) -> where a rank's share comes from,
-- in words
function M.describe(r, avail, local_ranks, over)
  return ("MemAvailable %s in /proc/meminfo x device.memory_fraction = %g over %d local rank(s), less %s " ..
          "this process holds beyond its tensors: code, data, Lua heap"):format(memory.format(avail),
          r.device.memory_fraction or 0.9, math.max(local_ranks or 1, 1), memory.format(over))
end

return M
