-- ztrain.model.lr: learning-rate schedules. warmup steps rise linearly to the base
-- rate, then "cosine" or "linear" decay to min_ratio * lr at the last step, or
-- "constant". Steps are 1-based.
local M = {}

M.defaults = { warmup = 0, schedule = "cosine", min_ratio = 0.1 }
M.schedules = { cosine = true, linear = true, constant = true }

-- make(base_lr, {warmup=, schedule=, min_ratio=}, total_steps) -> fn(step) -> lr
function M.make(base, opts, total)
  opts = opts or {}
  local warmup = opts.warmup or M.defaults.warmup
  local kind = opts.schedule or M.defaults.schedule
  local min_ratio = opts.min_ratio or M.defaults.min_ratio
  if not M.schedules[kind] then
    error(("unknown lr.schedule %q (known: cosine, linear, constant)"):format(tostring(kind)), 0)
  end
  if warmup < 0 or total < 1 then error("lr: warmup must be >= 0 and steps >= 1", 0) end
  local min_lr = base * min_ratio
  return function(step)
    if step <= warmup then return base * step / warmup end
    if kind == "constant" then return base end
    local span = total - warmup
    if span <= 0 then return base end
    local frac = (step - warmup) / span
    if frac > 1 then frac = 1 end
    if kind == "linear" then return base - (base - min_lr) * frac end
    return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * frac))
  end
end

return M
