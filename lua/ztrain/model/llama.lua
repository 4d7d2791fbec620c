-- ztrain.model.llama: the Llama family (Llama 3, Qwen 2.5, Mistral, SmolLM)
-- as a list of units over the runtime's kernels, GPT-2's unit model
-- (model/gpt2.lua: flat buffers, views, strategies' seams) with Llama's
-- blocks.
--
-- Units: "embed" (embed_tokens), "block.0" .. "block.L-1", "head" (norm,
-- and lm_head unless the embeddings are tied: then the head reads embed's
-- wte as GPT-2's does). Parameter names are Hugging Face's
-- (model.layers.N.self_attn.q_proj.weight, ...), so a checkpoint maps one
-- to one. q, k and v (and their biases, Qwen 2.5) sit next to each other
-- in the unit's buffer: one GEMM reads them as a fused (NH+2NKV)hs x C view;
-- gate and up likewise, one GEMM writing rows [gate | up] for the SwiGLU.
--
-- A block, for x (N,C), N = B*T, hs = C/NH:
--   ln1 = rmsnorm(x); qkv = ln1 Wqkv^T (+ b); q, k turned by RoPE (in place,
--   position t of each sequence); atty = attention(q, k, v: NKV kv heads,
--   sliding window W); resid2 = x + atty Wo^T; ln2 = rmsnorm(resid2);
--   gu = ln2 [Wgate; Wup]^T; act = silu(gate) * up; out = resid2 + act Wdown^T.
-- transformers' LlamaDecoderLayer in the same order, fp32.
local T = require "ztrain.core.tensor"
local ops = require "ztrain.core.ops"
local gpt2 = require "ztrain.model.gpt2"

local M = {}

-- name -> shape (a random initialisation's; checkpoints bring their own,
-- model/hf.lua). F: the MLP's width; NKV: key/value heads; tied: lm_head
-- is embed_tokens; theta: rope_theta; scaling: Llama 3's rope_scaling;
-- window: Mistral's sliding_window (0: none); qkv_bias: Qwen 2.5's.
M.sizes = {
  ["llama-tiny"]   = { L = 2, C = 64, NH = 4, NKV = 2, F = 176, maxT = 128, V = 256, eps = 1e-5,
                       theta = 500000, tied = false,
                       scaling = { factor = 8, low_freq_factor = 1, high_freq_factor = 4,
                                   original_max_position_embeddings = 64 } },
  ["qwen-tiny"]    = { L = 2, C = 64, NH = 4, NKV = 2, F = 176, maxT = 128, V = 256, eps = 1e-6,
                       theta = 1000000, tied = true, qkv_bias = true },
  ["mistral-tiny"] = { L = 2, C = 64, NH = 4, NKV = 2, F = 176, maxT = 128, V = 256, eps = 1e-5,
                       theta = 10000, tied = false, window = 16 },
  ["smollm-135m"]  = { L = 30, C = 576, NH = 9, NKV = 3, F = 1536, maxT = 2048, V = 49152,
                       eps = 1e-5, theta = 10000, tied = true },
  ["llama-3.2-1b"] = { L = 16, C = 2048, NH = 32, NKV = 8, F = 8192, maxT = 131072, V = 128256,
                       eps = 1e-5, theta = 500000, tied = true,
                       scaling = { factor = 32, low_freq_factor = 1, high_freq_factor = 4,
                                   original_max_position_embeddings = 8192 } },
  ["llama-3.2-3b"] = { L = 28, C = 3072, NH = 24, NKV = 8, F = 8192, maxT = 131072, V = 128256,
                       eps = 1e-5, theta = 500000, tied = true,
                       scaling = { factor = 32, low_freq_factor = 1, high_freq_factor = 4,
                                   original_max_position_embeddings = 8192 } },
  ["llama-3.1-8b"] = { L = 32, C = 4096, NH = 32, NKV = 8, F = 14336, maxT = 131072, V = 128256,
                       eps = 1e-5, theta = 500000, tied = false,
                       scaling = { factor = 8, low_freq_factor = 1, high_freq_factor = 4,
                                   original_max_position_embeddings = 8192 } },
  ["qwen2.5-0.5b"] = { L = 24, C = 896, NH = 14, NKV = 2, F = 4864, maxT = 32768, V = 151936,
                       eps = 1e-6, theta = 1000000, tied = true, qkv_bias = true },
  ["mistral-7b"]   = { L = 32, C = 4096, NH = 32, NKV = 8, F = 14336, maxT = 32768, V = 32000,
                       eps = 1e-5, theta = 10000, tied = false, window = 4096 },
}

local function sorted_names()
  local n = {}
  for k in pairs(M.sizes) do n[#n + 1] = k end
  table.sort(n)
  return table.concat(n, ", ")
end

function M.is_size(name) return M.sizes[name] ~= nil end

-- custom(spec, what) -> a config of any Llama shape (a checkpoint's): the
-- whole numbers >= 1, C a multiple of NH, NH of NKV, the head size even.
-- Raises naming `what` (e.g. the config.json the numbers came from).
function M.custom(spec, what)
  what = what or "model config"
  local cfg = { family = "llama", name = spec.name or "llama-custom" }
  gpt2.whole_numbers(spec, { "L", "C", "NH", "NKV", "F", "maxT", "V" }, what, cfg)
  if cfg.C % cfg.NH ~= 0 or (cfg.C / cfg.NH) % 2 ~= 0 then
    error(("%s: %d channels do not divide into %d heads of an even size"):format(what, cfg.C, cfg.NH), 0)
  end
  if cfg.NH % cfg.NKV ~= 0 then
    error(("%s: %d query heads do not divide into %d key/value heads"):format(what, cfg.NH, cfg.NKV), 0)
  end
  cfg.eps, cfg.theta = spec.eps or 1e-5, spec.theta or 10000
  cfg.tied, cfg.qkv_bias, cfg.window = spec.tied or false, spec.qkv_bias or false, spec.window or 0
  cfg.scaling = spec.scaling
  return cfg
end

-- config(size, {vocab_size=}) -> a named size's config
function M.config(size, over)
  local s = M.sizes[size]
  if not s then
    error(("unknown model size %q (known Llama-family sizes: %s)"):format(tostring(size), sorted_names()), 0)
  end
  local spec = {}
  for k, v in pairs(s) do spec[k] = v end
  spec.name, spec.V = size, over and over.vocab_size or s.V
  return M.custom(spec, size)
end

-- Parameter layout: GPT-2's { name, shape, decay, init } (init "w":
-- normal(0, 0.02), transformers' initializer_range; "one", "zero").
local function unit_layout(cfg)
  local C, V, F, hs = cfg.C, cfg.V, cfg.F, cfg.C / cfg.NH
  local q, kv = cfg.NH * hs, cfg.NKV * hs
  local units = { { name = "embed", kind = "embed", tensors = {
    { "model.embed_tokens.weight", { V, C }, true, "w" } } } }
  for l = 0, cfg.L - 1 do
    local p = "model.layers." .. l .. "."
    local a = p .. "self_attn."
    local t = { { p .. "input_layernorm.weight", { C }, false, "one" },
                { a .. "q_proj.weight", { q, C }, true, "w" },
                { a .. "k_proj.weight", { kv, C }, true, "w" },
                { a .. "v_proj.weight", { kv, C }, true, "w" } }
    if cfg.qkv_bias then
      t[#t + 1] = { a .. "q_proj.bias", { q }, false, "zero" }
      t[#t + 1] = { a .. "k_proj.bias", { kv }, false, "zero" }
      t[#t + 1] = { a .. "v_proj.bias", { kv }, false, "zero" }
    end
    for _, e in ipairs({ { a .. "o_proj.weight", { C, q }, true, "w" },
                         { p .. "post_attention_layernorm.weight", { C }, false, "one" },
                         { p .. "mlp.gate_proj.weight", { F, C }, true, "w" },
                         { p .. "mlp.up_proj.weight", { F, C }, true, "w" },
                         { p .. "mlp.down_proj.weight", { C, F }, true, "w" } }) do
      t[#t + 1] = e
    end
    local fused = { { "qkv_w", a .. "q_proj.weight", { q + 2 * kv, C } },
                    { "gu_w", p .. "mlp.gate_proj.weight", { 2 * F, C } } }
    if cfg.qkv_bias then fused[#fused + 1] = { "qkv_b", a .. "q_proj.bias", { q + 2 * kv } } end
    units[#units + 1] = { name = "block." .. l, kind = "block", layer = l, tensors = t, fused = fused }
  end
  local head = { { "model.norm.weight", { C }, false, "one" } }
  if not cfg.tied then head[2] = { "lm_head.weight", { V, C }, true, "w" } end
  units[#units + 1] = { name = "head", kind = "head", tensors = head }
  return units
end

local Model = setmetatable({}, { __index = gpt2.Model })
Model.__index = Model
M.Model = Model

-- new(cfg, opts) -> model (gpt2.new's options); cfg a config or a size's name
function M.new(cfg, opts)
  if type(cfg) == "string" then cfg = M.config(cfg) end
  return gpt2.build(cfg, unit_layout(cfg), opts, Model)
end

-- the RoPE table (T, hs/2) for sequences of T, one per model object, on its
-- tier; made at its first use (a layout-only model, the planner's, makes none)
-- and again for a longer T
function Model:rope_table(Tlen)
  if self.rope_cos and self.rope_len >= Tlen then return self.rope_cos, self.rope_sin end
  self:on_free()
  local h2 = self.cfg.C / self.cfg.NH / 2
  self.rope_cos = T.new({ Tlen, h2 }, { tier = self.tier, category = "activations" })
  self.rope_sin = T.new({ Tlen, h2 }, { tier = self.tier, category = "activations" })
  self.rope_len = Tlen
  ops.rope_table(self.rope_cos, self.rope_sin, self.cfg.theta, self.cfg.scaling)
  return self.rope_cos, self.rope_sin
end

function Model:on_free()
  if self.rope_cos then self.rope_cos:free(); self.rope_sin:free() end
  self.rope_cos, self.rope_sin = nil, nil
end

-- (init: gpt2.Model:init_unit's "w" normal(0, 0.02) and "one" are transformers'
-- initializer_range and norm weights; the layout uses no "proj")

---------------------------------------------------------------------------
-- Units (the contract of model/gpt2.lua's: forward(u, a, x) -> y,
-- backward(u, a) -> dx, backward_input / backward_weight split).

local MM = gpt2.fp32_matmuls
local function mm(a) return a.mm or MM end
-- bf16 GEMMs: the residual stream and its gradient d are bf16, as
-- GPT-2's (model/gpt2.lua): the GEMMs read d as it is

local function block_names(u)
  local p = "model.layers." .. u.layer .. "."
  return p .. "input_layernorm.weight", p .. "self_attn.o_proj.weight",
         p .. "post_attention_layernorm.weight", p .. "mlp.down_proj.weight"
end

local function rope(self, a, x, back)
  local cfg = a.cfg
  local f = back and ops.rope_backward or ops.rope_forward
  local cos, sin = self:rope_table(a.T)
  f(x, 0, cfg.NH + cfg.NKV, cfg.C / cfg.NH, a.T, 0, cos, sin)
end

local function block_forward(self, u, a, x)
  local P, S, sc, cfg = u.p, a.unit[u.index], a.scratch, a.cfg
  local n1, o, n2, down = block_names(u)
  ops.rmsnorm_forward(S.ln1, S.ln1_rstd, x, P[n1], cfg.eps)
  mm(a).forward(S.qkv, S.ln1, P.qkv_w, P.qkv_b)
  rope(self, a, S.qkv)
  ops.attention_forward(S.atty, S.lse, S.qkv, cfg.NH, cfg.NKV, cfg.window)
  mm(a).forward(sc.proj, S.atty, P[o], nil)
  ops.add3(S.resid2, x, sc.proj)
  ops.rmsnorm_forward(S.ln2, S.ln2_rstd, S.resid2, P[n2], cfg.eps)
  mm(a).forward(S.gu, S.ln2, P.gu_w, nil)
  ops.swiglu_forward(S.act, S.gu)
  mm(a).forward(sc.proj, S.act, P[down], nil)
  ops.add3(S.out, S.resid2, sc.proj)
  return S.out
end

-- d = a.grad: d(output) on entry, d(input) on exit (the norms' backward
-- accumulates into it: the residual's own path). bf16 GEMMs: dgu is
-- written bf16 (sc.dfch16) for the gate/up GEMM, dqkv bf16 by the
-- attention and turned back in bf16.
local function block_backward(self, u, a)
  local P, G, S, sc, x, cfg = u.p, u.g, a.unit[u.index], a.scratch, a.x[u.index], a.cfg
  local n1, o, n2, down = block_names(u)
  local d = a.grad
  mm(a).backward(sc.dact, G[down], nil, d, S.act, P[down])
  local dgu = sc.dfch16 or sc.dfch
  ops.swiglu_backward(dgu, sc.dact, S.gu)
  mm(a).backward(sc.dln, G.gu_w, nil, dgu, S.ln2, P.gu_w)
  ops.rmsnorm_backward(d, G[n2], sc.dln, S.resid2, P[n2], S.ln2_rstd)
  mm(a).backward(sc.datty, G[o], nil, d, S.atty, P[o])
  ops.attention_backward(sc.dqkv, sc.datty, S.qkv, S.atty, S.lse, cfg.NH, cfg.NKV, cfg.window)
  rope(self, a, sc.dqkv, true)
  mm(a).backward(sc.dln, G.qkv_w, G.qkv_b, sc.dqkv, S.ln1, P.qkv_w)
  ops.rmsnorm_backward(d, G[n1], sc.dln, x, P[n1], S.ln1_rstd)
  return d
end

-- the split backward: I keeps in w the gradients at each weight's output
local function block_backward_input(self, u, a, w)
  local P, S, sc, x, cfg = u.p, a.unit[u.index], a.scratch, a.x[u.index], a.cfg
  local n1, o, n2, down = block_names(u)
  local d = a.grad
  ops.copy(w.dy, d)
  mm(a).backward(sc.dact, nil, nil, d, S.act, P[down])
  local dgu = w.dfch16 or w.dfch
  ops.swiglu_backward(dgu, sc.dact, S.gu)
  mm(a).backward(w.dln2, nil, nil, dgu, S.ln2, P.gu_w)
  ops.rmsnorm_backward(d, nil, w.dln2, S.resid2, P[n2], S.ln2_rstd)
  ops.copy(w.dresid2, d)
  mm(a).backward(sc.datty, nil, nil, d, S.atty, P[o])
  ops.attention_backward(w.dqkv, sc.datty, S.qkv, S.atty, S.lse, cfg.NH, cfg.NKV, cfg.window)
  rope(self, a, w.dqkv, true)
  mm(a).backward(w.dln1, nil, nil, w.dqkv, S.ln1, P.qkv_w)
  ops.rmsnorm_backward(d, nil, w.dln1, x, P[n1], S.ln1_rstd)
  return d
end

-- W: never reads parameters (a gradient view stands in for each weight's shape)
local function block_backward_weight(u, a, w)
  local G, S, x = u.g, a.unit[u.index], a.x[u.index]
  local n1, o, n2, down = block_names(u)
  mm(a).backward(nil, G[down], nil, w.dy, S.act, G[down])
  mm(a).backward(nil, G.gu_w, nil, w.dfch16 or w.dfch, S.ln2, G.gu_w)
  ops.rmsnorm_backward(nil, G[n2], w.dln2, S.resid2, G[n2], S.ln2_rstd)
  mm(a).backward(nil, G[o], nil, w.dresid2, S.atty, G[o])
  mm(a).backward(nil, G.qkv_w, G.qkv_b, w.dqkv, S.ln1, G.qkv_w)
  ops.rmsnorm_backward(nil, G[n1], w.dln1, x, G[n1], S.ln1_rstd)
end

-- the LM head's weight: lm_head's, or embed's (tied); its gradient's view
-- (asked for in backward only: sharded strategies give a unit its gradient
-- buffer just before its weight pass)
function Model:lm_head(u)
  if self.cfg.tied then return self.embed.p["model.embed_tokens.weight"] end
  return u.p["lm_head.weight"]
end
function Model:lm_head_grad(u)
  if self.cfg.tied then return self.embed.g["model.embed_tokens.weight"] end
  return u.g["lm_head.weight"]
end

local function head_forward(self, u, a, x)
  local S = a.unit[u.index]
  ops.rmsnorm_forward(S.lnf, S.lnf_rstd, x, u.p["model.norm.weight"], a.cfg.eps)
  mm(a).forward(S.logits, S.lnf, self:lm_head(u), nil)     -- (N, Vp): rows padded
  ops.crossentropy(S.out, a.dscale and S.logits or nil, S.logits, a.targets, a.dscale or 0, a.cfg.V)
  return S.out
end

-- writes the LM head's gradient (tied: embed's, which the embedding's
-- backward then adds to, as GPT-2's)
local function head_backward(self, u, a)
  local S, sc = a.unit[u.index], a.scratch
  mm(a).backward(sc.dln, self:lm_head_grad(u), nil, S.logits, S.lnf, self:lm_head(u))
  ops.fill(a.grad, 0)
  ops.rmsnorm_backward(a.grad, u.g["model.norm.weight"], sc.dln, a.x[u.index], u.p["model.norm.weight"],
                       S.lnf_rstd)
  return a.grad
end

local function head_backward_input(self, u, a, w)
  local S = a.unit[u.index]
  mm(a).backward(w.dlnf, nil, nil, S.logits, S.lnf, self:lm_head(u))
  ops.fill(a.grad, 0)
  ops.rmsnorm_backward(a.grad, nil, w.dlnf, a.x[u.index], u.p["model.norm.weight"], S.lnf_rstd)
  return a.grad
end

local function head_backward_weight(self, u, a, w)
  local S = a.unit[u.index]
  local GW = self:lm_head_grad(u)
  mm(a).backward(nil, GW, nil, S.logits, S.lnf, GW)
  ops.rmsnorm_backward(nil, u.g["model.norm.weight"], w.dlnf, a.x[u.index], u.g["model.norm.weight"],
                       S.lnf_rstd)
end

-- bf16 GEMMs: the table read as stored, as GPT-2's (model/gpt2.lua)
local function embed_forward(u, a)
  local out = a.unit[u.index].out
  local w, s = u.p["model.embed_tokens.weight"], a.mm and a.mm.stored
  ops.encoder_forward(out, a.tokens, s and s(w) or w, nil)
  return out
end

-- untied: the embedding's gradient starts at 0 (tied: the head wrote it first)
local function embed_backward_weight(self, u, a)
  local g = u.g["model.embed_tokens.weight"]
  if not self.cfg.tied then ops.fill(g, 0) end
  ops.encoder_backward(g, nil, a.grad, a.tokens)
end

function Model:forward(u, a, x)
  a.x[u.index] = x
  if u.kind == "block" then return block_forward(self, u, a, x)
  elseif u.kind == "embed" then return embed_forward(u, a)
  else return head_forward(self, u, a, x) end
end

function Model:backward(u, a)
  if u.kind == "block" then return block_backward(self, u, a)
  elseif u.kind == "embed" then embed_backward_weight(self, u, a); return nil
  else return head_backward(self, u, a) end
end

function Model:backward_input(u, a, w)
  if u.kind == "block" then return block_backward_input(self, u, a, w)
  elseif u.kind == "embed" then return nil
  else return head_backward_input(self, u, a, w) end
end

function Model:backward_weight(u, a, w)
  if u.kind == "block" then block_backward_weight(u, a, w)
  elseif u.kind == "embed" then embed_backward_weight(self, u, a)
  else head_backward_weight(self, u, a, w) end
end

function Model:tied() return self.cfg.tied end
function Model:embedding_grad() return self.embed.g["model.embed_tokens.weight"] end

-- Whether a unit's backward reads its parameters: the embedding's adds
-- dout's rows into its gradient and reads none (driver/stage.lua); and
-- whether its ops read the stored bf16 ones with bf16 GEMMs: all do (the
-- RMS norms' weights, the GEMMs' weights and Qwen's biases, the
-- embedding's table, each widened exactly as read: precision.lua)
function Model:backward_reads_params(u) return u.kind ~= "embed" end
function Model:reads_stored() return true end
-- and whether its backward's ops write its stored bf16 gradients with bf16
-- GEMMs: all do (the GEMMs' weight and bias gradients, the norms', the
-- embedding's table added to as stored, each rounded once), so no unit's
-- gradients go through fp32 work buffers and casts (precision.lua)
function Model:writes_stored() return true end

-- the units a unit reads parameters from (the head: embed too when tied,
-- read only as its GEMMs' weight, as GPT-2's)
function Model:param_units(u)
  if u.kind == "head" and self.cfg.tied then return { u, self.embed } end
  return { u }
end

-- Generation (model/generate.lua's session s): the n tokens in w.tokens at
-- positions [s.pos, s.pos + n) through the blocks as the training forward,
-- attention over the session's KV cache (1, NKV, cap, hs); the last row's
-- logits into s.logits. w: generate's work rows (fch = gu, fch_gelu = act).
function Model:decode_run(s, w, n)
  local cfg = self.cfg
  local cos, sin = self:rope_table(s.cap)
  ops.encoder_forward(w.x, w.tokens, self.embed.p["model.embed_tokens.weight"], nil)
  local x, y = w.x, w.y
  for l = 1, cfg.L do
    local u = self.units[1 + l]
    local P = u.p
    local n1, o, n2, down = block_names(u)
    ops.rmsnorm_forward(w.ln, w.rstd, x, P[n1], cfg.eps)
    ops.matmul_forward(w.qkv, w.ln, P.qkv_w, P.qkv_b)
    ops.rope_forward(w.qkv, 0, cfg.NH + cfg.NKV, cfg.C / cfg.NH, n, s.pos, cos, sin)
    ops.attention_decode(w.atty, s.kc[l], s.vc[l], w.qkv, cfg.NH, s.pos, cfg.NKV, cfg.window)
    ops.matmul_forward(w.proj, w.atty, P[o], nil)
    ops.add3(w.resid2, x, w.proj)
    ops.rmsnorm_forward(w.ln, w.rstd, w.resid2, P[n2], cfg.eps)
    ops.matmul_forward(w.fch, w.ln, P.gu_w, nil)
    ops.swiglu_forward(w.fch_gelu, w.fch)
    ops.matmul_forward(w.proj, w.fch_gelu, P[down], nil)
    ops.add3(y, w.resid2, w.proj)
    x, y = y, x
  end
  ops.rmsnorm_forward(s.lnf, s.lnf_rstd, w.last[x], self.head.p["model.norm.weight"], cfg.eps)
  ops.matmul_forward(s.logits, s.lnf, self:lm_head(self.head), nil)
end

return M
