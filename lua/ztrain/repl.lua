-- ztrain.repl: a read-eval-print loop with ztrain loaded as `zt`. Prints every
-- result, survives errors, accepts multi-line input (continues while the
-- chunk is incomplete). Line editing and completion come later.
local errors = require "ztrain.errors"

local M = {}

local function show(v, depth)
  depth = depth or 0
  if type(v) == "table" and getmetatable(v) == nil and depth < 2 then
    local parts, n = {}, 0
    for k, x in pairs(v) do
      n = n + 1
      if n > 20 then parts[#parts + 1] = "..."; break end
      parts[#parts + 1] = tostring(k) .. " = " .. show(x, depth + 1)
    end
    return "{ " .. table.concat(parts, ", ") .. " }"
  elseif type(v) == "string" and depth > 0 then return ("%q"):format(v) end
  return tostring(v)
end
M.show = show

local function compile(code)
  local f, err = loadstring("return " .. code, "=repl")
  if not f then f, err = loadstring(code, "=repl") end
  return f, err
end

-- eval(code, quiet) -> true | false, err. Prints results unless quiet.
function M.eval(code, quiet)
  local f, err = compile(code)
  if not f then return false, err end
  local res = { xpcall(f, function(e)
    -- a user error is its message; a bug keeps its location and a traceback
    -- of the user's frames (cut where the REPL called in)
    if errors.is_user(e) then return errors.message(e) end
    local tb = debug.traceback(errors.message(e), 2)
    return (tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
  end) }
  if not res[1] then return false, res[2] end
  if not quiet then
    for i = 2, table.maxn(res) do io.stdout:write(show(res[i]), i < table.maxn(res) and "\t" or "\n") end
  end
  return true
end

function M.loop()
  io.stdout:write(("%s -- Lua REPL, ztrain loaded as `zt`. Ctrl-D exits.\n"):format(zt.version()))
  local buf = nil
  while true do
    io.stdout:write(buf and ">> " or "zt> ")
    io.stdout:flush()
    local line = io.read("*l")
    if not line then io.stdout:write("\n"); return end
    buf = buf and (buf .. "\n" .. line) or line
    local f, err = compile(buf)
    if not f and err:match("<eof>") then
      -- incomplete chunk: keep reading
    else
      local ok, eerr = M.eval(buf)
      if not ok then io.stdout:write("error: ", tostring(eerr), "\n") end
      buf = nil
    end
  end
end

return M
