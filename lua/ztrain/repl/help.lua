-- ztrain.repl.help: `help(x)` and `?x` at the REPL.
--
--   help.text(zt.train, "zt.train") -> "zt.train  (lua/ztrain/init.lua:52)\n  train(...) -> ..."
--   help.text(zt.tensor)            -> the module's header comment and its functions
--
-- The documentation is the source's own comments, so it cannot drift from
-- the code: for a Lua function, the comment lines right above its
-- definition (found through debug.getinfo); for a module (a table in
-- package.loaded), the comment at the top of its file and the first line
-- of each function's comment; for an object (a tensor, a model, a
-- trainer), its class's module. help.register(value, text) adds text for
-- values that have no such comment (the REPL's own helpers).
local interrupt = require "ztrain.core.interrupt"
local M = {}

local registry = setmetatable({}, { __mode = "k" })

function M.register(value, text) registry[value] = text end

local cache = {}
local function lines_of(path)
  if cache[path] == nil then
    local f = io.open(path, "rb")
    local t = false
    if f then
      t = {}
      for l in f:lines() do t[#t + 1] = l end
      f:close()
    end
    cache[path] = t
  end
  return cache[path] or nil
end

local function short(path)
  local home = rawget(_G, "ZTRAIN_HOME")
  if home and path:sub(1, #home + 1) == home .. "/" then return path:sub(#home + 2) end
  return path
end

-- the comment block ending right above line n (or nil)
local function comment_above(lines, n)
  local out = {}
  local i = n - 1
  while i >= 1 and lines[i]:match("^%s*%-%-") do
    table.insert(out, 1, (lines[i]:gsub("^%s*%-%-+ ?", "")))
    i = i - 1
  end
  if #out == 0 then return nil end
  return table.concat(out, "\n")
end

-- function_doc(f) -> text, "file:line" | nil
function M.function_doc(f)
  f = interrupt.original(f) or f     -- ops are wrapped in a poll
  if registry[f] then return registry[f] end
  local info = debug.getinfo(f, "S")
  if not info or info.what ~= "Lua" or info.source:sub(1, 1) ~= "@" then return nil end
  local path = info.source:sub(2)
  local lines = lines_of(path)
  if not lines then return nil end
  local text = comment_above(lines, info.linedefined)
  if not text then return nil end
  return text, ("%s:%d"):format(short(path), info.linedefined)
end

-- module_name(t) -> the name under which t is in package.loaded
local function module_name(t)
  for name, v in pairs(package.loaded) do
    if rawequal(v, t) and type(name) == "string" and name:match("^ztrain") then return name end
  end
  for name, v in pairs(package.loaded) do if rawequal(v, t) and type(name) == "string" then return name end end
end

-- class_module(obj) -> the module whose table holds obj's metatable (a
-- tensor's is ztrain.tensor's Tensor), or whose functions its methods are
local function class_module(obj)
  local mt = getmetatable(obj)
  if type(mt) ~= "table" then return nil end
  local names = {}
  for name in pairs(package.loaded) do
    if type(name) == "string" and name:match("^ztrain") then names[#names + 1] = name end
  end
  table.sort(names)                           -- the same answer every time
  for _, name in ipairs(names) do
    local v = package.loaded[name]
    if type(v) == "table" then
      for _, x in pairs(v) do if rawequal(x, mt) then return name, v end end
    end
  end
end

local function header(path)
  local lines = lines_of(path)
  if not lines then return nil end
  local out = {}
  for _, l in ipairs(lines) do
    if not l:match("^%-%-") then break end
    out[#out + 1] = (l:gsub("^%-%-+ ?", ""))
  end
  return #out > 0 and table.concat(out, "\n") or nil
end

-- module_doc(t, name) -> text | nil
function M.module_doc(t, name)
  if registry[t] then return registry[t] end
  local mname = module_name(t)
  if not mname then return nil end
  local path = package.searchpath(mname, package.path)
  local parts = { header(path or "") or ("module " .. mname) }
  local fns = {}
  for k, v in pairs(t) do
    if type(k) == "string" and type(v) == "function" then
      local doc = M.function_doc(v)
      fns[#fns + 1] = ("  %s.%s%s"):format(name or mname, k, doc and ("  " .. doc:match("^[^\n]*")) or "")
    elseif type(k) == "string" and type(v) == "table" and module_name(v) then
      fns[#fns + 1] = ("  %s.%s  (module %s)"):format(name or mname, k, module_name(v))
    end
  end
  table.sort(fns)
  if #fns > 0 then parts[#parts + 1] = "\nfunctions and modules:\n" .. table.concat(fns, "\n") end
  return table.concat(parts, "\n"), path and short(path) or nil
end

-- name_of(x) -> "zt.tensor.new" for a value found in the zt namespace (two levels)
function M.name_of(x)
  local zt = rawget(_G, "zt")
  if type(zt) ~= "table" then return nil end
  if x == zt then return "zt" end
  for k, v in pairs(zt) do
    if v == x then return "zt." .. k end
  end
  for k, v in pairs(zt) do
    if type(v) == "table" and k ~= "ffi" then
      for k2, v2 in pairs(v) do if v2 == x then return ("zt.%s.%s"):format(k, k2) end end
    end
  end
end

-- text(x, name) -> the help text for value x (named `name` as the user typed it)
function M.text(x, name)
  name = name or M.name_of(x) or tostring(x)
  if type(x) == "function" then
    local doc, where = M.function_doc(x)
    if doc then return ("%s%s\n%s"):format(name, where and ("  (" .. where .. ")") or "", doc) end
  elseif type(x) == "table" then
    local doc, where = M.module_doc(x, name)
    if doc then return ("%s%s\n%s"):format(name, where and ("  (" .. where .. ")") or "", doc) end
    local cname, cmod = class_module(x)
    if cname then
      local cdoc, cwhere = M.module_doc(cmod, cname)
      local ms = {}
      local idx = rawget(getmetatable(x), "__index")
      for k, v in pairs(type(idx) == "table" and idx or {}) do
        if type(k) == "string" and type(v) == "function" then
          local d = M.function_doc(v)
          ms[#ms + 1] = ("  %s:%s%s"):format(name, k, d and ("  " .. d:match("^[^\n]*")) or "")
        end
      end
      table.sort(ms)
      if cdoc then
        return ("%s is a %s object%s\n%s%s"):format(name, cname, cwhere and ("  (" .. cwhere .. ")") or "",
          cdoc, #ms > 0 and ("\n\nmethods:\n" .. table.concat(ms, "\n")) or "")
      end
    end
  end
  return ("no documentation for %s"):format(name)
end

return M
