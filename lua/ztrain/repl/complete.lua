-- ztrain.repl.complete: Tab completion candidates for the REPL.
--
--   complete.candidates("zt.tensor.ne")  -> { "zt.tensor.new" }
--   complete.candidates("t:sh")          -> { "t:shape" }        (t a tensor)
--   complete.candidates("pri")           -> { "print" }          (globals, keywords)
--
-- The text is the word under the cursor ('.' and ':' are not word breaks).
-- A dotted prefix is looked up from the globals (the REPL's `local`s are
-- globals too, repl.lua), never by calling anything but __index: fields of
-- tables, then of their metatables' __index tables (an object's methods);
-- after ':' only functions.
local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
                   "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

local function index(v, k)
  local ok, x = pcall(function() return v[k] end)
  if ok then return x end
end

-- names(v, methods) -> identifier keys of v and of its __index chain
-- (functions only when methods)
local function names(v, methods)
  local out, seen = {}, {}
  for _ = 1, 8 do                             -- a chain deeper than this is a loop
    if type(v) == "table" then
      for k, x in pairs(v) do
        if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] and
           (not methods or type(x) == "function") then
          seen[k] = true
          out[#out + 1] = k
        end
      end
    end
    local mt = getmetatable(v)
    local idx = type(mt) == "table" and rawget(mt, "__index") or nil
    if type(idx) ~= "table" then break end
    v = idx
  end
  return out
end

-- resolve("a.b.c", env) -> the value, or nil when any step is missing
local function resolve(path, env)
  local v = env
  for part in path:gmatch("[^%.]+") do
    v = index(v, part)
    if v == nil then return nil end
  end
  return v
end

-- candidates(text, env) -> sorted list of completions of text (full words)
function M.candidates(text, env)
  env = env or _G
  local out = {}
  local base, sep, part = text:match("^([%a_][%w_%.]*)([%.:])([%a_]?[%w_]*)$")
  if base and not base:find("%.%.") and not base:find("%.$") then
    local v = resolve(base, env)
    if v == nil then return out end
    if type(v) == "string" then v = string end         -- ("x"):upper
    for _, k in ipairs(names(v, sep == ":")) do
      if k:sub(1, #part) == part then out[#out + 1] = base .. sep .. k end
    end
  elseif text:match("^[%a_]?[%w_]*$") then
    for _, k in ipairs(names(env, false)) do
      if k:sub(1, #text) == text then out[#out + 1] = k end
    end
    for _, k in ipairs(KEYWORDS) do
      if k:sub(1, #text) == text and index(env, k) == nil then out[#out + 1] = k end
    end
  end
  table.sort(out)
  return out
end

return M
