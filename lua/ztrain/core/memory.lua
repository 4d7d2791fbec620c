-- ztrain.core.memory: the runtime's byte accounting by tier and category.
local zffi = require "ztrain.core.ffi"
local T = require "ztrain.core.tensor"
local interrupt = require "ztrain.core.interrupt"
local C, check = zffi.C, zffi.check

local M = {}
M.tiers = { "device", "host", "nvme" }
M.categories = { "params", "grads", "optim", "activations", "comm", "other" }

local UNITS = { [""] = 1, b = 1, k = 1e3, kb = 1e3, m = 1e6, mb = 1e6, g = 1e9, gb = 1e9,
                kib = 2^10, mib = 2^20, gib = 2^30, tib = 2^40, t = 1e12, tb = 1e12 }

-- the bytes a size names, before rounding down to whole bytes
local function size_of(s)
  if type(s) == "number" then return s end
  if type(s) ~= "string" then return nil, "a size must be a number or a string like \"2GiB\"" end
  local num, unit = s:lower():gsub("%s", ""):match("^([%d%.]+)(%a*)$")
  local mult = unit and UNITS[unit]
  if not num or not tonumber(num) or not mult then
    return nil, ("cannot read size %q (use bytes or a unit: KiB, MiB, GiB, KB, MB, GB)"):format(s)
  end
  return tonumber(num) * mult
end

-- parse_size("1.5GiB") -> bytes; numbers pass through. nil, err on bad input.
function M.parse_size(s)
  local n, err = size_of(s)
  if not n then return nil, err end
  return math.floor(n)
end

-- The smallest limit parse_limit takes: one page (a tier limit below it
-- holds no allocation; 0.5 rounded down would read as 0, "no limit").
M.PAGE = 4096

-- parse_limit(s) -> bytes of a memory limit, 0 for none (0 as written);
-- nil, err for a size that is not 0 and under one page, or negative.
function M.parse_limit(s)
  local n, err = size_of(s)
  if not n then return nil, err end
  if n ~= 0 and not (n >= M.PAGE) then
    return nil, ("%s is %.17g bytes, not 0 (no limit) and below one page (%d bytes): give a size such as " ..
                 "2GiB, or 0 for no limit"):format(type(s) == "string" and ("%q"):format(s) or tostring(s), n, M.PAGE)
  end
  return math.floor(n)
end

function M.format(bytes)
  local u, v, i = { "B", "KiB", "MiB", "GiB", "TiB" }, bytes, 1
  while v >= 1024 and i < #u do v, i = v / 1024, i + 1 end
  return i == 1 and ("%d B"):format(v) or ("%.2f %s"):format(v, u[i])
end

function M.set_limit(tier, bytes)
  check(C.zt_mem_set_limit(T.TIER[tier], bytes or 0), "memory.set_limit")
end
function M.limit(tier) return tonumber(C.zt_mem_limit(T.TIER[tier])) end
function M.current(tier, cat) return tonumber(C.zt_mem_current(T.TIER[tier], cat and T.CATEGORY[cat] or -1)) end
function M.peak(tier, cat) return tonumber(C.zt_mem_peak(T.TIER[tier], cat and T.CATEGORY[cat] or -1)) end
function M.reset_peak() C.zt_mem_reset_peak() end

-- Snapshot: { device = {current=, peak=, by_category = {params = {current=, peak=}, ...}}, ...}
function M.stats()
  local out = {}
  for _, tier in ipairs(M.tiers) do
    local by = {}
    for _, cat in ipairs(M.categories) do
      by[cat] = { current = M.current(tier, cat), peak = M.peak(tier, cat) }
    end
    out[tier] = { current = M.current(tier), peak = M.peak(tier), by_category = by }
  end
  return out
end

-- Ctrl-C (at the REPL) stops a loop of reads of the counters (settings,
-- which a run's clean-up puts back, never poll)
interrupt.check_all(M, { "limit", "current", "peak", "stats" })

return M
