-- ztrain.train.recipe_functions: a recipe's functions (a user schedule, a
-- strategy's option) as ranks compare them when they agree on a recipe
-- (recipe.serialize, trainer_build's check_agreement): by meaning, not by
-- bytecode. string.dump is not stable across processes in this LuaJIT (a
-- function holding a table constructor with several keys, such as
-- `{ op = "F", stage = 0, mb = i }`, dumps its template's keys in an order
-- that differs from process to process), so two ranks that loaded the same
-- file disagreed at random. A function is its source (file, or the chunk
-- a string was loaded from), its line range, a hash of the text of those
-- lines, and its upvalues that are plain values (numbers, strings,
-- booleans: `local n = 4` above it); other upvalues count by type only.
-- Two functions on the same lines of the same source with the same plain
-- upvalues compare equal.
local digest = require "ztrain.core.digest"

local M = {}

-- the lines first..last of a function's source: its file ("@path"), or
-- the chunk itself (load of a string); nil where there is none to read
local function source_lines(src, first, last)
  local text = src:sub(1, 1) ~= "@" and src:sub(1, 1) ~= "=" and src or nil
  if not text then
    local f = src:sub(1, 1) == "@" and io.open(src:sub(2), "rb")
    if not f then return nil end
    text = f:read("*a"); f:close()
  end
  local out, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if n >= first and n <= last then out[#out + 1] = line end
    if n > last then break end
  end
  return table.concat(out, "\n")
end

-- text(f) -> a function as ranks compare it: where it is defined
-- (source, line range), a hash of that source text, and its upvalues that
-- are plain values. Never string.dump: in this LuaJIT a function holding a
-- table constructor with several keys dumps differently in each process.
function M.text(f)
  local info = debug.getinfo(f, "S")
  if info.what == "C" then return "function:C" end
  local src = info.source or "?"
  local body = source_lines(src, info.linedefined, info.lastlinedefined)
  local ups = {}
  for i = 1, 255 do
    local name, val = debug.getupvalue(f, i)
    if not name then break end
    local t = type(val)
    ups[#ups + 1] = name .. "=" .. ((t == "number" or t == "string" or t == "boolean") and
                                    ("%q"):format(tostring(val)) or t)
  end
  return ("function:%s:%d-%d:%s:%s"):format(src:sub(1, 1) == "@" and src:sub(2) or "chunk", info.linedefined,
         info.lastlinedefined, body and digest.string(body):sub(1, 16) or "?",
         digest.string(table.concat(ups, ",")):sub(1, 16))
end

return M
