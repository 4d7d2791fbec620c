-- ztrain.repl.pretty: how the REPL shows a value.
--
--   pretty.show(t)        -- a tensor: shape, dtype, tier, category, bytes, a few values
--   pretty.show(model)    -- a GPT-2 model: its config and units with their sizes
--   pretty.show(tr)       -- a trainer (zt.train(..., {keep = true})): strategy, step, model
--   pretty.show(summary)  -- a run's summary, or a list of them: the seeds' results table
--   pretty.show(x)        -- anything else: tables one level deep, strings quoted inside
local ffi = require "ffi"
local memory = require "ztrain.core.memory"
local tensor = require "ztrain.core.tensor"
local family = require "ztrain.model.family"

local M = {}

local MAX_VALUES = 6

local function is_tensor(x) return type(x) == "table" and tensor.is_tensor(x) end
local function is_model(x) return family.is_model(x) end
local function is_trainer(x)
  return type(x) == "table" and type(x.train_step) == "function" and type(x.recipe) == "table"
end
local function is_summary(x)
  return type(x) == "table" and x.param_digest ~= nil and x.strategy ~= nil and x.steps ~= nil
end

local function num(v)
  if v ~= v then return "nan" end
  if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  return ("%.6g"):format(v)
end

-- bf16 / f16 bits -> number
local u32f = ffi.new("union { uint32_t u; float f; }")
local function bf16(b) u32f.u = b * 65536; return u32f.f end
local function f16(b)
  local s = b >= 0x8000 and -1 or 1
  local e, m = math.floor(b / 1024) % 32, b % 1024
  if e == 0 then return s * m * 2 ^ -24 end
  if e == 31 then return m == 0 and s * math.huge or 0 / 0 end
  return s * (1 + m / 1024) * 2 ^ (e - 15)
end

-- values(t) -> the first few values, and min / max / mean over all (fp64)
local function values(t)
  local n, dt = t:numel(), t:dtype()
  local ct = dt == "f32" and "float[?]" or dt == "i32" and "int32_t[?]" or "uint16_t[?]"
  local buf = ffi.new(ct, n)
  t:read(buf)
  local conv = (dt == "bf16" and bf16) or (dt == "f16" and f16) or tonumber
  local first, lo, hi, sum = {}, math.huge, -math.huge, 0
  for i = 0, n - 1 do
    local v = conv(buf[i])
    if i < MAX_VALUES then first[#first + 1] = num(v) end
    if v < lo then lo = v end
    if v > hi then hi = v end
    sum = sum + v
  end
  return first, lo, hi, sum / n
end

-- tensor(t) -> "Tensor f32 [2, 3]  device  params  24 B\n  values 1, 1, ... min 1 max 1 mean 1"
function M.tensor(t)
  if t.c == nil then return "Tensor (freed)" end
  local head = ("Tensor %s [%s]  %s  %s  %s (%d elements)"):format(t:dtype(), table.concat(t:shape(), ", "),
    t:tier(), t:category(), memory.format(t:nbytes()), t:numel())
  local ok, first, lo, hi, mean = pcall(values, t)
  if not ok then return head .. "\n  (values not readable: " .. tostring(first) .. ")" end
  local more = t:numel() > MAX_VALUES and ", ..." or ""
  return ("%s\n  values %s%s\n  min %s  max %s  mean %s"):format(head, table.concat(first, ", "), more,
    num(lo), num(hi), num(mean))
end

-- model(m) -> its config and a table of units (params, held here or not)
function M.model(m)
  local c = m.cfg
  local out = { ("GPT-2 %s: %s parameters, %d layers, %d channels, %d heads, vocabulary %d, context %d")
                :format(c.name or "?", num(m.nparams), c.L, c.C, c.NH, c.V, c.maxT) }
  out[#out + 1] = ("  %-4s %-10s %12s %12s  %s"):format("#", "unit", "params", "bytes (f32)", "buffer here")
  local shown = 0
  for i, u in ipairs(m.units) do
    if shown < 8 or i == #m.units then
      local here = u.params and ("%s %s"):format(u.params:tier(), memory.format(u.params:nbytes())) or "-"
      out[#out + 1] = ("  %-4d %-10s %12s %12s  %s"):format(i, u.name, num(u.numel), memory.format(4 * u.numel), here)
      shown = shown + 1
    elseif shown == 8 then
      out[#out + 1] = ("  ... %d more units"):format(#m.units - 9)
      shown = shown + 1
    end
  end
  return table.concat(out, "\n")
end

function M.trainer(tr)
  local r = tr.recipe
  local head = ("Trainer: %s on rank %d of %d, step %d of %d, micro-batch %d x %d tokens, accumulate %d")
               :format(tr.strategy and tr.strategy.name or "?", tr.rank or 0, tr.world_size or 1, tr.step or 0,
                       r.train.steps, r.batch.micro, r.data.seq_len, tr.accumulate or 1)
  local body = tr.model and M.model(tr.model) or "  (freed)"
  return head .. "\n" .. body ..
         "\n  tr:evaluate(), tr:sample{prompt = ...}, tr:param_digest(), tr:state(), tr:free()"
end

-- summaries(list) -> the seeds' TRAINING_RESULTS table, one row per run
local function peak(s, key)
  local m = 0
  for _, r in ipairs(type(s.memory) == "table" and s.memory or {}) do m = math.max(m, r[key] or 0) end
  return memory.format(m)
end
local function fnum(x, f) return type(x) == "number" and f:format(x) or "-" end

function M.summaries(list)
  local head = { "Strategy", "Ranks", "Steps", "Time/step", "Tokens/s", "Peak device", "Peak host",
                 "Final loss", "Eval loss", "Digest", "Exit" }
  local rows = { head }
  local first = list[1] and list[1].param_digest
  for _, s in ipairs(list) do
    local d = type(s.param_digest) == "string" and s.param_digest:sub(1, 12) or "-"
    if #list > 1 and type(first) == "string" then d = d .. (s.param_digest == first and " (=)" or " (differs)") end
    rows[#rows + 1] = { tostring(s.strategy), tostring(s.world_size or 1), tostring(s.steps),
      fnum(s.step_ms_median, "%.1f ms"), fnum(s.tokens_per_s, "%.0f"), peak(s, "device_peak"), peak(s, "host_peak"),
      fnum(s.final_loss, "%.4f"), fnum(s.eval_loss, "%.4f"), d, tostring(s.exit or "") }
  end
  local w = {}
  for _, r in ipairs(rows) do for j, c in ipairs(r) do w[j] = math.max(w[j] or 0, #c) end end
  local out = {}
  for i, r in ipairs(rows) do
    local cells = {}
    for j, c in ipairs(r) do cells[j] = c .. (" "):rep(w[j] - #c) end
    out[#out + 1] = "| " .. table.concat(cells, " | ") .. " |"
    if i == 1 then
      local dash = {}
      for j = 1, #r do dash[j] = ("-"):rep(w[j]) end
      out[#out + 1] = "|-" .. table.concat(dash, "-|-") .. "-|"
    end
  end
  local s1 = list[1]
  if s1 and type(s1.model) == "table" then
    table.insert(out, 1, ("%s (%s params), %s"):format(tostring(s1.model.name), num(s1.model.params or 0),
                                                       tostring(s1.recipe)))
  end
  return table.concat(out, "\n")
end

local function plain(v, depth)
  depth = depth or 0
  if type(v) == "table" and getmetatable(v) == nil and depth < 2 then
    local parts, n = {}, 0
    for k, x in pairs(v) do
      n = n + 1
      if n > 20 then parts[#parts + 1] = "..."; break end
      parts[#parts + 1] = tostring(k) .. " = " .. plain(x, depth + 1)
    end
    return "{ " .. table.concat(parts, ", ") .. " }"
  elseif type(v) == "string" and depth > 0 then return ("%q"):format(v) end
  return tostring(v)
end
M.plain = plain

-- show(v) -> text
function M.show(v)
  local ok, text = pcall(function()
    if is_tensor(v) then return M.tensor(v) end
    if is_model(v) then return M.model(v) end
    if is_trainer(v) then return M.trainer(v) end
    if is_summary(v) then return M.summaries({ v }) end
    if type(v) == "table" and #v > 0 and is_summary(v[1]) then return M.summaries(v) end
  end)
  if ok and text then return text end
  return plain(v)
end

return M
