-- ztrain.cli: the `ztrain` command line (argv parsing, -e, the REPL).
local M = {}

M.usage = require "ztrain.usage"   -- plan and compare print it too, without requiring the CLI

local errors = require "ztrain.errors"
local fs = require "ztrain.util.fs"
local SUBCOMMANDS          -- name -> fn(args) -> exit code (set below, once they exist)

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

-- `ztrain schedule ...`: draw a pipeline schedule without training ----------

local SCHEDULE_KEYS = { p = "pipeline ranks", m = "micro-batches", v = "chunks per rank (interleaved)",
                        out = "output directory" }

-- schedule_args(args) -> { p, m, v, out }. Raises a user error naming the
-- argument.
local function schedule_args(args, from)
  local o = {}
  for j = from, #args do
    local k, v = args[j]:match("^([%w_]+)=(.*)$")
    if not k then
      error(("cannot read argument %q: expected key=value (p=4 m=8 v=2 out=DIR)"):format(args[j]), 0)
    end
    if not SCHEDULE_KEYS[k] then
      error(("unknown key %q for ztrain schedule (known: p ranks, m micro-batches, v chunks, out DIR)")
            :format(k), 0)
    end
    if k == "out" then o.out = v
    else
      local n = tonumber(v)
      if not n or n ~= math.floor(n) or n < 1 then
        error(("%s=%s: %s must be a whole number >= 1"):format(k, v, SCHEDULE_KEYS[k]), 0)
      end
      o[k] = n
    end
  end
  return o
end

-- fmt_peak(res, stages) -> "s0 2, s1 1"
local function fmt_peak(res, stages)
  local t = {}
  for s = 0, stages - 1 do t[#t + 1] = ("s%d %d"):format(s, res.peak[s] or 0) end
  return table.concat(t, ", ")
end

local function out_dir(o, what)
  local dir = o.out or ("runs/schedule-%s-p%d-m%d%s-%s"):format(what, o.p, o.m,
    (o.v and o.v > 1) and ("-v" .. o.v) or "", os.date("%Y%m%d-%H%M%S"))
  local ok, err = fs.mkdirs(dir, "output directory")
  if not ok then error(err, 0) end
  return dir
end

-- schedule(args) -> exit code. args = { NAME, key=value ... }.
local function schedule(args)
  local schedules = require "ztrain.pipeline.schedules"
  local simulate = require "ztrain.pipeline.simulate"
  local timeline = require "ztrain.pipeline.timeline"
  local names = {}
  for k in pairs(schedules.builtin) do names[#names + 1] = k end
  table.sort(names)
  local known = table.concat(names, ", ") .. ", or compare"
  local name = args[1]
  if name == "-h" or name == "--help" then io.stdout:write(M.usage); return 0 end
  if not name or name:find("=") then
    error(("schedule: give a schedule name (%s), e.g. ztrain schedule 1f1b p=4 m=8"):format(known), 0)
  end
  if name ~= "compare" and not schedules.builtin[name] then
    error(("unknown pipeline schedule %q (known: %s)"):format(name, known), 0)
  end
  local o = schedule_args(args, 2)
  o.p, o.m = o.p or 4, o.m or 8
  local T = simulate.TIMES
  local model = ("simulated with F=%g B=%g (I=%g W=%g) time units, communication free")
                :format(T.F, T.B, T.I, T.W)

  if name ~= "compare" then
    -- interleaving with one chunk is 1F1B: default to two
    o.v = o.v or ((name == "interleaved_1f1b" or name == "zbv") and 2 or 1)
    local lists, q = schedules.build(name, { ranks = o.p, microbatches = o.m, chunks = o.v })
    local res = simulate.check(lists)
    print(("%s: p=%d ranks, m=%d micro-batches, v=%d chunk(s) per rank, %d stages; %s")
          :format(name, q.ranks, q.microbatches, q.chunks, q.stages, model))
    io.stdout:write(simulate.grid(res))
    print(("bubble %.6f (%.1f%%) of ranks x makespan %g, idle / (ranks x makespan); %.6f of busy time " ..
           "(Megatron's normalisation)"):format(res.bubble, 100 * res.bubble, res.makespan, res.bubble_busy))
    print("peak activations per stage (micro-batches held): " .. fmt_peak(res, q.stages))
    local dir = out_dir(o, name)
    local w = timeline.write(dir, timeline.from_simulation(res), {
      name = ("%s p=%d m=%d%s"):format(name, q.ranks, q.microbatches, q.chunks > 1 and (" v=" .. q.chunks) or ""),
      subtitle = model .. "; the ideal timeline", us_per_unit = 1000 })
    print(("wrote %s and %s (1 time unit = 1 ms in the trace)"):format(w.svg, w.json))
    return 0
  end

  -- compare: every built-in schedule at the same p and m (interleaved with
  -- v, default 2), and the naive pipeline (GPipe with one micro-batch)
  local v = o.v or 2
  local dir = out_dir(o, "compare")
  local rows = {}
  print(("p=%d ranks, m=%d micro-batches (interleaved_1f1b: v=%d); %s"):format(o.p, o.m, v, model))
  print(("%-18s %-9s %-9s %s"):format("schedule", "bubble", "makespan", "peak activations per stage"))
  local cases = { { "naive (gpipe m=1)", "gpipe", 1, 1 }, { "gpipe", "gpipe", o.m, 1 },
                  { "1f1b", "1f1b", o.m, 1 }, { "interleaved_1f1b", "interleaved_1f1b", o.m, v },
                  { "zb_h1", "zb_h1", o.m, 1 }, { "zbv", "zbv", o.m, 2 } }
  for _, c in ipairs(cases) do
    local label, sname, m, chunks = c[1], c[2], c[3], c[4]
    local ok, lists, q = pcall(schedules.build, sname, { ranks = o.p, microbatches = m, chunks = chunks })
    local res
    if ok then ok, res = pcall(simulate.check, lists) end
    if ok then
      print(("%-18s %-9.6f %-9g %s"):format(label, res.bubble, res.makespan, fmt_peak(res, q.stages)))
      local maxpeak = 0
      for s = 0, q.stages - 1 do maxpeak = math.max(maxpeak, res.peak[s] or 0) end
      rows[#rows + 1] = { name = label, bubble = res.bubble, note = ("(peak activations: %d)"):format(maxpeak) }
      timeline.write(dir, timeline.from_simulation(res), {
        name = ("%s p=%d m=%d%s"):format(sname, q.ranks, q.microbatches, q.chunks > 1 and (" v=" .. q.chunks) or ""),
        subtitle = model, us_per_unit = 1000, basename = "timeline-" .. label:gsub("[^%w_]+", "-"):gsub("-$", "") })
    else
      local why = require("ztrain.errors").message(lists or res)
      print(("%-18s n/a: %s"):format(label, why))
      rows[#rows + 1] = { name = label, note = why }
    end
  end
  local path = timeline.write_file(dir .. "/compare.svg", timeline.compare_svg(rows, {
    title = ("pipeline bubble per schedule, p=%d m=%d"):format(o.p, o.m),
    subtitle = ("idle / (ranks x makespan), utilisation = 1 - bubble; F=%g B=%g (I=%g W=%g), no communication cost")
               :format(T.F, T.B, T.I, T.W) }))
  print(("wrote %s and each schedule's timeline-NAME.svg/.json in %s"):format(path, dir))
  return 0
end

-- `ztrain generate SRC "PROMPT" ...`: text from a Hugging Face GPT-2 -------

local GENERATE_KEYS = { max_tokens = "number", temperature = "number", top_k = "number",
                        top_p = "number", seed = "number", tokenizer = "string" }

-- generate(args) -> exit code. args = { SRC, PROMPT, key=value ... }.
local function generate(args)
  local usage = 'ztrain generate SRC "PROMPT" [max_tokens=N temperature=T top_k=K top_p=P seed=S ' ..
                'tokenizer=NAME]'
  local src, prompt = args[1], args[2]
  if src == "-h" or src == "--help" then io.stdout:write(M.usage); return 0 end
  if not src or not prompt or src:find("=") then
    error("generate: give a model directory and a prompt: " .. usage, 0)
  end
  local o = {}
  for j = 3, #args do
    local k, v = args[j]:match("^([%w_.]+)=(.*)$")
    if not k then error(("generate: cannot read argument %q: expected key=value (%s)"):format(args[j], usage), 0) end
    local kind = GENERATE_KEYS[k]
    if not kind then
      local known = {}
      for name in pairs(GENERATE_KEYS) do known[#known + 1] = name end
      table.sort(known)
      error(("generate: unknown key %q (known: %s)"):format(k, table.concat(known, ", ")), 0)
    end
    if kind == "number" then
      local n = tonumber(v)
      if not n then error(("generate: %s=%s is not a number"):format(k, v), 0) end
      o[k] = n
    else
      o[k] = v
    end
  end
  local dir = require("ztrain.nn.hf").dir_of(src) or src
  local function has(f)
    local h = io.open(dir .. "/" .. f, "rb")
    if h then h:close() end
    return h ~= nil
  end
  if not has("config.json") then
    error(("generate: %s has no config.json: SRC must be a Hugging Face GPT-2 directory " ..
           "(hf:DIR, or a run's export.hf directory)"):format(dir), 0)
  end
  local zt = require "ztrain"
  local tok = o.tokenizer
  if not tok then
    if not (has("vocab.json") and has("merges.txt")) then
      error(("generate: %s has no vocab.json + merges.txt: name a tokenizer with tokenizer=NAME " ..
             "(bytes, bpe, bpe:DIR, hf:DIR)"):format(dir), 0)
    end
    tok = "hf:" .. dir
  end
  o.tokenizer = zt.data.tokenizer(tok)
  local model = require("ztrain.nn.hf").load(dir)
  local ok, ids, text = pcall(zt.generate, model, prompt, o)
  model:free()
  if not ok then error(ids, 0) end
  io.stdout:write(prompt, text, "\n")
  return 0
end

-- export(args) -> exit code. args = { CHECKPOINT, DIR }.
local function export(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(M.usage); return 0 end
  if not args[1] or not args[2] or args[3] then
    error("export: give a checkpoint and an output directory: ztrain export CHECKPOINT DIR", 0)
  end
  local dir = require("ztrain.checkpoint").export(args[1], args[2])
  print(("wrote %s (config.json, model.safetensors)"):format(dir))
  return 0
end

-- `ztrain ds-convert FILE [nproc=N]`: a DeepSpeed config as a recipe on stdout
local function ds_convert(args)
  if args[1] == "-h" or args[1] == "--help" or not args[1] then
    if not args[1] then error("ds-convert: give a DeepSpeed config: ztrain ds-convert ds_config.json [nproc=N]", 0) end
    io.stdout:write(M.usage); return 0
  end
  local n = args[2] and tonumber((args[2]:match("^nproc=(%d+)$")))
  if args[2] and not n or args[3] then error("ds-convert: expected ztrain ds-convert FILE [nproc=N]", 0) end
  io.stdout:write(require("ztrain.dsconfig").recipe_text(args[1], n or 1))
  return 0
end

-- `ztrain plan ...`: the memory planner (plan_report.lua)
local function plan(args) return require("ztrain.plan_report").main(args) end

SUBCOMMANDS = { compare = function(args) return require("ztrain.compare").main(args) end,
                ["ds-convert"] = ds_convert, export = export, generate = generate, plan = plan,
                schedule = schedule }

function M.main(argv)
  -- subcommands: their arguments after the name; an error is one `ztrain:` line
  local sub = SUBCOMMANDS[argv[1]]
  if sub then
    local args = {}
    for j = 2, #argv do args[j - 1] = argv[j] end
    local ok, rc = xpcall(sub, errors.traceback, args)
    if not ok then return die(rc) end
    return rc
  end
  local opts = { exprs = {}, overrides = {} }
  local i = 1
  while argv[i] do
    local a = argv[i]
    if a == "-h" or a == "--help" then io.stdout:write(M.usage); return 0
    elseif a == "--version" then print(require("ztrain").version()); return 0
    elseif a == "-e" then
      if not argv[i + 1] then return die("-e needs an argument (Lua code)") end
      opts.exprs[#opts.exprs + 1] = argv[i + 1]; i = i + 1
    elseif a == "-i" then opts.interactive = true
    elseif a == "--script" then
      if not argv[i + 1] then return die("--script needs a file") end
      opts.script = argv[i + 1]
      opts.script_args = {}
      for j = i + 2, #argv do opts.script_args[#opts.script_args + 1] = argv[j] end
      break
    elseif a == "-q" or a == "--quiet" then opts.quiet = true
    elseif a == "--overwrite" then opts.overrides[#opts.overrides + 1] = "overwrite=true"
    elseif a == "--ds-config" then
      if not argv[i + 1] then return die("--ds-config needs a DeepSpeed config file (ds_config.json)") end
      opts.ds_config = argv[i + 1]; i = i + 1
    elseif a == "--nproc" then
      local n = tonumber(argv[i + 1] or "")
      if not n or n < 1 or n ~= math.floor(n) then return die("--nproc needs a rank count >= 1") end
      opts.nproc = n; i = i + 1
    elseif a == "--hostfile" then
      if not argv[i + 1] then return die("--hostfile needs an Open MPI hostfile (HOST slots=N lines)") end
      opts.hostfile = argv[i + 1]; i = i + 1
    elseif a == "--mpirun-arg" then
      if not argv[i + 1] then return die("--mpirun-arg needs an argument for mpirun (one word)") end
      opts.mpirun_args = opts.mpirun_args or {}
      opts.mpirun_args[#opts.mpirun_args + 1] = argv[i + 1]; i = i + 1
    elseif a == "--threads" then
      local n = tonumber(argv[i + 1] or "")
      if not n then return die("--threads needs a number") end
      opts.overrides[#opts.overrides + 1] = "device.threads=" .. n; i = i + 1
      opts.threads = n
    elseif a:match("^%-") then return die(("unknown option %s (see ztrain --help)"):format(a))
    elseif not opts.recipe and a:match("%.lua$") then opts.recipe = a
    elseif a:match("=") then opts.overrides[#opts.overrides + 1] = a
    else return die(("cannot read argument %q: expected RECIPE.lua or key=value"):format(a)) end
    i = i + 1
  end

  if opts.ds_config then
    if not opts.recipe then return die("--ds-config needs a recipe: ztrain RECIPE.lua --ds-config FILE") end
    local ds = require "ztrain.dsconfig"
    local ok, list, notes = pcall(function()
      return ds.overrides(opts.ds_config, ds.world_size(opts.nproc, opts.recipe, opts.overrides))
    end)
    if not ok then return die(list) end
    opts.ds_overrides = list
    ds.say_notes(notes)
  end

  local comm = require "ztrain.comm"
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
  local pre            -- the recipe, read here to decide whether to launch
  if not comm.launched() and (opts.nproc or runs_recipe) then
    if runs_recipe then
      -- Read once before launching: its launch.nproc says how many ranks
      -- to start, and a broken recipe is said once, not once per rank.
      local err
      pre, err = require("ztrain.recipe").load(opts.recipe, recipe_overrides(opts))
      if not pre then return die(err) end
    end
    local n = opts.nproc or pre.launch.nproc
    local hostfile = opts.hostfile or (pre and pre.launch.hostfile ~= "" and pre.launch.hostfile) or nil
    if hostfile and n == 0 then
      -- across hosts, launch.nproc = 0 means one rank per slot of the hostfile
      local hosts, slots = require("ztrain.launch_hosts").check(hostfile, 0)
      if not hosts then return die(slots) end
      n = slots
    end
    local repl_opens = not opts.script and (opts.interactive or (not opts.recipe and #opts.exprs == 0))
    if hostfile and repl_opens then
      return die("--hostfile runs a recipe across hosts; the multi-rank REPL runs on this machine " ..
                 "(ztrain --nproc N)")
    end
    if opts.nproc and repl_opens then
      -- the multi-rank REPL: this process keeps the terminal and drives
      -- mpirun's ranks (repl/ranks.lua)
      local args = {}
      for j = 1, #argv do args[j] = argv[j] end
      local rc, err = require("ztrain.repl.ranks").front(n, argv[0], args)
      if not rc then return die(err) end
      return rc
    end
    if opts.nproc or n > 1 or hostfile then
      -- the ranks get the same arguments (--nproc too: each checks it)
      local args = {}
      for j = 1, #argv do args[j] = argv[j] end
      -- mpirun runs as a child: the launcher names a rank that dies and
      -- cleans up after it (launch.run)
      local code, err = require("ztrain.launch").run(n, argv[0], args,
                                                      { hostfile = hostfile, mpirun_args = opts.mpirun_args })
      if code then return code end
      if not opts.nproc then
        err = ("%s (the recipe asks for launch.nproc = %d; launch.nproc=1 runs one rank here)"):format(err, n)
      end
      return die(err)
    end
  end

  if comm.launched() then
    -- a rank: tell the launcher's registry who this pid is (job/registry.lua)
    local registry = require "ztrain.job.registry"
    local r = require("ztrain.launch").launched_rank()
    if r then registry.note("rank " .. r) end
    -- and on which host (a test cluster's namespace has its own hostname)
    local hf = io.open("/proc/sys/kernel/hostname", "rb")
    if hf then registry.note("host " .. (hf:read("*l") or "?")); hf:close() end
  end
  local ok_load, zt = pcall(require, "ztrain")
  if not ok_load then return die(zt) end
  if comm.launched() then
    -- a rank: the launcher's stop request (SIGUSR1 through mpirun) is
    -- counted from the start, not fatal before the run installs its policy
    require("ztrain.interrupt").install({ require("ztrain.interrupt").SIGUSR1 })
  end
  _G.zt = zt
  if opts.nproc and zt.comm.world().size ~= opts.nproc then
    local w = zt.comm.world()
    if w.rank == 0 then
      io.stderr:write(("ztrain: --nproc %d, but the launcher started %d rank(s); drop --nproc under " ..
                       "mpirun/srun, or unset ZTRAIN_COMM\n"):format(opts.nproc, w.size))
    end
    zt.comm.finalize()
    return 1
  end
  if opts.threads then
    local ok, err = pcall(zt.threads, opts.threads)
    if not ok then return die(err) end
  end

  if opts.interactive or (not opts.recipe and #opts.exprs == 0 and not opts.script) then
    -- a session: Ctrl-C interrupts -e code and the recipe too, then the REPL
    -- opens (SIGUSR1: what mpirun forwards from the multi-rank front end)
    local interrupt = require "ztrain.interrupt"
    if os.getenv(require("ztrain.repl.ranks").ENV) then
      interrupt.install({ interrupt.SIGUSR1 })
      interrupt.set_action("raise", { agreed = zt.comm.world().size > 1 })
    else
      interrupt.install({ interrupt.SIGINT })
      interrupt.set_action("raise")
    end
  end

  for _, code in ipairs(opts.exprs) do
    local ok, err = require("ztrain.repl").eval(code, true)
    if not ok then return die(err) end
  end

  if opts.script then
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

  if opts.recipe then
    -- the recipe read before launching serves, unless -e code ran since
    -- (it may change what the recipe sees)
    local r = #opts.exprs == 0 and pre or nil
    if not r then
      local code
      r, code = load_recipe(zt, opts)
      if not r then return code end
    end
    local world = zt.comm.world()
    local okw, werr = require("ztrain.launch").check_world(r.launch.nproc, world.size, "launcher")
    if not okw then
      -- every rank resolved the same recipe: rank 0 says why, all exit 1
      if world.rank == 0 then say(werr) end
      zt.comm.finalize()
      return 1
    end
    local graceful = not opts.interactive
    if graceful then
      -- a graceful stop: the first SIGINT/SIGTERM (SIGUSR1: what the
      -- launcher forwards through mpirun) ends the run after the step in
      -- flight, with a checkpoint and summary.json; a second one at once
      local interrupt = require "ztrain.interrupt"
      interrupt.install({ interrupt.SIGINT, interrupt.SIGTERM, interrupt.SIGUSR1 })
      interrupt.set_action("raise", { agreed = world.size > 1 })
      interrupt.hard_after(2)
    end
    local ok, rerr = pcall(require("ztrain.run").run, r, { quiet = opts.quiet, graceful = graceful })
    if not ok then
      if world.size > 1 and errors.is_all_ranks(rerr) then
        -- every rank stopped at the same point: rank 0 says why, all exit
        -- alike (1, or 130 when interrupted)
        if world.rank == 0 then say(rerr) end
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
