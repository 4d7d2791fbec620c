-- The runtime's messages name C things, never a recipe key (runtime/ztrain.h,
-- "Conventions"): the Lua code that hands a recipe's value to the runtime
-- names the key (lua/ztrain/core/ffi.lua check_key; Comm:use_nccl's key;
-- comm.watch's names). Every string literal of runtime/*.c is read and
-- none may hold "SECTION.key" for a section of the recipe. The behaviour
-- behind it: spec/c/test_runtime.c (the C side), device_spec,
-- comm_backend_spec and watchdog_spec (what a user reads).
local recipe = require "ztrain.train.recipe"

-- aio*.c: converted by its own change (its owner's, under way)
local SKIP = {}

local function sections()
  local s = {}
  for k, v in pairs(recipe.defaults) do
    if type(v) == "table" then s[#s + 1] = k end
  end
  table.sort(s)
  return s
end

local function literals(path)
  local f = assert(io.open(path, "rb"))
  local src = f:read("*a")
  f:close()
  src = src:gsub("/%*.-%*/", function(c) return (c:gsub("[^\n]", " ")) end)   -- comments out, lines kept
  local out = {}
  local line = 1
  local i = 1
  while true do
    local s, e = src:find('"[^"\n]*"', i)
    if not s then break end
    -- an escaped quote inside: extend to the real end
    while src:sub(e - 1, e - 1) == "\\" do
      local e2 = src:find('"', e + 1, true)
      if not e2 then break end
      e = e2
    end
    local _, nl = src:sub(i, s):gsub("\n", "")
    line = line + nl
    out[#out + 1] = { line = line, text = src:sub(s, e) }
    i = e + 1
  end
  return out
end

describe("the runtime's messages", function()
  it("name no recipe key (the Lua caller that passed the value names it)", function()
    local secs = sections()
    assert.is_true(#secs >= 10, "recipe sections: " .. table.concat(secs, " "))
    local found, n = {}, 0
    local p = io.popen("ls runtime/*.c")
    for path in p:lines() do
      if not SKIP[path] then
        n = n + 1
        for _, lit in ipairs(literals(path)) do
          for _, sec in ipairs(secs) do
            local at = lit.text:find("%f[%w_]" .. sec .. "%.[a-z]")
            -- "comm.h" and the like: a file name, not a key
            if at and not lit.text:find("^\"[%w_]+%.h\"$") then
              found[#found + 1] = ("%s:%d: %s"):format(path, lit.line, lit.text)
              break
            end
          end
        end
      end
    end
    p:close()
    assert.is_true(n >= 15, "only " .. n .. " files read")
    assert.are.same({}, found)
  end)
end)
