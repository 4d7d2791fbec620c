-- ztrain.cli: the `ztrain` command line (argv parsing, -e, the REPL). The
-- subcommands (schedule, generate, export, compare, plan, ds-convert) are in
-- cli/commands.lua; this file reads the options, launches ranks when asked
-- (--nproc, launch.nproc, --hostfile), and runs -e code, a --script, a
-- recipe or the REPL.
--
-- Requires sit inside the paths that need them, not at the top: this file
-- runs in every process ztrain starts, and the launcher (the process that
-- runs mpirun for --nproc), `ztrain schedule` and --help must not load the
-- runtime library (libztrain, OpenMP, the device), the model or the data
-- they hand to the ranks -- loading it costs each start ~0.1-0.3 s and, with
-- the CUDA backend, a device context. Loaded at start: this file, usage,
-- commands and core/errors (spec/unit/layers_spec.lua checks the list).
local M = {}

local usage = require "ztrain.cli.usage"

local errors = require "ztrain.core.errors"
local commands = require "ztrain.cli.commands"

-- say(e): print an error as "ztrain: MESSAGE" -- a user error as is, a bug
-- with its location (errors.lua). Messages that already start with the
-- program's name do not get it twice.
local function say(e)
  local msg = errors.message(e)
  io.stderr:write(msg:find("^ztrain: ") and "" or "ztrain: ", msg, "\n")
end

-- die(e) -> the exit status for e (errors.status: 1, or 3 for an I/O error)
local function die(e)
  say(e)
  return errors.status(e)
end

-- The overrides a recipe is loaded with: the command line's, then --nproc's
-- count as launch.nproc (--nproc wins over the recipe and over key=value).
local function recipe_overrides(opts)
  local o = {}
  -- a DeepSpeed config's keys come first: key=value arguments win over them
  for _, v in ipairs(opts.ds_overrides or {}) do o[#o + 1] = v end
  for _, v in ipairs(opts.overrides) do o[#o + 1] = v end
  if opts.nproc then o[#o + 1] = "launch.nproc=" .. opts.nproc end
  return o
end

-- load_recipe(zt, opts) -> recipe | nil, exit code. On every rank of the
-- world; when it fails, the message is said once if every rank failed alike
-- (the usual case: one file, one error), else by each rank that failed.
local function load_recipe(zt, opts)
  local okl, r, err = pcall(zt.recipe.load, opts.recipe, recipe_overrides(opts))
  if not okl then r, err = nil, r end
  local okw, world = pcall(zt.comm.world)
  if not okw then
    if not r then say(err) else say(world) end
    return nil, 1
  end
  if world.size == 1 then
    if not r then say(err); return nil, 1 end
    return r
  end
  local failed = 0
  for _, v in ipairs(world:gather_doubles({ r and 0 or 1 })) do failed = failed + v[1] end
  if failed == 0 then return r end
  if failed == world.size then
    if world.rank == 0 then say(err) end
  elseif not r then
    io.stderr:write(("ztrain: rank %d: %s\n"):format(world.rank, errors.message(err)))
  end
  io.stderr:flush()
  zt.comm.finalize()
  return nil, 1
end

-- parse(argv) -> opts, or nil and the exit code (after --help, --version or
-- a message)
local function parse(argv)
  local opts = { exprs = {}, overrides = {} }
  local i = 1
  while argv[i] do
    local a = argv[i]
    if a == "-h" or a == "--help" then io.stdout:write(usage.text); return nil, 0
    elseif a == "--version" then print(require("ztrain").version()); return nil, 0
    elseif a == "-e" then
      if not argv[i + 1] then return nil, die("-e needs an argument (Lua code)") end
      opts.exprs[#opts.exprs + 1] = argv[i + 1]; i = i + 1
    elseif a == "-i" then opts.interactive = true
    elseif a == "--script" then
      if not argv[i + 1] then return nil, die("--script needs a file") end
      opts.script = argv[i + 1]
      opts.script_args = {}
      for j = i + 2, #argv do opts.script_args[#opts.script_args + 1] = argv[j] end
      break
    elseif a == "-q" or a == "--quiet" then opts.quiet = true
    elseif a == "--overwrite" then opts.overrides[#opts.overrides + 1] = "overwrite=true"
    elseif a == "--oversubscribe" then opts.oversubscribe = true
    elseif a == "--ds-config" then
      if not argv[i + 1] then return nil, die("--ds-config needs a DeepSpeed config file (ds_config.json)") end
      opts.ds_config = argv[i + 1]; i = i + 1
    elseif a == "--nproc" then
      local n = tonumber(argv[i + 1] or "")
      if not n or n < 1 or n ~= math.floor(n) then return nil, die("--nproc needs a rank count >= 1") end
      opts.nproc = n; i = i + 1
    elseif a == "--hostfile" then
      if not argv[i + 1] then return nil, die("--hostfile needs an Open MPI hostfile (HOST slots=N lines)") end
      opts.hostfile = argv[i + 1]; i = i + 1
    elseif a == "--mpirun-arg" then
      if not argv[i + 1] then return nil, die("--mpirun-arg needs an argument for mpirun (one word)") end
      opts.mpirun_args = opts.mpirun_args or {}
      opts.mpirun_args[#opts.mpirun_args + 1] = argv[i + 1]; i = i + 1
    elseif a == "--threads" then
      local n = tonumber(argv[i + 1] or "")
      if not n then return nil, die("--threads needs a number") end
      opts.overrides[#opts.overrides + 1] = "device.threads=" .. n; i = i + 1
      opts.threads = n
    elseif a:match("^%-") then return nil, die(("unknown option %s (see ztrain --help)"):format(a))
    elseif not opts.recipe and a:match("%.lua$") then opts.recipe = a
    elseif a:match("=") then opts.overrides[#opts.overrides + 1] = a
    else return nil, die(("cannot read argument %q: expected RECIPE.lua or key=value"):format(a)) end
    i = i + 1
  end
  return opts
end

-- --ds-config FILE: the DeepSpeed config's keys become overrides before the
-- command line's (opts.ds_overrides). Returns nil, or the exit code of a
-- failure.
local function ds_config(opts)
  if not opts.ds_config then return end
  if not opts.recipe then return die("--ds-config needs a recipe: ztrain RECIPE.lua --ds-config FILE") end
  local ds = require "ztrain.train.dsconfig"
  local ok, list, notes = pcall(function()
    return ds.overrides(opts.ds_config, ds.world_size(opts.nproc, opts.recipe, opts.overrides))
  end)
  if not ok then return die(list) end
  opts.ds_overrides = list
  ds.say_notes(notes)
end

-- copy(argv) -> argv[1..n] as a new list (what the ranks are started with)
local function copy(argv)
  local args = {}
  for j = 1, #argv do args[j] = argv[j] end
  return args
end

-- launch(opts, argv, comm) -> the exit code when this process started ranks
-- (mpirun's, or the multi-rank REPL's) or refused to; else nil and the
-- recipe it read to decide (reused by run_recipe)
local function launch(opts, argv, comm)
  local runs_recipe = opts.recipe ~= nil and opts.script == nil
  -- --hostfile launches a recipe; without one it would be ignored silently
  if opts.hostfile and not runs_recipe then
    if opts.script or #opts.exprs > 0 then
      return die("--hostfile launches a recipe across hosts (ztrain --hostfile FILE RECIPE.lua); -e and " ..
                 "--script run on this machine (ztrain --nproc N for ranks here)")
    end
    return die("--hostfile runs a recipe across hosts; the multi-rank REPL runs on this machine " ..
               "(ztrain --nproc N)")
  end
  if comm.launched() or not (opts.nproc or runs_recipe) then return nil end
  local pre            -- the recipe, read here to decide whether to launch
  if runs_recipe then
    -- Read once before launching: its launch.nproc says how many ranks
    -- to start, and a broken recipe is said once, not once per rank.
    local err
    pre, err = require("ztrain.train.recipe").load(opts.recipe, recipe_overrides(opts))
    if not pre then return die(err) end
  end
  local n = opts.nproc or pre.launch.nproc
  local hostfile = opts.hostfile or (pre and pre.launch.hostfile ~= "" and pre.launch.hostfile) or nil
  if hostfile and n == 0 then
    -- across hosts, launch.nproc = 0 means one rank per slot of the hostfile
    local hosts, slots = require("ztrain.job.hosts").check(hostfile, 0)
    if not hosts then return die(slots) end
    n = slots
  end
  local repl_opens = not opts.script and (opts.interactive or (not opts.recipe and #opts.exprs == 0))
  if hostfile and repl_opens then
    return die("--hostfile runs a recipe across hosts; the multi-rank REPL runs on this machine " ..
               "(ztrain --nproc N)")
  end
  if not hostfile and n > 1 and not opts.oversubscribe then
    -- more ranks than this machine runs (its cores x a factor): refused
    local ok, err = require("ztrain.job.launch").check_nproc(n)
    if not ok then return die(err) end
  end
  if pre and (opts.nproc or n > 1 or hostfile) then
    -- what the recipe and the rank count decide alone, before any rank
    -- starts: one line, not one a rank under Open MPI's abort banner
    local okc, cerr = require("ztrain.train.world_checks").check(pre, n)
    if not okc then return die(cerr) end
  end
  if opts.nproc and repl_opens then
    -- the multi-rank REPL: this process keeps the terminal and drives
    -- mpirun's ranks (repl/ranks.lua)
    local rc, err = require("ztrain.repl.ranks").front(n, argv[0], copy(argv))
    if not rc then return die(err) end
    return rc
  end
  if opts.nproc or n > 1 or hostfile then
    -- the ranks get the same arguments (--nproc too: each checks it);
    -- mpirun runs as a child: the launcher names a rank that dies and
    -- cleans up after it (launch.run)
    local code, err = require("ztrain.job.launch").run(n, argv[0], copy(argv),
                                                    { hostfile = hostfile, mpirun_args = opts.mpirun_args })
    if code then return code end
    if not opts.nproc then
      err = ("%s (the recipe asks for launch.nproc = %d; launch.nproc=1 runs one rank here)"):format(err, n)
    end
    return die(err)
  end
  return nil, pre
end

-- start(opts, comm) -> zt, or nil and the exit code: on a rank, its notes
-- for the launcher's registry and its stop request counted; the API loaded
-- (as the global zt), --nproc checked against the world, --threads, and in
-- a session Ctrl-C made an error that -e code, the recipe and the REPL see
local function start(opts, comm)
  if comm.launched() then
    -- a rank: tell the launcher's registry who this pid is (job/registry.lua)
    local registry = require "ztrain.job.registry"
    local r = require("ztrain.job.launch").launched_rank()
    if r then registry.note("rank " .. r) end
    -- and on which host (a test cluster's namespace has its own hostname)
    local hf = io.open("/proc/sys/kernel/hostname", "rb")
    if hf then registry.note("host " .. (hf:read("*l") or "?")); hf:close() end
  end
  local ok_load, zt = pcall(require, "ztrain")
  if not ok_load then return nil, die(zt) end
  if comm.launched() then
    -- a rank: the launcher's stop request (SIGUSR1 through mpirun) is
    -- counted from the start, not fatal before the run installs its policy
    require("ztrain.core.interrupt").install({ require("ztrain.core.interrupt").SIGUSR1 })
  end
  _G.zt = zt
  if opts.nproc and zt.comm.world().size ~= opts.nproc then
    local w = zt.comm.world()
    if w.rank == 0 then
      io.stderr:write(("ztrain: --nproc %d, but the launcher started %d rank(s); drop --nproc under " ..
                       "mpirun/srun, or unset ZTRAIN_COMM\n"):format(opts.nproc, w.size))
    end
    zt.comm.finalize()
    return nil, 1
  end
  if opts.threads then
    local ok, err = pcall(zt.threads, opts.threads)
    if not ok then return nil, die(err) end
  end
  if opts.interactive or (not opts.recipe and #opts.exprs == 0 and not opts.script) then
    -- a session: Ctrl-C interrupts -e code and the recipe too, then the REPL
    -- opens (SIGUSR1: what mpirun forwards from the multi-rank front end)
    local interrupt = require "ztrain.core.interrupt"
    if os.getenv(require("ztrain.repl.ranks").ENV) then
      interrupt.install({ interrupt.SIGUSR1 })
      interrupt.set_action("raise", { agreed = zt.comm.world().size > 1 })
    else
      interrupt.install({ interrupt.SIGINT })
      interrupt.set_action("raise")
    end
  end
  return zt
end

-- run_script(opts, zt) -> exit code: --script FILE with its arguments as arg
local function run_script(opts, zt)
  local f, err = loadfile(opts.script)
  if not f then return die(err) end
  _G.arg = opts.script_args
  opts.script_args[0] = opts.script
  local ok, rerr = xpcall(f, errors.traceback, unpack(opts.script_args))
  if not ok then
    if zt.comm.world().size > 1 then say(rerr); io.stderr:flush(); zt.comm.abort(1) end
    return die(rerr)
  end
  zt.comm.finalize()
  return 0
end

-- run_recipe(opts, zt, pre) -> the exit code when the process ends here;
-- nil when it goes on (the REPL after -i, or the normal exit)
local function run_recipe(opts, zt, pre)
  -- the recipe read before launching serves, unless -e code ran since
  -- (it may change what the recipe sees)
  local r = #opts.exprs == 0 and pre or nil
  if not r then
    local code
    r, code = load_recipe(zt, opts)
    if not r then return code end
  end
  local world = zt.comm.world()
  local okw, werr = require("ztrain.job.launch").check_world(r.launch.nproc, world.size, "launcher")
  if not okw then
    -- every rank resolved the same recipe: rank 0 says why, all exit 1
    if world.rank == 0 then say(werr) end
    zt.comm.finalize()
    return 1
  end
  if world.size == 1 and not opts.quiet then
    local warn = require("ztrain.train.world_checks").lone_rank(r, opts.recipe)
    if warn then io.stderr:write("ztrain: warning: ", warn, "\n") end
  end
  local graceful = not opts.interactive
  if graceful then
    -- a graceful stop: the first SIGINT/SIGTERM (SIGUSR1: what the
    -- launcher forwards through mpirun) ends the run after the step in
    -- flight, with a checkpoint and summary.json; a second one at once
    local interrupt = require "ztrain.core.interrupt"
    interrupt.install({ interrupt.SIGINT, interrupt.SIGTERM, interrupt.SIGUSR1 })
    interrupt.set_action("raise", { agreed = world.size > 1 })
    interrupt.hard_after(2)
  end
  local ok, rerr = pcall(require("ztrain.train.run").run, r, { quiet = opts.quiet, graceful = graceful,
                                                                    command = opts.command })
  if not ok then
    if world.size > 1 and errors.is_all_ranks(rerr) then
      -- every rank stopped at the same point: rank 0 says why, all exit
      -- alike (1, or 130 when interrupted)
      if world.rank == 0 then say(rerr) end
      -- flushed before the last collective: the first rank to exit non-zero
      -- makes mpirun kill the others at once (launch.lua), maybe before exit
      io.stdout:flush(); io.stderr:flush()
      zt.comm.finalize()
      return errors.status(rerr)
    elseif world.size > 1 then
      -- the other ranks may wait in a collective for ever: end the job
      io.stderr:write(("ztrain: rank %d: %s\n"):format(world.rank, errors.message(rerr)))
      io.stderr:flush()
      zt.comm.abort(errors.status(rerr))
    end
    if not opts.interactive then return die(rerr) end
    say(rerr)
  end
end

function M.main(argv)
  -- subcommands: their arguments after the name; an error is one `ztrain:` line
  local sub = commands.SUBCOMMANDS[argv[1]]
  if sub then
    local args = {}
    for j = 2, #argv do args[j - 1] = argv[j] end
    local ok, rc = xpcall(sub, errors.traceback, args)
    if not ok then return die(rc) end
    return rc
  end
  local opts, code = parse(argv)
  if not opts then return code end
  -- the command line as a shell would take it back (summary.json's record)
  local words = { "ztrain" }
  for j = 1, #argv do words[#words + 1] = argv[j]:match("^[%w%._/=:,@%-+]+$") and argv[j] or
                                          ("'" .. argv[j]:gsub("'", "'\\''") .. "'") end
  opts.command = table.concat(words, " ")
  code = ds_config(opts)
  if code then return code end

  local comm = require "ztrain.core.comm"
  local pre
  code, pre = launch(opts, argv, comm)
  if code then return code end
  local zt
  zt, code = start(opts, comm)
  if not zt then return code end

  for _, expr in ipairs(opts.exprs) do
    local ok, err = require("ztrain.repl").eval(expr, true)
    if not ok then return die(err) end
  end
  if opts.script then return run_script(opts, zt) end
  if opts.recipe then
    code = run_recipe(opts, zt, pre)
    if code then return code end
  elseif #opts.overrides > 0 then
    local n = opts.threads
    if not n or #opts.overrides > 1 then
      return die("key=value overrides need a recipe: ztrain RECIPE.lua " .. opts.overrides[#opts.overrides])
    end
  end

  if opts.interactive or (not opts.recipe and #opts.exprs == 0) then
    if os.getenv(require("ztrain.repl.ranks").ENV) then require("ztrain.repl.ranks").loop()
    else require("ztrain.repl").loop() end
  end
  zt.comm.finalize()
  return 0
end

return M
