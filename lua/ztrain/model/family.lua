-- ztrain.model.family: which model module a config belongs to. GPT-2
-- (model/gpt2.lua) and the Llama family (model/llama.lua) build the same
-- kind of object -- units with flat buffers, forward and backward -- so
-- strategies, drivers and the planner take either; this module is the one
-- place that picks: by a size's name, or by cfg.family.
local gpt2 = require "ztrain.model.gpt2"
local llama = require "ztrain.model.llama"

local M = {}

M.PAD = gpt2.PAD

-- module(cfg) -> model/gpt2 or model/llama
function M.module(cfg)
  return cfg.family == "llama" and llama or gpt2
end

-- config(size, {vocab_size=}) -> the named size's config, of either family
function M.config(size, over)
  if llama.is_size(size) then return llama.config(size, over) end
  if gpt2.sizes[size] then return gpt2.config(size, over) end
  local names = {}
  for k in pairs(gpt2.sizes) do names[#names + 1] = k end
  for k in pairs(llama.sizes) do names[#names + 1] = k end
  table.sort(names)
  error(("unknown model size %q (known: %s)"):format(tostring(size), table.concat(names, ", ")), 0)
end

-- new(cfg, opts) -> a model of cfg's family (gpt2.new's options)
function M.new(cfg, opts)
  return M.module(cfg).new(cfg, opts)
end

-- is_model(x) -> whether x is a model of either family
function M.is_model(x)
  local mt = type(x) == "table" and getmetatable(x)
  return mt == gpt2.Model or mt == llama.Model
end

return M
