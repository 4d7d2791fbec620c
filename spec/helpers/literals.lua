-- spec/helpers/literals.lua -- the string literals of a Lua or C source
-- file, comments skipped, escapes decoded: literals(text, lang) -> list of
-- { text = ..., line = N, concat = true where a Lua ".." joins it to more }.
-- lang is "lua" or "c". Adjacent C literals ("a" "b") stay two entries; Lua
-- long strings ([[...]], [==[...]==]) count.
local M = {}

local ESC = { n = "\n", t = "\t", r = "\r", a = "\a", b = "\b", f = "\f", v = "\v",
              ["\\"] = "\\", ['"'] = '"', ["'"] = "'", ["\n"] = "\n", ["0"] = "\0" }

-- a quoted literal opened at i by q: its decoded text and the index after it
local function quoted(src, i, q)
  local parts, j = {}, i + 1
  while true do
    local k = src:find("[\\\n" .. q .. "]", j)
    if not k then return table.concat(parts) .. src:sub(j), #src + 1 end
    parts[#parts + 1] = src:sub(j, k - 1)
    local c = src:sub(k, k)
    if c ~= "\\" then return table.concat(parts), k + 1 end   -- the quote, or an unclosed line
    local e = src:sub(k + 1, k + 1)
    if e:find("%d") then
      local digits = src:match("^%d%d?%d?", k + 1)
      parts[#parts + 1] = string.char(tonumber(digits) % 256); j = k + 1 + #digits
    elseif e == "x" then
      local hex = src:match("^%x%x?", k + 2) or ""
      parts[#parts + 1] = hex ~= "" and string.char(tonumber(hex, 16)) or ""; j = k + 2 + #hex
    else
      parts[#parts + 1] = ESC[e] or e; j = k + 2
    end
  end
end

-- the index after a Lua long bracket [==[ ... ]==] opened at i (nil: not one)
local function long_bracket(src, i)
  local eq = src:match("^%[(=*)%[", i)
  if not eq then return nil end
  local open_end = i + #eq + 2
  local s, e = src:find("]" .. eq .. "]", open_end, true)
  if not s then return #src + 1, src:sub(open_end) end
  return e + 1, src:sub(open_end, s - 1):gsub("^\n", "")
end

local function line_at(src, i, state)
  local _, n = src:sub(state.pos, i):gsub("\n", "")
  state.line, state.pos = state.line + n, i + 1
  return state.line
end

function M.literals(src, lang)
  local out, i, st = {}, 1, { line = 1, pos = 1 }
  local starts = lang == "lua" and "[\"'%-%[]" or "[\"'/]"
  while true do
    i = src:find(starts, i)
    if not i then return out end
    local c, c2 = src:sub(i, i), src:sub(i + 1, i + 1)
    if lang == "lua" and c == "-" and c2 == "-" then
      i = long_bracket(src, i + 2) or (src:find("\n", i, true) or #src) + 1
    elseif lang == "c" and c == "/" and c2 == "/" then
      i = (src:find("\n", i, true) or #src) + 1
    elseif lang == "c" and c == "/" and c2 == "*" then
      i = (select(2, src:find("*/", i + 2, true)) or #src) + 1
    elseif lang == "lua" and c == "[" then
      local after, text = long_bracket(src, i)
      if after then out[#out + 1] = { text = text, line = line_at(src, i, st) }; i = after
      else i = i + 1 end
    elseif c == '"' or (c == "'" and lang == "lua") then
      local text, after = quoted(src, i, c)
      local concat = lang == "lua" and (src:find("^%s*%.%.", after)
                                        or src:sub(math.max(1, i - 40), i - 1):find("%.%.%s*$"))
      out[#out + 1] = { text = text, line = line_at(src, i, st), concat = concat ~= nil }; i = after
    elseif c == "'" then                                  -- a C character literal
      i = (src:find("'", i + (c2 == "\\" and 3 or 2), true) or #src) + 1
    else
      i = i + 1
    end
  end
end

-- pieces(text) -> the runs of a format string between its directives
-- (%s, %d, %5.1f, %zu, %lld, %q, ... ; "%%" is a "%") and newlines
function M.pieces(text)
  local out, i = {}, 1
  text = text:gsub("%%%%", "\1")
  while true do
    local s, e = text:find("%%[-+ #0]*[%d%*]*%.?[%d%*]*[hlLqjzt]*[a-zA-Z]?", i)
    local nl = text:find("\n", i, true)
    if nl and (not s or nl < s) then s, e = nl, nl end
    out[#out + 1] = (text:sub(i, (s or #text + 1) - 1):gsub("\1", "%%"))
    if not s then return out end
    i = e + 1
  end
end

return M
