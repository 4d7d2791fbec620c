-- ztrain.parallel.strategy.state: a strategy's state, made public.
--
-- Every strategy describes what it holds in the same terms, so checkpoints,
-- reports, offload and the REPL can read any strategy's state without
-- knowing the strategy:
--
--   layout   per unit: { unit, index, numel, padded, lo, hi, size, padding }
--            this rank's shard [lo, hi) of the unit's padded flat buffer
--            (size = hi - lo; padding = padded - numel). Replicated
--            strategies hold the whole unit: lo = 0, hi = padded.
--   kinds    named state: params, grads, and the optimizer's (exp_avg,
--            exp_avg_sq; master_params under mixed precision), each with
--            { name, dtype, tier, sharded, category } and per unit the
--            tensor holding this rank's part: shards[u.index] =
--            { lo =, hi =, tensor = } (tensor element 0 = element lo).
--
-- state(ctx) exports, and load_state(ctx, read) imports, a strategy-
-- independent form: ranges of each kind's unpadded per-unit flat buffer.
-- Whatever the strategy and the number of ranks that wrote it, a loader asks
-- for exactly the ranges it holds.
local ops = require "ztrain.core.ops"
local stream = require "ztrain.core.stream"

-- Copy between tensors on any tiers: a plain copy on one tier, an explicit
-- copy (waited for) between tiers.
local function copy_any(dst, src)
  if dst:tier() == src:tier() then return ops.copy(dst, src) end
  stream.copy_async(dst, src)
  stream.current():sync()
end

local M = {}

-- new(model, dp, sharded) -> a state table with the layout filled in.
-- sharded: true when each of the dp ranks owns 1/N of every unit.
function M.new(model, dp, sharded)
  local st = { layout = {}, kinds = {}, order = {} }
  for _, u in ipairs(model.units) do
    local lo, hi = 0, u.padded
    if sharded and dp.size > 1 then
      local n = u.padded / dp.size
      assert(n == math.floor(n), "unit " .. u.name .. " is not padded for " .. dp.size .. " ranks")
      lo, hi = dp.rank * n, (dp.rank + 1) * n
    end
    st.layout[u.index] = { unit = u.name, index = u.index, numel = u.numel, padded = u.padded,
                           lo = lo, hi = hi, size = hi - lo, padding = u.padded - u.numel }
  end
  return st
end

-- add_kind(st, name, { dtype=, tier=, sharded=, category=, derived= }) -> kind
-- derived: computed from other kinds (the low-precision parameters, a
-- rounding of the fp32 master): described, never exported or imported.
function M.add_kind(st, name, info)
  local k = { name = name, dtype = info.dtype or "f32", tier = info.tier or "device",
              sharded = info.sharded and true or false, category = info.category, shards = {},
              derived = info.derived or nil }
  st.kinds[name] = k
  st.order[#st.order + 1] = name
  return k
end

-- set(st, kind, u, lo, hi, tensor): this rank holds [lo, hi) of kind for u in tensor.
function M.set(st, name, u, lo, hi, tensor)
  st.kinds[name].shards[u.index] = { lo = lo, hi = hi, tensor = tensor }
end

-- describe(st) -> plain table (no tensors) for reports and the REPL.
function M.describe(st)
  local out = { layout = {}, kinds = {} }
  for i, l in ipairs(st.layout) do out.layout[i] = l end
  for _, name in ipairs(st.order) do
    local k = st.kinds[name]
    out.kinds[#out.kinds + 1] = { name = name, dtype = k.dtype, tier = k.tier, sharded = k.sharded }
  end
  return out
end

---------------------------------------------------------------------------
-- Export / import.

-- The part of a shard that holds real elements: [lo, min(hi, numel)).
local function clip(l, sh)
  local lo, hi = sh.lo, math.min(sh.hi, l.numel)
  if hi <= lo then return nil end
  return lo, hi
end

-- each_range(st, model, fn): fn(kind_name, u, lo, hi, view) for every kind
-- but grads and every unit this rank holds real elements of; view covers
-- [lo, hi): fn keeps it or frees it (on an error it is freed here).
local function each_range(st, model, fn)
  for _, name in ipairs(st.order) do
    local k = st.kinds[name]
    if name ~= "grads" and not k.derived then  -- gradients do not outlive a step
      for _, u in ipairs(model.units) do
        local sh = k.shards[u.index]
        local lo, hi = nil, nil
        if sh then lo, hi = clip(st.layout[u.index], sh) end
        if lo then
          local v = sh.tensor:view(lo - sh.lo, { hi - lo })
          local ok, err = pcall(fn, name, u, lo, hi, v)
          if not ok then v:free(); error(err, 0) end
        end
      end
    end
  end
end

-- export(st, model, step) -> { step =, units = {{name, numel}...},
-- entries = { { kind, unit, lo, hi, tensor }... }, free = fn }: this rank's
-- ranges of every kind, unpadded (tensors are views; call :free() after use).
function M.export(st, model, step)
  local out = { step = step, units = {}, entries = {}, views = {} }
  for _, u in ipairs(model.units) do out.units[#out.units + 1] = { name = u.name, numel = u.numel } end
  each_range(st, model, function(name, u, lo, hi, v)
    out.views[#out.views + 1] = v                -- kept until out.free()
    out.entries[#out.entries + 1] = { kind = name, unit = u.name, lo = lo, hi = hi, tensor = v }
  end)
  function out.free()
    for _, v in ipairs(out.views) do v:free() end
    out.views, out.entries = {}, {}
  end
  return out
end

-- import(st, model, read): for every kind but grads and every unit, fill
-- this rank's range with read(kind, unit_name, lo, hi, dst, numel) (dst: a
-- tensor of hi - lo elements, on any tier; numel: the unit's element count
-- in this model, for the reader to check). Padding stays as it is (zero).
function M.import(st, model, read)
  each_range(st, model, function(name, u, lo, hi, v)
    read(name, u.name, lo, hi, v, u.numel)
    v:free()
  end)
end

-- reach(spans, lo) -> how far from lo the spans { {a, b}, ... } cover
-- [lo, reach) without a gap (a reader checks that it found every element).
function M.reach(spans, lo)
  table.sort(spans, function(x, y) return x[1] < y[1] end)
  local reach = lo
  for _, sp in ipairs(spans) do
    if sp[1] > reach then break end
    if sp[2] > reach then reach = sp[2] end
  end
  return reach
end

-- reader(exports) -> read function over one or more exports (e.g. every
-- rank's, gathered): copies the overlapping parts of matching entries (a
-- replicated kind appears in every rank's export: copies agree) and checks
-- that every element was found.
function M.reader(exports)
  local numel = {}      -- unit name -> element count in the saved model
  for _, ex in ipairs(exports) do
    for _, u in ipairs(ex.units or {}) do numel[u.name] = u.numel end
  end
  return function(kind, unit, lo, hi, dst, want_numel)
    if want_numel and numel[unit] and numel[unit] ~= want_numel then
      error(("state: unit %s has %d elements in the saved state but %d in this model: " ..
             "it was saved from another model size or vocabulary"):format(unit, numel[unit], want_numel), 0)
    end
    local spans = {}
    for _, ex in ipairs(exports) do
      for _, e in ipairs(ex.entries) do
        if e.kind == kind and e.unit == unit then
          local a, b = math.max(lo, e.lo), math.min(hi, e.hi)
          if b > a then
            local s = e.tensor:view(a - e.lo, { b - a })
            local d = dst:view(a - lo, { b - a })
            local ok, err = pcall(copy_any, d, s)
            s:free(); d:free()
            if not ok then error(err, 0) end
            spans[#spans + 1] = { a, b }
          end
        end
      end
    end
    local reach = M.reach(spans, lo)
    if reach < hi then
      error(("state: %s of %s [%d, %d) is not in the saved state (elements from %d are missing)")
            :format(kind, unit, lo, hi, reach), 0)
    end
  end
end

return M
