-- ztrain.model.gpt2: GPT-2 as a list of units over the runtime's kernels.
--
-- Units: "embed" (wte, wpe), "block.0" .. "block.L-1", "head" (ln_f; the LM
-- head is tied to embed's wte). Each unit keeps its parameters in one flat
-- buffer and its gradients in another, with named tensors as views into them
-- (the layout sharding slices). A unit's forward and backward take explicit
-- inputs and outputs over an activation set per (stage, micro-batch) (see
-- activations.lua) and use the unit's current views, so a strategy may swap
-- a unit's flat buffers (zero3 gathers) between calls.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local Acts = require "ztrain.model.activations"

local M = {}

-- name -> { L, C, NH, maxT, V } (V defaults to GPT-2's 50257; a tokenizer may override).
M.sizes = {
  ["gpt2-tiny"]   = { L = 2,  C = 64,   NH = 4,  maxT = 128 },
  -- gpt2-tiny's widths, 8 units: enough for 8 pipeline stages (p=4, 2 chunks) in specs
  ["gpt2-tiny-deep"] = { L = 6, C = 64, NH = 4,  maxT = 128 },
  ["gpt2-mini"]   = { L = 4,  C = 128,  NH = 4,  maxT = 256 },
  ["gpt2"]        = { L = 12, C = 768,  NH = 12, maxT = 1024 },
  ["gpt2-medium"] = { L = 24, C = 1024, NH = 16, maxT = 1024 },
  ["gpt2-large"]  = { L = 36, C = 1280, NH = 20, maxT = 1024 },
  ["gpt2-xl"]     = { L = 48, C = 1600, NH = 25, maxT = 1024 },
}

-- Flat buffers are padded to a multiple of this many elements, so views stay
-- 64-byte aligned and shards can be cut on fixed-sum block boundaries.
M.PAD = 16

local function sorted_names()
  local n = {}
  for k in pairs(M.sizes) do n[#n + 1] = k end
  table.sort(n)
  return table.concat(n, ", ")
end

-- config(size, {vocab_size=, seq_len=}) -> { name, L, C, NH, maxT, V }
function M.config(size, over)
  over = over or {}
  local s = M.sizes[size]
  if not s then
    error(("unknown model size %q (known: %s)"):format(tostring(size), sorted_names()), 0)
  end
  local cfg = { name = size, L = s.L, C = s.C, NH = s.NH, maxT = s.maxT,
                V = over.vocab_size or 50257 }
  return cfg
end

-- custom{ name=, L=, C=, NH=, maxT=, V= } -> a config of any shape (a
-- checkpoint's, model/hf.lua): each a whole number >= 1, C a multiple of NH.
-- Raises naming `what` (e.g. the file the numbers came from).
-- whole_numbers(spec, keys, what, cfg): spec[k] into cfg[k] for each key,
-- each a whole number >= 1 (raises naming `what` and the key)
function M.whole_numbers(spec, keys, what, cfg)
  for _, k in ipairs(keys) do
    local v = spec[k]
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) or v > 2 ^ 31 then
      error(("%s: %s must be a whole number >= 1, got %s"):format(what, k, tostring(v)), 0)
    end
    cfg[k] = v
  end
end

function M.custom(spec, what)
  what = what or "model config"
  local cfg = { name = spec.name or "gpt2-custom" }
  M.whole_numbers(spec, { "L", "C", "NH", "maxT", "V" }, what, cfg)
  if cfg.C % cfg.NH ~= 0 then
    error(("%s: %d channels do not divide into %d heads"):format(what, cfg.C, cfg.NH), 0)
  end
  return cfg
end

-- Parameter layout of each unit: list of { name, shape, decay, std }.
-- std: "w" = 0.02, "proj" = 0.02/sqrt(2L), "zero", "one".
local function unit_layout(cfg)
  local C, V = cfg.C, cfg.V
  local units = {}
  units[1] = { name = "embed", kind = "embed", tensors = {
    { "wte", { V, C }, true, "w" }, { "wpe", { cfg.maxT, C }, true, "w" } } }
  for l = 0, cfg.L - 1 do
    local p = "h." .. l .. "."
    units[#units + 1] = { name = "block." .. l, kind = "block", layer = l, tensors = {
      { p .. "ln_1.weight", { C }, false, "one" }, { p .. "ln_1.bias", { C }, false, "zero" },
      { p .. "attn.c_attn.weight", { 3 * C, C }, true, "w" },
      { p .. "attn.c_attn.bias", { 3 * C }, false, "zero" },
      { p .. "attn.c_proj.weight", { C, C }, true, "proj" },
      { p .. "attn.c_proj.bias", { C }, false, "zero" },
      { p .. "ln_2.weight", { C }, false, "one" }, { p .. "ln_2.bias", { C }, false, "zero" },
      { p .. "mlp.c_fc.weight", { 4 * C, C }, true, "w" },
      { p .. "mlp.c_fc.bias", { 4 * C }, false, "zero" },
      { p .. "mlp.c_proj.weight", { C, 4 * C }, true, "proj" },
      { p .. "mlp.c_proj.bias", { C }, false, "zero" } } }
  end
  units[#units + 1] = { name = "head", kind = "head", tensors = {
    { "ln_f.weight", { C }, false, "one" }, { "ln_f.bias", { C }, false, "zero" } } }
  return units
end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

local Model = {}
Model.__index = Model
M.Model = Model

-- new(cfg, {tier=, pad=, alloc=}) -> model. cfg: a config, or a size's
-- name ("gpt2-xl": config(name)). Each unit's flat buffers hold
-- u.padded elements: u.numel rounded up to a multiple of `pad` (default PAD;
-- sharded strategies ask for world_size * the norm block). With alloc=false
-- no buffer is allocated: the strategy places them (see materialize).
-- Interrupted (Ctrl-C at the REPL: each allocation polls) it frees the
-- buffers it made before it raises.
function M.new(cfg, opts)
  if type(cfg) == "string" then cfg = M.config(cfg) end
  return M.build(cfg, unit_layout(cfg), opts, Model)
end

-- build(cfg, layout, opts, mt) -> a model of class mt (Model or a family's
-- subclass, model/llama.lua) over the unit layout: new's body. A layout unit
-- may list fused views, { name, first tensor, shape }: one view spanning
-- consecutive tensors (Llama's q, k, v weights as one GEMM's).
function M.build(cfg, layout, opts, mt)
  opts = opts or {}
  local pad = opts.pad or M.PAD
  assert(pad % M.PAD == 0, "gpt2.new: pad must be a multiple of 16")
  local self = setmetatable({ cfg = cfg, units = {}, tier = opts.tier or "device", pad = pad }, mt)
  local nparams, stream = 0, 0
  for ui, lay in ipairs(layout) do
    local u = { name = lay.name, kind = lay.kind, layer = lay.layer, index = ui, tensors = {},
                fused = lay.fused }
    local off = 0
    for _, t in ipairs(lay.tensors) do
      local n = numel(t[2])
      u.tensors[#u.tensors + 1] = { name = t[1], shape = t[2], offset = off, numel = n,
                                    decay = t[3], init = t[4], stream = stream }
      off = off + n
      nparams = nparams + n
      stream = stream + 1
    end
    u.numel = off
    u.padded = math.ceil(off / pad) * pad
    self.units[ui] = u
  end
  self.nparams = nparams
  self.embed, self.head = self.units[1], self.units[#self.units]
  if opts.alloc ~= false then
    local ok, err = pcall(function()
      for _, u in ipairs(self.units) do
        self:set_params(u, T.new({ u.padded }, { tier = self.tier, category = "params" }))
        self:set_grads(u, T.new({ u.padded }, { tier = self.tier, category = "grads" }))
      end
    end)
    if not ok then
      self:free()
      error(err, 0)
    end
  end
  if self.on_build then self:on_build() end
  return self
end

-- Allocate full parameter (and unless grads=false, gradient) buffers for
-- every unit (or opts.units) and initialise them from seed: what replicated
-- strategies do.
function Model:materialize(seed, opts)
  opts = opts or {}
  for _, u in ipairs(opts.units or self.units) do
    if not u.params then
      self:set_params(u, T.new({ u.padded }, { tier = self.tier, category = "params" }))
      self:init_unit(u, seed)
    end
    if opts.grads ~= false and not u.grads then
      self:set_grads(u, T.new({ u.padded }, { tier = self.tier, category = "grads" }))
    end
  end
end

local function free_views(views)
  if views then for _, v in pairs(views) do v:free() end end
end

-- views of flat: one per tensor, and the unit's fused views
local function views_of(u, flat)
  local v, at = {}, {}
  for _, t in ipairs(u.tensors) do
    v[t.name] = flat:view(t.offset, t.shape)
    at[t.name] = t.offset
  end
  for _, f in ipairs(u.fused or {}) do v[f[1]] = flat:view(at[f[2]], f[3]) end
  return v
end

-- Point unit u's parameter views at flat buffer `flat` (a tensor of >= u.numel
-- elements). The unit takes over the buffer; the previous one is returned.
function Model:set_params(u, flat)
  free_views(u.p)
  local old = u.params
  u.params, u.p = flat, nil
  if flat then u.p = views_of(u, flat) end
  return old
end

function Model:set_grads(u, flat)
  free_views(u.g)
  local old = u.grads
  u.grads, u.g = flat, nil
  if flat then u.g = views_of(u, flat) end
  return old
end

-- GPT-2 initialisation, deterministic in seed: normal(0, 0.02) weights,
-- residual projections 0.02/sqrt(2L), zero biases, unit LayerNorm scales.
-- Each tensor draws from its own stream (its canonical index), so a unit
-- can be initialised alone (sharded strategies do one unit at a time).
-- With model.source set (an object with :fill_unit(model, u), e.g. a
-- checkpoint from model/hf.lua) the unit's values come from it instead: every
-- strategy initialises through here, so each loads the checkpoint alike.
function Model:init_unit(u, seed)
  if self.source then return self.source:fill_unit(self, u) end
  local proj_std = 0.02 / math.sqrt(2 * self.cfg.L)
  for _, t in ipairs(u.tensors) do
    local v = u.p[t.name]
    if t.init == "w" then ops.randn(v, seed, t.stream, 0, 0.02)
    elseif t.init == "proj" then ops.randn(v, seed, t.stream, 0, proj_std)
    elseif t.init == "one" then ops.fill(v, 1)
    else ops.fill(v, 0) end
  end
end

function Model:init(seed)
  for _, u in ipairs(self.units) do self:init_unit(u, seed) end
end

-- Iterate canonical (unit, tensor spec) pairs.
function Model:each_tensor()
  return coroutine.wrap(function()
    for _, u in ipairs(self.units) do
      for _, t in ipairs(u.tensors) do coroutine.yield(u, t) end
    end
  end)
end

function Model:free()
  for _, u in ipairs(self.units) do
    local p = self:set_params(u, nil)
    local g = self:set_grads(u, nil)
    if p then p:free() end
    if g then g:free() end
  end
  if self.on_free then self:on_free() end
end

-- An activation set for micro-batches of B x T (T <= maxT) over `units`
-- (default: all of them): one per (stage, micro-batch) in flight.
-- A stage's sets share its scratch; a set made without one owns its own.
function Model:activations(B, Tlen, units, scratch)
  if Tlen > self.cfg.maxT then
    error(("sequence length %d exceeds %s's context of %d; lower data.seq_len")
          :format(Tlen, self.cfg.name, self.cfg.maxT), 0)
  end
  return Acts.new(self.cfg, B, Tlen, self.tier, units or self.units, scratch,
                  { gemm16 = self.gemm16 })
end

-- Scratch shared by a stage's activation sets (activations.lua).
function Model:scratch(B, Tlen)
  return Acts.scratch(self.cfg, B, Tlen, self.tier, { gemm16 = self.gemm16 })
end

-- What a unit's W pass keeps from its I pass (split backward), or nil.
function Model:wgrad(u, B, Tlen)
  if u.kind == "embed" then return nil end
  return Acts.wgrad(self.cfg, B, Tlen, self.tier, u.kind, self.gemm16)
end

---------------------------------------------------------------------------
-- Units with explicit inputs and outputs. `a` is the activation set of the
-- micro-batch (with a.scratch the stage's scratch), x the unit's input:
--   forward(u, a, x) -> y     embed: x = a.tokens; head: y = per-position
--                             losses (and dlogits in place when a.dscale is set)
--   backward(u, a) -> dx      fused I + W; a.grad holds dy on entry, dx on exit
--   backward_input(u, a, w) -> dx   I only; keeps in w what W needs
--   backward_weight(u, a, w)        W only: writes the unit's gradients
-- backward(u, a) and backward_input + backward_weight give the same bits:
-- the same kernel calls, with the input and weight halves issued apart.
-- The W pass never reads parameters (a strategy may release them after I):
-- the kernels read a weight only for the input gradient, so each weight's
-- gradient view stands in for the weight's shape.
-- Gradients are WRITTEN (beta = 0), except embed's wte, which the head's
-- backward writes first and the embedding's adds to (one fixed order).

-- The matmuls of a pass: the fp32 kernels, or what the activation set
-- carries (a.mm, set by the stage runner: precision.lua's bf16 GEMMs).
local MM = { forward = ops.matmul_forward, backward = ops.matmul_backward }
M.fp32_matmuls = MM   -- the seam ztrain.record.profile times them through (indexed per call)
local function mm(a) return a.mm or MM end

-- The MLP's first GEMM and its GELU, and backward the second GEMM's input
-- gradient and the GELU's: one op where the matmuls have it (the bf16
-- ones: a GPU fuses the GELU into the GEMM's epilogue), else the two
local function fc_gelu(a, out, inp, w, b, pre)
  local m = mm(a)
  if m.forward_gelu then return m.forward_gelu(out, inp, w, b, pre) end
  m.forward(pre, inp, w, b)
  ops.gelu_forward(out, pre)
end
-- dfch (the GELU's input gradient, bf16 with bf16 GEMMs) from d; dfch32
-- the f32 product (scratch); dw, db nil in the split backward's I pass
local function proj_dgelu(a, dfch, dfch32, dw, db, d, inp, w, pre)
  local m = mm(a)
  if m.backward_dgelu then return m.backward_dgelu(dfch, dw, db, d, inp, w, pre, dfch32) end
  m.backward(dfch32, dw, db, d, inp, w)
  ops.gelu_backward(dfch, pre, dfch32)
end

local function block_forward(u, a, x)
  local P, S, sc = u.p, a.unit[u.index], a.scratch
  local pre = "h." .. u.layer .. "."
  ops.layernorm_forward(S.ln1, S.ln1_mean, S.ln1_rstd, x, P[pre .. "ln_1.weight"], P[pre .. "ln_1.bias"])
  mm(a).forward(S.qkv, S.ln1, P[pre .. "attn.c_attn.weight"], P[pre .. "attn.c_attn.bias"])
  ops.attention_forward(S.atty, S.lse, S.qkv, a.cfg.NH)
  mm(a).forward(sc.proj, S.atty, P[pre .. "attn.c_proj.weight"], P[pre .. "attn.c_proj.bias"])
  -- resid2 = x + proj and ln2 = layernorm(resid2), one pass
  ops.layernorm_residual_forward(S.resid2, S.ln2, S.ln2_mean, S.ln2_rstd, x, sc.proj,
                                 P[pre .. "ln_2.weight"], P[pre .. "ln_2.bias"])
  fc_gelu(a, S.fch_gelu, S.ln2, P[pre .. "mlp.c_fc.weight"], P[pre .. "mlp.c_fc.bias"], S.fch)
  mm(a).forward(sc.proj, S.fch_gelu, P[pre .. "mlp.c_proj.weight"], P[pre .. "mlp.c_proj.bias"])
  ops.add3(S.out, S.resid2, sc.proj)
  return S.out
end

-- d = a.grad: d(output residual) on entry, d(input residual) on exit. With
-- bf16 GEMMs the stream (x, resid2, out) and d are bf16 (activations.lua):
-- norms add their gradient into d rounding once; GEMMs read d as it is.
local function block_backward(u, a)
  local P, G, S, sc, x = u.p, u.g, a.unit[u.index], a.scratch, a.x[u.index]
  local pre, d = "h." .. u.layer .. ".", a.grad
  local dfch = sc.dfch16 or sc.dfch     -- bf16 GEMMs: written bf16 for the GEMM
  proj_dgelu(a, dfch, sc.dfch, G[pre .. "mlp.c_proj.weight"], G[pre .. "mlp.c_proj.bias"], d,
             S.fch_gelu, P[pre .. "mlp.c_proj.weight"], S.fch)
  mm(a).backward(sc.dln, G[pre .. "mlp.c_fc.weight"], G[pre .. "mlp.c_fc.bias"], dfch,
                      S.ln2, P[pre .. "mlp.c_fc.weight"])
  ops.layernorm_backward(d, G[pre .. "ln_2.weight"], G[pre .. "ln_2.bias"], sc.dln, S.resid2,
                         P[pre .. "ln_2.weight"], S.ln2_mean, S.ln2_rstd)
  mm(a).backward(sc.datty, G[pre .. "attn.c_proj.weight"], G[pre .. "attn.c_proj.bias"], d,
                      S.atty, P[pre .. "attn.c_proj.weight"])
  ops.attention_backward(sc.dqkv, sc.datty, S.qkv, S.atty, S.lse, a.cfg.NH)
  mm(a).backward(sc.dln, G[pre .. "attn.c_attn.weight"], G[pre .. "attn.c_attn.bias"], sc.dqkv,
                      S.ln1, P[pre .. "attn.c_attn.weight"])
  ops.layernorm_backward(d, G[pre .. "ln_1.weight"], G[pre .. "ln_1.bias"], sc.dln, x,
                         P[pre .. "ln_1.weight"], S.ln1_mean, S.ln1_rstd)
  return d
end

local function block_backward_input(u, a, w)
  local P, S, sc, x = u.p, a.unit[u.index], a.scratch, a.x[u.index]
  local pre, d = "h." .. u.layer .. ".", a.grad
  ops.copy(w.dy, d)
  local dfch, d32 = w.dfch16 or w.dfch, w.dfch16 and sc.dfch or w.dfch
  proj_dgelu(a, dfch, d32, nil, nil, d, S.fch_gelu, P[pre .. "mlp.c_proj.weight"], S.fch)
  mm(a).backward(w.dln2, nil, nil, dfch, S.ln2, P[pre .. "mlp.c_fc.weight"])
  ops.layernorm_backward(d, nil, nil, w.dln2, S.resid2, P[pre .. "ln_2.weight"], S.ln2_mean, S.ln2_rstd)
  ops.copy(w.dresid2, d)
  mm(a).backward(sc.datty, nil, nil, d, S.atty, P[pre .. "attn.c_proj.weight"])
  ops.attention_backward(w.dqkv, sc.datty, S.qkv, S.atty, S.lse, a.cfg.NH)
  mm(a).backward(w.dln1, nil, nil, w.dqkv, S.ln1, P[pre .. "attn.c_attn.weight"])
  ops.layernorm_backward(d, nil, nil, w.dln1, x, P[pre .. "ln_1.weight"], S.ln1_mean, S.ln1_rstd)
  return d
end

local function block_backward_weight(u, a, w)
  local G, S, x = u.g, a.unit[u.index], a.x[u.index]
  local pre = "h." .. u.layer .. "."
  mm(a).backward(nil, G[pre .. "mlp.c_proj.weight"], G[pre .. "mlp.c_proj.bias"], w.dy,
                      S.fch_gelu, G[pre .. "mlp.c_proj.weight"])
  mm(a).backward(nil, G[pre .. "mlp.c_fc.weight"], G[pre .. "mlp.c_fc.bias"], w.dfch16 or w.dfch,
                      S.ln2, G[pre .. "mlp.c_fc.weight"])
  ops.layernorm_backward(nil, G[pre .. "ln_2.weight"], G[pre .. "ln_2.bias"], w.dln2, S.resid2,
                         G[pre .. "ln_2.weight"], S.ln2_mean, S.ln2_rstd)
  mm(a).backward(nil, G[pre .. "attn.c_proj.weight"], G[pre .. "attn.c_proj.bias"], w.dresid2,
                      S.atty, G[pre .. "attn.c_proj.weight"])
  mm(a).backward(nil, G[pre .. "attn.c_attn.weight"], G[pre .. "attn.c_attn.bias"], w.dqkv,
                      S.ln1, G[pre .. "attn.c_attn.weight"])
  ops.layernorm_backward(nil, G[pre .. "ln_1.weight"], G[pre .. "ln_1.bias"], w.dln1, x,
                         G[pre .. "ln_1.weight"], S.ln1_mean, S.ln1_rstd)
end

-- The head needs wte, which lives in the embed unit (tied weights).
local function head_forward(u, a, x, model)
  local P, S = u.p, a.unit[u.index]
  ops.layernorm_forward(S.lnf, S.lnf_mean, S.lnf_rstd, x, P["ln_f.weight"], P["ln_f.bias"])
  mm(a).forward(S.logits, S.lnf, model.embed.p.wte, nil)       -- (N, Vp): rows padded
  ops.crossentropy(S.out, a.dscale and S.logits or nil, S.logits, a.targets, a.dscale or 0, a.cfg.V)
  return S.out
end

-- Writes embed's wte gradient (the head's contribution comes first; the
-- embedding backward then adds its own: one fixed order).
local function head_backward(u, a, model)
  local P, G, S, sc = u.p, u.g, a.unit[u.index], a.scratch
  mm(a).backward(sc.dln, model.embed.g.wte, nil, S.logits, S.lnf, model.embed.p.wte)
  ops.fill(a.grad, 0)
  ops.layernorm_backward(a.grad, G["ln_f.weight"], G["ln_f.bias"], sc.dln, a.x[u.index],
                         P["ln_f.weight"], S.lnf_mean, S.lnf_rstd)
  return a.grad
end

local function head_backward_input(u, a, w, model)
  local P, S = u.p, a.unit[u.index]
  mm(a).backward(w.dlnf, nil, nil, S.logits, S.lnf, model.embed.p.wte)
  ops.fill(a.grad, 0)
  ops.layernorm_backward(a.grad, nil, nil, w.dlnf, a.x[u.index], P["ln_f.weight"], S.lnf_mean, S.lnf_rstd)
  return a.grad
end

local function head_backward_weight(u, a, w, model)
  local G, S = u.g, a.unit[u.index]
  mm(a).backward(nil, model.embed.g.wte, nil, S.logits, S.lnf, model.embed.g.wte)
  ops.layernorm_backward(nil, G["ln_f.weight"], G["ln_f.bias"], w.dlnf, a.x[u.index],
                         G["ln_f.weight"], S.lnf_mean, S.lnf_rstd)
end

-- With bf16 GEMMs (a.mm.stored) the tables are read as stored, bf16,
-- widened by the kernel (Model:reads_stored), the same bits.
local function embed_forward(u, a)
  local out = a.unit[u.index].out
  local s = a.mm and a.mm.stored
  ops.encoder_forward(out, a.tokens, s and s(u.p.wte) or u.p.wte, s and s(u.p.wpe) or u.p.wpe)
  return out
end

-- The embedding has no input gradient; its weight gradient reads a.grad,
-- which nothing overwrites after the embedding's turn in the micro-batch.
local function embed_backward_weight(u, a)
  if a.T < a.cfg.maxT then   -- rows [T, maxT) get no gradient from this batch
    local C, wpe = a.cfg.C, u.tensors[2]
    local tail = u.grads:view(wpe.offset + a.T * C, { (a.cfg.maxT - a.T) * C })
    ops.fill(tail, 0)
    tail:free()
  end
  ops.encoder_backward(u.g.wte, u.g.wpe, a.grad, a.tokens)
end

function Model:forward(u, a, x)
  a.x[u.index] = x
  if u.kind == "block" then return block_forward(u, a, x)
  elseif u.kind == "embed" then return embed_forward(u, a)
  else return head_forward(u, a, x, self) end
end

function Model:backward(u, a)
  if u.kind == "block" then return block_backward(u, a)
  elseif u.kind == "embed" then embed_backward_weight(u, a); return nil
  else return head_backward(u, a, self) end
end

function Model:backward_input(u, a, w)
  if u.kind == "block" then return block_backward_input(u, a, w)
  elseif u.kind == "embed" then return nil
  else return head_backward_input(u, a, w, self) end
end

function Model:backward_weight(u, a, w)
  if u.kind == "block" then block_backward_weight(u, a, w)
  elseif u.kind == "embed" then embed_backward_weight(u, a)
  else head_backward_weight(u, a, w, self) end
end

-- Forward over every unit of a whole-model set `a` (tokens and targets
-- filled by the caller); returns the mean loss. For the REPL, benchmarks and
-- specs: drivers run units one by one with the strategy's hooks.
function Model:forward_all(a)
  local x = a.tokens
  for _, u in ipairs(self.units) do x = self:forward(u, a, x) end
  return self:mean_loss(a)
end

-- Fused backward over every unit, in reverse (after forward_all with a.dscale set).
function Model:backward_all(a)
  for i = #self.units, 1, -1 do self:backward(self.units[i], a) end
end

-- GPT-2's head reads the embedding's wte (tied): pipelines exchange its
-- gradient between the first and the last stage (parallel/schedule/stages.lua)
function Model:tied() return true end
-- the embed unit's embedding gradient view (the tied head's part goes there)
function Model:embedding_grad() return self.embed.g.wte end

-- For the precision policy: whether a unit's backward reads its parameters
-- (the embedding's adds dout's rows: none; driver/stage.lua), and whether,
-- with bf16 GEMMs, its ops read the stored bf16 parameters (each widened
-- as read) and write the stored bf16 gradients (each rounded once, the
-- embedding's table added to as stored): all do, so nothing goes through
-- fp32 work buffers and casts (precision.lua)
function Model:backward_reads_params(u) return u.kind ~= "embed" end
function Model:reads_stored() return true end
function Model:writes_stored() return true end

-- The units a unit reads parameters from (itself, plus embed for the tied
-- head, which reads only wte, and only as its GEMMs' weight: with bf16
-- GEMMs the precision policy leaves the embedding's fp32 image uncast for it).
function Model:param_units(u)
  if u.kind == "head" then return { u, self.embed } end
  return { u }
end

-- Mean loss of a set's last forward (fp64 sum over positions / count).
function Model:mean_loss(a)
  return ops.sum(a:losses()) / (a.B * a.T)
end

return M
