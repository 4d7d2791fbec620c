-- ztrain.core.ops: the runtime's tensor ops, checked. Tensor arguments are
-- ztrain.tensor objects (or nil where the C API allows NULL); failures raise
-- a Lua error with the runtime's message. An op's tensors must all live on
-- one tier (move bytes with ztrain.stream.copy_async); ops run on the calling
-- thread's current stream.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local interrupt = require "ztrain.core.interrupt"
local C, check = zffi.C, zffi.check

local M = {}

local function c(t) if t == nil then return nil end return t.c end

function M.fill(x, v) check(C.zt_fill(c(x), v), "fill") end
function M.copy(dst, src) check(C.zt_copy(c(dst), c(src)), "copy") end
function M.scale(x, a) check(C.zt_scale(c(x), a), "scale") end
function M.axpy(y, a, x) check(C.zt_axpy(c(y), a, c(x)), "axpy") end
function M.add(y, x) check(C.zt_add(c(y), c(x)), "add") end
function M.add3(out, a, b) check(C.zt_add3(c(out), c(a), c(b)), "add3") end
-- resid = a + b, then out, mean, rstd = layernorm(resid): add3 and
-- layernorm_forward's bits in one pass
function M.layernorm_residual_forward(resid, out, mean, rstd, a, b, w, bias)
  check(C.zt_layernorm_residual_forward(c(resid), c(out), c(mean), c(rstd), c(a), c(b), c(w), c(bias)),
        "layernorm_residual_forward")
end
function M.cast(dst, src) check(C.zt_cast(c(dst), c(src)), "cast") end

function M.encoder_forward(out, tokens, wte, wpe)
  check(C.zt_encoder_forward(c(out), c(tokens), c(wte), c(wpe)), "encoder_forward")
end
function M.encoder_backward(dwte, dwpe, dout, tokens)
  check(C.zt_encoder_backward(c(dwte), c(dwpe), c(dout), c(tokens)), "encoder_backward")
end
function M.layernorm_forward(out, mean, rstd, inp, w, b)
  check(C.zt_layernorm_forward(c(out), c(mean), c(rstd), c(inp), c(w), c(b)), "layernorm_forward")
end
-- Split backward: dinp nil computes the weight gradients only; dw and db both
-- nil the input gradient only. Each output has the same bits as in the fused call.
-- dinp16 (optional, bf16): the accumulated dinp rounded once, for a bf16 GEMM
function M.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, dinp16)
  if dinp16 then
    check(C.zt_layernorm_backward_b16(c(dinp), c(dinp16), c(dw), c(db), c(dout), c(inp), c(w), c(mean),
                                      c(rstd)), "layernorm_backward")
    return
  end
  check(C.zt_layernorm_backward(c(dinp), c(dw), c(db), c(dout), c(inp), c(w), c(mean), c(rstd)),
        "layernorm_backward")
end
function M.matmul_forward(out, inp, w, b)
  check(C.zt_matmul_forward(c(out), c(inp), c(w), c(b)), "matmul_forward")
end
-- dinp and db may be nil; dw nil (then db nil) computes dinp only (split
-- backward: the same bits as the fused call).
function M.matmul_backward(dinp, dw, db, dout, inp, w)
  check(C.zt_matmul_backward(c(dinp), c(dw), c(db), c(dout), c(inp), c(w)), "matmul_backward")
end
-- bf16 operands (inp, w, dout), fp32 outputs and bias, fp32 accumulation;
-- the same nils and split backward as matmul_*.
function M.matmul_bf16_forward(out, inp, w, b)
  check(C.zt_matmul_bf16_forward(c(out), c(inp), c(w), c(b)), "matmul_bf16_forward")
end
function M.matmul_bf16_backward(dinp, dw, db, dout, inp, w)
  check(C.zt_matmul_bf16_backward(c(dinp), c(dw), c(db), c(dout), c(inp), c(w)),
        "matmul_bf16_backward")
end
-- The MLP's GEMMs with the GELU (bf16 activations): pre = inp @ w^T + b,
-- out = gelu(pre), both bf16; and dinp16 = gelu'(pre) * (dout @ w) (dinp32
-- f32 scratch), dw, db as matmul_bf16_backward. A GPU fuses the GELU into
-- the GEMM's epilogue; the CPU runs the two ops (zt_ops.h).
function M.matmul_bf16_forward_gelu(out, inp, w, b, pre)
  check(C.zt_matmul_bf16_forward_gelu(c(out), c(inp), c(w), c(b), c(pre)), "matmul_bf16_forward_gelu")
end
function M.matmul_bf16_backward_dgelu(dinp16, dw, db, dout, inp, w, pre, dinp32)
  check(C.zt_matmul_bf16_backward_dgelu(c(dinp16), c(dw), c(db), c(dout), c(inp), c(w), c(pre),
                                        c(dinp32)), "matmul_bf16_backward_dgelu")
end
-- Causal attention. kv_heads (nil: nh) grouped-query kv heads, nh a
-- multiple: qkv rows q (nh heads) | k (kv_heads) | v (kv_heads); window
-- (nil or 0: plain causal) a sliding window, query i seeing keys (i-window, i].
-- Without either the GPT-2 calls, (B,T,3C).
local function gqa(kv_heads, window) return kv_heads ~= nil or (window or 0) ~= 0 end
function M.attention_forward(out, lse, qkv, nh, kv_heads, window)
  if gqa(kv_heads, window) then
    check(C.zt_attention_forward_gqa(c(out), c(lse), c(qkv), nh, kv_heads or nh, window or 0),
          "attention_forward")
  else
    check(C.zt_attention_forward(c(out), c(lse), c(qkv), nh), "attention_forward")
  end
end
function M.attention_backward(dqkv, dout, qkv, out, lse, nh, kv_heads, window)
  if gqa(kv_heads, window) then
    check(C.zt_attention_backward_gqa(c(dqkv), c(dout), c(qkv), c(out), c(lse), nh, kv_heads or nh,
                                      window or 0), "attention_backward")
  else
    check(C.zt_attention_backward(c(dqkv), c(dout), c(qkv), c(out), c(lse), nh), "attention_backward")
  end
end
-- Generation: appends qkv's new positions [pos, pos+T) to the caches
-- (B,kv_heads,maxT,hs) and attends each over positions [0, its own]
-- (within the window).
function M.attention_decode(out, kcache, vcache, qkv, nh, pos, kv_heads, window)
  if gqa(kv_heads, window) then
    check(C.zt_attention_decode_gqa(c(out), c(kcache), c(vcache), c(qkv), nh, kv_heads or nh,
                                    window or 0, pos), "attention_decode")
  else
    check(C.zt_attention_decode(c(out), c(kcache), c(vcache), c(qkv), nh, pos), "attention_decode")
  end
end
function M.gelu_forward(out, inp) check(C.zt_gelu_forward(c(out), c(inp)), "gelu_forward") end
function M.gelu_backward(dinp, inp, dout)
  check(C.zt_gelu_backward(c(dinp), c(inp), c(dout)), "gelu_backward")
end
-- Llama's ops (f32). rmsnorm: out = w * (x * rstd), rstd saved; the
-- backward accumulates dinp and writes dw (either nil, not both).
function M.rmsnorm_forward(out, rstd, inp, w, eps)
  check(C.zt_rmsnorm_forward(c(out), c(rstd), c(inp), c(w), eps), "rmsnorm_forward")
end
-- dinp16: nil, or (bf16) dinp rounded once, as the next bf16 GEMM reads it
function M.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, dinp16)
  check(C.zt_rmsnorm_backward_b16(c(dinp), c(dinp16), c(dw), c(dout), c(inp), c(w), c(rstd)),
        "rmsnorm_backward")
end
-- cos, sin (positions, hs/2); scaling: nil or Llama 3's { factor=,
-- low_freq_factor=, high_freq_factor=, original_max_position_embeddings= }
function M.rope_table(cos, sin, theta, scaling)
  local s = scaling or {}
  check(C.zt_rope_table(c(cos), c(sin), theta, s.factor or 0, s.low_freq_factor or 0,
                        s.high_freq_factor or 0, s.original_max_position_embeddings or 0),
        "rope_table")
end
-- the nh heads of hs at column col0 of x's rows turned in place by position
-- pos0 + row % T (rope_backward: turned back)
function M.rope_forward(x, col0, nh, hs, T, pos0, cos, sin)
  check(C.zt_rope_forward(c(x), col0, nh, hs, T, pos0, c(cos), c(sin)), "rope_forward")
end
function M.rope_backward(dx, col0, nh, hs, T, pos0, cos, sin)
  check(C.zt_rope_backward(c(dx), col0, nh, hs, T, pos0, c(cos), c(sin)), "rope_backward")
end
-- gu (N, 2F) rows [gate | up]: out (N, F) = silu(gate) * up
function M.swiglu_forward(out, gu) check(C.zt_swiglu_forward(c(out), c(gu)), "swiglu_forward") end
function M.swiglu_backward(dgu, dout, gu)
  check(C.zt_swiglu_backward(c(dgu), c(dout), c(gu)), "swiglu_backward")
end
-- logits (N,V) or, with V given, rows padded to padded_cols(V) (the LM
-- head's); f32 or bf16, dlogits the same (nil, or logits itself).
function M.crossentropy(losses, dlogits, logits, targets, dscale, V)
  check(C.zt_crossentropy(c(losses), c(dlogits), c(logits), c(targets), dscale, V or 0),
        "crossentropy")
end
-- n rounded up to the row padding of logits (128): 50257 -> 50304
function M.padded_cols(n) return tonumber(C.zt_padded_cols(n)) end
-- parts: a zt_adamw_part[n] (ffi; model/adamw.lua fills it), n of them:
-- every tensor's segment of a step in one op (one launch on a GPU)
function M.adamw_multi(parts, n, lr, b1, b2, eps, gscale, step)
  check(C.zt_adamw_multi(parts, n, lr, b1, b2, eps, gscale, step), "adamw_multi")
end
function M.adamw(p, g, m, v, lr, b1, b2, eps, wd, gscale, step)
  check(C.zt_adamw(c(p), c(g), c(m), c(v), lr, b1, b2, eps, wd, gscale, step), "adamw")
end

function M.randn(x, seed, stream, mean, std)
  check(C.zt_randn(c(x), seed, stream, mean or 0, std or 1), "randn")
end

local dbuf = ffi.new("double[1]")
-- Sum of x in fp64 over fixed blocks.
function M.sum(x) check(C.zt_sum(dbuf, c(x)), "sum"); return dbuf[0] end
-- Per-block sums of squares (a double[] cdata of ceil(numel/block) entries).
function M.sumsq_blocks(x)
  local nb = math.ceil(x:numel() / tonumber(C.zt_sum_block()))
  local partials = ffi.new("double[?]", nb)
  check(C.zt_sumsq_blocks(partials, c(x)), "sumsq_blocks")
  return partials, nb
end

-- sumsq_blocks of every tensor of xs (a list) -> partials (a double[]
-- cdata, each tensor's blocks in turn) and counts (each tensor's number of
-- blocks). Runs of tensors on one tier and of one dtype go in one call: on
-- a GPU one wait a run instead of one a tensor.
function M.sumsq_blocks_many(xs)
  local block = tonumber(C.zt_sum_block())
  local counts, total = {}, 0
  for i, x in ipairs(xs) do counts[i] = math.ceil(x:numel() / block); total = total + counts[i] end
  local partials = ffi.new("double[?]", math.max(total, 1))
  local i, off = 1, 0
  while i <= #xs do
    local j, tier, dt, nb = i, xs[i]:tier(), xs[i]:dtype(), 0
    while j <= #xs and xs[j]:tier() == tier and xs[j]:dtype() == dt do nb = nb + counts[j]; j = j + 1 end
    local run = ffi.new("const zt_tensor *[?]", j - i)
    for k = i, j - 1 do run[k - i] = c(xs[k]) end
    check(C.zt_sumsq_blocks_many(partials + off, run, j - i), "sumsq_blocks_many")
    off, i = off + nb, j
  end
  return partials, counts
end

-- A loop of kernels (at the REPL: `for i = 1, 1e4 do ops.matmul(...) end`)
-- stops between two of them on Ctrl-C: each op ends with a poll, which does
-- nothing unless a session asked polls to raise (ztrain.interrupt).
local polled = interrupt.polled
for name, f in pairs(M) do M[name] = polled(f) end

return M
