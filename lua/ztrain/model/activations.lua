-- ztrain.model.activations: what one micro-batch leaves behind on one stage.
--
-- An activation set belongs to a (stage, micro-batch): a stage is a run of
-- consecutive units, and a driver keeps one set per micro-batch in flight on
-- it (the sequential driver: one set; a pipeline: up to its in-flight bound).
-- Everything lives in one f32 slab (category "activations"), every view
-- 256-byte aligned, plus (B,T) i32 tokens and targets where the stage has the
-- embedding or the head. Per unit, for N = B*T rows:
--   embed   out (N,C)
--   block   saved: ln1, atty, resid2, ln2 (N,C); qkv (N,3C); fch, fch_gelu (N,4C);
--                  ln1/ln2 mean+rstd (N); lse (B,NH,T);  out (N,C)
--   head    saved: lnf (N,C) + mean/rstd (N); logits (N,Vp) (overwritten in
--                  place by dlogits); out = losses (N)
-- (That is GPT-2's block; a Llama-family block, model/llama.lua, saves
-- ln1, atty, resid2, ln2 (N,C) and their rstd (N), qkv (N,(NH+2NKV)hs)
-- with q and k turned by RoPE, lse, gu (N,2F) and act (N,F); its head
-- keeps no mean: SAVED below. With bf16 GEMMs its ln1, ln2, lnf (the RMS
-- norms' bf16 out), qkv (turned by RoPE in bf16: each pair widened, turned,
-- rounded once), atty, gu (the gate/up GEMM's bf16 out) and act (the
-- SwiGLU's) are bf16, and so are the scratch's dqkv and dfch16, the
-- SwiGLU backward's dgu.)
-- The logits' rows are padded to Vp = ops.padded_cols(V) (50257 -> 50304):
-- a GPU's GEMMs need rows on 16 bytes for their fast kernels; the GEMMs and
-- the cross-entropy use the first V columns of each row (ztrain.h, "padded
-- rows"), Set:read_logits gives them packed.
--
-- With bf16 GEMMs (opts.gemm16: precision bf16, device.bf16_gemm), what
-- only a GEMM reads is stored bf16, in a second slab: ln1, ln2, fch_gelu,
-- lnf (their kernels write bf16: the fp32 value rounded once, the very bits
-- the GEMM's cast gave before) and the logits (the head's GEMM writes them,
-- the cross-entropy reads and overwrites them in bf16); so is fch, the c_fc
-- GEMM's output (written bf16 by the GEMM, bias added before the one
-- rounding; the GELU reads it in both passes, widened exactly: bf16
-- activations, other math than fp32 fch); so are qkv (the c_attn GEMM's
-- bf16 out) and atty (the attention's, rounded once), which the attention
-- reads widened exactly (zt_attention_*'s bf16 I/O); in the stage's
-- scratch the GELU backward's output dfch16, which the c_fc GEMM reads,
-- and dqkv, the attention backward's bf16 out, which the c_attn GEMM reads.
-- So is the residual stream, end to end: every unit's out, resid2, the
-- stage's input and grad, the scratch's proj (the projection GEMMs' bf16
-- out), the host checkpoint's kept inputs and ping-pong buffers, and the
-- split backward's dy and dresid2 -- each sum rounded once (zt_add3, the
-- layer norm's fused add), the layer norms reading the rounded stream, and
-- each norm backward adding its gradient into grad rounded once an element
-- (llm.c's bf16 residual; other math than an fp32 stream).
-- and for the stage: `input` (N,C) when its first unit is not the embedding
-- (a pipeline receives it), `grad` (N,C), the gradient flowing backward
-- (d output on entry to a unit's backward, d input on exit).
--
-- Scratch shared by every set of a stage (never alive across units): the
-- forward projection output and the fused backward's intermediates.
--
-- Activation checkpointing (opts.checkpoint[u.index] = true, blocks only):
-- such a block keeps only its output in the set (the next unit's input);
-- what its backward reads (ln1 .. fch_gelu, lse) lives in one block's worth
-- of the stage's scratch ("recompute"), which every checkpointed block of
-- every set shares. Its forward writes there and is overwritten by the next
-- block's; the driver runs the block's forward again, from its kept input,
-- right before its backward (driver/stage.lua), with the same kernels on the
-- same inputs: the same bits. The backward must be fused (B): a split W
-- would read the shared buffers after another block's recompute.
--
-- With opts.host (train.checkpoint_host), a checkpointed block's kept input
-- lives on the host tier instead (set.hx[u.index], copied after its
-- forward), and the output of a unit that feeds a checkpointed block is
-- not kept in the set either: it goes to one of two device buffers of the
-- stage's scratch (ping-pong, s.ping[1], s.ping[2]) that the next unit
-- reads at once. Backward copies the kept input back to the scratch's
-- `xin` before the recompute.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local ffi = require "ffi"

local M = {}

-- A slab plan: named views of one f32 tensor, each rounded up to 64 floats,
-- and of one bf16 tensor for the views added with bf16 = true, each rounded
-- up to 128 elements: every view starts on 256 bytes (a slab's base is
-- 4096-aligned on the host, 256 on a GPU), what cuBLASLt's and vectorized
-- kernels' alignment promises want.
local function planner()
  local P = { list = {}, total = 0, total16 = 0 }
  function P.add(key, shape, bf16)
    local n = 1
    for i = 1, #shape do n = n * shape[i] end
    if bf16 then
      P.list[#P.list + 1] = { key = key, shape = shape, offset = P.total16, bf16 = true }
      P.total16 = P.total16 + math.ceil(n / 128) * 128
    else
      P.list[#P.list + 1] = { key = key, shape = shape, offset = P.total }
      P.total = P.total + math.ceil(n / 64) * 64
    end
  end
  function P.bytes() return math.max(P.total, 16) * 4 + P.total16 * 2 end
  -- Allocate the slabs and return { slab, slab16, views = list, [key] = view }.
  function P.alloc(tier, category)
    local out = { views = {} }
    out.slab = T.new({ math.max(P.total, 16) }, { tier = tier, category = category })
    if P.total16 > 0 then
      local ok, t = pcall(T.new, { P.total16 }, { tier = tier, category = category, dtype = "bf16" })
      if not ok then out.slab:free(); error(t, 0) end
      out.slab16 = t
    end
    for _, e in ipairs(P.list) do
      local v = (e.bf16 and out.slab16 or out.slab):view(e.offset, e.shape)
      out.views[#out.views + 1] = v
      out[e.key] = v
    end
    return out
  end
  return P
end

local function free_slab(s)
  if not s then return end
  for _, v in ipairs(s.views) do v:free() end
  s.slab:free()
  if s.slab16 then s.slab16:free() end
end

-- What a block saves, per model family: { key, width, stored bf16 with bf16
-- GEMMs }; width "N" (N), "lse" (B,NH,T), or a key of widths(cfg) (B,T,w).
-- Llama's (model/llama.lua): the RMS norms keep no mean; gu (N,2F) is the
-- stacked gate/up GEMM's out, act (N,F) the SwiGLU's; qkv (N,(NH+2NKV)hs)
-- holds q and k turned by RoPE.
local SAVED = {
  gpt2 = { { "ln1", "C", true }, { "ln1_mean", "N" }, { "ln1_rstd", "N" }, { "qkv", "qkv", true },
           { "atty", "C", true }, { "lse", "lse" }, { "resid2", "C", true }, { "ln2", "C", true },
           { "ln2_mean", "N" }, { "ln2_rstd", "N" }, { "fch", "ffn_in", true },
           { "fch_gelu", "ffn", true } },
  llama = { { "ln1", "C", true }, { "ln1_rstd", "N" }, { "qkv", "qkv", true }, { "atty", "C", true },
            { "lse", "lse" }, { "resid2", "C", true }, { "ln2", "C", true }, { "ln2_rstd", "N" },
            { "gu", "ffn_in", true }, { "act", "ffn", true } },
}
local function saved(cfg) return SAVED[cfg.family or "gpt2"] end

-- the row widths of a block's activations: C, qkv's, the MLP's first
-- GEMM's out (ffn_in) and the activation's (ffn)
local function widths(cfg)
  if cfg.family == "llama" then
    local hs = cfg.C / cfg.NH
    return { C = cfg.C, qkv = (cfg.NH + 2 * cfg.NKV) * hs, ffn_in = 2 * cfg.F, ffn = cfg.F }
  end
  return { C = cfg.C, qkv = 3 * cfg.C, ffn_in = 4 * cfg.C, ffn = 4 * cfg.C }
end
M.widths = widths

local Set = {}
Set.__index = Set
M.Set = Set

local function block_shape(s, B, Tlen, N, cfg)
  return s[2] == "N" and { N } or s[2] == "lse" and { B, cfg.NH, Tlen } or { B, Tlen, widths(cfg)[s[2]] }
end

-- new(cfg, B, T, tier, units, scratch, opts) -> an activation set for those
-- units. Sets of one stage share the stage's scratch; without one the set
-- owns its own. opts.checkpoint: { [unit index] = true } for checkpointed
-- blocks (the scratch must then have been made with recompute = true).
-- The slab plan of a set (no allocation): planner, has_embed, has_head.
-- feeds_ckpt(units, i, ckpt): unit i's output is a checkpointed block's input
local function feeds_ckpt(units, i, ckpt) return units[i + 1] ~= nil and ckpt[units[i + 1].index] end

local function plan(cfg, B, Tlen, units, ckpt, host, gemm16)
  local N, C, V = B * Tlen, cfg.C, cfg.V
  local P = planner()
  local first = units[1]
  local has_embed, has_head = false, false
  for i, u in ipairs(units) do
    local k = "u" .. u.index .. "."
    -- host mode: an output a checkpointed block reads goes to a ping-pong buffer
    local keep_out = not (host and feeds_ckpt(units, i, ckpt))
    if u.kind == "embed" then
      has_embed = true
      if keep_out then P.add(k .. "out", { B, Tlen, C }, gemm16) end
    elseif u.kind == "block" then
      if not ckpt[u.index] then
        for _, s in ipairs(saved(cfg)) do
          P.add(k .. s[1], block_shape(s, B, Tlen, N, cfg), gemm16 and s[3])
        end
      end
      if keep_out then P.add(k .. "out", { B, Tlen, C }, gemm16) end
    else
      has_head = true
      P.add(k .. "lnf", { B, Tlen, C }, gemm16); P.add(k .. "lnf_rstd", { N })
      if cfg.family ~= "llama" then P.add(k .. "lnf_mean", { N }) end
      P.add(k .. "logits", { B, Tlen, ops.padded_cols(V) }, gemm16)
      P.add(k .. "out", { N })
    end
  end
  if first.kind ~= "embed" then P.add("input", { B, Tlen, C }, gemm16) end
  P.add("grad", { B, Tlen, C }, gemm16)
  return P, has_embed, has_head
end

-- set_bytes(cfg, B, T, units, checkpoint) -> the bytes one set of these
-- units holds (its slab, tokens and targets), checkpointed blocks or not;
-- for reports ("activation memory with and without checkpointing").
function M.set_bytes(cfg, B, Tlen, units, ckpt, host, gemm16)
  local P, e, h = plan(cfg, B, Tlen, units, ckpt or {}, host, gemm16)
  return P.bytes() + (e and B * Tlen * 4 or 0) + (h and B * Tlen * 4 or 0)
end

function M.new(cfg, B, Tlen, tier, units, scratch, opts)
  local ckpt = opts and opts.checkpoint or {}
  local host = opts and opts.host and next(ckpt) ~= nil
  local N = B * Tlen
  local gemm16 = opts and opts.gemm16 or false
  local P, has_embed, has_head = plan(cfg, B, Tlen, units, ckpt, host, gemm16)
  local self = setmetatable({ cfg = cfg, B = B, T = Tlen, N = N, units = units,
                              slab_bytes = P.bytes(), tier = tier, x = {}, checkpointed = ckpt,
                              gemm16 = gemm16 }, Set)
  self.mem = P.alloc(tier, "activations")
  -- per-unit tables of views: self.unit[u.index].qkv, ...
  self.unit = {}
  for _, u in ipairs(units) do
    local k, t = "u" .. u.index .. ".", {}
    for key, v in pairs(self.mem) do
      if type(key) == "string" and key:sub(1, #k) == k then t[key:sub(#k + 1)] = v end
    end
    self.unit[u.index] = t
  end
  self.input, self.grad = self.mem.input, self.mem.grad
  self.w = {}
  self.scratch = scratch
  local ok, err = pcall(function()
    if has_embed then
      self.tokens = T.new({ B, Tlen }, { dtype = "i32", tier = tier, category = "activations" })
    end
    if has_head then
      self.targets = T.new({ B, Tlen }, { dtype = "i32", tier = tier, category = "activations" })
    end
    if not scratch then
      self.scratch = M.scratch(cfg, B, Tlen, tier, { recompute = next(ckpt) ~= nil, host = host,
                                                     gemm16 = gemm16 })
      self.own_scratch = true
    end
    if host then
      -- kept inputs on the host; outputs feeding them through the ping-pong buffers
      assert(self.scratch.ping, "host checkpointing needs a scratch made with host = true")
      self.hx = {}
      local flip = 1
      for i, u in ipairs(units) do
        if feeds_ckpt(units, i, ckpt) then
          self.unit[u.index].out = self.scratch.ping[flip]
          flip = 3 - flip
        end
        if ckpt[u.index] then
          self.hx[u.index] = T.new({ B, Tlen, cfg.C }, { tier = "host", category = "activations",
                                                         dtype = gemm16 and "bf16" or "f32" })
        end
      end
    end
    -- checkpointed blocks: what backward reads is the stage's recompute buffer
    for _, u in ipairs(units) do
      if ckpt[u.index] then
        assert(u.kind == "block", "only blocks are checkpointed")
        assert(self.scratch.recompute, "checkpointed blocks need a scratch made with recompute = true")
        assert(not gemm16 == not self.scratch.gemm16, "the scratch's bf16 GEMM inputs must match the set's")
        for _, s in ipairs(saved(cfg)) do self.unit[u.index][s[1]] = self.scratch.recompute[s[1]] end
      end
    end
  end)
  if not ok then self:free(); error(err, 0) end   -- nothing half-made stays allocated
  return self
end

function Set:bytes()
  return self.slab_bytes + (self.tokens and self.N * 4 or 0) + (self.targets and self.N * 4 or 0)
end

-- The logits of the set's last forward as packed fp32 rows: a float[N*V]
-- cdata (0-based) and N*V. For the REPL and specs (a host copy).
function Set:read_logits()
  local last = self.units[#self.units]
  assert(last.kind == "head", "read_logits: this set has no head")
  local lg, V = self.unit[last.index].logits, self.cfg.V
  local Vp = lg:shape()[3]
  local out = ffi.new("float[?]", self.N * V)
  if lg:dtype() == "bf16" then
    local raw = ffi.new("uint16_t[?]", lg:numel())
    lg:read(raw)
    local u = ffi.new("uint32_t[1]")
    for n = 0, self.N - 1 do
      for j = 0, V - 1 do
        u[0] = bit.lshift(raw[n * Vp + j], 16)
        out[n * V + j] = ffi.cast("float *", u)[0]
      end
    end
  else
    local raw = ffi.new("float[?]", lg:numel())
    lg:read(raw)
    for n = 0, self.N - 1 do ffi.copy(out + n * V, raw + n * Vp, V * 4) end
  end
  return out, self.N * V
end

-- The losses (N) of this micro-batch, when the set holds the head.
function Set:losses()
  local last = self.units[#self.units]
  return last.kind == "head" and self.unit[last.index].out or nil
end

function Set:free()
  free_slab(self.mem); self.mem = nil
  for _, h in pairs(self.hx or {}) do h:free() end
  self.hx = nil
  if self.own_scratch and self.scratch then self.scratch.free() end
  self.scratch = nil
  if self.tokens then self.tokens:free(); self.tokens = nil end
  if self.targets then self.targets:free(); self.targets = nil end
end

---------------------------------------------------------------------------
-- Scratch shared by the sets of one stage: proj (N,C) for forward; dln,
-- datty (N,C), dqkv (N,3C), dfch (N,4C) for the fused backward; with
-- opts.gemm16 dqkv, proj, dln, datty (and Llama's dact) are bf16 (the
-- attention backward and the GEMMs write them so: activation gradients
-- bf16 too; dfch stays the f32 product the GELU backward reads) and there
-- is also dfch16 (N,ffn_in) bf16: the GELU (SwiGLU) backward's output as
-- the next bf16 GEMM reads it (model/gpt2.lua); with
-- opts.recompute, one block's saved activations (s.recompute.ln1, ...) for
-- checkpointed blocks.
local function scratch_plan(cfg, B, Tlen, opts)
  local N, C, W = B * Tlen, cfg.C, widths(cfg)
  local gemm16 = opts and opts.gemm16
  local P = planner()
  P.add("proj", { B, Tlen, C }, gemm16)
  P.add("dln", { B, Tlen, C }, gemm16); P.add("datty", { B, Tlen, C }, gemm16)
  P.add("dqkv", { B, Tlen, W.qkv }, gemm16)
  -- dfch: GPT-2's fp32 c_proj input gradient (then GELU'd into dfch16 with
  -- bf16 GEMMs); Llama's (N,2F) dgu, bf16 in dfch16 with bf16 GEMMs (its
  -- fp32 gradient is dact)
  if not (gemm16 and cfg.family == "llama") then P.add("dfch", { B, Tlen, W.ffn_in }) end
  -- Llama: the down GEMM's input gradient (N,F), apart from dfch (N,2F)
  if cfg.family == "llama" then P.add("dact", { B, Tlen, W.ffn }, gemm16) end
  if gemm16 then P.add("dfch16", { B, Tlen, W.ffn_in }, true) end
  if opts and opts.recompute then
    for _, b in ipairs(saved(cfg)) do
      P.add("rc." .. b[1], block_shape(b, B, Tlen, N, cfg), gemm16 and b[3])
    end
  end
  if opts and opts.host then
    P.add("ping1", { B, Tlen, C }, gemm16); P.add("ping2", { B, Tlen, C }, gemm16)
    P.add("xin", { B, Tlen, C }, gemm16)
  end
  return P
end

-- scratch_bytes(cfg, B, T, opts) -> the bytes M.scratch allocates (for the
-- memory planner, plan.lua: no allocation).
function M.scratch_bytes(cfg, B, Tlen, opts)
  return scratch_plan(cfg, B, Tlen, opts).bytes()
end

function M.scratch(cfg, B, Tlen, tier, opts)
  local N = B * Tlen
  local P = scratch_plan(cfg, B, Tlen, opts)
  local s = P.alloc(tier, "activations")
  s.N, s.gemm16 = N, opts and opts.gemm16 or nil
  if opts and opts.host then s.ping = { s.ping1, s.ping2 } end
  if opts and opts.recompute then
    s.recompute = {}
    for _, b in ipairs(saved(cfg)) do s.recompute[b[1]] = s["rc." .. b[1]] end
  end
  s.free = function() free_slab(s) end
  return s
end

---------------------------------------------------------------------------
-- What a unit's weight-gradient pass (W) needs from its input-gradient pass
-- (I) when the backward is split: the gradients at each weight's output.
--   block  dy, dresid2, dln1, dln2 (N,C); dqkv (N,3C); the GELU (SwiGLU)
--          backward's output: dfch (N,ffn_in), or with gemm16 dfch16
--   head   dlnf (N,C)            embed  dy (N,C)
-- (with gemm16 all bf16)
local function wgrad_plan(cfg, B, Tlen, kind, gemm16)
  local C, W = cfg.C, widths(cfg)
  local P = planner()
  if kind == "block" then
    P.add("dy", { B, Tlen, C }, gemm16); P.add("dresid2", { B, Tlen, C }, gemm16)
    P.add("dln1", { B, Tlen, C }, gemm16); P.add("dln2", { B, Tlen, C }, gemm16)
    P.add("dqkv", { B, Tlen, W.qkv }, gemm16)
    -- with gemm16 W reads dfch16; the I pass's f32 product is the stage
    -- scratch's (not kept per unit: ~200 MB a block at GPT-2 B=16 T=1024)
    if not gemm16 then P.add("dfch", { B, Tlen, W.ffn_in }) end
    if gemm16 then P.add("dfch16", { B, Tlen, W.ffn_in }, true) end
  elseif kind == "head" then
    P.add("dlnf", { B, Tlen, C }, gemm16)
  else
    P.add("dy", { B, Tlen, C }, gemm16)
  end
  return P
end

function M.wgrad(cfg, B, Tlen, tier, kind, gemm16)
  local s = wgrad_plan(cfg, B, Tlen, kind, gemm16).alloc(tier, "activations")
  s.free = function() free_slab(s) end
  return s
end

-- wgrad_bytes(cfg, B, T, kind, gemm16) -> the bytes M.wgrad allocates (the
-- planner's; no allocation).
function M.wgrad_bytes(cfg, B, Tlen, kind, gemm16)
  return wgrad_plan(cfg, B, Tlen, kind, gemm16).bytes()
end

return M
