-- ztrain.util.json: the JSON codec ztrain writes and reads its files with.
--
-- Its own lua-cjson instance (cjson.new()), so loading ztrain changes no
-- setting of the `require "cjson"` that a user's script, a tool or a spec
-- shares (report.lua used to set them globally, and timeline.lua and
-- compare.lua made instances of their own to escape that). The settings:
-- numbers with 14 significant digits (a loss, a digest's timing), NaN and
-- infinities written as null (a diverged loss), an array too sparse for
-- lua-cjson's ratio (a table keyed by step or rank with gaps) written as an
-- object with string keys rather than refused.
local cjson = require("cjson").new()
cjson.encode_number_precision(14)
cjson.encode_invalid_numbers("null")
cjson.encode_sparse_array(true)

local M = {
  null = cjson.null,          -- JSON null (the same value as any cjson's)
  encode = cjson.encode,      -- encode(value) -> text; raises on what JSON cannot hold
  decode = cjson.decode,      -- decode(text) -> value; raises on malformed text
}

-- try_decode(text) -> value | nil, err: for files a user or a crash may have cut short
function M.try_decode(text)
  local ok, v = pcall(cjson.decode, text)
  if ok then return v end
  return nil, tostring(v)
end

return M
