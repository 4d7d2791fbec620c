-- ztrain.train.checkpoint.changes: what a resume may change. A checkpoint
-- keeps the settings that decide what the run computes (its "math"); a run
-- that resumes from it under other ones would silently be another run --
-- another global batch, a learning rate that jumps, other data -- so those
-- are refused, each named with both values, unless `allow_changes` names
-- its group. Where the run's pieces are placed (strategy, world size,
-- pipeline stages, offload) changes nothing of the math (DESIGN.md's "same
-- math whatever the strategy"): a resume proceeds and says what moved.
-- The kernels a run took (the device, the bf16 GEMMs or not, the attention
-- once "auto" is resolved) give other bits but the same training: moving
-- a run from a CPU to a GPU is expected, so a resume proceeds and says so
-- too ("with other kernels").
--
--   changes.of(tr)                      -> the manifest's "math", "placement", "kernels"
--   changes.check(saved, now, allowed)  -> placement notes, kernel notes | raises
local lr = require "ztrain.model.lr"
local precision = require "ztrain.model.precision"

local M = {}

-- The groups allow_changes may name, in the order a refusal lists them.
M.GROUPS = { "batch", "lr", "optim", "data", "precision" }

local function plain(v)
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = tostring(x) end
    return table.concat(parts, ",")
  end
  return v
end

-- of(tr) -> { math = ..., placement = ... } for save_run's manifest
function M.of(tr)
  local r = tr.recipe
  return {
    math = {
      batch = { global_batch = r.batch.micro * tr.accumulate * tr.dp.size, seq_len = r.data.seq_len },
      lr = { lr = r.optim.lr, warmup = r.lr.warmup, schedule = r.lr.schedule, min_ratio = r.lr.min_ratio,
             steps = r.train.steps },
      optim = { betas = plain(r.optim.betas), eps = r.optim.eps, weight_decay = r.optim.weight_decay,
                clip = r.optim.clip },
      data = { text = plain(r.data.text), exclude = plain(r.data.exclude), valid_fraction = r.data.valid_fraction,
               seed = r.data.seed },
      precision = { precision = r.precision },
    },
    placement = { strategy = tr.strategy.name, world_size = tr.world_size, stages = tr.pp and tr.pp.size or 1 },
    kernels = M.kernels(tr),
  }
end

-- the kernels' bits class: the device (the fake GPUs run the CPU's
-- kernels), the GEMMs (the CPU's AMX path has its own bits, its
-- AVX512_BF16 and portable paths share theirs: kernels.h), the attention,
-- and on the cuda device whether the GELU rides the GEMMs' epilogue
-- (ZTRAIN_GELU_FUSION=0 turns it off: other bits) and whether the
-- tensor-core attention's backward adds dQ in its dK/dV kernel
-- (ZTRAIN_ATTN_DQ=ordered: other bits, and others again at head size 128
-- with ZTRAIN_ATTN_BWD128=wide (ZTRAIN_ATTN_BWD64 at head size 64), its dQ
-- parts of 128 keys; ZTRAIN_ATTN_FWD128
-- and ZTRAIN_ATTN_FWD keep them, and so does the wide backward with dQ by its
-- own pass)
function M.kernels(tr)
  local r = tr.recipe
  local dev = tostring(r.device.backend):match("^fakegpu") and "cpu" or r.device.backend
  local gemm = "fp32"
  if tr.model.gemm16 then
    local _, path = precision.gemm16(r)
    gemm = dev ~= "cpu" and "bf16" or (path:match("^AMX") and "bf16 amx" or "bf16 vdpbf16ps")
  end
  local fused = dev == "cuda" and tr.model.gemm16 and os.getenv("ZTRAIN_GELU_FUSION") ~= "0"
  local gelu = fused and "epilogue" or "apart"
  local attention = tr.attention
  local hs = tr.cfg and tr.cfg.C / tr.cfg.NH      -- the tensor-core kernels' head sizes: 64, 128
  if dev == "cuda" and attention == "bf16" and (hs == 64 or hs == 128) and
     os.getenv("ZTRAIN_ATTN_DQ") == "ordered" then
    attention = "bf16 ordered-dq"
    if os.getenv(hs == 128 and "ZTRAIN_ATTN_BWD128" or "ZTRAIN_ATTN_BWD64") == "wide" then
      attention = "bf16 ordered-dq wide"
    end
  end
  return { device = dev, gemm = gemm, attention = attention, gelu = gelu }
end

-- the keys under each group as a user sets them (recipe paths)
local PATHS = {
  batch = { global_batch = "batch.global (micro x accumulate x ranks)", seq_len = "data.seq_len" },
  lr = { lr = "optim.lr", warmup = "lr.warmup", schedule = "lr.schedule", min_ratio = "lr.min_ratio",
         steps = "train.steps" },
  optim = { betas = "optim.betas", eps = "optim.eps", weight_decay = "optim.weight_decay", clip = "optim.clip" },
  data = { text = "data.text", exclude = "data.exclude", valid_fraction = "data.valid_fraction", seed = "data.seed" },
  precision = { precision = "precision" },
}

-- lr_differs(a, b, from) -> the first step after `from` where the two
-- schedules give another rate, or nil: train.steps alone changes nothing
-- under a constant schedule, and everything under a decaying one
local function lr_differs(a, b, from)
  local fa = lr.make(a.lr, a, a.steps)
  local fb = lr.make(b.lr, b, b.steps)
  for s = from + 1, math.max(from + 1, math.min(a.steps, b.steps)) do
    if fa(s) ~= fb(s) then return s, fa(s), fb(s) end
  end
end

-- group_changes(name, was, now, step) -> { "key was -> now", ... }
local function group_changes(name, was, now, step)
  local out = {}
  local keys = {}
  for k in pairs(PATHS[name]) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if was[k] ~= nil and was[k] ~= now[k] then
      out[#out + 1] = ("%s %s -> %s"):format(PATHS[name][k], tostring(was[k]), tostring(now[k]))
    end
  end
  if name == "lr" and #out > 0 then
    local s, a, b = lr_differs(was, now, step)
    if not s then return {} end
    out[#out] = out[#out] .. (" (the learning rate at step %d: %.4g -> %.4g)"):format(s, a, b)
  end
  return out
end

-- allowed(text) -> set of groups from allow_changes ("lr,batch", "all", "")
function M.allowed(text)
  local set = {}
  for g in tostring(text or ""):gmatch("[^,%s]+") do
    if g == "all" then for _, n in ipairs(M.GROUPS) do set[n] = true end
    else set[g] = true end
  end
  return set
end

-- the keys of `keys` whose value moved from was to now, as "k a -> b" lines
-- (a key the checkpoint did not record is not compared)
local function moved(was, now, keys)
  local notes = {}
  for _, k in ipairs(keys) do
    if was[k] ~= nil and was[k] ~= now[k] then
      notes[#notes + 1] = ("%s %s -> %s"):format(k, tostring(was[k]), tostring(now[k]))
    end
  end
  return notes
end

-- check(saved, now, allowed, step, dir) -> placement notes, kernel notes:
-- raises naming every change of the math not allowed; returns the
-- placement's and the kernels' changes, as lines. A checkpoint written
-- before these records were kept (no saved.math, no saved.kernels) is not
-- checked for them.
function M.check(saved, now, allowed, step, dir)
  if type(saved) ~= "table" or type(saved.math) ~= "table" then return {}, {} end
  local refused = {}
  for _, g in ipairs(M.GROUPS) do
    local was = saved.math[g]
    if type(was) == "table" and not allowed[g] then
      local ch = group_changes(g, was, now.math[g], step)
      if #ch > 0 then refused[#refused + 1] = ("%s: %s"):format(g, table.concat(ch, ", ")) end
    end
  end
  if #refused > 0 then
    local names = {}
    for _, line in ipairs(refused) do names[#names + 1] = line:match("^(%w+):") end
    error(("resume from %s would change what the run computes -- %s; resume with the checkpoint's settings, " ..
           "or allow it with allow_changes=%s"):format(dir, table.concat(refused, "; "), table.concat(names, ",")), 0)
  end
  local function saved_of(k) return type(saved[k]) == "table" and saved[k] or {} end
  local knotes = moved(saved_of("kernels"), now.kernels, { "device", "gemm", "attention", "gelu" })
  if type(saved.kernels) ~= "table" then
    knotes = { "not recorded" }     -- a checkpoint written before 2026-11-28
  end
  return moved(saved_of("placement"), now.placement, { "strategy", "world_size", "stages" }), knotes
end

return M
