-- spec/cuda/whole_step.lua -- whole training steps on two backends, compared:
-- recipes/single.lua at the digest oracle's small settings (gpt2-tiny, seq_len
-- 32, micro-batch 2), a few steps, once on backend a and once on backend b
-- (each in its own process: the device is chosen once per process). Checks
-- every step's loss, the first step's gradient norm and every parameter's
-- gradient after the first backward, and the parameters after the last step.
-- Run by `make test-cuda`:
--
--   ZTRAIN_LIB=build-cuda/libztrain.so build-cuda/ztrain --script spec/cuda/whole_step.lua
--
-- keys (key=value): a=cpu b=cuda (the backends), threads_b=N (b's
-- device.threads), attention_b=exact|bf16 (b's device.attention: bf16, the
-- tensor-core kernels, at precision=bf16 only), precision=fp32,bf16 (each
-- with its own tolerances; bf16 with bf16 GEMMs), steps=3, perturb=X (b's first-step gradients scaled by
-- 1+X before its update: the comparison must then fail), env_b=NAME=VALUE
-- (one variable set for b's run, e.g. env_b=OPENBLAS_CORETYPE=Prescott: other
-- GEMM kernels, other sums), ztrain=PATH (the program for the two runs;
-- default: the one running this).
-- Without a GPU (b=cuda on a CPU build, or no visible GPU) it prints one
-- skip line and exits 0; spec/cuda_step_harness_spec.lua checks this harness
-- on the CPU (cpu against cpu passes, a perturbed side fails, the skip).
local ffi = require "ffi"
local zt = require "ztrain"
local common = dofile(zt.home .. "/spec/cuda/common.lua")

-- Tolerances, by precision.
--  loss:  |la - lb| / |la| per step, times the step number (errors grow with
--         the updates). cuBLAS and OpenBLAS sum a GEMM's products in other
--         orders (fp32, no TF32: ~K * 2^-24 relative at worst, far less in
--         practice), and the GPU's layernorm/softmax/cross-entropy reduce in
--         other orders; spec/reference_spec.lua sees ztrain against PyTorch's
--         CPU (another order again) within 1e-5 over 10 steps.
--  grad:  per tensor, max |ga - gb| / max |ga| after the first backward (and
--         the first step's gradient norm, relative). reference_spec holds
--         every gradient within 1e-4 (norm-relative) of PyTorch's.
--  param: per tensor, ||pa - pb|| / ||pa|| after the last step. Adam divides
--         by sqrt(v): where a gradient is near zero its rounding noise moves
--         the parameter by up to ~lr, so loose. Measured on the CPU against
--         itself with other GEMM kernels (env_b=OPENBLAS_CORETYPE=Prescott):
--         losses 1.5e-8, gradients 5e-7, parameters 2e-4 after 3 and after
--         10 steps (c_attn.bias, whose k slice has a zero gradient in exact
--         arithmetic: spec/fixtures/README.md), everything else below 1e-5.
--  bf16 (bf16 storage and GEMMs, fp32 accumulation): both sides round the
--  same fp32 values to bf16 (the casts are bit-identical), but an fp32
--  difference of one ulp flips a bf16 rounding (2^-8 relative) now and then,
--  and those flips travel. Never run on a GPU: a first guess, to be set from
--  the first GPU run's figures (docs/gpu.md).
local TOL = {
  fp32 = { loss = 1e-5, grad = 1e-4, param = 1e-3 },
  bf16 = { loss = 1e-3, grad = 3e-2, param = 1e-2 },
}

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)

-- ---- a child run: train, dump losses, gradients and parameters ----

local function product(shape) local n = 1; for _, d in ipairs(shape) do n = n * d end; return n end

-- read_f32(t) -> float[t:numel()] of tensor t (cast on its tier when not f32)
local function read_f32(t)
  local buf = ffi.new("float[?]", t:numel())
  if t:dtype() == "f32" then t:read(buf); return buf end
  local tmp = zt.tensor.new({ t:numel() }, { tier = t:tier() })
  local ok, err = pcall(function() zt.ops.cast(tmp, t); tmp:read(buf) end)
  tmp:free()
  if not ok then error(err, 0) end
  return buf
end

local function child()
  local replicated = require "ztrain.strategy.replicated"
  local steps, prec = tonumber(args.steps or 3), args.precision or "fp32"
  local over = {}
  for w in common.cases.BASE:gmatch("%S+") do if w ~= "-q" then over[#over + 1] = w end end
  for _, w in ipairs({ common.cases.SETTINGS.tiny, common.DATA:gsub("'", ""), "train.steps=" .. steps,
                       "device.backend=" .. args.backend, "precision=" .. prec }) do
    over[#over + 1] = w
  end
  if prec == "bf16" then over[#over + 1] = "device.bf16_gemm=on" end
  if args.threads then over[#over + 1] = "device.threads=" .. args.threads end
  if args.attention then over[#over + 1] = "device.attention=" .. args.attention end
  local r = assert(zt.recipe.load(zt.home .. "/recipes/single.lua", over))
  local tr = zt.trainer.new(r)
  local bin = assert(io.open(args.dump .. ".bin", "wb"))
  local index, off = { losses = {}, tensors = {} }, 0
  local function dump(kind, u, flat)
    bin:write(ffi.string(flat, u.padded * 4))
    for _, t in ipairs(u.tensors) do
      index.tensors[#index.tensors + 1] = ("{ kind = %q, name = %q, at = %d, n = %d }")
        :format(kind, t.name, off + t.offset, product(t.shape))
    end
    off = off + u.padded
  end
  -- the gradients the first update reads, read just before it
  local S = tr.env.strategy
  local step = S.step
  S.step = function(ctx, lr)
    S.step = step
    for _, u in ipairs(replicated.units(ctx)) do
      local g = replicated.grad_of(ctx, u)
      if args.perturb then zt.ops.scale(g, 1 + tonumber(args.perturb)) end
      dump("grad", u, read_f32(g))
    end
    return step(ctx, lr)
  end
  for i = 1, steps do
    local rec = tr:train_step()
    index.losses[i] = ("%.17g"):format(rec.loss)
    if i == 1 then index.gnorm = ("%.17g"):format(rec.grad_norm) end
  end
  for _, u in ipairs(replicated.units(tr.ctx)) do
    local function put(p) dump("param", u, read_f32(p)) end
    if S.with_full_params then S.with_full_params(tr.ctx, u, put) else put(u.params) end
  end
  bin:close()
  local f = assert(io.open(args.dump .. ".lua", "wb"))
  f:write(("return { losses = { %s }, gnorm = %s,\n  tensors = {\n  %s } }\n")
          :format(table.concat(index.losses, ", "), index.gnorm, table.concat(index.tensors, ",\n  ")))
  f:close()
  tr:free()
end

-- ---- the comparison ----

local function load(path)
  local d = dofile(path .. ".lua")
  d.bytes = common.util.read(path .. ".bin")
  d.f = ffi.cast("const float *", d.bytes)
  return d
end

-- max |x - y| / max |x| over n floats (0 when both are all zeros)
local function maxrel(x, y, n)
  local dm, xm = 0, 0
  for i = 0, n - 1 do
    dm = math.max(dm, math.abs(x[i] - y[i])); xm = math.max(xm, math.abs(x[i]))
  end
  if xm == 0 then return dm == 0 and 0 or math.huge end
  return dm / xm
end

-- ||x - y|| / ||x||
local function normrel(x, y, n)
  local d, s = 0, 0
  for i = 0, n - 1 do d = d + (x[i] - y[i]) ^ 2; s = s + x[i] ^ 2 end
  if s == 0 then return d == 0 and 0 or math.huge end
  return math.sqrt(d / s)
end

-- compare(A, B, tol) -> report line, list of failures
local function compare(A, B, tol)
  local fails, worst = {}, { loss = 0, grad = 0, param = 0 }
  local where = {}
  local function check(kind, e, lim, what)
    if e > worst[kind] then worst[kind], where[kind] = e, what end
    if not (e <= lim) then fails[#fails + 1] = ("%s: %.3g > %.3g"):format(what, e, lim) end
  end
  if #A.losses ~= #B.losses then fails[#fails + 1] = "the runs logged different step counts" end
  for i = 1, math.min(#A.losses, #B.losses) do
    check("loss", math.abs(A.losses[i] - B.losses[i]) / math.abs(A.losses[i]), tol.loss * i,
          ("step %d loss %.9g vs %.9g"):format(i, A.losses[i], B.losses[i]))
  end
  check("grad", math.abs(A.gnorm - B.gnorm) / A.gnorm, tol.grad, "step 1 gradient norm")
  if #A.tensors ~= #B.tensors then fails[#fails + 1] = "the runs dumped different tensors" end
  for i = 1, math.min(#A.tensors, #B.tensors) do
    local ta, tb = A.tensors[i], B.tensors[i]
    assert(ta.name == tb.name and ta.kind == tb.kind and ta.n == tb.n, "the two dumps' tensors differ")
    local x, y = A.f + ta.at, B.f + tb.at
    if ta.kind == "grad" then
      check("grad", maxrel(x, y, ta.n), tol.grad, "gradient " .. ta.name)
    else
      check("param", normrel(x, y, ta.n), tol.param, "parameter " .. ta.name)
    end
  end
  local line = ("losses worst %.2g (tol %.0e x step), step-1 gradients worst %.2g in %s (tol %.0e), " ..
                "params after %d steps worst %.2g in %s (tol %.0e)")
    :format(worst.loss, tol.loss, worst.grad, where.grad or "-", tol.grad, #A.losses, worst.param,
            where.param or "-", tol.param)
  return line, fails
end

local function parent()
  local a, b = args.a or "cpu", args.b or "cuda"
  local what = "cuda whole step"
  common.need_backend(a, what)
  common.need_backend(b, what)
  local prog = common.program(args)
  local steps = tonumber(args.steps or 3)
  local failed = 0
  for _, prec in ipairs(A.list(args.precision, "fp32,bf16")) do
    local tol = assert(TOL[prec], "precision must be fp32 or bf16, got " .. prec)
    local dir = common.util.tmpdir()
    local function run(side, backend, extra, env)
      local cmd = ("%s%s --script %s/spec/cuda/whole_step.lua dump=%s/%s backend=%s precision=%s steps=%d %s")
        :format(env and ("env '" .. env .. "' ") or "", prog, zt.home, dir, side, backend, prec, steps, extra)
      common.run(cmd, ("%s: the %s run (backend %s)"):format(what, side, backend))
      return load(dir .. "/" .. side)
    end
    local A = run("a", a, "")
    local B = run("b", b, (args.threads_b and ("threads=" .. args.threads_b) or "") ..
                          (args.attention_b and (" attention=" .. args.attention_b) or "") ..
                          (args.perturb and (" perturb=" .. args.perturb) or ""), args.env_b)
    common.util.rm(dir)
    local line, fails = compare(A, B, tol)
    print(("%s %s%s (%s against %s, %d steps): %s: %s"):format(what, prec,
                                                             args.attention_b and (", b's attention " .. args.attention_b) or "",
                                                             b, a, steps, line,
                                                             #fails == 0 and "ok" or "FAILED"))
    for i, f in ipairs(fails) do
      if i > 8 then print(("  ... and %d more"):format(#fails - 8)); break end
      print("  " .. f)
    end
    if #fails > 0 then failed = failed + 1 end
  end
  os.exit(failed == 0 and 0 or 1)
end

if args.dump then child() else parent() end
