-- ztrain.core.errors: errors meant for users, errors every rank raises alike, and
-- how both are shown.
--
-- Two kinds of error reach the top (the CLI, the REPL, summary.json):
--  * user errors: bad input, a setting out of range, a file that does not
--    exist. The message names the thing and what to do; a Lua file and line
--    would only distract. Raise them with error(errors.user(msg), 0), or with
--    error(msg, 0) (a plain string without a location counts as one).
--  * bugs: anything else (an index of nil, an error(msg) or error(msg, 2) with
--    its "file.lua:N:" location, a non-string error object). They keep their
--    location, and where the host prints one, a traceback: the place to fix.
--
-- Under several ranks an error normally ends the job with MPI_Abort: the
-- other ranks may be waiting in a collective. But an error that every rank
-- reaches at the same point (a bad setting they all resolved, a loss that
-- diverged after it was reduced) can end the job cleanly: each rank finishes
-- its collectives, rank 0 writes summary.json, every rank exits 1. Such
-- all_ranks errors are user errors too.
local M = {}

local mt = { __tostring = function(e) return e.msg end }

-- user(msg) -> an error object to raise with error(obj, 0).
function M.user(msg)
  return setmetatable({ msg = tostring(msg), user = true }, mt)
end

-- all_ranks(msg) -> a user error that every rank raises alike; error(obj, 0).
function M.all_ranks(msg)
  return setmetatable({ msg = tostring(msg), user = true, all_ranks = true }, mt)
end

function M.is_all_ranks(e) return type(e) == "table" and e.all_ranks == true end

-- The process's exit status by what happened (docs/cli.md "Exit status").
M.EXIT = { ok = 0, error = 1, io = 3, comm = 5, interrupted = 130 }

-- io(msg) -> a user error for a failed write of an output (disk full, I/O
-- error, a name too long): the run ends with exit status EXIT.io.
function M.io(msg)
  return setmetatable({ msg = tostring(msg), user = true, status = M.EXIT.io }, mt)
end

-- status(e) -> the exit status an error ends the process with
function M.status(e)
  return type(e) == "table" and e.status or M.EXIT.error
end

-- keeps_kind(e) -> true for an error a caller passes on as it is, not as
-- its message: every rank's (all_ranks), or one with an exit status of its
-- own (an interrupt: 130; a failed write: 3)
function M.keeps_kind(e)
  return M.is_all_ranks(e) or (type(e) == "table" and e.status ~= nil)
end

-- located(s) -> true when string s starts with a Lua location, as error()
-- at level >= 1 and the VM's own errors write it: "path/file.lua:12: ",
-- "repl:3: ", '[string "..."]:1: '.
function M.located(s)
  return type(s) == "string" and
         (s:find("^[^%s:]+:%d+: ") ~= nil or s:find('^%[string ".-"%]:%d+: ') ~= nil)
end

-- is_user(e) -> true for errors meant for users: user() and all_ranks()
-- objects, and strings raised without a location (level 0).
function M.is_user(e)
  if type(e) == "table" then return e.user == true end
  return type(e) == "string" and not M.located(e)
end

-- message(e) -> the text to show. A user error's message as is; a bug's full
-- text, location included (a non-string object through its __tostring).
function M.message(e)
  if type(e) == "table" and e.user == true then return e.msg end
  if type(e) == "string" then return e end
  local mtab = getmetatable(e)
  if mtab and mtab.__tostring then return tostring(e) end
  return ("(error object is a %s value)"):format(type(e))
end

-- traceback(e, level) -> for xpcall: a user error's message alone; a bug's
-- message with a traceback from `level` (default: the function that raised).
function M.traceback(e, level)
  if M.is_user(e) then return M.message(e) end
  return debug.traceback(M.message(e), level or 2)
end

-- agree(world, err) -> the first rank's error ("" for none), once every rank
-- of `world` has said whether it failed (a collective): a check whose
-- outcome could differ between ranks (a file one rank cannot read) then
-- stops all of them alike.
function M.agree(world, err)
  if not world or world.size == 1 then return err end
  for _, e in ipairs(world:gather_strings(err)) do if e ~= "" then return e end end
  return ""
end

return M
