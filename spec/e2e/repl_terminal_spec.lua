-- The REPL as a new user meets it, in a terminal (tmux): readline's history
-- and Tab completion, Ctrl-C at the prompt, during zt.train and a loop of
-- zt calls (a line typed meanwhile kept), pretty tensors, ?help; `ztrain
-- --nproc 2 -i` on two ranks. (Its parts called
-- directly: unit/repl_spec.lua.)
local util = require "helpers.util"

local ROOT = os.getenv("PWD")

-- tmux on a socket of its own (never the user's server)
local SOCK = "ztrain_spec_" .. tostring(os.time()) .. "_" .. tostring(math.random(1e6))
local function tmux(args)
  local out, rc = util.sh("tmux -L " .. SOCK .. " " .. args)
  return out, rc
end
local function pane(s)
  return (tmux("capture-pane -p -J -S -200 -t " .. s):gsub("rc=%d+%s*$", ""))
end
local function send(s, ...)
  local keys = {}
  for i, k in ipairs({ ... }) do keys[i] = ("'%s'"):format(k:gsub("'", [['\'']])) end
  tmux("send-keys -t " .. s .. " " .. table.concat(keys, " "))
end
local function sleep(t) os.execute("sleep " .. t) end
-- wait_for(s, pattern, seconds, plain) -> the pane once it matches; fails with the pane otherwise
local function wait_for(s, pattern, seconds, plain)
  local deadline = os.time() + (seconds or 10)
  local text
  repeat
    text = pane(s)
    if text:find(pattern, 1, plain) then return text end
    sleep(0.1)
  until os.time() > deadline
  error(("timed out waiting for %q; the pane:\n%s"):format(pattern, text), 2)
end
-- count(text, s) -> occurrences of plain string s
local function count(text, s)
  local n, i = 0, 1
  while true do
    local j = text:find(s, i, true)
    if not j then return n end
    n, i = n + 1, j + #s
  end
end
local function start(s, cmd, env)
  tmux(("new-session -d -s %s -x 200 -y 50 \"cd %s && %s %s; echo EXITED rc=\\$?; sleep 60\"")
       :format(s, ROOT, env or "", cmd))
end

local have_tmux = select(2, util.sh("tmux -V")) == 0

describe("the REPL in a terminal", function()
  if not have_tmux then
    it("needs tmux (make deps installs it)", function() pending("tmux is not installed: skipped") end)
    return
  end
  local hist = os.tmpname()
  os.remove(hist)
  local env = ("ZTRAIN_HISTORY=%s TERM=xterm"):format(hist)
  local outs = {}
  local function outdir() outs[#outs + 1] = util.outdir(); return outs[#outs] end
  teardown(function()
    tmux("kill-server")
    os.remove(hist)
    for _, d in ipairs(outs) do util.rm(d) end
  end)

  it("edits lines, completes zt. names, pretty-prints, helps, and survives Ctrl-C", function()
    local s = "one"
    start(s, "build/ztrain", env)
    wait_for(s, "zt> ", 10, true)
    -- Tab completion of zt. names: one candidate completes in place ...
    send(s, "zt.tens", "Tab")
    wait_for(s, "zt> zt.tensor", 5, true)
    send(s, ".ne", "Tab")
    wait_for(s, "zt> zt.tensor.new", 5, true)
    send(s, "C-u")
    -- ... several are listed on a second Tab
    send(s, "zt.t", "Tab", "Tab")
    local p = wait_for(s, "zt.trainer", 5, true)
    assert.truthy(p:find("zt.train ", 1, true), p)
    assert.truthy(p:find("zt.threads ", 1, true), p)
    send(s, "C-u")
    -- Ctrl-C at the prompt drops the line and keeps the session
    send(s, "keepme = 99")
    send(s, "Enter")
    send(s, "this line is dropped")
    wait_for(s, "zt> this line is dropped", 5, true)
    send(s, "C-c")
    wait_for(s, "dropped^C", 5, true)
    send(s, "keepme + 1", "Enter")
    wait_for(s, "\n100\n", 5, true)
    -- a tensor, pretty
    send(s, 't = zt.tensor.new({3, 4}, {category = "params"})', "Enter")
    send(s, "t", "Enter")
    p = wait_for(s, "mean 0", 5, true)
    assert.truthy(p:find("Tensor f32 [3, 4]  device  params  48 B (12 elements)", 1, true), p)
    -- ?x prints documentation
    send(s, "?zt.train", "Enter")
    wait_for(s, "train(recipe_path_or_table, overrides, opts) -> summary[, trainer]", 5, true)
    send(s, "?nosuch", "Enter")
    wait_for(s, "no documentation for nosuch", 5, true)
    -- Ctrl-C stops a long zt.train between steps; the session and its
    -- variables stay, and the trainer trained so far is returned
    send(s, 's, tr = zt.train("recipes/single.lua", {"train.steps=100000", "out=' .. outdir() ..
            '"}, {keep = true})', "Enter")
    wait_for(s, "step +%d+/100000")
    send(s, "C-c")
    wait_for(s, "exit        interrupted", 20, true)
    send(s, "keepme, s.exit, tr.step > 0", "Enter")
    wait_for(s, "\n99%s+interrupted%s+true\n", 10)         -- (tmux shows the tabs as spaces)
    send(s, "histmark = 1", "Enter")
    send(s, "C-d")
    wait_for(s, "EXITED rc=0", 10, true)
    tmux("kill-session -t " .. s)

    -- the next session has the history: Up brings back the last line, Up again the one before
    s = "two"
    start(s, "build/ztrain", env)
    wait_for(s, "zt> ", 10, true)
    send(s, "Up")
    wait_for(s, "zt> histmark = 1", 5, true)
    send(s, "Up")
    wait_for(s, "zt> keepme, s.exit, tr.step > 0", 5, true)
    send(s, "C-u", "C-d")
    wait_for(s, "EXITED rc=0", 10, true)
    local h = util.read(hist)
    assert.truthy(h:find("keepme = 99\n", 1, true), h)
    assert.falsy(h:find("this line is dropped", 1, true), h)
  end)

  it("stops a loop of zt calls on Ctrl-C, and keeps a line typed while it ran", function()
    local s = "busy"
    start(s, "build/ztrain", env)
    wait_for(s, "zt> ", 10, true)
    -- a loop the JIT compiles (no count hook runs there): the memory calls poll
    send(s, 'print("busy"); n = 0; while true do n = n + zt.memory.current("device") + 1 end', "Enter")
    wait_for(s, "\nbusy\n", 10, true)
    -- typed while it runs, then Ctrl-C: the terminal's queue is not flushed (NOFLSH)
    send(s, "typed = 7", "Enter")
    send(s, "C-c")
    wait_for(s, "error: interrupted", 10, true)
    wait_for(s, "zt> typed = 7\n", 10, true)
    send(s, "typed, n > 0", "Enter")
    wait_for(s, "\n7%s+true\n", 10)
    send(s, "C-d")
    wait_for(s, "EXITED rc=0", 10, true)
  end)

  it("runs each line on every rank under --nproc 2 -i, shows errors and survives Ctrl-C", function()
    local s = "ranks"
    start(s, "build/ztrain --nproc 2 -i", env .. " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    wait_for(s, "2 ranks: each chunk runs on all of them", 20, true)
    wait_for(s, "zt> ", 10, true)
    send(s, "zt.comm.world().rank * 10", "Enter")
    local p = wait_for(s, "[rank 1] 10", 10, true)
    assert.truthy(p:find("[rank 0] 0\n", 1, true), p)
    send(s, 'assert(zt.comm.world().rank == 0, "boom on rank 1")', "Enter")
    p = wait_for(s, "[rank 1] error: boom on rank 1", 10, true)
    send(s, "shared = 6 * 7", "Enter")
    send(s, "shared", "Enter")
    wait_for(s, "[all ranks] 42", 10, true)
    -- Ctrl-C reaches both ranks (SIGUSR1 through mpirun) without ending the job
    send(s, 'zt.train("recipes/dp.lua", {"train.steps=100000", "launch.nproc=0", "out=' .. outdir() .. '"})',
         "Enter")
    wait_for(s, "step +%d+/100000", 20)
    -- a line typed while the ranks train is kept through the Ctrl-C that stops them
    send(s, "typed = 8", "Enter")
    send(s, "C-c")
    wait_for(s, "[all ranks] error: interrupted", 20, true)
    send(s, "shared + typed - 7", "Enter")
    wait_for(s, "[all ranks] 43", 10, true)
    -- Tab completes from rank 0's globals
    send(s, "shar", "Tab")
    wait_for(s, "zt> shared", 5, true)
    send(s, "C-u", "C-d")
    wait_for(s, "EXITED rc=0", 20, true)
  end)
end)
