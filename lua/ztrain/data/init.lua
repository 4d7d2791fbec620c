-- ztrain.data: tokenizers, text datasets and batch loaders. Pure Lua + LuaJIT FFI
-- (libc only); produces plain ffi arrays, nothing here needs the C runtime.
--
--   local data = require "ztrain.data"
--   local tok = data.tokenizer("bytes")
--   local ds = assert(data.text{ text = "/usr/share/games/fortunes/*", exclude = "*.dat",
--                                tokenizer = tok, valid_fraction = 0.05 })
--   local L = assert(data.loader{ split = ds.train, B = 4, T = 128, seed = 1337 })
--   local x, y = L:batch(0)
--
-- See text.lua and loader.lua for the exact rules (file selection, split, windows,
-- shuffling, resume).
local M = {}

local tokenizers = {
  bytes = "ztrain.data.bytes",
}

-- Names of the known tokenizers, sorted.
function M.tokenizers()
  local names = {}
  for k in pairs(tokenizers) do names[#names + 1] = k end
  table.sort(names)
  return names
end

-- data.tokenizer(name) -> tokenizer { name, vocab_size, eot, encode, decode }.
-- A tokenizer object is returned as is.
function M.tokenizer(name)
  if type(name) == "table" and type(name.encode) == "function" then return name end
  if type(name) ~= "string" then
    error("data.tokenizer: expected a tokenizer name, got " .. type(name), 0)
  end
  local mod = tokenizers[name]
  if not mod then
    error(("data.tokenizer: unknown tokenizer %q (known: %s)"):format(name, table.concat(M.tokenizers(), ", ")), 0)
  end
  return require(mod)
end

M.text = require("ztrain.data.text").text        -- data.text(opts) -> ds | nil, err
M.loader = require("ztrain.data.loader").loader  -- data.loader(opts) -> L | nil, err

return M
