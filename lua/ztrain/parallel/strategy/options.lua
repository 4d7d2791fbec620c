-- ztrain.parallel.strategy.options: what every strategy object is checked against.
--
-- A strategy is a table of hooks (docs/strategies.md). The recipe resolver
-- checks it once (validate), so a missing or misspelt hook is an error when
-- the recipe is read, not "attempt to call a nil value" in the middle of a
-- step; constructors check their options (check), so an unknown option is
-- an error naming the valid ones instead of being silently ignored.
local M = {}

-- Hooks a strategy must define.
M.required = { "setup", "step" }
-- Per-unit hooks every driver calls; missing ones are no-ops.
M.unit_hooks = { "pre_forward", "post_forward", "pre_backward", "post_input_grad", "pre_weight_grad",
                 "post_backward" }
-- Other optional members.
M.optional = { "free", "reduce_loss", "with_full_params", "predicted", "pad", "finish_grads",
               "state", "load_state", "describe", "footprint" }

local suggest = require "ztrain.util.suggest"
local state = require "ztrain.parallel.strategy.state"

local function nearest(word, list)
  -- a prefix is a strong hint ("defer" -> "defer_reduction")
  return suggest.nearest(word, list, function(w, c)
    return (c:sub(1, #w) == w or w:sub(1, #c) == c) and math.max(suggest.distance(w, c) - 1, 0) or 0
  end)
end

-- check(strategy_name, opts, valid) -> opts: every key of opts must be in
-- valid (a list of names); else an error naming the key and the valid ones.
function M.check(name, opts, valid)
  opts = opts or {}
  if type(opts) ~= "table" then
    error(("%s: options must be a table, got %s"):format(name, type(opts)), 0)
  end
  for k in pairs(opts) do
    local ok = false
    for _, v in ipairs(valid) do if v == k then ok = true end end
    if not ok then
      local hint = ""
      if #valid > 0 then
        local near, d = nearest(tostring(k), valid)
        hint = (d <= 3 and ("did you mean %q? "):format(near) or "") ..
               "valid options: " .. table.concat(valid, ", ")
      else
        hint = "it takes no options"
      end
      error(("%s: unknown option %q; %s"):format(name, tostring(k), hint), 0)
    end
  end
  return opts
end

-- complete(S) -> S with missing per-unit hooks set to no-ops (so wrappers
-- can call any hook of any strategy), and state / load_state defaulting to
-- the generic ones over ctx.state (strategy/state.lua).
local function noop() end
local function default_state(ctx)
  return state.export(ctx.state, ctx.model, ctx.optim.t)
end
local function default_load_state(ctx, read)
  state.import(ctx.state, ctx.model, read)
end
function M.complete(S)
  for _, h in ipairs(M.unit_hooks) do if S[h] == nil then S[h] = noop end end
  if S.state == nil then S.state = default_state end
  if S.load_state == nil then S.load_state = default_load_state end
  return S
end

-- validate(S) -> S, or raises: required hooks present, every hook a
-- function, no unknown member that looks like a misspelt hook.
function M.validate(S)
  local label = ("strategy %q"):format(tostring(rawget(S, "name") or S.name or "?"))
  for _, h in ipairs(M.required) do
    if type(S[h]) ~= "function" then
      error(("%s has no %s hook: a strategy needs %s (and may define %s; docs/strategies.md)")
            :format(label, h, table.concat(M.required, ", "), table.concat(M.unit_hooks, ", ")), 0)
    end
  end
  local known = {}
  for _, list in ipairs({ M.required, M.unit_hooks, M.optional }) do
    for _, h in ipairs(list) do
      known[h] = true
      if S[h] ~= nil and type(S[h]) ~= "function" then
        error(("%s: hook %s must be a function, got %s"):format(label, h, type(S[h])), 0)
      end
    end
  end
  local hooks = {}
  for _, list in ipairs({ M.required, M.unit_hooks, M.optional }) do
    for _, h in ipairs(list) do hooks[#hooks + 1] = h end
  end
  for k, v in pairs(S) do
    if type(k) == "string" and not known[k] and type(v) == "function" then
      local near, d = nearest(k, hooks)
      if d <= 2 then
        error(("%s: unknown hook %s; did you mean %s?"):format(label, k, near), 0)
      end
    end
  end
  return M.complete(S)
end

return M
