-- ztrain.train.dsconfig_file: a DeepSpeed config file read and checked as
-- JSON (train/dsconfig.lua maps its keys): one line naming the file for a
-- missing or unreadable file, a directory, bad JSON, an array, or a number
-- JSON's 1e999 makes infinite.
local cjson = require "cjson.safe"
local errors = require "ztrain.core.errors"

local M = {}

local function refuse(fmt, ...) error(errors.user("ds-config: " .. fmt:format(...)), 0) end

-- finite(v, where): every number in a decoded value is finite (JSON's
-- 1e999 decodes to inf, which no setting takes)
local function finite(v, where)
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      refuse("%s is %s, not a finite number; give a value in range", where, tostring(v))
    end
  elseif type(v) == "table" then
    for k, x in pairs(v) do finite(x, where == "" and tostring(k) or (where .. "." .. tostring(k))) end
  end
end

-- read(path) -> the decoded JSON table
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then refuse("cannot read %s", err) end              -- io.open's message names the path
  -- a directory opens on Linux, and reading it fails
  local text, rerr = f:read("*a")
  f:close()
  if not text then refuse("cannot read %s: %s (a DeepSpeed config is a JSON file)", path, tostring(rerr)) end
  -- a UTF-8 byte order mark (Windows editors write one) is not JSON: skip it
  text = text:gsub("^\239\187\191", "")
  local t, jerr = cjson.decode(text)
  if type(t) ~= "table" then
    refuse("%s is not a JSON object%s", path, jerr and (": " .. tostring(jerr)) or "")
  end
  if #t > 0 or (next(t) == nil and text:match("^%s*%[")) then
    refuse("%s holds a JSON array, not an object: a DeepSpeed config is an object of keys " ..
           "(\"train_batch_size\", \"optimizer\", ...)", path)
  end
  finite(t, "")
  return t
end

return M
