-- ztrain.job.registry: who is who in a job, written by its ranks, read by
-- its launcher.
--
-- The launcher makes a private directory and passes it to every rank as
-- ZTRAIN_JOB. Each rank writes a file named by its pid there, with lines
-- "rank R", "host H", "nvme DIR" (where its swap files go), "ckpt ROOT"
-- (a checkpoint root it writes temporary directories in) and, rank 0, "out
-- DIR" (the run's output directory); a launch
-- agent (tools/netns_agent) writes "host H" and "session DIR" (the Open
-- MPI daemon's session directory). After mpirun ends, the launcher reads
-- them to name a rank that died, kill any rank left behind and remove swap
-- files that ranks killed without exit handlers left (ztrain.job.launch).
-- Anything may note a line (the offload engine notes its directory); this
-- module sits below every one of them.
local libc = require "ztrain.core.libc"
local fs = require "ztrain.util.fs"

local M = {}

-- note(line): add a line to this rank's registry file (no-op outside a job).
function M.note(line)
  local dir = os.getenv("ZTRAIN_JOB")
  if not dir or dir == "" then return end
  local f = io.open(("%s/%d"):format(dir, libc.getpid()), "a")
  if f then f:write(line, "\n"); f:close() end
end

-- read(dir) -> { [pid] = { rank =, host =, nvme = { DIR, ... }, session =,
--                         ckpt = { ROOT, ... } (checkpoint roots it wrote into), out = } }
function M.read(dir)
  local ranks = {}
  for _, path in ipairs(fs.glob(dir .. "/*") or {}) do
    local pid = tonumber(path:match("/(%d+)$"))
    local text = pid and fs.read_file(path)
    if text then
      local r = { nvme = {} }
      r.rank = tonumber(text:match("rank (%d+)"))
      for d in text:gmatch("nvme ([^\n]+)") do r.nvme[#r.nvme + 1] = d end
      r.ckpt = {}
      for d in text:gmatch("ckpt ([^\n]+)") do r.ckpt[#r.ckpt + 1] = d end
      r.host = text:match("host ([^\n]+)")
      r.session = text:match("session ([^\n]+)")
      r.out = text:match("\nout ([^\n]+)") or text:match("^out ([^\n]+)")
      if text:match("out%-restored ") then r.out_restored = true end
      ranks[pid] = r
    end
  end
  return ranks
end

return M
