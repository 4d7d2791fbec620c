-- tools/bench_scale.lua -- the measured scaling table (issue 14, `make bench-scale`).
--
--   build/ztrain --script tools/bench_scale.lua [dry=1] [reuse=1] [local=1] [only=dp,zero3]
--       [hosts=2,4] [rates=1gbit,10gbit,100gbit] [model=gpt2-mini] [T=64] [B=4] [accumulate=2] [steps=5]
--       [pairs=0]      (leave out the 2 hosts x 2 ranks runs: dp across, pipeline_dp)
--       [mem_bw=5e9]   (bytes/s the model assumes for the optimizer's copies; tools/bench.sh measures AdamW's)
--       [baseline=0] [results=DIR] [netcluster=SCRIPT] [doc=PATH] [svg=PATH]
--       (skip the one-rank run; results elsewhere than build/bench_scale; another cluster script; render
--        elsewhere than docs/scaling.md and docs/scaling.svg)
--
-- For each host count, brings up a test cluster (tools/netcluster.sh: network
-- namespaces joined by shaped veth links), and for each link rate and
-- strategy (dp, zero1, zero3, zero3_offload, pipeline_1f1b) runs a real job
-- across the hosts (`build/ztrain --hostfile`), one rank per host, and saves
-- its summary's figures to build/bench_scale/<strategy>_h<H>_<rate>.json:
-- step time (median of the steps after the first), bytes per step per rank
-- and the share of communication hidden behind compute (summary.json
-- comm_per_step, "n/a" where the runtime does not report them). A baseline
-- run on one rank (no network) measures the FLOP rate the step-time model
-- starts from. Every strategy does the same work per step: dp and ZeRO
-- accumulate `accumulate` micro-batches per rank, the pipeline accumulate x
-- hosts through its stages (same global batch, same math). And the seeds'
-- "pipeline across nodes, data parallelism within" on 2 hosts of 2 ranks
-- each: pipeline_dp (2 stages across the hosts, a stage's 2 replicas on
-- one host) against dp over all 4 ranks (its all-reduce across the link),
-- ids <strategy>_h2x2_<rate>.
--
-- Then (and alone with reuse=1: from the saved results, nothing run) it
-- renders docs/scaling.md's measured block, the model's calibration and
-- error, and docs/scaling.svg (tools/scale_report.lua); the predictions
-- block is tools/scale_predict.lua's.
--
-- dry=1 prints the runs it would make; local=1 runs them without a cluster
-- (all ranks on this host, `--nproc`, the rate column "local": a check of
-- the harness, not a measurement). The cluster is taken down when a run
-- fails too (pcall, then `netcluster.sh down`).
local cjson = require "cjson"
local zt = require "ztrain"
local durable = require "ztrain.util.durable"
local report = dofile(zt.home .. "/tools/scale_report.lua")

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local list = A.list
local function num(k, default)
  local v = tonumber(args[k] or default)
  if not v or v < 1 or v ~= math.floor(v) then
    error(("bench_scale: %s=%s must be a whole number >= 1"):format(k, tostring(args[k])), 0)
  end
  return v
end

local home = zt.home
local CORES                       -- set below (sh is defined further down)
local RESULTS = args.results or (home .. "/build/bench_scale")
local NETCLUSTER = args.netcluster or (home .. "/tools/netcluster.sh")   -- another script: the specs' stand-in
local cfg = { model = args.model or "gpt2-mini", T = num("T", 64), B = num("B", 4), accumulate = num("accumulate", 2),
              steps = num("steps", 5) }
local STRATEGIES = list(args.strategies, "dp,zero1,zero3,zero3_offload,pipeline_1f1b")
local HOSTS = list(args.hosts, "2,4")
local RATES = args["local"] and { "local" } or list(args.rates, "1gbit,10gbit,100gbit")

local function wanted(s)
  return not args.only or ("," .. args.only .. ","):find("," .. s .. ",", 1, true) ~= nil
end

-- the shell's quoting of one word
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- sh(cmd) -> ok, output (stdout and stderr). The exit status is echoed:
-- LuaJIT's popen():close() does not return it.
local function sh(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\""))
  local text = p:read("*a")
  p:close()
  local rc = tonumber(text:match("__rc=(%d+)%s*$"))
  text = text:gsub("__rc=%d+%s*$", "")
  return rc == 0, text
end

-- The plan: the baseline, then per host count the rates, per rate the strategies.
local function runs()
  local out = {}
  -- the baseline (one rank, no network): the FLOP rate the model starts from
  if args.baseline ~= "0" then
    out[#out + 1] = { id = "single_h1", strategy = "single", hosts = 1, rate = "none" }
  end
  for _, h in ipairs(HOSTS) do
    for _, rate in ipairs(RATES) do
      for _, s in ipairs(STRATEGIES) do
        if wanted(s) then
          out[#out + 1] = { id = ("%s_h%s_%s"):format(s, h, rate), strategy = s, hosts = tonumber(h), rate = rate,
                            slots = 1 }
        end
      end
    end
  end
  if args.pairs ~= "0" then
    for _, rate in ipairs(RATES) do
      for _, s in ipairs({ "dp", "pipeline_dp" }) do
        if wanted(s) then
          out[#out + 1] = { id = ("%s_h2x2_%s"):format(s, rate), strategy = s, hosts = 2, slots = 2, rate = rate }
        end
      end
    end
  end
  return out
end

-- command(run, hostfile) -> the ztrain command line of one run.
local function command(run, hostfile, dir)
  local slots = run.slots or 1
  local ranks = run.hosts * slots
  -- the same global batch: a pipeline replica takes its stages' share
  local acc = run.strategy == "pipeline_1f1b" and cfg.accumulate * run.hosts or
              run.strategy == "pipeline_dp" and cfg.accumulate * run.hosts or cfg.accumulate
  local recipe = run.strategy == "pipeline_1f1b" and "recipes/pipeline_1f1b.lua" or
                 run.strategy == "pipeline_dp" and "recipes/pipeline_dp.lua" or "recipes/single.lua"
  local over = ("model.size=%s model.vocab_size=50257 data.tokenizer=bytes data.seq_len=%d batch.micro=%d " ..
                "batch.accumulate=%d train.steps=%d train.eval_every=0 train.eval_batches=0 train.log_every=1000 " ..
                "lr.warmup=1 sample.tokens=0"):format(cfg.model, cfg.T, cfg.B, acc, cfg.steps)
  if run.strategy:match("^pipeline") then over = over .. (" pipeline.stages=%d"):format(run.hosts)
  else over = over .. " strategy=" .. run.strategy end
  -- the baseline on one thread: the rate of one core, as each rank of a
  -- multi-host run has (ztrain gives a rank cores / local ranks threads)
  if run.hosts == 1 then over = over .. " device.threads=1" end
  local launch = ""
  if ranks > 1 then
    launch = hostfile and ("--hostfile %s --nproc %d"):format(q(hostfile), ranks) or ("--nproc " .. ranks)
  end
  -- Open MPI refuses root without these; the cluster needs root
  return ("cd %s && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 900 build/ztrain %s %s %s -q " ..
          "out=%s"):format(q(home), launch, recipe, over, q(dir))
end

-- write_json(path, t): atomically (durable.write_atomic: a temporary name,
-- fsync, rename); an error names the file and why.
local function write_json(path, t)
  local ok, err = durable.write_atomic(path, cjson.encode(t) .. "\n")
  if not ok then error("bench_scale: " .. err, 0) end
end

-- measure(run, hostfile) -> the saved record (ok = false with the error's text).
local function measure(run, hostfile)
  local dir = RESULTS .. "/run_" .. run.id
  sh("rm -rf " .. q(dir))
  local cmd = command(run, hostfile, dir)
  local ok, text = sh(cmd)
  local rec = { id = run.id, strategy = run.strategy, hosts = run.hosts, slots = run.slots, rate = run.rate,
                config = cfg,
                command = cmd, ok = false }
  local f = io.open(dir .. "/summary.json")
  if ok and f then
    local s = cjson.decode(f:read("*a"))
    f:close()
    rec.ok = true
    rec.step_ms = s.step_ms_median
    rec.tokens_per_s = s.tokens_per_s
    rec.world_size, rec.threads = s.world_size, s.threads
    rec.cores = CORES
    rec.model = s.model
    rec.batch = s.batch
    rec.param_digest = s.param_digest
    rec.comm_per_step = s.comm_per_step       -- nil until the runtime counts bytes
  else
    if f then f:close() end
    rec.error = text:sub(-2000)
  end
  write_json(("%s/%s.json"):format(RESULTS, run.id), rec)
  sh("rm -rf " .. q(dir))
  return rec
end

-- the machine's cores, which every namespace host shares
CORES = tonumber((select(2, sh("nproc")) or ""):match("%d+")) or 1

local function say(...) io.stdout:write(string.format(...), "\n"); io.stdout:flush() end

local function cluster(cmd)
  local ok, text = sh(("ZTRAIN_NETCLUSTER=${ZTRAIN_NETCLUSTER:-ztbench} %s %s"):format(q(NETCLUSTER), cmd))
  if not ok then error(("bench_scale: %s %s failed: %s"):format(NETCLUSTER, cmd, text), 0) end
  return text
end

local function run_all(plan)
  sh("mkdir -p " .. q(RESULTS))
  -- a cluster per layout (hosts x slots), in the plan's order
  local groups, order = {}, {}
  for _, r in ipairs(plan) do
    local key = r.hosts .. "x" .. (r.slots or 1)
    if not groups[key] then groups[key] = {}; order[#order + 1] = key end
    table.insert(groups[key], r)
  end
  for _, key in ipairs(order) do
    local group = groups[key]
    local h, slots = group[1].hosts, group[1].slots or 1
    local net = h > 1 and not args["local"]
    local hostfile = net and (RESULTS .. "/hostfile") or nil
    local ok, err = pcall(function()
      local current
      if net then
        cluster(("up %d --rate %s --slots %d"):format(h, group[1].rate, slots))
        local lines = {}
        for line in cluster("hostfile"):gmatch("[^\n]+") do
          if line:match("slots=") then lines[#lines + 1] = line end
        end
        if #lines ~= h then
          error(("bench_scale: tools/netcluster.sh hostfile listed %d host(s), %d expected"):format(#lines, h), 0)
        end
        local f = assert(io.open(hostfile, "w")); f:write(table.concat(lines, "\n"), "\n"); f:close()
        current = group[1].rate
      end
      for _, r in ipairs(group) do
        if net and r.rate ~= current then cluster("shape " .. r.rate); current = r.rate end
        local t0 = os.time()
        local rec = measure(r, hostfile)
        if rec.ok then say("%-28s %9.1f ms/step  (%ds)", r.id, rec.step_ms, os.time() - t0)
        else say("%-28s failed: %s", r.id, (rec.error or ""):gsub("\n", " "):sub(-300)) end
      end
    end)
    if net then pcall(cluster, "down") end
    if not ok then error(err, 0) end
  end
end

local plan = runs()
if args.dry then
  say("bench_scale: %d run(s), %s, T=%d, B=%d, accumulate %d (pipelines x hosts), %d steps; results in %s",
      #plan, cfg.model, cfg.T, cfg.B, cfg.accumulate, cfg.steps, RESULTS)
  for _, r in ipairs(plan) do
    say("%-28s %s", r.id, command(r, (r.hosts > 1 and not args["local"]) and (RESULTS .. "/hostfile") or nil,
                                  RESULTS .. "/run_" .. r.id))
  end
  return
end
if not args.reuse then run_all(plan) end
local recs = report.load(RESULTS)
if #recs == 0 then error("bench_scale: no results in " .. RESULTS .. " (run without reuse=1 first)", 0) end
local out = report.render(recs, { doc = args.doc or (home .. "/docs/scaling.md"),
                                  svg = args.svg or (home .. "/docs/scaling.svg"),
                                  fit_out = RESULTS .. "/fit.json", mem_bw = tonumber(args.mem_bw),
                                  results = args.results and RESULTS or nil })
io.stdout:write(out)
