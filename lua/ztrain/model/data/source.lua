-- ztrain.model.data.source: data.open, the one entry point from a recipe's data block to
-- token streams.
--
--   local ds, err = data.open{
--     text = ...,              -- what to read (below); a recipe's data.text
--     exclude = "*.dat",       -- globs left out (text globs and .bin globs)
--     tokenizer = tok,         -- object or name (data.tokenizer)
--     valid_fraction = 0.05,   -- text globs only: the validation cut of each file
--     cache = nil,             -- tokenisation cache dir; nil or "" = the default
--                              -- ($ZTRAIN_CACHE, $XDG_CACHE_HOME/ztrain, ~/.cache/ztrain);
--                              -- false or "off" = none (cache.lua)
--     seq_len = 128,           -- optional: the train split must hold seq_len + 1 tokens
--   }
--   -- ds = { kind = "text"|"wikitext"|"bin", train, valid, test (when the source has one),
--   --        tokenizer, vocab_size, files, file_info, seconds, cache, warnings, describe() }
--   -- each split = { tokens = uint16_t[n] | int32_t[n], n, dtype, name = "train"|"validation"|"test" }
--
-- `text` is one of:
--   "wikitext:DIR", or a directory holding wiki.train.raw
--        the WikiText raw release, split by its own files (wikitext.lua)
--   "bin:TRAIN[,VALID[,TEST]]"
--        llm.c token files (tokbin.lua); each of TRAIN, VALID, TEST is a path or a glob
--        (an empty one = no such split); several files of one split are concatenated
--        in sorted order
--   a glob (or list of globs) ending in ".bin", or a directory of *.bin files
--        llm.c token files split by llm.c's naming: a base name with "_train" is
--        train, "_val" validation, "_test" test (tiny_shakespeare_train.bin,
--        fineweb_val_000000.bin); any other name is an error
--   any other glob or list of globs
--        text files, cut into train and validation by valid_fraction (text.lua)
-- Token files are taken as they are (they carry their own document separators; no
-- eot is added) and every id is checked against the tokenizer's vocabulary: the
-- tokenizer must be the one the files were made with. valid_fraction does not apply
-- to WikiText or token files: they bring their own splits.
local text = require "ztrain.model.data.text"
local wikitext = require "ztrain.model.data.wikitext"
local tokbin = require "ztrain.model.data.tokbin"
local cache = require "ztrain.model.data.cache"

local M = {}

local known_keys = { text = true, exclude = true, tokenizer = true, valid_fraction = true, cache = true,
                     seq_len = true }

local SPLITS = { { key = "train", name = "train" }, { key = "valid", name = "validation" },
                 { key = "test", name = "test" } }

local function is_dir(path)
  local st = cache.stat(path)
  return st and st.kind == "dir"
end

local function has_magic(s) return s:find("[*?%[{~]") ~= nil end

---------------------------------------------------------------------------
-- llm.c token files

local BinDataset = {}
BinDataset.__index = BinDataset

function BinDataset:describe()
  local parts = {}
  for _, s in ipairs(SPLITS) do
    local nf = #self.groups[s.key]
    if nf > 0 then
      parts[#parts + 1] = ("%s %d tokens (%d file%s)"):format(s.name, self[s.key].n, nf, nf == 1 and "" or "s")
    elseif s.key == "valid" then
      parts[#parts + 1] = "no validation files"
    end
  end
  return ("llm.c token files: %s (%s, vocab %d); loaded in %.3f s")
    :format(table.concat(parts, ", "), self.tokenizer.name or "?", self.vocab_size, self.seconds)
end

-- groups = { train = {paths}, valid = {paths}, test = {paths} } -> ds | nil, err
local function open_bins(groups, tok, skipped)
  local t0 = os.clock()
  if #groups.train == 0 then
    return nil, "data: no training token file (llm.c names them *_train*.bin; or give data.text = \"bin:TRAIN.bin,VAL.bin\")"
  end
  local V = tok.vocab_size
  local ds = { kind = "bin", groups = groups, files = {}, file_info = {}, skipped = skipped or {}, tokenizer = tok,
               vocab_size = V, bytes = 0 }
  for _, s in ipairs(SPLITS) do
    local list = groups[s.key]
    if #list > 0 or s.key == "valid" then
      local tabs, wide = {}, false
      for _, p in ipairs(list) do
        local t, err = tokbin.read(p)
        if not t then return nil, "data: " .. err end
        -- the ids must fit the vocabulary the model will be built for
        local tk = t.tokens
        for i = 0, t.n - 1 do
          if tk[i] >= V then
            return nil, ("data: token file %s holds id %d at position %d, outside the %s tokenizer's %d ids: "
                         .. "set data.tokenizer to the vocabulary the file was made with (e.g. \"hf:DIR\" or "
                         .. "\"bpe:DIR\")"):format(p, tonumber(tk[i]), i, tostring(tok.name), V)
          end
        end
        tabs[#tabs + 1] = t
        wide = wide or t.width == 4
        ds.files[#ds.files + 1] = p
        ds.file_info[#ds.file_info + 1] = { path = p, split = s.key, tokens = t.n }
      end
      local dtype = (wide or V > 65536) and "int32_t" or "uint16_t"
      local sp
      if #tabs == 1 and tabs[1].dtype == dtype then
        -- one file: its array is the split (no second copy of a big shard)
        local t = tabs[1]
        sp = { tokens = t.tokens, n = t.n, dtype = dtype, name = s.name }
      else
        local parts = {}
        for i, t in ipairs(tabs) do parts[i] = { ids = t.tokens, n = t.n } end
        sp = text.build_split(parts, dtype, nil, s.name)
      end
      sp.source = #list == 1 and list[1] or (#list .. " files")
      ds[s.key] = sp
    end
  end
  ds.seconds = os.clock() - t0
  return setmetatable(ds, BinDataset)
end

-- llm.c's naming: *_train*, *_val*, *_test* (base names)
local function split_of(path)
  local base = path:match("([^/]*)$")
  if base:find("_train", 1, true) then return "train" end
  if base:find("_val", 1, true) then return "valid" end
  if base:find("_test", 1, true) then return "test" end
  return nil
end

local function bins_by_name(patterns, excludes, tok)
  local files, reals_or_err, skipped = text.expand(patterns, excludes)
  if not files then return nil, (reals_or_err:gsub("^data%.text", "data")) end
  local groups = { train = {}, valid = {}, test = {} }
  for _, p in ipairs(files) do
    if p:sub(-4) ~= ".bin" then
      return nil, ("data: %s is not a .bin token file, but the other matches are: give token files or text, "
                   .. "not both (or add it to data.exclude)"):format(p)
    end
    local k = split_of(p)
    if not k then
      return nil, ("data: cannot tell which split the token file %s belongs to: llm.c names them "
                   .. "*_train*.bin, *_val*.bin and *_test*.bin; rename it, or list the splits with "
                   .. "data.text = \"bin:TRAIN,VALID\""):format(p)
    end
    local g = groups[k]
    g[#g + 1] = p
  end
  return open_bins(groups, tok, skipped)
end

local function bins_listed(spec, excludes, tok)
  -- split at the commas outside glob braces ({a,b} is one glob)
  local items, depth, cur = {}, 0, {}
  for ch in spec:gmatch(".") do
    if ch == "{" then depth = depth + 1 elseif ch == "}" and depth > 0 then depth = depth - 1 end
    if ch == "," and depth == 0 then items[#items + 1] = table.concat(cur); cur = {}
    else cur[#cur + 1] = ch end
  end
  items[#items + 1] = table.concat(cur)
  if #items > 3 then
    return nil, ("data: %q lists %d splits; bin: takes TRAIN[,VALID[,TEST]]"):format("bin:" .. spec, #items)
  end
  local groups = { train = {}, valid = {}, test = {} }
  for i, item in ipairs(items) do
    local key = SPLITS[i].key
    if item ~= "" then
      local files, err = text.expand({ item }, excludes)
      if not files then return nil, (err:gsub("^data%.text", "data")) end
      groups[key] = files
    end
  end
  return open_bins(groups, tok)
end

---------------------------------------------------------------------------

local function check_lengths(ds, seq_len)
  ds.warnings = ds.warnings or {}
  if seq_len == nil then return ds end
  if type(seq_len) ~= "number" or seq_len < 1 or seq_len % 1 ~= 0 then
    error("data.open: seq_len must be a positive integer, got " .. tostring(seq_len), 0)
  end
  local need = seq_len + 1
  local tr = ds.train
  if tr.n < need then
    return nil, ("data: the train split has %d tokens%s, but one sequence needs data.seq_len + 1 = %d; "
                 .. "lower data.seq_len or give more training text"):format(tr.n,
                 tr.source and (" (from %s)"):format(tr.source) or "", need)
  end
  for _, k in ipairs({ "valid", "test" }) do
    local sp = ds[k]
    if sp and sp.n > 0 and sp.n < need then
      ds.warnings[#ds.warnings + 1] = ("the %s split has %d tokens, fewer than one sequence (data.seq_len + 1 = %d): "
                                       .. "it cannot be evaluated"):format(sp.name, sp.n, need)
    end
  end
  return ds
end

function M.open(opts)
  if type(opts) ~= "table" then error("data.open: expected a table of options, got " .. type(opts), 0) end
  for k in pairs(opts) do
    if not known_keys[k] then
      local names = {}
      for n in pairs(known_keys) do names[#names + 1] = n end
      table.sort(names)
      error(("data.open: unknown option %q (known: %s)"):format(tostring(k), table.concat(names, ", ")), 0)
    end
  end
  if opts.tokenizer == nil then error("data.open: tokenizer is required (e.g. data.tokenizer(\"bytes\"))", 0) end
  local tok = text.resolve_tokenizer(opts.tokenizer)
  local src = opts.text
  local cache = opts.cache
  if cache == nil then cache = "" end -- data.open caches by default
  local excludes = text.string_list(opts.exclude, "exclude", true)
  local ds, err
  if type(src) == "string" and src:match("^wikitext:") then
    ds, err = wikitext.open{ dir = src:sub(10), tokenizer = tok, cache = cache }
  elseif type(src) == "string" and src:match("^bin:") then
    ds, err = bins_listed(src:sub(5), excludes, tok)
  elseif type(src) == "string" and not has_magic(src) and is_dir(src) then
    if wikitext.is_dir(src) then
      ds, err = wikitext.open{ dir = src, tokenizer = tok, cache = cache }
    else
      local d = src:gsub("/+$", "")
      local okb, bins = pcall(text.expand, { d .. "/*.bin" }, excludes)
      if okb and bins then
        ds, err = bins_by_name({ d .. "/*.bin" }, excludes, tok)
      else
        return nil, ("data: %s is a directory without wiki.train.raw or *.bin token files; for the text files "
                     .. "in it give a glob (data.text = %q)"):format(src, d .. "/*")
      end
    end
  else
    local patterns = text.string_list(src, "text", false)
    local all_bin = true
    for _, p in ipairs(patterns) do
      if p:sub(-4) ~= ".bin" then all_bin = false end
    end
    if all_bin then
      ds, err = bins_by_name(patterns, excludes, tok)
    else
      ds, err = text.text{ text = src, exclude = opts.exclude, tokenizer = tok,
                           valid_fraction = opts.valid_fraction, cache = cache }
    end
  end
  if not ds then return nil, err end
  -- a cache that could not be written (cache.lua): a line with the run's warnings
  local cw = ds.cache and ds.cache:warning()
  if cw then ds.warnings = ds.warnings or {}; ds.warnings[#ds.warnings + 1] = cw end
  return check_lengths(ds, opts.seq_len)
end

return M
