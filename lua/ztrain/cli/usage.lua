-- ztrain.cli.usage: the `ztrain --help` text (M.text), and each command's
-- synopsis (M.SYNOPSIS), written once: --help shows them all, and
-- `ztrain COMMAND -h` its own (M.command).
local M = {}

-- name -> the command's synopsis, as --help prints it after "usage:"
M.SYNOPSIS = {
  schedule = "ztrain schedule [show|simulate] NAME|compare|csv:PATH [p=4] [m=8] [v=2] [out=DIR]",
  generate = 'ztrain generate SRC "PROMPT" [max_tokens=64] [temperature=1] [top_k=0] [top_p=1]\n' ..
             '                [seed=0] [tokenizer=NAME]',
  export = "ztrain export CHECKPOINT DIR",
  compare = "ztrain compare [--nproc N] [NAME[@RANKS][,key=value...] ...] [key=value ...] [out=DIR]",
  plan = "ztrain plan [RECIPE.lua] [nproc=N] [key=value ...]",
  ["ds-convert"] = "ztrain ds-convert DS_CONFIG.json [nproc=N]",
}
local ORDER = { "schedule", "generate", "export", "compare", "plan", "ds-convert" }

-- command(name) -> `ztrain NAME -h`'s text: its synopsis and where the rest is
function M.command(name)
  return ("usage: %s\n\nztrain --help lists every command and option; docs/cli.md explains %s.\n")
         :format((M.SYNOPSIS[name]:gsub("\n", "\n       ")), name)
end

local lines = { "usage: ztrain [options] [RECIPE.lua [key=value ...]]" }
for _, name in ipairs(ORDER) do
  lines[#lines + 1] = "       " .. M.SYNOPSIS[name]:gsub("\n", "\n       ")
end

M.text = table.concat(lines, "\n") .. "\n" .. [==[

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
  --oversubscribe
                 start more local ranks than the machine's usable cores x 8
                 (refused without it; mpirun itself always oversubscribes)
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
                 scheduler, gradient_clipping, tensorboard, csv_monitor ...
                 (docs/recipes.md); "auto" values are the recipe's; key=value
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

Recipe keys (defaults in lua/ztrain/train/recipe.lua; docs/recipes.md):
  model.size (gpt2-tiny, gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl), model.seed,
    model.from (hf:DIR: a Hugging Face GPT-2; model=hf:DIR for short), model.vocab_size
  data.text (globs, wikitext:DIR, bin:TRAIN,VALID,TEST), data.exclude, data.tokenizer (bpe, bytes,
    bpe:DIR, hf:DIR), data.seq_len, data.valid_fraction, data.seed, data.cache
  optim.lr, optim.betas, optim.eps, optim.weight_decay, optim.clip
  lr.warmup, lr.schedule (cosine, linear, constant), lr.min_ratio
  batch.micro, batch.accumulate, batch.global (= ranks x micro x accumulate)
  train.steps, train.log_every, train.eval_every, train.eval_batches,
    train.ckpt_every, train.ckpt_keep, train.ckpt_dir, train.checkpoint_activations (true or k)
  resume (latest or a checkpoint directory), allow_changes (batch, lr, optim, data, precision, all),
    export.hf (DIR)
  report.tensorboard (DIR: TensorBoard event files; true: OUT/tensorboard),
    report.csv (PATH: a CSV of the logged steps; true: OUT/metrics.csv)
  sample.prompt, sample.tokens, sample.temperature, sample.top_k, sample.top_p, sample.seed
  device.backend, device.memory_limit (e.g. 2GiB), device.threads, device.bf16_gemm (auto, on, off),
    device.attention (auto: bf16 with bf16 GEMMs on cuda, else exact; exact; bf16: tensor cores, cuda only),
    device.memory_fraction (0.9: the share of MemAvailable a run may plan to fill without a limit)
  comm.backend (mpi, nccl: needs device.backend=cuda), comm.deterministic (rank-order sums)
  strategy (single, dp, dp_deferred, zero1, zero2, zero3, zero1_offload, zero2_offload,
    zero3_offload or an object), out, overwrite, name
  offload.staging (host staging buffers, e.g. 16MiB), offload.prefetch (units fetched ahead)
  launch.nproc (local ranks to start; 0: the launcher's, or one), launch.hostfile (as --hostfile)
  pipeline.stages (ranks per pipeline), pipeline.chunks (stages per rank, interleaved),
    pipeline.split ("params", "time" or unit counts per stage), pipeline.placement ("", loop, v)
  schedule ("": sequential driver; one_stage, one_stage_iw, gpipe, 1f1b, interleaved_1f1b,
    looped_bfs, zb_h1, zbv, dualpipev, pipedream, csv:PATH (a PyTorch pipelining CSV) or a
    function: schedule driver; any backward order trains with the bits of micro-batch order)

ztrain schedule [show|simulate] NAME p=P m=M [v=V] [out=DIR] draws a pipeline schedule
without training: builds it (gpipe, 1f1b, interleaved_1f1b, looped_bfs, zb_h1, zbv, dualpipev,
pipedream), simulates it, prints the ranks x time grid, the predicted bubble, peak
activations and the gradients kept for micro-batch order per stage, and
writes timeline.svg and timeline.json (Chrome trace) of the ideal timeline to
DIR (default runs/schedule-NAME-pP-mM-<time>/). `ztrain schedule compare p=4
m=8` prints every schedule's bubble and writes compare.svg (a bar chart).
`ztrain schedule csv:PATH` reads a schedule PyTorch's pipelining dumped
(compute-only with any chunks, looped or V; 2.5's B-for-I; SEND/RECV with
WAIT_*) and draws it; schedule=csv:PATH trains it.

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
is fastest to try. A pipeline recipe's own run comes first (recipe+: its
stages, chunks, schedule and strategy, the heaviest rank). Any recipe key may
be set, e.g.
  ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB precision=bf16
  ztrain plan recipes/zero3.lua nproc=4 batch.micro=8 data.seq_len=1024
  ztrain plan recipes/pipeline_dp.lua strategy=dp
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
schedules), metrics.csv and tensorboard/ (report.csv=true,
report.tensorboard=true). An out= that holds an earlier run is refused unless --overwrite
(or resume=...); one run at a time per directory (a lock).

Exit status: 0 success; 1 an error (bad input, a failed run: the message says);
3 an output could not be written (disk full, I/O error; the previous file stays);
5 a collective waited past comm.timeout for its peers (the message names them);
130 interrupted (the first SIGINT or SIGTERM: stopped after a step, with a
checkpoint and summary.json); 128 + N a second signal N, stopped at once (130,
143), or a rank killed by signal N (137: SIGKILL). Across hosts (--hostfile),
a failed job that mpirun does not end (a host it cannot reach) is ended by
ztrain after $ZTRAIN_ABORT_GRACE seconds (default 5), with the failure's exit
status, and ranks that do not all start within $ZTRAIN_START_TIMEOUT seconds
(default 60) end the launch (1).
]==]

return M
