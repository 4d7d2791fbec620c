-- ztrain.cli: the `ztrain` command line (argv parsing, -e, the REPL).
local M = {}

M.usage = [==[
usage: ztrain [options] [RECIPE.lua [key=value ...]]

Runs a training recipe, or with no recipe opens a Lua REPL with ztrain loaded
(as `zt`). Recipes are Lua files returning a table; key=value arguments
override dotted fields of it, e.g.

  ztrain recipes/single.lua train.steps=100 model.size=gpt2-mini
  ztrain recipes/single.lua batch.micro=8 device.memory_limit=2GiB out=runs/try1

options:
  -e CODE        run Lua CODE with ztrain loaded as `zt` (may repeat), then exit
                 unless -i is given
  -i             open the REPL after running -e code or a recipe
  --script FILE [ARGS...]
                 run a Lua script with ztrain loaded (`arg` holds ARGS), then exit
  --nproc N      run N ranks on this machine (through Open MPI's mpirun); under
                 mpirun or srun already, ranks come from the launcher
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
  strategy (single, dp, dp_deferred, zero1, zero2, zero3 or an object), out, name
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
  if opts.nproc and not comm.launched() then
    local rest = {}
    local skip = false
    for j = 1, #argv do
      if skip then skip = false
      elseif argv[j] == "--nproc" then skip = true
      else rest[#rest + 1] = argv[j] end
    end
    local _, err = require("ztrain.launch").exec(opts.nproc, argv[0], rest)
    return die(err)
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
    local r, err = zt.recipe.load(opts.recipe, opts.overrides)
    if not r then return die(err) end
    local ok, rerr = pcall(require("ztrain.run").run, r, { quiet = opts.quiet })
    if not ok then
      local world = zt.comm.world()
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
