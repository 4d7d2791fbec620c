-- ztrain.cli: the `ztrain` command line (argv parsing, -e, the REPL).
local M = {}

M.usage = [==[
usage: ztrain [options] [RECIPE.lua [key=value ...]]
       ztrain schedule NAME|compare [p=4] [m=8] [v=2] [out=DIR]
       ztrain generate SRC "PROMPT" [max_tokens=64] [temperature=1] [top_k=0] [top_p=1]
                       [seed=0] [tokenizer=NAME]
       ztrain export CHECKPOINT DIR
       ztrain compare [--nproc N] [NAME[@RANKS][,key=value...] ...] [key=value ...] [out=DIR]
       ztrain plan [RECIPE.lua] [nproc=N] [key=value ...]
       ztrain ds-convert DS_CONFIG.json [nproc=N]

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
  --nproc N      run N ranks (on this machine; across the hosts of --hostfile
                 when given), through Open MPI's mpirun; wins over the
                 recipe's launch.nproc. Under mpirun or srun already, ranks
                 come from the launcher (and must number N)
  --hostfile FILE
                 run the ranks across the hosts of an Open MPI hostfile (HOST
                 slots=N lines; same as launch.hostfile=FILE); --nproc N ranks,
                 else launch.nproc, else one per slot. Hosts of tools/netcluster.sh (network
                 namespaces here) are reached with tools/netns_agent, TCP kept
                 to their links (docs/cluster.md); other hosts as mpirun does
  --mpirun-arg ARG
                 pass ARG (one word) to mpirun, e.g. --mpirun-arg --mca
                 --mpirun-arg btl_tcp_if_include --mpirun-arg eth0 (may repeat;
                 $ZTRAIN_MPIRUN_ARGS adds words too)
  --ds-config FILE
                 apply a DeepSpeed config (ds_config.json) over the recipe:
                 zero_optimization, fp16/bf16, batch sizes, optimizer,
                 scheduler, gradient_clipping ... (docs/recipes.md); key=value
                 arguments win; every key it does not map is named on stderr
  -q, --quiet    no progress output (outputs are still written)
  --overwrite    replace an earlier run's outputs in out= (same as overwrite=true)
  --threads N    kernel and BLAS threads (same as device.threads=N)
  --version      print the version
  -h, --help     this text

The REPL (docs/cli.md): readline keys, history in $ZTRAIN_HISTORY or
~/.ztrain_history, Tab completes zt. names, fields and methods; help(x) or ?x
prints documentation; Ctrl-C drops the line, or interrupts the running call
(training stops between steps) and keeps the session; Ctrl-D exits.
zt.train(recipe, overrides, {keep = true}) also returns the live trainer.
`ztrain --nproc N` (or --nproc N -i) runs each line on N ranks and shows the
results per rank ([rank k]) or once ([all ranks]); Ctrl-C reaches every rank.

Recipe keys (defaults in lua/ztrain/recipe.lua; docs/recipes.md):
  model.size (gpt2-tiny, gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl), model.seed,
    model.from (hf:DIR: a Hugging Face GPT-2; model=hf:DIR for short), model.vocab_size
  data.text (globs, wikitext:DIR, bin:TRAIN,VALID,TEST), data.exclude, data.tokenizer (bpe, bytes,
    bpe:DIR, hf:DIR), data.seq_len, data.valid_fraction, data.seed, data.cache
  optim.lr, optim.betas, optim.eps, optim.weight_decay, optim.clip
  lr.warmup, lr.schedule (cosine, linear, constant), lr.min_ratio
  batch.micro, batch.accumulate, batch.global (= ranks x micro x accumulate)
  train.steps, train.log_every, train.eval_every, train.eval_batches,
    train.ckpt_every, train.ckpt_keep, train.ckpt_dir, train.checkpoint_activations (true or k)
  resume (latest or a checkpoint directory), export.hf (DIR)
  sample.prompt, sample.tokens, sample.temperature, sample.top_k, sample.top_p, sample.seed
  device.backend, device.memory_limit (e.g. 2GiB), device.threads, device.bf16_gemm (auto, on, off),
    device.attention (exact, bf16: tensor cores, needs device.backend=cuda)
  comm.backend (mpi, nccl: needs device.backend=cuda), comm.deterministic (rank-order sums)
  strategy (single, dp, dp_deferred, zero1, zero2, zero3, zero1_offload, zero2_offload,
    zero3_offload or an object), out, overwrite, name
  offload.staging (host staging buffers, e.g. 16MiB), offload.prefetch (units fetched ahead)
  launch.nproc (local ranks to start; 0: the launcher's, or one), launch.hostfile (as --hostfile)
  pipeline.stages (ranks per pipeline), pipeline.chunks (stages per rank, interleaved),
    pipeline.split ("params", "time" or unit counts per stage), pipeline.placement ("", loop, v)
  schedule ("": sequential driver; one_stage, one_stage_iw, gpipe, 1f1b, interleaved_1f1b,
    zb_h1, zbv, pipedream or a function: schedule driver)

ztrain schedule NAME p=P m=M [v=V] [out=DIR] draws a pipeline schedule without
training: builds it (gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv, pipedream), simulates it, prints
the ranks x time grid, the predicted bubble and peak activations per stage, and
writes timeline.svg and timeline.json (Chrome trace) of the ideal timeline to
DIR (default runs/schedule-NAME-pP-mM-<time>/). `ztrain schedule compare p=4
m=8` prints every schedule's bubble and writes compare.svg (a bar chart).

ztrain generate SRC "PROMPT" continues PROMPT with a GPT-2 model and prints the
prompt and its continuation. SRC is hf:DIR or DIR: a Hugging Face GPT-2
directory (config.json + model.safetensors), such as a run's export.hf. The
tokenizer is DIR's vocab.json + merges.txt unless tokenizer= names one (bytes,
bpe, bpe:DIR, hf:DIR). temperature=0 is greedy; top_k=0 and top_p=1 are off;
a seed reproduces a sample. The prompt and max_tokens must fit the model's context.

ztrain export CHECKPOINT DIR writes a checkpoint's parameters (consolidated
from every rank's shard, whatever strategy and world size saved it) as a
Hugging Face GPT-2 directory: config.json + model.safetensors (fp32), and the
tokenizer's vocab.json + merges.txt when the run used a BPE vocabulary.
CHECKPOINT is a checkpoint directory, or a directory with `latest`.

ztrain compare trains a list of strategies on the same settings, one after
another, each as its own ztrain process into DIR/<item>/, and writes
results.md and results.csv (time/step, tokens/s, peak memory per tier and
category, model state predicted vs measured, final loss, param digest and
whether it equals the first run's: "same bits") and memory.svg,
throughput.svg, loss.svg. An item is a recipe name (recipes/NAME.lua) or a
RECIPE.lua path, with @RANKS (default --nproc, 2; single: 1) and its own
,key=value overrides: `ztrain compare single dp zero3 zero3,model.seed=7`.
Default items: single dp zero1 zero2 zero3 zero2_offload zero3_offload
infinity. Every item gets model.size=gpt2-tiny data.tokenizer=bytes
batch.micro=8 train.steps=20 train.log_every=1 (key=value overrides them)
and the same global batch (fewer ranks accumulate more micro-batches). A
failed run is a row with its error; the exit status is 1 only when every
run failed (or on bad input). Default DIR: runs/compare-<time>/.

ztrain plan predicts one rank's bytes by tier (device, host, nvme) and category
(parameters, gradients, optimizer state, activations, working buffers) for
every strategy and offload setting at nproc=N ranks, says which fit
device.memory_limit (else the available memory shared by the ranks) and which
is fastest to try. Any recipe key may be set, e.g.
  ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB precision=bf16
  ztrain plan recipes/zero3.lua nproc=4 batch.micro=8 data.seq_len=1024
Its step and tokens/s columns are the step-time model's (docs/scaling.md) on
--hosts H x --gpus-per-host G ranks (default: 8 a host), --link RATE and
--latency T across hosts (400gbit, 5us), --intra-link RATE and
--intra-latency T within (450GB/s, 2us), --flops F per GPU (989T) at --mfu X
(0.4): an H100 cluster with NDR InfiniBand unless told otherwise, e.g.
  ztrain plan model.size=gpt2-xl --hosts 4 --gpus-per-host 8 --link 100gbit precision=bf16
A run checks the same prediction before it allocates, and refuses with the
numbers when its strategy does not fit.

ztrain ds-convert FILE [nproc=N] prints a DeepSpeed config as a recipe (the
keys --ds-config would set; unsupported keys as comments), its batch sizes
checked for N ranks.

Outputs go to out= (default runs/<recipe>-<time>/, made unique): metrics.jsonl,
summary.json, checkpoints/ (train.ckpt_every), timeline.svg/.json (pipeline
schedules). An out= that holds an earlier run is refused unless --overwrite
(or resume=...); one run at a time per directory (a lock).

Exit status: 0 success; 1 an error (bad input, a failed run: the message says);
3 an output could not be written (disk full, I/O error; the previous file stays);
5 a collective waited past comm.timeout for its peers (the message names them);
128 + N a rank killed by signal N. Across hosts (--hostfile), a failed job
that mpirun does not end (a host it cannot reach) is ended by ztrain after
$ZTRAIN_ABORT_GRACE seconds (default 5), with the failure's exit status, and
ranks that do not all start within $ZTRAIN_START_TIMEOUT seconds (default
60) end the launch (1).
]==]

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
    -- a rank: tell the launcher's registry who this pid is (launch.note)
    local launch = require "ztrain.launch"
    local r = launch.launched_rank()
    if r then launch.note("rank " .. r) end
    -- and on which host (a test cluster's namespace has its own hostname)
    local hf = io.open("/proc/sys/kernel/hostname", "rb")
    if hf then launch.note("host " .. (hf:read("*l") or "?")); hf:close() end
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
