-- ztrain.model.data: tokenizers, datasets and batch loaders. Pure Lua + LuaJIT FFI
-- (libc only); produces plain ffi arrays, nothing here needs the C runtime.
--
--   local data = require "ztrain.model.data"
--   local tok = data.tokenizer("bpe")                 -- or "bytes", "bpe:DIR", "hf:DIR"
--   local ds = assert(data.open{ text = "/usr/share/games/fortunes/*", exclude = "*.dat",
--                                tokenizer = tok, valid_fraction = 0.05, seq_len = 128 })
--   local L = assert(data.loader{ split = ds.train, B = 4, T = 128, seed = 1337 })
--   local x, y = L:batch(0)
--
-- data.open (source.lua) takes text globs, a WikiText raw directory or llm.c .bin
-- token files and caches tokenisation on disk; data.text (text.lua) is the text-glob
-- dataset alone. See text.lua, wikitext.lua, tokbin.lua, cache.lua and loader.lua for
-- the exact rules (file selection, splits, windows, shuffling, resume).
local tokenizer = require "ztrain.model.data.tokenizer"

local M = {}

-- tokenizers by name (data/tokenizer.lua, which data.text uses too)
M.home, M.BPE_DEFAULT = tokenizer.home, tokenizer.BPE_DEFAULT
M.tokenizers, M.tokenizer = tokenizer.names, tokenizer.get

M.text = require("ztrain.model.data.text").text        -- data.text(opts) -> ds | nil, err (text globs only)
M.open = require("ztrain.model.data.source").open      -- data.open(opts) -> ds | nil, err (any source)
M.loader = require("ztrain.model.data.loader").loader  -- data.loader(opts) -> L | nil, err

return M
