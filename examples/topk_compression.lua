-- examples/topk_compression.lua -- a strategy written by a user: data
-- parallelism that sends only the largest `keep` fraction of each unit's
-- gradient, with error feedback (Seide et al. 2014, Stich et al. 2018).
--
-- Per unit and micro-batch, on every rank:
--
--   c = g + e                 the gradient plus what earlier steps held back
--   sent = top_k(|c|) of c    k = ceil(keep x numel) (index, value) pairs
--   e = c - sent              the rest stays here, for the next step
--
-- The ranks all-gather their k pairs (8k bytes each instead of dp's 4 x
-- numel) and every rank adds them up, in rank order, into the gradient the
-- optimizer sees. Nothing is lost, only delayed: summed over steps, what
-- was sent plus the residual is exactly what was computed.
--
-- keep = 1 sends everything and is dp, bit for bit (spec/e2e/examples_spec.lua
-- compares digests); keep < 1 leaves the same-math rule on purpose. The
-- selection runs on the host in Lua (clear rather than fast): a GPU version
-- would select and scatter with kernels.
--
--   build/ztrain --nproc 2 examples/topk_dp.lua
local ffi = require "ffi"
local zt = require "ztrain"
local ops = zt.ops
local replicated = require "ztrain.parallel.strategy.replicated"
local shard = require "ztrain.parallel.strategy.shard"
local options = require "ztrain.parallel.strategy.options"

local M = {}

-- -0.0, not 0.0, is the identity of floating-point addition: x + (-0) = x
-- for every x, while -0 + (+0) = +0. Residuals and sums start from it so
-- that "add nothing" leaves a gradient's bits, signed zeros included.
local NEG_ZERO = -0.0

-- The k-th largest of mag[0..n-1] (0 < k <= n), found by
-- quickselect on a scratch copy.
local function kth_largest(mag, scratch, n, k)
  ffi.copy(scratch, mag, n * ffi.sizeof("double"))
  local lo, hi, want = 0, n - 1, k - 1         -- position want in descending order
  while lo < hi do
    local pivot = scratch[lo + math.floor((hi - lo) / 2)]
    local i, j = lo, hi
    while i <= j do
      while scratch[i] > pivot do i = i + 1 end
      while scratch[j] < pivot do j = j - 1 end
      if i <= j then scratch[i], scratch[j] = scratch[j], scratch[i]; i = i + 1; j = j - 1 end
    end
    if want <= j then hi = j elseif want >= i then lo = i else break end
  end
  return scratch[want]
end

-- new{ keep = 0.01, trace = false, audit = false } -> strategy
--   trace: one line per step in OUT/topk.rank<r>.jsonl (bytes sent, norms)
--   audit: also keep, per rank, the sums over steps of the raw gradients and
--          of what was sent, and report how far sent + residual is from them
function M.new(opts)
  opts = options.check("topk", opts, { "keep", "trace", "audit" })
  local keep = opts.keep or 0.01
  assert(keep > 0 and keep <= 1, "topk: keep must be in (0, 1]")
  local S = { name = "topk_ef", opts = opts }
  local reset_stats   -- defined below

  function S.setup(ctx)
    if ctx.precision then error(S.name .. " runs in fp32 only", 0) end
    if ctx.pp then error(S.name .. " replicates the whole model: no pipeline stages", 0) end
    replicated.setup(ctx)   -- whole model, optimizer state, accumulators: dp's
    local N, tier = ctx.dp.size, ctx.model.tier
    local work = { units = {}, step = 0 }
    ctx.work = work
    local largest = 0
    for _, u in ipairs(replicated.units(ctx)) do
      local n = u.numel
      local k = math.max(1, math.ceil(keep * n))
      local w = { k = k }
      -- the error-feedback residual: this rank's gradient not yet sent
      w.residual = zt.tensor.new({ n }, { tier = tier, category = "grads" }):fill(NEG_ZERO)
      -- what goes over the wire, on the host tier: this rank's k pairs and
      -- everyone's (all_gather: rank r's pairs at [r*k, (r+1)*k))
      w.idx = zt.tensor.new({ k }, { dtype = "i32", tier = "host", category = "comm" })
      w.val = zt.tensor.new({ k }, { tier = "host", category = "comm" })
      w.all_idx = zt.tensor.new({ N * k }, { dtype = "i32", tier = "host", category = "comm" })
      w.all_val = zt.tensor.new({ N * k }, { tier = "host", category = "comm" })
      if opts.audit then
        w.sum_g, w.sum_sent = ffi.new("double[?]", n), ffi.new("double[?]", n)
      end
      work.units[u.index] = w
      largest = math.max(largest, n)
    end
    -- host scratch for the selection (one set, reused unit by unit)
    work.c = ffi.new("float[?]", largest)
    work.g = ffi.new("float[?]", largest)
    work.mag = ffi.new("double[?]", largest)
    work.scratch = ffi.new("double[?]", largest)
    reset_stats(ctx)
  end

  -- this step's figures (trace), zeroed after each step
  function reset_stats(ctx)
    ctx.work.stats = { sent_elements = 0, sent_bytes = 0, dense_bytes = 0, c_sq = 0, sent_sq = 0,
                       residual_sq = 0, ledger = 0, ledger_scale = 0 }
  end

  -- Unit u's gradient of micro-batch mb is complete: compress, exchange,
  -- decompress into u.grads, then accumulate as dp does.
  function S.post_backward(ctx, u, mb)
    local work, N = ctx.work, ctx.dp.size
    local w, n, st = work.units[u.index], u.numel, work.stats
    local k = w.k
    local g = u.grads:view(0, { n })
    if opts.audit then g:read(work.g) end
    -- c = g + e, in the residual's buffer
    ops.add(w.residual, g)
    local c, mag = work.c, work.mag
    w.residual:read(c)
    for i = 0, n - 1 do mag[i] = math.abs(c[i]) end
    local t = kth_largest(mag, work.scratch, n, k)
    -- the k largest, ties at t taken in index order: exactly k pairs
    local above = 0
    for i = 0, n - 1 do if mag[i] > t then above = above + 1 end end
    local ties = k - above
    local idx, val = w.idx:ptr(), w.val:ptr()
    local j, c_sq, sent_sq = 0, 0, 0
    for i = 0, n - 1 do
      local m = mag[i]
      c_sq = c_sq + m * m
      if m > t or (m == t and ties > 0) then
        if m == t then ties = ties - 1 end
        idx[j], val[j] = i, c[i]
        sent_sq = sent_sq + m * m
        j = j + 1
        c[i] = NEG_ZERO                      -- e = c - sent
      end
    end
    assert(j == k, "topk: selected a wrong count")
    w.residual:write(c)
    -- everyone's pairs (both gathers in flight at once)
    local r1 = ctx.dp:all_gather(w.all_idx, w.idx, true)
    local r2 = ctx.dp:all_gather(w.all_val, w.val, true)
    r1:wait(); r2:wait()
    -- decompress: the sum over ranks, in rank order, into this unit's gradient
    local dense = c                          -- the scratch is free again
    for i = 0, n - 1 do dense[i] = NEG_ZERO end
    local ai, av = w.all_idx:ptr(), w.all_val:ptr()
    for q = 0, N * k - 1 do
      local i = ai[q]
      dense[i] = dense[i] + av[q]            -- two floats added in double, stored as float: fp32's add
    end
    g:write(dense)
    g:free()
    local acc = ctx.state.acc[u.index]
    if acc then replicated.accumulate(acc, u.grads, mb) end
    -- what this cost and what it kept back
    st.sent_elements = st.sent_elements + k
    st.sent_bytes = st.sent_bytes + w.idx:nbytes() + w.val:nbytes()
    st.dense_bytes = st.dense_bytes + 4 * n
    st.c_sq, st.sent_sq = st.c_sq + c_sq, st.sent_sq + sent_sq
    if opts.audit or opts.trace then
      local e, esq = work.c, 0
      w.residual:read(e)
      for i = 0, n - 1 do esq = esq + e[i] * e[i] end
      st.residual_sq = st.residual_sq + esq
      if opts.audit then
        -- sent + residual against the raw gradients, summed over steps
        local sg, ss = w.sum_g, w.sum_sent
        for q = 0, k - 1 do ss[idx[q]] = ss[idx[q]] + val[q] end
        for i = 0, n - 1 do
          sg[i] = sg[i] + work.g[i]
          st.ledger = math.max(st.ledger, math.abs(sg[i] - ss[i] - e[i]))
          st.ledger_scale = math.max(st.ledger_scale, math.abs(sg[i]))
        end
      end
    end
  end

  -- The step: dp's (global norm, clip, update), on the decompressed sums.
  function S.step(ctx, lr)
    local gn = replicated.step(ctx, lr)
    local work = ctx.work
    work.step = work.step + 1
    if opts.trace then
      local path = ("%s/topk.rank%d.jsonl"):format(ctx.out_dir, ctx.dp.rank)
      if not work.trace then
        assert(require("ztrain.record.report").mkdirs(ctx.out_dir))
        work.trace = assert(io.open(path, "w"))
      end
      local st = work.stats
      work.trace:write(('{"step":%d,"sent_elements":%d,"sent_bytes":%d,"dense_bytes":%d,"c_sq":%.17g,' ..
                        '"sent_sq":%.17g,"residual_sq":%.17g,"ledger":%.17g,"ledger_scale":%.17g}\n')
        :format(work.step, st.sent_elements, st.sent_bytes, st.dense_bytes, st.c_sq, st.sent_sq,
                st.residual_sq, st.ledger, st.ledger_scale))
      work.trace:flush()
    end
    reset_stats(ctx)
    return gn
  end

  function S.reduce_loss(ctx, sum) return shard.sum_over_ranks(ctx.dp, sum) end

  -- dp's model state, plus the residual (4 bytes a parameter)
  function S.predicted(ctx)
    local p = replicated.predicted(ctx)
    p.grads = p.grads + 4 * replicated.nparams(ctx)
    return p
  end

  function S.free(ctx)
    local work = ctx and ctx.work
    if work and work.units then
      if work.trace then work.trace:close(); work.trace = nil end
      for _, w in pairs(work.units) do
        for _, name in ipairs({ "residual", "idx", "val", "all_idx", "all_val" }) do w[name]:free() end
      end
      work.units = nil
    end
    replicated.free(ctx)
  end

  return options.complete(S)
end

return M
