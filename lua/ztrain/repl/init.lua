-- ztrain.repl: a read-eval-print loop with ztrain loaded as `zt`.
--
-- On a terminal: GNU readline (repl/readline.lua) for line editing, history
-- kept in $ZTRAIN_HISTORY or ~/.ztrain_history, and Tab completion of
-- globals, `zt.` names, fields and methods (repl/complete.lua). Results are
-- pretty-printed (repl/pretty.lua): tensors, models, trainers, run
-- summaries. `help(x)` or `?x` prints x's documentation (repl/help.lua).
-- Input continues while the chunk is incomplete; an error is printed and
-- the session goes on; `local x = ...` at the prompt also defines a global
-- (each line is its own chunk, so a local would be gone at the next).
--
-- Ctrl-C (SIGINT, counted by runtime/interrupt.c) at the prompt drops the
-- line; during a call it raises "interrupted" at the next safe point: between
-- training steps, between kernels, or (in Lua code the JIT has not compiled)
-- every few thousand VM instructions. Under several ranks see repl/ranks.lua.
local errors = require "ztrain.core.errors"
local interrupt = require "ztrain.core.interrupt"
local pretty = require "ztrain.repl.pretty"
local help = require "ztrain.repl.help"
local libc = require "ztrain.core.libc"
local readline = require "ztrain.repl.readline"
local complete = require "ztrain.repl.complete"

local M = {}

M.show = pretty.show

-- exports(code) -> the names a leading `local` statement declares
-- ("local a, b = ..." -> { "a", "b" }), or nil. Each chunk is compiled on
-- its own, so a local would be gone at the next line: they are also set as
-- globals when the chunk ends (and stay locals inside it).
function M.exports(code)
  local fname = code:match("^%s*local%s+function%s+([%a_][%w_]*)")
  if fname then return { fname } end
  local list = code:match("^%s*local%s+([%a_][%w_%s,]-)%s*=[^=]") or code:match("^%s*local%s+([%a_][%w_%s,]-)%s*$")
             or code:match("^%s*local%s+([%a_][%w_%s,]-)%s*[;\n]")
  if not list then return nil end
  local names = {}
  for n in list:gmatch("[%a_][%w_]*") do names[#names + 1] = n end
  return #names > 0 and names or nil
end

-- compile(code) -> function | nil, err: an expression (its values are
-- shown), statements (a leading local exported, see exports), or statements
-- then an expression after the last ';' (`x = f(); x.field` shows x.field)
local function compile(code)
  local f, err = loadstring("return " .. code, "=repl")
  if f then return f end
  local names = M.exports(code)
  if names then
    local set = {}
    for i, n in ipairs(names) do set[i] = ("rawset(_G, %q, %s)"):format(n, n) end
    -- (fails to compile after a final `return`: then the chunk runs as typed)
    f = loadstring(code .. "\n" .. table.concat(set, " "), "=repl")
    if f then return f end
  end
  f, err = loadstring(code, "=repl")
  if f then return f end
  local stmts, last = code:match("^(.*);%s*([^;]-)%s*$")
  if stmts and last ~= "" then
    local g = loadstring(stmts .. "\nreturn " .. last, "=repl")
    if g then return g end
  end
  return nil, err
end
M.compile = compile

-- help(x [, name]): print x's documentation (a global at the REPL)
function M.help(x, name)
  io.stdout:write(help.text(x, name or (x == nil and "nil") or nil), "\n")
end
help.register(M.help, "help(x) or ?x: the documentation of a function, module or object (its source comments)")

-- `?expr` -> the code that prints expr's documentation
function M.question(code)
  local expr = code:match("^%s*%?%s*(.-)%s*$")
  if not expr then return nil end
  if expr == "" then return "help(zt, 'zt')" end
  return ("help((function() return %s end)(), %q)"):format(expr, expr)
end

local function handler(e)
  -- a user error is its message; a bug keeps its location and a traceback
  -- of the user's frames (cut where the REPL called in)
  if errors.is_user(e) then return errors.message(e) end
  local tb = debug.traceback(errors.message(e), 2)
  return (tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
end

-- results(res, from) -> the results' text (pretty), or nil when none
function M.results_text(res, n)
  if n < 2 then return nil end
  local parts, multiline = {}, false
  for i = 2, n do
    parts[#parts + 1] = pretty.show(res[i])
    if parts[#parts]:find("\n") then multiline = true end
  end
  return table.concat(parts, multiline and "\n" or "\t")
end

local function pack(...) return { n = select("#", ...), ... } end   -- keeps trailing nils

-- A pending Ctrl-C raises "interrupted" from a count hook too: Lua loops
-- that call nothing polled (interpreted code; compiled traces run no hooks).
local function hook() interrupt.poll() end

-- run(code, hooked) -> true, results text | false, error message. With
-- `hooked` (the prompt; not -e code) a count hook polls for Ctrl-C.
function M.run(code, hooked)
  local q = M.question(code)
  if q then code = q end
  local f, err = compile(code)
  if not f then return false, err end
  interrupt.clear()
  if hooked then debug.sethook(hook, "", 10000) end
  local res = pack(xpcall(f, handler))
  if hooked then debug.sethook() end
  if not res[1] then
    -- what the interrupted call built and nothing holds (a half-made model,
    -- a loop's tensors) is released now, not at some later collection
    if interrupt.is_interrupt(res[2]) then collectgarbage(); collectgarbage() end
    return false, res[2]
  end
  -- (formatting reads tensors, which poll: a Ctrl-C now drops the display)
  local ok, text = pcall(M.results_text, res, res.n)
  if not ok then return false, errors.message(text) end
  return true, text
end

-- eval(code, quiet, hooked) -> true | false, err. Prints results unless quiet.
function M.eval(code, quiet, hooked)
  local ok, text = M.run(code, hooked)
  if not ok then return false, text end
  if text and not quiet then io.stdout:write(text, "\n") end
  return true
end

-- complete(text) -> candidates (Tab)
function M.complete(text) return complete.candidates(text, _G) end

local function banner()
  return ("%s -- Lua REPL, ztrain loaded as `zt`. help(x) or ?x for documentation, Tab completes, " ..
          "Ctrl-C interrupts, Ctrl-D exits.\n"):format(zt.version())
end
M.banner = banner

-- incomplete(buf) -> true while the chunk needs more lines
function M.incomplete(buf)
  if M.question(buf) then return false end
  local f, err = compile(buf)
  return not f and err:match("<eof>") ~= nil
end

-- reader() -> fn(prompt) -> line | nil (end) | false (Ctrl-C), closer
local function reader()
  if libc.isatty(0) == 1 and os.getenv("TERM") ~= "dumb" then
    local ed = readline.open {
      history = readline.history_file(), complete = M.complete }
    if ed then
      local undo = readline.keep_typeahead(0)        -- lines typed while busy survive a Ctrl-C
      return function(p) return ed:read(p) end, function() ed:close(); undo() end
    end
  end
  return function(p)
    io.stdout:write(p)
    io.stdout:flush()
    local line = io.read("*l")
    if not line and interrupt.count() > 0 then interrupt.clear(); return false end
    return line
  end, function() end
end

function M.loop()
  rawset(_G, "help", M.help)
  io.stdout:write(banner())
  interrupt.install({ interrupt.SIGINT })
  local prev = interrupt.set_action("raise")
  local read, close = reader()
  local buf = nil
  while true do
    local line = read(buf and ">> " or "zt> ")
    if line == nil then io.stdout:write("\n"); break end
    if line == false then
      buf = nil                                   -- Ctrl-C: drop the chunk
    else
      buf = buf and (buf .. "\n" .. line) or line
      if not M.incomplete(buf) then
        local ok, eerr = M.eval(buf, false, true)
        if not ok then io.stdout:write("error: ", tostring(eerr), "\n") end
        io.stdout:flush()
        buf = nil
      end
    end
  end
  close()
  interrupt.set_action(prev)
  interrupt.restore({ interrupt.SIGINT })
end

return M
