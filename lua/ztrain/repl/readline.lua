-- ztrain.repl.readline: GNU readline (libreadline.so.8, Debian's libreadline8)
-- through the FFI: line editing, history kept in a file, Tab completion.
--
--   local rl = require "ztrain.repl.readline"
--   local ed = rl.open { history = path, complete = fn(text) -> { candidates } }
--   local line = ed:read("zt> ")   -- string | nil (end of input) | false (Ctrl-C)
--   ed:close()
--
-- Readline's callback interface is used, not readline(): the wait for a key
-- is our poll(), so a signal (Ctrl-C; the handler only counts it,
-- runtime/interrupt.c) ends the wait with EINTR and the line is dropped
-- here, on the main thread, outside any signal handler. Readline installs no
-- signal handlers of its own (rl_catch_signals = 0).
--
-- Readline calls back into Lua (the line handler, completion). An FFI
-- callback must not be entered from JIT-compiled code, so the functions that
-- call into readline are kept out of traces (jit.off).
local ffi = require "ffi"
local bit = require "bit"
local libc = require "ztrain.core.libc"
local interrupt = require "ztrain.core.interrupt"

local M = {}

-- declared under private names bound with asm labels (as libc.lua does), so
-- a user's own cdef of `readline` or `add_history` cannot clash
local declared = pcall(ffi.typeof, "ztrain_rl_line_fn")
if not declared then
  ffi.cdef [[
typedef void (*ztrain_rl_line_fn)(char *line);
typedef char **(*ztrain_rl_complete_fn)(const char *text, int start, int end);
void ztrain_rl_callback_handler_install(const char *prompt, ztrain_rl_line_fn fn)
  __asm__("rl_callback_handler_install");
void ztrain_rl_callback_read_char(void) __asm__("rl_callback_read_char");
void ztrain_rl_callback_handler_remove(void) __asm__("rl_callback_handler_remove");
int ztrain_rl_replace_line(const char *text, int clear_undo) __asm__("rl_replace_line");
int ztrain_rl_crlf(void) __asm__("rl_crlf");
void ztrain_rl_free_line_state(void) __asm__("rl_free_line_state");
void ztrain_rl_add_history(const char *line) __asm__("add_history");
int ztrain_rl_read_history(const char *file) __asm__("read_history");
int ztrain_rl_write_history(const char *file) __asm__("write_history");
int ztrain_rl_append_history(int n, const char *file) __asm__("append_history");
int ztrain_rl_history_truncate_file(const char *file, int lines) __asm__("history_truncate_file");
void ztrain_rl_using_history(void) __asm__("using_history");
extern ztrain_rl_complete_fn ztrain_rl_attempted_completion_function
  __asm__("rl_attempted_completion_function");
extern const char *ztrain_rl_readline_name __asm__("rl_readline_name");
extern const char *ztrain_rl_basic_word_break_characters __asm__("rl_basic_word_break_characters");
extern int ztrain_rl_catch_signals __asm__("rl_catch_signals");
extern int ztrain_rl_catch_sigwinch __asm__("rl_catch_sigwinch");
extern int ztrain_rl_attempted_completion_over __asm__("rl_attempted_completion_over");
extern int ztrain_rl_completion_suppress_append __asm__("rl_completion_suppress_append");
]]
end

M.MAX_HISTORY = 1000

local lib
-- load() -> the library, or nil and why (no readline: the REPL reads plain lines)
function M.load()
  if lib then return lib end
  local ok, l = pcall(ffi.load, "libreadline.so.8")
  if not ok then return nil, tostring(l) end
  lib = l
  return lib
end

-- history_file() -> $ZTRAIN_HISTORY, else ~/.ztrain_history (nil without HOME)
function M.history_file()
  local f = os.getenv("ZTRAIN_HISTORY")
  if f and f ~= "" then return f end
  local home = os.getenv("HOME")
  return home and home ~= "" and (home .. "/.ztrain_history") or nil
end

-- matches(list) -> a malloc'd NULL-terminated char*[] as readline wants from
-- a completion function: [0] is what replaces the word (the candidates'
-- longest common prefix), then the candidates; readline frees all of it.
local function cstr(s)
  local p = ffi.cast("char *", libc.malloc(#s + 1))
  ffi.copy(p, s, #s)
  p[#s] = 0
  return p
end

function M.common_prefix(list)
  local p = list[1] or ""
  for i = 2, #list do
    local s, n = list[i], 0
    while n < #p and n < #s and p:byte(n + 1) == s:byte(n + 1) do n = n + 1 end
    p = p:sub(1, n)
  end
  return p
end

-- keep_typeahead(fd) -> undo(): lines typed while a call runs wait in the
-- terminal's queue (readline is not reading) and are read at the next
-- prompt; but a signal key (Ctrl-C) flushes that queue, the terminal's
-- default. NOFLSH keeps it: Ctrl-C interrupts the call, and what was typed
-- meanwhile is still read after it. undo() puts the flag back as it was.
function M.keep_typeahead(fd)
  local t = libc.termios_t()
  if libc.tcgetattr(fd, t) ~= 0 then return function() end end
  local had = bit.band(t.c_lflag, libc.NOFLSH)
  t.c_lflag = bit.bor(t.c_lflag, libc.NOFLSH)
  libc.tcsetattr(fd, libc.TCSANOW, t)
  return function()
    if had ~= 0 or libc.tcgetattr(fd, t) ~= 0 then return end
    t.c_lflag = bit.band(t.c_lflag, bit.bnot(libc.NOFLSH))
    libc.tcsetattr(fd, libc.TCSANOW, t)
  end
end

local Editor = {}
Editor.__index = Editor

-- open{ history = path|false, complete = fn(text, line) -> list } -> editor | nil, why
function M.open(o)
  o = o or {}
  local R, err = M.load()
  if not R then return nil, err end
  local self = setmetatable({ R = R, history = o.history, complete = o.complete }, Editor)
  R.ztrain_rl_readline_name = "ztrain"          -- `$if ztrain` in ~/.inputrc
  R.ztrain_rl_catch_signals = 0
  R.ztrain_rl_catch_sigwinch = 0
  -- '.' and ':' are not word breaks: "zt.tensor.ne" and "t:sha" complete whole
  self.breaks = ffi.new("char[?]", 32, " \t\n\"'`@$><=;|&{(,+-*/%^~#[]")
  R.ztrain_rl_basic_word_break_characters = self.breaks
  R.ztrain_rl_using_history()
  if self.history then
    if R.ztrain_rl_read_history(self.history) ~= 0 then
      R.ztrain_rl_write_history(self.history)   -- create it: append_history needs the file
    end
  end
  -- callbacks live as long as the editor (anchored in self)
  self.on_line = ffi.cast("ztrain_rl_line_fn", function(p)
    if p == nil then self.got = nil
    else self.got = ffi.string(p); libc.free(p) end
    self.done = true
    -- removing the handler here keeps readline from printing the prompt again
    R.ztrain_rl_callback_handler_remove()
  end)
  if self.complete then
    self.on_complete = ffi.cast("ztrain_rl_complete_fn", function(text, start, stop)
      R.ztrain_rl_attempted_completion_over = 1        -- no file-name completion
      local ok, list = pcall(self.complete, ffi.string(text))
      if not ok or type(list) ~= "table" or #list == 0 then return nil end
      R.ztrain_rl_completion_suppress_append = 1      -- no space after "zt.tensor"
      local arr = ffi.cast("char **", libc.malloc(ffi.sizeof("char *") * (#list + 2)))
      arr[0] = cstr(#list == 1 and list[1] or M.common_prefix(list))
      for i, s in ipairs(list) do arr[i] = cstr(s) end
      arr[#list + 1] = nil
      return arr
    end)
    R.ztrain_rl_attempted_completion_function = self.on_complete
  end
  return self
end

-- ed:read(prompt) -> line | nil (end of input: Ctrl-D) | false (Ctrl-C:
-- the line was dropped). A non-empty line goes into the history (and its file).
local pfd = libc.pollfd(1)
function Editor:read(prompt)
  local R = self.R
  self.done, self.got = false, nil
  R.ztrain_rl_callback_handler_install(prompt, self.on_line)
  while not self.done do
    pfd[0].fd, pfd[0].events, pfd[0].revents = 0, libc.POLLIN, 0
    local n = libc.poll(pfd, 1, -1)
    if n < 0 and ffi.errno() ~= libc.EINTR then
      R.ztrain_rl_callback_handler_remove()
      return nil
    end
    if interrupt.count() > 0 then
      -- Ctrl-C at the prompt: drop the line, a fresh prompt
      interrupt.clear()
      R.ztrain_rl_free_line_state()
      R.ztrain_rl_replace_line("", 0)
      io.stdout:write("^C")
      io.stdout:flush()
      R.ztrain_rl_crlf()
      R.ztrain_rl_callback_handler_remove()
      return false
    end
    if n > 0 then R.ztrain_rl_callback_read_char() end
  end
  local line = self.got
  if line and line:find("%S") then
    R.ztrain_rl_add_history(line)
    if self.history then R.ztrain_rl_append_history(1, self.history) end
  end
  return line
end
-- readline calls back into Lua from here: never from a trace
jit.off(Editor.read, true)

function Editor:close()
  if self.history then self.R.ztrain_rl_history_truncate_file(self.history, M.MAX_HISTORY) end
  if self.on_complete then
    self.R.ztrain_rl_attempted_completion_function = nil
    self.on_complete:free(); self.on_complete = nil
  end
  if self.on_line then self.on_line:free(); self.on_line = nil end
end

return M
