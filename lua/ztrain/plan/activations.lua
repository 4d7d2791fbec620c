-- ztrain.plan.activations: the planner's activation rows (plan/init.lua):
-- the activation sets a stage holds, its scratch and tables, and rank 0's
-- sample at evaluations and at the end.
local family = require "ztrain.model.family"
local Acts = require "ztrain.model.activations"
local precision = require "ztrain.model.precision"
local losses = require "ztrain.parallel.driver.losses"
local fp = require "ztrain.parallel.strategy.footprint"
local data = require "ztrain.model.data"

local M = {}
local add = fp.add

-- A Llama-family RoPE table of n positions: cos and sin, (n, hs/2) fp32
-- each (model/llama.lua's rope_table)
local function rope_bytes(cfg, n) return 2 * n * (cfg.C / cfg.NH / 2) * 4 end

-- Activations of `sets` micro-batches in flight over these units, and the
-- stage's scratch (model/activations.lua's plan); kept inputs on the host.
-- ckpt: the model's checkpointed blocks (the trainer's rule,
-- driver/stage.lua's checkpoint_units over every unit of the model).
-- rank: a table shared by the calls for one rank's stages (what the rank's
-- model keeps once: the RoPE table), or nil for a rank with one stage.
function M.activations(t, cfg, r, units, sets, ckpt, rank)
  local B, Tlen = r.batch.micro, r.data.seq_len
  -- the stage's own checkpointed blocks (its pool's: driver/stage.lua)
  local mine = {}
  for _, u in ipairs(units) do if ckpt[u.index] then mine[u.index] = true end end
  ckpt = mine
  local host = r.train.checkpoint_host and next(ckpt) ~= nil
  -- bf16 GEMMs keep what only they read in bf16 (the trainer's choice)
  local g16 = precision.gemm16(r)
  add(t, "device", "activations", sets * Acts.set_bytes(cfg, B, Tlen, units, ckpt, host, g16) +
      Acts.scratch_bytes(cfg, B, Tlen, { recompute = next(ckpt) ~= nil, host = host, gemm16 = g16 }))
  -- the head's stage keeps the step's per-position losses (driver/losses.lua);
  -- a Llama-family stage with blocks its RoPE table, cos and sin (T, hs/2)
  -- (model/llama.lua's rope_table)
  local rope = false
  for _, u in ipairs(units) do
    if u.kind == "head" then add(t, "device", "activations", losses.bytes(r.batch.accumulate, B, Tlen)) end
    rope = rope or (u.kind == "block" and cfg.family == "llama")
  end
  if rope and not (rank and rank.rope) then add(t, "device", "activations", rope_bytes(cfg, Tlen)) end
  if rope and rank then rank.rope = true end
  if host then
    -- each kept input a stream row: bf16 with the bf16 GEMMs (bf16 activations)
    for _ in pairs(ckpt) do add(t, "host", "activations", sets * B * Tlen * cfg.C * (g16 and 2 or 4)) end
  end
end

-- Mixed precision without the bf16 GEMMs: the fp32 work buffers a rank's
-- precision policy keeps for the units it runs (model/precision.lua's
-- work_bytes; category activations), once a rank.
function M.precision_work(t, r, model, units)
  if r.precision == "fp32" then return end
  add(t, "device", "activations", precision.work_bytes(model, units, precision.gemm16(r) and true or false))
end

-- Rank 0's sample (sample.tokens > 0, at each evaluation and at the end,
-- while the training activations are held): model/generate.lua's session (a
-- key/value cache of prompt + tokens positions, the final norm, logits)
-- and its work rows (the prompt's prefill and one decode row), and for a
-- strategy that keeps no full parameters (sharded, or mixed precision) a
-- full fp32 copy of the model ("other", trainer.lua's sample).
-- generate.lua's ROWS, as widths of Acts.widths
local GEN_ROWS = { "C", "C", "C", "qkv", "C", "C", "C", "ffn_in", "ffn" }
local function gen_work(cfg, n)
  local W = Acts.widths(cfg)
  local total = 2 * n + 16
  for _, k in ipairs(GEN_ROWS) do total = total + math.ceil(n * W[k] / 16) * 16 end
  return 4 * (total + n)
end

function M.sample(t, cfg, r, spec)
  if r.sample.tokens <= 0 then return end
  local n = #r.sample.prompt + 1                 -- tokens of the prompt, at most one per byte
  local okt, tok = pcall(data.tokenizer, r.data.tokenizer)
  if okt and r.sample.prompt ~= "" and tok.encode then
    local oke, ids = pcall(tok.encode, tok, r.sample.prompt)
    if oke and type(ids) == "table" then n = #ids end
  end
  local cap = math.min(n + r.sample.tokens, cfg.maxT)
  local kv = (cfg.NKV or cfg.NH) * (cfg.C / cfg.NH)          -- a cached position's keys (Llama: NKV heads)
  -- a strategy that keeps no full parameters samples from a full fp32 copy
  -- of the model (train/whole_model.lua), with its own RoPE table of cap
  -- positions; in place, the training model's table is made again for cap
  -- positions when cap > T, replacing it (cos and sin, (positions, hs/2) each)
  local copy = spec.stage > 0 or r.precision ~= "fp32"
  local rope = cfg.family ~= "llama" and 0 or rope_bytes(cfg, copy and cap or math.max(0, cap - r.data.seq_len))
  add(t, "device", "activations", 4 * (2 * cfg.L * kv * cap + cfg.C + 2 + cfg.V) + gen_work(cfg, n) +
      gen_work(cfg, 1) + rope)
  if copy then
    for _, u in ipairs(family.new(cfg, { alloc = false, pad = family.PAD }).units) do
      add(t, "device", "other", 4 * u.padded)
    end
  end
end

return M
