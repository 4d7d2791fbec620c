-- ztrain.record.profile: time per (phase, op family) of training steps, for
-- tools/bench_ops.lua (`make bench-ops`) and spec/unit/profile_spec.lua.
--
--   local prof = profile.start(model, ctx)   -- ctx optional (its precision)
--   ... steps ...; prof:reset() after warm-up steps
--   local rows = prof:rows()                 -- { phase, family, s, calls, flops, bytes }
--   prof:stop()
--
-- How: start() swaps every function of the ztrain.ops table (the one table
-- all callers index at call time) for a wrapper that times the call with
-- zt_now and adds it to the current (phase, family); stop() puts the
-- originals back. Nothing runs when no profile is started (zero cost off),
-- and a wrapper calls the same kernel with the same arguments (the same
-- bits: spec/unit/profile_spec.lua checks the param_digest). On the CPU backend
-- an op runs on the calling thread (the compute stream), so the time
-- around the call is the op's time. On an asynchronous backend (CUDA)
-- start the profile with { sync = true }: each wrapper then waits for the
-- device (zt_device_sync) before and after its op, so the time is the op's
-- own, at the cost of the overlap a real step has (tools/bench_gpu.lua).
--
-- Phases: "forward" inside Model:forward, "backward" inside Model:backward,
-- :backward_input and :backward_weight, and the precision policy's casts
-- around them (enter/leave) count to the unit's phase; every other op of
-- a step (the strategy's step: grad norm, AdamW, master-weight casts,
-- accumulation) counts to "optimizer".
-- Families: matmuls by role, told apart by the weight's shape (C the model
-- width, V its vocabulary): qkv (3C,C), attn proj (C,C), mlp fc (4C,C),
-- mlp proj (C,4C), lm head (V,C); the rest by op name (FAMILY below).
local zffi = require "ztrain.core.ffi"
local ops = require "ztrain.core.ops"
local gpt2 = require "ztrain.model.gpt2"
local C = zffi.C

local M = {}

-- op name -> family (matmuls handled apart)
local FAMILY = {
  attention_forward = "attention", attention_backward = "attention",
  layernorm_forward = "layernorm", layernorm_backward = "layernorm",
  layernorm_residual_forward = "layernorm",
  gelu_forward = "gelu", gelu_backward = "gelu",
  add3 = "residual add", add = "grad accumulate",
  encoder_forward = "embedding", encoder_backward = "embedding",
  crossentropy = "cross-entropy", sum = "loss sum",
  adamw = "AdamW", adamw_multi = "AdamW", sumsq_blocks = "grad norm",
  sumsq_blocks_many = "grad norm", scale = "grad clip",
  cast = "precision casts", copy = "copy/fill", fill = "copy/fill",
  axpy = "axpy", randn = "init",
}
M.FAMILY = FAMILY

local MATMUL = { matmul_forward = true, matmul_backward = true,
                 matmul_bf16_forward = true, matmul_bf16_backward = true,
                 matmul_bf16_forward_gelu = true, matmul_bf16_backward_dgelu = true }

local active = nil   -- the one running profile

local function nb(t) if t == nil then return 0 end return t:nbytes() end

-- the role of a matmul from its weight's shape
local function role(cfg, w)
  local s = w:shape()
  local r, c = s[1], s[2]
  local Cw = cfg.C
  if r == cfg.V and c == Cw then return "matmul lm head" end
  if r == 3 * Cw and c == Cw then return "matmul qkv" end
  if r == Cw and c == Cw then return "matmul attn proj" end
  if r == 4 * Cw and c == Cw then return "matmul mlp fc" end
  if r == Cw and c == 4 * Cw then return "matmul mlp proj" end
  return "matmul other"
end

-- flops and the bytes an op must move at the least (each operand read or
-- written once), from its arguments.
local COST = {}
function COST.matmul_forward(cfg, out, inp, w, b)
  local s = w:shape()
  local rows = inp:numel() / s[2]
  return 2 * rows * s[1] * s[2], nb(out) + nb(inp) + nb(w) + nb(b)
end
COST.matmul_bf16_forward = COST.matmul_forward
function COST.matmul_backward(cfg, dinp, dw, db, dout, inp, w)
  local s = w:shape()
  local rows = dout:numel() / s[1]
  local one = 2 * rows * s[1] * s[2]
  local fl, by = 0, nb(dout)
  if dinp then fl = fl + one; by = by + 2 * nb(dinp) + nb(w) end   -- dinp written (read if accumulated)
  if dw then fl = fl + one; by = by + nb(dw) + nb(inp) + nb(db) end
  return fl, by
end
COST.matmul_bf16_backward = COST.matmul_backward
-- the GEMM's and the GELU's: pre written (and read by the GELU), out written
function COST.matmul_bf16_forward_gelu(cfg, out, inp, w, b, pre)
  local fl, by = COST.matmul_forward(cfg, pre, inp, w, b)
  return fl, by + nb(pre) + nb(out)
end
function COST.matmul_bf16_backward_dgelu(cfg, dinp16, dw, db, dout, inp, w, pre, dinp32)
  local fl, by = COST.matmul_backward(cfg, dinp16 and dinp32, dw, db, dout, inp, w)
  if dinp16 then by = by + nb(pre) + nb(dinp16) end
  return fl, by
end
-- PaLM's count (bench.lua's): QK^T and AV in full, no causal discount;
-- the backward twice the forward
function COST.attention_forward(cfg, out, lse, qkv, nh)
  local s = qkv:shape()
  local B, T, C3 = s[1], s[2], s[3]
  return 4 * B * T * T * (C3 / 3), nb(out) + nb(lse) + nb(qkv)
end
function COST.attention_backward(cfg, dqkv, dout, qkv, out, lse, nh)
  local s = qkv:shape()
  local B, T, C3 = s[1], s[2], s[3]
  return 8 * B * T * T * (C3 / 3), nb(dqkv) + nb(dout) + nb(qkv) + nb(out) + nb(lse)
end
function COST.layernorm_forward(cfg, out, mean, rstd, inp, w, b)
  return 0, nb(out) + nb(mean) + nb(rstd) + nb(inp) + nb(w) + nb(b)
end
function COST.layernorm_residual_forward(cfg, resid, out, mean, rstd, a, b, w, bias)
  return 0, nb(resid) + nb(out) + nb(mean) + nb(rstd) + nb(a) + nb(b) + nb(w) + nb(bias)
end
function COST.layernorm_backward(cfg, dinp, dw, db, dout, inp, w, mean, rstd)
  -- dinp is accumulated into (read and written)
  return 0, 2 * nb(dinp) + nb(dw) + nb(db) + nb(dout) + nb(inp) + nb(mean) + nb(rstd)
end
function COST.gelu_forward(cfg, out, inp) return 0, nb(out) + nb(inp) end
function COST.gelu_backward(cfg, dinp, inp, dout) return 0, nb(dinp) + nb(inp) + nb(dout) end
function COST.add3(cfg, out, a, b) return 0, nb(out) + nb(a) + nb(b) end
function COST.add(cfg, y, x) return 0, 2 * nb(y) + nb(x) end
function COST.axpy(cfg, y, a, x) return 0, 2 * nb(y) + nb(x) end
function COST.scale(cfg, x) return 0, 2 * nb(x) end
function COST.copy(cfg, dst, src) return 0, nb(dst) + nb(src) end
function COST.cast(cfg, dst, src) return 0, nb(dst) + nb(src) end
function COST.fill(cfg, x) return 0, nb(x) end
function COST.sum(cfg, x) return 0, nb(x) end
function COST.sumsq_blocks(cfg, x) return 0, nb(x) end
function COST.sumsq_blocks_many(cfg, xs)
  local n = 0
  for _, x in ipairs(xs) do n = n + nb(x) end
  return 0, n
end
function COST.randn(cfg, x) return 0, nb(x) end
-- the rows of wte and wpe gathered (T of wpe's rows, reused over B)
function COST.encoder_forward(cfg, out, tokens, wte, wpe)
  local s = out:shape()
  return 0, 2 * nb(out) + nb(tokens) + s[2] * s[3] * 4
end
-- dout read once, the f32 dwte rows it adds to read and written (one per
-- position at most), dwpe's T rows written
function COST.encoder_backward(cfg, dwte, dwpe, dout, tokens)
  local s = dout:shape()
  local rows = s[1] * s[2] * s[3] * 4
  return 0, nb(dout) + 2 * rows + nb(tokens) + 2 * s[2] * s[3] * 4
end
-- logits read, dlogits written in place when asked
function COST.crossentropy(cfg, losses, dlogits, logits, targets)
  return 0, nb(losses) + nb(logits) + nb(dlogits) + nb(targets)
end
-- p, g, m, v read; p, m, v written
function COST.adamw(cfg, p, g, m, v) return 0, 2 * nb(p) + nb(g) + 2 * nb(m) + 2 * nb(v) end
-- parts: a zt_adamw_part[n], each its segment's elements only (a range's
-- padding is not touched): p, m, v read and written (24), g read (4, or 2
-- when a mixed-precision step's stored gradient is read as it is), the
-- low-precision copy written
function COST.adamw_multi(cfg, parts, n)
  local bytes = 0
  for k = 0, n - 1 do
    local q, len = parts[k], tonumber(parts[k].length)
    local gb = zffi.C.zt_tensor_dtype(q.grad) == zffi.C.ZT_F32 and 4 or 2
    bytes = bytes + (24 + gb) * len + (q.lp ~= nil and 2 * len or 0)
  end
  return 0, bytes
end

local Prof = {}
Prof.__index = Prof

local function add(self, phase, family, dt, fl, by)
  local key = phase .. "\0" .. family
  local e = self.acc[key]
  if not e then
    e = { phase = phase, family = family, s = 0, calls = 0, flops = 0, bytes = 0 }
    self.acc[key] = e
  end
  e.s, e.calls, e.flops, e.bytes = e.s + dt, e.calls + 1, e.flops + fl, e.bytes + by
end

local function wrap_op(self, name, f)
  local cost, cfg = COST[name], self.cfg
  local fam = FAMILY[name] or name
  local sync = self.sync
  return function(...)
    if sync then zffi.check(C.zt_device_sync(), "profile: device sync") end
    local t0 = C.zt_now()
    local r1, r2 = f(...)
    if sync then zffi.check(C.zt_device_sync(), "profile: device sync") end
    local dt = C.zt_now() - t0
    local family = fam
    if MATMUL[name] then
      local w = select(name:match("backward") and 6 or 3, ...)
      family = role(cfg, w) .. (name:match("gelu") and " + gelu" or "")   -- the fused op's GELU in it
    end
    local fl, by = 0, 0
    if cost then fl, by = cost(cfg, ...) end
    add(self, self.phase, family, dt, fl, by)
    return r1, r2
  end
end

-- run f with the profile's phase set to `phase` (restored after, also on error)
local function in_phase(self, phase, f)
  return function(...)
    local prev = self.phase
    self.phase = phase
    local res = { pcall(f, ...) }
    self.phase = prev
    if not res[1] then error(res[2], 0) end
    return unpack(res, 2, table.maxn(res))
  end
end

-- start(model, ctx, opts) -> profile. One at a time; stop() undoes every
-- swap. opts.sync: wait for the device around every op (asynchronous backends).
function M.start(model, ctx, opts)
  if active then error("profile.start: a profile is already running; stop it first", 0) end
  local self = setmetatable({ cfg = model.cfg, acc = {}, phase = "optimizer", saved_ops = {},
                              saved_model = {}, saved_mm = {}, ctx = ctx,
                              sync = opts and opts.sync or false }, Prof)
  for name, f in pairs(ops) do
    if type(f) == "function" then
      self.saved_ops[name] = f
      ops[name] = wrap_op(self, name, f)
    end
  end
  -- the fp32 matmuls gpt2.lua took from ops when it loaded
  for k, f in pairs(gpt2.fp32_matmuls) do
    self.saved_mm[k] = f
    gpt2.fp32_matmuls[k] = ops["matmul_" .. k]
  end
  local Model = gpt2.Model
  for name, phase in pairs({ forward = "forward", backward = "backward",
                             backward_input = "backward", backward_weight = "backward" }) do
    self.saved_model[name] = rawget(Model, name)
    Model[name] = in_phase(self, phase, self.saved_model[name])
  end
  local prec = ctx and ctx.precision
  if prec and prec.lp then
    local enter, leave = prec.enter, prec.leave
    self.prec = prec
    prec.enter = function(p, u, want_params, want_grads)
      return in_phase(self, want_grads and "backward" or "forward", enter)(p, u, want_params, want_grads)
    end
    -- leave casts gradients back after a backward, nothing after a forward
    prec.leave = function(p, u)
      return in_phase(self, next(p.saved_g) and "backward" or "forward", leave)(p, u)
    end
  end
  active = self
  return self
end

function Prof:stop()
  if active ~= self then return end
  for name, f in pairs(self.saved_ops) do ops[name] = f end
  for k, f in pairs(self.saved_mm) do gpt2.fp32_matmuls[k] = f end
  for name, f in pairs(self.saved_model) do gpt2.Model[name] = f end
  if self.prec then self.prec.enter, self.prec.leave = nil, nil end   -- the class's again
  active = nil
end

-- forget what was measured so far (after warm-up steps)
function Prof:reset() self.acc = {} end

local PHASES = { forward = 1, backward = 2, optimizer = 3 }

-- rows() -> list of { phase, family, s, calls, flops, bytes }, in phase
-- order, the longest first within a phase
function Prof:rows()
  local out = {}
  for _, e in pairs(self.acc) do out[#out + 1] = e end
  table.sort(out, function(a, b)
    local pa, pb = PHASES[a.phase] or 9, PHASES[b.phase] or 9
    if pa ~= pb then return pa < pb end
    if a.s ~= b.s then return a.s > b.s end
    return a.family < b.family
  end)
  return out
end

-- total seconds over every row
function Prof:total()
  local t = 0
  for _, e in pairs(self.acc) do t = t + e.s end
  return t
end

M.COST = COST
M.role = role
return M
