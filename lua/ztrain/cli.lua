-- ztrain.cli: the `ztrain` command line (argv parsing, -e, the REPL).
local M = {}

M.usage = [==[
usage: ztrain [options] [RECIPE.lua [key=value ...]]

Runs a training recipe, or with no recipe opens a Lua REPL with ztrain loaded
(as `zt`). Recipes are Lua files returning a table; key=value arguments
override dotted fields of it, e.g.

  ztrain recipes/single.lua train.steps=100 model.size=gpt2-mini
  ztrain recipes/single.lua batch.micro=8 device.memory_limit=2GiB out=runs/try1
  ztrain recipes/dp.lua launch.nproc=2     # start 2 local ranks (as --nproc 2)

A recipe with launch = { nproc = N } (N > 1) starts N local ranks itself
(through mpirun, as --nproc N) unless already under mpirun or srun, where the
launcher's rank count must equal N. launch.nproc = 0 (the default) takes what
the launcher gave, or one rank. The recipe file is read once before launching
(to find N), then again in each rank.

options:
  -e CODE        run Lua CODE with ztrain loaded as `zt` (may repeat), then exit
                 unless -i is given
  -i             open the REPL after running -e code or a recipe
  --script FILE [ARGS...]
                 run a Lua script with ztrain loaded (`arg` holds ARGS), then exit
  --nproc N      run N ranks on this machine (through Open MPI's mpirun); wins
                 over the recipe's launch.nproc. Under mpirun or srun already,
                 ranks come from the launcher (and must number N)
  -q, --quiet    no progress output (outputs are still written)
  --threads N    kernel and BLAS threads (same as device.threads=N)
  --version      print the version
  -h, --help     this text

Recipe keys (defaults in lua/ztrain/recipe.lua; docs/recipes.md):
  model.size (gpt2-tiny, gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl), model.seed
  data.text, data.exclude, data.tokenizer, data.seq_len, data.valid_fraction, data.seed
  optim.lr, optim.betas, optim.eps, optim.weight_decay, optim.clip
  lr.warmup, lr.schedule (cosine, linear, constant), lr.min_ratio
  batch.micro, batch.accumulate, batch.global (= ranks x micro x accumulate)
  train.steps, train.log_every, train.eval_every, train.eval_batches
  device.backend, device.memory_limit (e.g. 2GiB), device.threads
  strategy (single, dp, dp_deferred, zero1, zero2, zero3, zero1_offload, zero2_offload,
    zero3_offload or an object), out, name
  offload.staging (host staging buffers, e.g. 16MiB), offload.prefetch (units fetched ahead)
  launch.nproc (local ranks to start; 0: the launcher's, or one)
  schedule ("": sequential driver; one_stage, one_stage_iw or a function: schedule driver)

Outputs go to out= (default runs/<recipe>-<time>/): metrics.jsonl, summary.json.
]==]

local errors = require "ztrain.errors"

-- say(e): print an error as "ztrain: MESSAGE" -- a user error as is, a bug
-- with its location (errors.lua). Messages that already start with the
-- program's name do not get it twice.
local function say(e)
  local msg = errors.message(e)
  io.stderr:write(msg:find("^ztrain: ") and "" or "ztrain: ", msg, "\n")
end

local function die(e)
  say(e)
  return 1
end

-- The overrides a recipe is loaded with: the command line's, then --nproc's
-- count as launch.nproc (--nproc wins over the recipe and over key=value).
local function recipe_overrides(opts)
  local o = {}
  for i, v in ipairs(opts.overrides) do o[i] = v end
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

function M.main(argv)
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
    elseif a == "--nproc" then
      local n = tonumber(argv[i + 1] or "")
      if not n or n < 1 or n ~= math.floor(n) then return die("--nproc needs a rank count >= 1") end
      opts.nproc = n; i = i + 1
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

  local comm = require "ztrain.comm"
  local runs_recipe = opts.recipe ~= nil and opts.script == nil
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
    if opts.nproc or n > 1 then
      -- the ranks get the same arguments (--nproc too: each checks it)
      local args = {}
      for j = 1, #argv do args[j] = argv[j] end
      local _, err = require("ztrain.launch").exec(n, argv[0], args)
      if not opts.nproc then
        err = ("%s (the recipe asks for launch.nproc = %d; launch.nproc=1 runs one rank here)"):format(err, n)
      end
      return die(err)
    end
  end

  local ok_load, zt = pcall(require, "ztrain")
  if not ok_load then return die(zt) end
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
    local ok, rerr = pcall(require("ztrain.run").run, r, { quiet = opts.quiet })
    if not ok then
      if world.size > 1 and errors.is_all_ranks(rerr) then
        -- every rank stopped at the same point: rank 0 says why, all exit 1
        if world.rank == 0 then say(rerr) end
        zt.comm.finalize()
        return 1
      elseif world.size > 1 then
        -- the other ranks may wait in a collective for ever: end the job
        io.stderr:write(("ztrain: rank %d: %s\n"):format(world.rank, errors.message(rerr)))
        io.stderr:flush()
        zt.comm.abort(1)
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
    require("ztrain.repl").loop()
  end
  zt.comm.finalize()
  return 0
end

return M
