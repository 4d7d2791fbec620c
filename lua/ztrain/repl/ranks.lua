-- ztrain.repl.ranks: the REPL over several ranks (`ztrain --nproc N -i`).
--
-- Two parts:
--
-- * the front end (front): the process the user started. It does not join
--   the job: it starts mpirun as a child in its own process group, with
--   pipes for its stdin and stdout, and owns the terminal: readline, history
--   and completion as on one rank. Each chunk typed is sent to rank 0 over
--   mpirun's stdin; the ranks' output comes back through mpirun's stdout up
--   to a marker that says "ready for the next chunk".
--
-- * the ranks (loop): rank 0 reads a chunk (framed: "<bytes>\n<chunk>") and
--   every rank receives it from rank 0 (a collective), runs it, and sends
--   rank 0 its text: the printed results, what `print` wrote, or the error.
--   Rank 0 shows the texts: once with "[all ranks]" when every rank said
--   the same, else each line prefixed "[rank k]". An error on one rank is
--   shown like any result; the session goes on.
--
-- Ctrl-C: the terminal's SIGINT reaches the front end alone (mpirun is in
-- another process group; Open MPI ends the whole job on SIGINT). At the
-- prompt it drops the line. During a chunk the front end sends SIGUSR1 to
-- mpirun, which forwards it to every rank (Open MPI forwards SIGUSR1 and
-- SIGUSR2); each rank counts it (runtime/interrupt.c) and training stops at
-- the next step boundary on every rank together (interrupt.poll_all, a
-- collective), raising "interrupted". A loop of your own that never reaches
-- such a boundary, or a rank waiting in a collective the others never
-- join, cannot be interrupted that way: a second Ctrl-C ends the job
-- (SIGTERM to mpirun) and the front end exits.
local ffi = require "ffi"
local errors = require "ztrain.core.errors"
local libc = require "ztrain.core.libc"
local interrupt = require "ztrain.core.interrupt"
local repl = require "ztrain.repl"
local comm = require "ztrain.core.comm"
local launch = require "ztrain.job.launch"
local zffi = require "ztrain.core.ffi"
local readline = require "ztrain.repl.readline"

local M = {}

M.MARKER = "\30ztrain-ready\30\n"
M.ENV = "ZTRAIN_REPL_RANKS"

-- fd helpers: whole writes, reads that retry on EINTR (a forwarded Ctrl-C
-- must not look like the end of input)
local function write_all(fd, s)
  local p, n = ffi.cast("const char *", s), #s
  while n > 0 do
    local w = libc.write(fd, p, n)
    if w < 0 then
      if ffi.errno() ~= libc.EINTR then return false end
    else
      p, n = p + w, n - tonumber(w)
    end
  end
  return true
end
M.write_all = write_all

local rbuf = ffi.new("char[65536]")
-- read_some(fd) -> bytes | nil (end of file or error) | "" (interrupted)
local function read_some(fd)
  local n = libc.read(fd, rbuf, 65536)
  if n < 0 then return ffi.errno() == libc.EINTR and "" or nil end
  if n == 0 then return nil end
  return ffi.string(rbuf, n)
end

-- A framed reader over fd 0 (rank 0's stdin, fed by the front end).
local pending = ""
local function read_exact(n)
  while #pending < n do
    local s = read_some(0)
    if s == nil then return nil end
    pending = pending .. s
  end
  local out = pending:sub(1, n)
  pending = pending:sub(n + 1)
  return out
end
local function read_line()
  while not pending:find("\n", 1, true) do
    local s = read_some(0)
    if s == nil then return nil end
    pending = pending .. s
  end
  local i = pending:find("\n", 1, true)
  local line = pending:sub(1, i - 1)
  pending = pending:sub(i + 1)
  return line
end

-- frame(kind, text) -> "R<bytes>\n<text>": R runs a chunk, C asks rank 0
-- for completions of a word
function M.frame(kind, text) return ("%s%d\n%s"):format(kind, #text, text) end

-- read_frame() -> kind, text | nil at end of input
local function read_frame()
  local head = read_line()
  if not head then return nil end
  local kind, n = head:match("^([RC])(%d+)$")
  if not kind then return nil end
  local text = read_exact(tonumber(n))
  if not text then return nil end
  return kind, text
end

-- show(texts) -> what rank 0 prints for the ranks' texts ({ [rank+1] = text }):
-- "" when all are empty, "[all ranks] ..." when all are equal, else each
-- non-empty text with its lines prefixed "[rank k] "
function M.show(texts)
  local same, any = true, false
  for i, t in ipairs(texts) do
    if t ~= texts[1] then same = false end
    if t ~= "" then any = true end
  end
  if not any then return "" end
  local function prefixed(tag, t)
    local out = {}
    for line in (t .. "\n"):gmatch("(.-)\n") do out[#out + 1] = tag .. line end
    return table.concat(out, "\n") .. "\n"
  end
  if same and #texts > 1 then return prefixed("[all ranks] ", texts[1]) end
  local out = {}
  for i, t in ipairs(texts) do
    if t ~= "" then out[#out + 1] = prefixed(("[rank %d] "):format(i - 1), t) end
  end
  return table.concat(out)
end

-- run_captured(code) -> text: the chunk's results, what print wrote, or
-- "error: ..." (repl.run under a print that writes into the text)
local function run_captured(code)
  local printed = {}
  local real_print = print
  _G.print = function(...)
    local n, parts = select("#", ...), {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    printed[#printed + 1] = table.concat(parts, "\t")
  end
  local ok, text = repl.run(code, true)
  _G.print = real_print
  if not ok then printed[#printed + 1] = "error: " .. tostring(text)
  elseif text then printed[#printed + 1] = text end
  return table.concat(printed, "\n")
end

M.FENCE_SITE = "the end of its chunk (the REPL)"

-- level(own) -> the messages of the collectives a chunk left unmatched: every
-- communicator this rank holds (the world, its live groups; not the REPL's
-- own) is fenced, all at once, and again until a fence succeeds. With
-- comm.check on, a rank still in a collective of the chunk meets the others'
-- fence there: both fail with the check's message, and the ranks, level
-- again, fence once more. (Off, fences move nothing: a rank left in a
-- collective waits for comm.timeout, whose watchdog ends the job.)
function M.level(own)
  local msgs, more = {}, 0
  local todo = {}
  for _, g in ipairs(comm.live()) do
    if g ~= own and g.c ~= nil and g.size > 1 then todo[#todo + 1] = g end
  end
  while #todo > 0 do
    local reqs, again = {}, {}
    for i, g in ipairs(todo) do reqs[i] = g:fence(M.FENCE_SITE, true) end
    for i, req in ipairs(reqs) do
      local ok, err = pcall(req.wait, req)
      if not ok then
        local m = errors.message(err):gsub("^comm%.fence: ", "", 1)
        -- the first says what happened; the others (a run's reductions in
        -- flight) are counted
        if #msgs == 0 then msgs[1] = "error: " .. m else more = more + 1 end
        -- a mismatch left the ranks level: fence again; anything else ends it
        if m:find("differs between ranks", 1, true) then again[#again + 1] = todo[i] end
      end
    end
    todo = again
  end
  if more > 0 then
    msgs[#msgs + 1] = ("error: and %d more collective(s) of other ranks met this rank's fences"):format(more)
  end
  return msgs
end

-- gather(own, s) -> every rank's s, over the REPL's own communicator. The
-- ranks wait here while the user thinks, and for each other's chunks: the
-- watchdog's timeout is out of reach meanwhile (NEVER), yet on, so this rank
-- still answers a peer's watchdog (runtime/comm_watch.c) that reports a
-- collective of the chunk stuck on that peer.
M.NEVER = 2 ^ 31
local function gather(own, s)
  local watch = comm.watch({ timeout = M.NEVER })
  local ok, res = pcall(own.gather_strings, own, s)
  comm.watch(watch)
  if not ok then error(res, 0) end
  return res
end

-- loop(): every rank's side (ZTRAIN_REPL_RANKS set by the front end). The
-- REPL's own traffic (the chunk from rank 0, the ranks' texts back) runs on a
-- communicator of its own, split from the world: a chunk's collectives,
-- matched or not, never meet it. Collectives are checked (comm.check), a
-- run's too (comm.hold_check), unless ZTRAIN_COMM_CHECK=0, so a chunk's
-- unmatched one is reported (level).
function M.loop()
  local zt = rawget(_G, "zt")
  local world = zt.comm.world()
  local own = world:split(0, world.rank)
  local checks = os.getenv("ZTRAIN_COMM_CHECK") ~= "0"
  local watched = comm.watch({ check = checks })
  local held = comm.hold_check(checks)                -- zt.train's runs too
  rawset(_G, "help", repl.help)
  -- the interrupt: SIGUSR1 forwarded by mpirun (and SIGINT under a plain
  -- mpirun, which ends the job anyway); only agreed polls raise
  interrupt.install({ interrupt.SIGUSR1 })
  local prev, prev_agreed = interrupt.set_action("raise", { agreed = world.size > 1 })
  if world.rank == 0 then
    io.stdout:write(repl.banner():gsub("\n$", ""), (" %d ranks: each chunk runs on all of them.\n"):format(world.size))
  end
  while true do
    local msg = ""
    if world.rank == 0 then
      while true do
        io.stdout:write(M.MARKER)
        io.stdout:flush()
        local kind, text = read_frame()
        if kind == "C" then
          -- completion: rank 0's globals answer, no collective
          io.stdout:write(table.concat(repl.complete(text), "\n"), "\n")
        else
          msg = kind and ("R" .. text) or "Q"
          break
        end
      end
    end
    msg = gather(own, msg)[1]
    if msg == "Q" then break end
    local text = run_captured(msg:sub(2))
    local left = M.level(own)
    if #left > 0 then
      if text ~= "" then table.insert(left, 1, text) end
      text = table.concat(left, "\n")
    end
    local texts = gather(own, text)
    if world.rank == 0 then
      io.stdout:write(M.show(texts))
      io.stdout:flush()
    end
  end
  interrupt.set_action(prev, { agreed = prev_agreed })
  interrupt.restore({ interrupt.SIGUSR1 })
  comm.watch(watched)
  comm.hold_check(held)
  own:free()
end

-- ---- the front end: M.front and its steps, in the order it takes them ----------------

-- spawn_mpirun(cmd) -> { pid, to (mpirun's stdin), from (its stdout), got = "" } | nil, err:
-- mpirun started in its own process group, so the terminal's Ctrl-C reaches this process only
local function spawn_mpirun(cmd)
  local inp, outp = ffi.new("int[2]"), ffi.new("int[2]")
  assert(libc.pipe(inp) == 0 and libc.pipe(outp) == 0, "pipe")
  local fa, at = libc.spawn_actions(), libc.spawnattr()
  libc.posix_spawn_file_actions_init(fa)
  libc.posix_spawn_file_actions_adddup2(fa, inp[0], 0)
  libc.posix_spawn_file_actions_adddup2(fa, outp[1], 1)
  for _, fd in ipairs({ inp[0], inp[1], outp[0], outp[1] }) do libc.posix_spawn_file_actions_addclose(fa, fd) end
  libc.posix_spawnattr_init(at)
  libc.posix_spawnattr_setflags(at, libc.POSIX_SPAWN_SETPGROUP)
  libc.posix_spawnattr_setpgroup(at, 0)
  local argv = ffi.new("char *[?]", #cmd + 1)
  local keep = {}
  for i, a in ipairs(cmd) do keep[i] = ffi.new("char[?]", #a + 1, a); argv[i - 1] = keep[i] end
  argv[#cmd] = nil
  local pid = ffi.new("int[1]")
  local environ = libc.environ()
  local rc = libc.posix_spawnp(pid, "mpirun", fa, at, argv, environ)
  libc.posix_spawn_file_actions_destroy(fa)
  libc.posix_spawnattr_destroy(at)
  libc.close(inp[0]); libc.close(outp[1])
  if rc ~= 0 then
    libc.close(inp[1]); libc.close(outp[0])
    return nil, "cannot run mpirun (" .. ffi.string(libc.strerror(rc)) ..
                "): install Open MPI (make deps) or start the ranks with your own launcher"
  end
  return { pid = pid[0], to = inp[1], from = outp[0], got = "" }
end

-- forward_interrupts(job, sent) -> sent: the Ctrl-Cs counted beyond `sent` passed
-- on to mpirun -- the first as SIGUSR1 (forwarded to every rank by mpirun), a
-- second as SIGTERM, which ends the job
local function forward_interrupts(job, sent)
  local c = interrupt.count()
  if c > sent then
    if c == 1 then
      libc.kill(job.pid, interrupt.SIGUSR1)
    else
      io.stderr:write("\nztrain: second Ctrl-C: ending the job\n")
      libc.kill(job.pid, interrupt.SIGTERM)
    end
    sent = c
  end
  return sent
end

-- until_ready(job, echo) -> text before the marker (echoed as it comes when
-- echo), or nil when mpirun's output ended (the job is over)
local function until_ready(job, echo)
  local sent = 0
  while true do
    local i = job.got:find(M.MARKER, 1, true)
    if i then
      local before = job.got:sub(1, i - 1)
      job.got = job.got:sub(i + #M.MARKER)
      if echo then io.stdout:write(before); io.stdout:flush() end
      return before
    end
    if echo and #job.got > #M.MARKER then
      -- show progress as it comes, keeping what could be a marker's start
      local cut = #job.got - #M.MARKER
      io.stdout:write(job.got:sub(1, cut)); io.stdout:flush()
      job.got = job.got:sub(cut + 1)
    end
    local s = read_some(job.from)
    if s == nil then
      if echo then io.stdout:write(job.got); io.stdout:flush() end
      return nil
    end
    job.got = job.got .. s
    sent = forward_interrupts(job, sent)
  end
end

-- open_editor(job) -> a readline editor completing from rank 0's globals, on a
-- terminal that is not "dumb"; else nil
local function open_editor(job)
  if libc.isatty(0) == 1 and os.getenv("TERM") ~= "dumb" then
    job.undo_typeahead = readline.keep_typeahead(0)  -- lines typed while busy survive a Ctrl-C
    return readline.open { history = readline.history_file(), complete = function(text)
      -- rank 0 knows the session's globals
      if not write_all(job.to, M.frame("C", text)) then return {} end
      local list = {}
      for w in (until_ready(job, false) or ""):gmatch("[^\n]+") do list[#list + 1] = w end
      return list
    end }
  end
end

-- prompt_line(ed, prompt) -> a line | nil at end of input | false when a Ctrl-C
-- dropped it
local function prompt_line(ed, prompt)
  if ed then return ed:read(prompt) end
  io.stdout:write(prompt); io.stdout:flush()
  local line = io.read("*l")
  if not line and interrupt.count() > 0 then interrupt.clear(); return false end
  return line
end

-- converse(job, ed): the prompt loop -- lines gathered until a chunk is complete,
-- the chunk run on the ranks and their answer shown -- until end of input or the
-- job's end
local function converse(job, ed)
  local alive = until_ready(job, true) ~= nil
  local buf
  while alive do
    local line = prompt_line(ed, buf and ">> " or "zt> ")
    if line == nil then io.stdout:write("\n"); break end
    if line == false then buf = nil
    else
      buf = buf and (buf .. "\n" .. line) or line
      if not repl.incomplete(buf) then
        interrupt.clear()
        alive = write_all(job.to, M.frame("R", buf)) and until_ready(job, true) ~= nil
        interrupt.clear()
        buf = nil
      end
    end
  end
end

-- finish(job, ed) -> exit code: the ranks told to exit, their last words shown,
-- mpirun reaped (128 + signal when a signal killed it)
local function finish(job, ed)
  if ed then ed:close() end
  if job.undo_typeahead then job.undo_typeahead() end
  libc.close(job.to)                               -- rank 0 reads the end: every rank exits
  while until_ready(job, true) do end
  libc.close(job.from)
  local status = ffi.new("int[1]")
  while libc.waitpid(job.pid, status, 0) < 0 and ffi.errno() == libc.EINTR do end
  interrupt.restore({ interrupt.SIGINT })
  local st = status[0]
  if st % 128 ~= 0 then return 128 + st % 128 end  -- killed by a signal
  return math.floor(st / 256) % 256
end

-- front(n, program, args) -> exit code: start mpirun with n ranks of
-- `program args` and drive them from this terminal.
function M.front(n, program, args)
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0)
  libc.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0)
  libc.setenv("ZTRAIN_HOME", rawget(_G, "ZTRAIN_HOME") or zffi.home, 0)
  libc.setenv(M.ENV, "1", 1)
  local cmd, cerr = launch.command(n, program, args)
  if not cmd then return nil, cerr end
  table.insert(cmd, 2, "-x"); table.insert(cmd, 3, M.ENV)
  local job, err = spawn_mpirun(cmd)
  if not job then return nil, err end
  -- a job that ended leaves a closed pipe: a write says so (EPIPE), it
  -- must not kill this process
  libc.signal(libc.SIGPIPE, libc.SIG_IGN)
  interrupt.install({ interrupt.SIGINT })
  interrupt.clear()
  local ed = open_editor(job)
  converse(job, ed)
  return finish(job, ed)
end
-- the front end calls into readline, which calls back into Lua (completion):
-- none of it is compiled (readline.lua says why)
for _, f in ipairs({ spawn_mpirun, forward_interrupts, until_ready, open_editor, prompt_line,
                     converse, finish, M.front }) do
  jit.off(f, true)
end

return M
