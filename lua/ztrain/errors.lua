-- ztrain.errors: errors every rank raises alike.
--
-- Under several ranks an error normally ends the job with MPI_Abort: the
-- other ranks may be waiting in a collective. But an error that every rank
-- reaches at the same point (a bad setting they all resolved, a loss that
-- diverged after it was reduced) can end the job cleanly: each rank finishes
-- its collectives, rank 0 writes summary.json, every rank exits 1.
local M = {}

local mt = { __tostring = function(e) return e.msg end }

-- all_ranks(msg) -> an error object to raise with error(obj, 0).
function M.all_ranks(msg) return setmetatable({ msg = msg, all_ranks = true }, mt) end

function M.is_all_ranks(e) return type(e) == "table" and e.all_ranks == true end

-- message(e) -> text without a "file.lua:123: " prefix (users need the message).
function M.message(e)
  return (tostring(e):gsub("^[^\n:]*%.lua:%d+: ", ""))
end

return M
