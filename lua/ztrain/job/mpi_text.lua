-- ztrain.job.mpi_text: what the launcher (job/launch.lua) does with mpirun's
-- standard error. Open MPI's own text -- its help blocks, between rules of
-- exactly 74 dashes (show_help's: the abort banners "MPI_ABORT was invoked
-- ...", "mpirun detected that one or more processes exited ..."), and its
-- "[host:pid] ..." notes -- is kept out of the terminal, so a failed job's
-- last line is the rank's own message; keep() writes it to the run
-- directory's mpirun.log (or $TMPDIR, or $ZTRAIN_MPI_LOG). The ranks' lines
-- pass. A "block" longer than MPI_BLOCK lines was not Open MPI's: it goes
-- to the terminal as it was; past MPI_KEEP bytes kept, the rest too
-- (nothing is dropped). The state lives in the launcher's watch w:
-- w.partial (a line without its end yet), w.block (a help block being
-- read), w.mpi (Open MPI's text kept).
local libc = require "ztrain.core.libc"

local M = {}

local MPI_RULE, MPI_NOTE = "^" .. ("%-"):rep(74) .. "$", "^%[[%w%.%-_]+:%d+%] "
local MPI_KEEP, MPI_BLOCK = 65536, 60

local function to_terminal(text) libc.write(2, text, #text) end

local function divert(w, text)
  if #w.mpi < MPI_KEEP then w.mpi = w.mpi .. text else to_terminal(text) end
end

-- relay(w, text): the ranks' lines to stderr, Open MPI's to w.mpi; a
-- partial line waits for its end unless it cannot start Open MPI's text
function M.relay(w, text)
  w.partial = w.partial .. text
  while true do
    local nl = w.partial:find("\n", 1, true)
    if not nl then break end
    local line = w.partial:sub(1, nl)
    w.partial = w.partial:sub(nl + 1)
    local bare = line:gsub("\r?\n$", "")
    if bare:match(MPI_RULE) then
      if w.block then divert(w, table.concat(w.block) .. line); w.block = nil
      else w.block = { line } end
    elseif w.block then
      w.block[#w.block + 1] = line
      if #w.block > MPI_BLOCK then to_terminal(table.concat(w.block)); w.block = nil end
    elseif bare:match(MPI_NOTE) then
      divert(w, line)
    else
      to_terminal(line)
    end
  end
  local c = w.partial:sub(1, 1)
  if w.partial ~= "" and not w.block and c ~= "-" and c ~= "[" then
    to_terminal(w.partial)                       -- a progress line without its end yet
    w.partial = ""
  end
end

-- keep(w, ranks): Open MPI's text into $ZTRAIN_MPI_LOG when set,
-- else OUT/mpirun.log (rank 0's
-- run directory, from the registry), or where the job has none (it ended
-- before one was made, or a failed start removed it) into
-- $TMPDIR/ztrain-mpirun-PID.log (the launcher's pid); to stderr only when
-- neither can be written
function M.keep(w, ranks)
  if w.partial ~= "" then M.relay(w, "\n") end
  if w.block then divert(w, table.concat(w.block)); w.block = nil end   -- a block the job's end cut short
  if w.mpi == "" then return end
  local out
  for _, r in pairs(ranks) do
    -- not into a run --overwrite put back as it was (rundir.lua)
    if r.out and not r.out_restored then out = out or r.out end
  end
  local tmp, named = os.getenv("TMPDIR"), os.getenv("ZTRAIN_MPI_LOG")
  local f = (named and named ~= "" and io.open(named, "a")) or (out and io.open(out .. "/mpirun.log", "a")) or
            io.open(("%s/ztrain-mpirun-%d.log"):format((tmp and tmp ~= "") and tmp or "/tmp", libc.getpid()), "a")
  if f then
    f:write(w.mpi)
    f:close()
  else
    io.stderr:write(w.mpi)
  end
end

return M
