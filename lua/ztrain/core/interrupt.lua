-- ztrain.core.interrupt: what a signal means, decided at safe points.
--
-- The runtime's handler (runtime/interrupt.c) only counts signals. Long
-- loops poll the count at boundaries where stopping is safe and this module
-- says what a pending interrupt does there:
--
--   interrupt.install()                 -- count SIGINT (and others) instead of dying
--   interrupt.set_action("raise")       -- polls raise the error "interrupted" (the REPL)
--   interrupt.poll()                    -- a boundary safe on this rank alone
--   interrupt.poll_all(group)           -- a boundary every rank of group reaches (a collective)
--   interrupt.shield(fn, ...)           -- run fn with poll() a no-op (mid-step: async work in flight)
--   interrupt.checked(f)                -- f with a poll first (the FFI wrappers: tensor, memory)
--   if interrupt.pending() then ... end -- another policy (a graceful stop) reads the count itself
--
-- With no action set (plain runs), polls do nothing: the count is there for
-- whoever wants to act on it (issue 13's graceful stop: finish the step,
-- checkpoint, exit "interrupted"; a second signal, count() >= 2, stops now).
-- Under several ranks a poll that raised on one rank alone would leave the
-- others waiting in a collective, so with `agreed` set only poll_all raises,
-- and it raises on every rank of the group together.
local zffi = require "ztrain.core.ffi"
local errors = require "ztrain.core.errors"
local C, check = zffi.C, zffi.check
local count_fn, clear_fn = C.zt_interrupt_count, C.zt_interrupt_clear

local M = {}

-- signal numbers (Linux)
M.SIGINT, M.SIGUSR1, M.SIGTERM = 2, 10, 15
M.MESSAGE = "interrupted"

local action, agreed, held = nil, false, 0

-- install(sigs): count these signals (default SIGINT) instead of their
-- default action. restore(sigs): give them their default action back.
function M.install(sigs)
  for _, s in ipairs(sigs or { M.SIGINT }) do check(C.zt_interrupt_install(s), "interrupt.install") end
end
function M.restore(sigs)
  for _, s in ipairs(sigs or { M.SIGINT }) do check(C.zt_interrupt_restore(s), "interrupt.restore") end
end

function M.count() return count_fn() end
function M.pending() return count_fn() > 0 end
function M.clear() clear_fn() end
-- hard_after(n): the n-th signal received kills at once (its default
-- action): a graceful stop's second Ctrl-C. 0 = never.
function M.hard_after(n) C.zt_interrupt_hard(n or 0) end

-- grace(seconds): with hard_after set, the first signal leaves this long to
-- reach the stop point; grace_done() once it was reached (runtime/interrupt.c).
function M.grace(seconds) C.zt_interrupt_grace(math.max(0, math.ceil(seconds))) end
function M.grace_done() C.zt_interrupt_grace_done() end

-- raise(): count one, as a signal would (tests; a front end forwarding Ctrl-C)
function M.raise() C.zt_interrupt_raise() end

-- set_action(a, {agreed=}) -> the previous action, agreed. a: nil (polls do
-- nothing) or "raise". agreed: only poll_all raises (several ranks).
function M.set_action(a, opts)
  assert(a == nil or a == "raise", "interrupt.set_action: nil or \"raise\"")
  local pa, pg = action, agreed
  action, agreed = a, opts and opts.agreed or false
  return pa, pg
end

-- error() -> the error object a poll raises: a user error ("interrupted",
-- no Lua location) that every rank raises alike when it comes from poll_all.
function M.error(all)
  local e = all and errors.all_ranks(M.MESSAGE) or errors.user(M.MESSAGE)
  e.interrupted = true
  e.status = errors.EXIT.interrupted
  return e
end

-- is_interrupt(e) -> true for the error a poll raised (or its message).
function M.is_interrupt(e)
  if type(e) == "table" then return e.interrupted == true end
  return e == M.MESSAGE
end

-- poll(): at a boundary safe on this rank alone (between kernels, files,
-- evaluation batches): raises "interrupted" when one is pending and the
-- action is "raise" (not under `agreed`, not inside shield).
function M.poll()
  if count_fn() == 0 or action ~= "raise" or agreed or held > 0 then return end
  clear_fn()
  error(M.error(false), 0)
end

-- poll_all(group): at a boundary every rank of `group` reaches together
-- (between training steps). With an action set and several ranks it is a
-- collective (every rank says whether it saw a signal); then all raise
-- together, or none does.
function M.poll_all(group)
  if action ~= "raise" then return end
  if not group or group.size == 1 then
    if count_fn() == 0 then return end
    clear_fn()
    error(M.error(true), 0)
  end
  local any = 0
  for _, v in ipairs(group:gather_doubles({ count_fn() })) do any = any + v[1] end
  if any == 0 then return end
  clear_fn()
  error(M.error(true), 0)
end

-- polled(f) -> a function that calls f, then poll(): for loops of calls
-- that should stop between two of them (ztrain.ops wraps each op).
-- original(g) -> the f a polled g wraps (help shows f's documentation).
local originals = setmetatable({}, { __mode = "k" })
function M.polled(f)
  local poll = M.poll
  local g = function(...)
    local a, b = f(...)
    poll()
    return a, b
  end
  originals[g] = f
  return g
end
function M.original(g) return originals[g] end

-- checked(f) -> a function that polls, then calls f: for calls that build
-- something (a tensor) or read the runtime (memory counters), so that a loop
-- of them stops on Ctrl-C, and never between building a thing and handing
-- it over (the poll comes first: an interrupted call built nothing).
function M.checked(f)
  local poll = M.poll
  local g = function(...)
    poll()
    return f(...)
  end
  originals[g] = f
  return g
end

-- check_all(tbl, names): tbl's functions under these names made checked
function M.check_all(tbl, names)
  for _, name in ipairs(names) do
    if type(tbl[name]) == "function" then tbl[name] = M.checked(tbl[name]) end
  end
end

-- shield(fn, ...) -> fn's results, with poll() a no-op meanwhile: for work
-- that must not stop half-way (a training step: gathered parameters,
-- asynchronous copies and reductions in flight). The signal stays counted
-- for the next poll after it.
function M.shield(fn, ...)
  held = held + 1
  local res = { pcall(fn, ...) }
  held = held - 1
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

return M
