-- ztrain.train.dsconfig_value: reading one value of a DeepSpeed config
-- (dsconfig.lua): its JSON kind checked and named by the key's path, and
-- the recipe key it maps to checked by the recipe's own rules, so a wrong
-- value is refused naming the file's key instead of read as absent or
-- passed on to a later layer.
local cjson = require "cjson.safe"
local errors = require "ztrain.core.errors"
local recipe = require "ztrain.train.recipe"
local adamw = require "ztrain.model.adamw"
local offload = require "ztrain.parallel.strategy.offload"
local fmt = require "ztrain.util.fmt"

local M = {}

local function refuse(fmt, ...) error(errors.user("ds-config: " .. fmt:format(...)), 0) end

-- An "auto" value left after fill_auto is one Hugging Face's Trainer does not fill either.
local function value(t, key, path)
  local v = t[key]
  if v == "auto" then
    refuse("%s is \"auto\", which ztrain fills only where Hugging Face's Trainer does (batch sizes, " ..
           "gradient_clipping, the optimizer's and scheduler's numbers, fp16/bf16.enabled); give a value", path)
  end
  if v == cjson.null then return nil end
  return v
end

-- JSON's kinds as DeepSpeed's schema names them. A decoded object and
-- array are both tables: an array's keys are 1..n, an object's are strings
-- (JSON has no other), and an empty table is either.
local KINDS = { string = "a string", number = "a number", boolean = "true or false", object = "an object",
                array = "an array" }

local function kind_of(v)
  if type(v) ~= "table" then return type(v) end
  if next(v) == nil then return "empty" end
  return #v > 0 and "array" or "object"
end

-- shown(v) -> v as the file writes it, for "got ..."
local function shown(v)
  local k = kind_of(v)
  if k == "string" then return ("%q"):format(v) end
  if k == "array" or k == "object" then return KINDS[k] end
  if k == "empty" then return "an empty array or object" end
  return tostring(v)
end

-- typed(t, key, path, kind) -> t[key] when it is of JSON kind `kind`, nil
-- when absent; any other kind refuses the file, naming the key's path: a
-- value of the wrong kind must not read as absent (fp16: true as fp32) or
-- reach the code that uses it (a number as a directory name)
local function typed(t, key, path, kind)
  local v = value(t, key, path)
  if v == nil then return nil end
  local k = kind_of(v)
  if k ~= kind and not (k == "empty" and (kind == "object" or kind == "array")) then
    refuse("%s must be %s, got %s", path, KINDS[kind], shown(v))
  end
  return v
end

local function number(t, key, path) return typed(t, key, path, "number") end
local function boolean(t, key, path) return typed(t, key, path, "boolean") end
local function object(t, key, path) return typed(t, key, path, "object") end
local function str(t, key, path) return typed(t, key, path, "string") end

-- num(x) -> the shortest text that reads back as x (3e-4, not 0.00029999...)
local num = fmt.shortest

-- text(v) -> v as a key=value override's value ({a,b} for pairs)
local function text(v)
  if type(v) == "table" then return ("{%s,%s}"):format(num(v[1]), num(v[2])) end
  if type(v) == "number" then return num(v) end
  return tostring(v)
end

-- Checks beyond the recipe's ranges, for values the recipe takes as is
-- and a later layer checks: the optimizer's betas, the nvme block size
-- (whole pages, the engine's limit; the queue depth's is the recipe's range)
local CHECK = {
  ["optim.betas"] = function(v) return adamw.check { betas = v } end,
  ["offload.block_size"] = function(v) return pcall(offload.disk_keys, { block_size = v }) end,
}

-- check(k, v, from): recipe key k takes v, by the recipe's own checks
-- (recipe.resolve: ranges, integers) and CHECK's; else the refusal names
-- `from`, the file's key, in the recipe check's words.
local function check(k, v, from)
  local ok, err = recipe.resolve({}, { k .. "=" .. text(v) })
  if ok and CHECK[k] then ok, err = CHECK[k](v) end
  if ok then return end
  err = tostring(err)
  if err:sub(1, #k) == k then err = from .. err:sub(#k + 1) else err = from .. ": " .. err end
  refuse("%s (ztrain's %s)", err, k)
end

M.refuse, M.value, M.typed, M.text, M.num, M.check = refuse, value, typed, text, num, check
M.number, M.boolean, M.object, M.str = number, boolean, object, str

return M
