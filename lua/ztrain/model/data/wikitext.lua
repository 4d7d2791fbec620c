-- ztrain.model.data.wikitext: a WikiText raw directory as a dataset.
--
--   local ds, err = require("ztrain.model.data.wikitext").open{
--     dir = "wikitext-2-raw",           -- holds wiki.train.raw [, wiki.valid.raw, wiki.test.raw]
--     tokenizer = tok,                  -- object or name
--     cache = dir | "" | false,         -- the tokenisation cache (cache.lua); nil = none
--   }
--
-- The release's own splits are used (no valid_fraction cut): wiki.train.raw is the
-- train split, wiki.valid.raw the validation split, wiki.test.raw the test split
-- (ds.test; absent when the file is). wiki.train.raw is required; a missing
-- wiki.valid.raw gives an empty validation split (ds.valid.n = 0), said by describe().
--
-- Each file is UTF-8 text (checked as data.text checks it) tokenised whole, as it is:
-- " = Title = " headings, " @-@ " and the blank lines stay (the raw release is what the
-- seeds' `wikitext-2-raw-v1` holds; nothing is detokenised). The tokenizer's eot, when
-- it has one, follows each file's tokens, as data.text appends it after each part.
local text = require "ztrain.model.data.text"
local fs = require "ztrain.util.fs"
local cache = require "ztrain.model.data.cache"

local M = {}

M.FILES = { { split = "train", file = "wiki.train.raw" },
            { split = "valid", file = "wiki.valid.raw", name = "validation" },
            { split = "test", file = "wiki.test.raw" } }

-- is_dir(dir) -> true when dir holds wiki.train.raw
function M.is_dir(dir) return fs.exists(dir .. "/wiki.train.raw") end

local Dataset = {}
Dataset.__index = Dataset

function Dataset:describe()
  local parts = {}
  for _, f in ipairs(M.FILES) do
    local s = self[f.split]
    if s then
      parts[#parts + 1] = ("%s %d tokens"):format(f.name or f.split, s.n)
    end
  end
  return ("wikitext %s, %d bytes; %s%s (%s, vocab %d); loaded in %.3f s%s")
    :format(self.dir, self.bytes, table.concat(parts, ", "),
            self.valid.source == "wiki.valid.raw" and "" or " (no wiki.valid.raw)",
            self.tokenizer.name or "?", self.vocab_size, self.seconds,
            self.cache and "; " .. self.cache:describe() or "")
end

-- Why `dir` is not a WikiText raw directory (wiki.train.raw missing), with a hint.
local function missing_train(dir)
  local f, err = io.open(dir .. "/wiki.train.raw", "rb")
  if f then f:close() end
  local why = err and tostring(err):match(": ([^:]+)$") or "missing"
  if why == "Permission denied" then
    return ("data: cannot read %s/wiki.train.raw: permission denied; make it readable (chmod a+r)"):format(dir)
  end
  local d = io.open(dir, "rb")
  if not d then
    return ("data: WikiText directory %s does not exist (data.text = \"wikitext:DIR\" names the directory "
            .. "holding wiki.train.raw, wiki.valid.raw and wiki.test.raw)"):format(dir)
  end
  d:close()
  local hint = "a WikiText raw directory holds wiki.train.raw, wiki.valid.raw and wiki.test.raw " ..
               "(the wikitext-2-raw-v1 or wikitext-103-raw-v1 release)"
  if fs.exists(dir .. "/wiki.train.tokens") then
    hint = "this is the tokenised release (wiki.train.tokens, with <unk>); use the raw one " ..
           "(wikitext-2-raw-v1: wiki.train.raw)"
  else
    local ok2, list = pcall(text.expand, { dir .. "/*/wiki.train.raw" }, {})
    if ok2 and list then
      hint = ("did you mean %s?"):format(list[1]:match("^(.*)/wiki%.train%.raw$"))
    end
  end
  return ("data: no wiki.train.raw in %s; %s"):format(dir, hint)
end

function M.open(opts)
  local t0 = os.clock()
  local dir = opts.dir
  if type(dir) ~= "string" or dir == "" then error("wikitext.open: dir must be a directory path", 2) end
  dir = dir:gsub("(.)/+$", "%1")
  local tok = text.resolve_tokenizer(opts.tokenizer)
  if not M.is_dir(dir) then return nil, missing_train(dir) end
  local c
  if opts.cache ~= nil and opts.cache ~= false then c = cache.open(cache.dir(opts.cache), tok) end
  local rule = "wikitext whole-file v1"
  local dtype = text.dtype(tok.vocab_size)
  local ds = { dir = dir, files = {}, file_info = {}, skipped = {}, tokenizer = tok, vocab_size = tok.vocab_size,
               bytes = 0, cache = c, kind = "wikitext" }
  for _, f in ipairs(M.FILES) do
    local path = dir .. "/" .. f.file
    -- present = it exists (statx needs no read permission: an unreadable file is
    -- reported by read_text as such, not taken for absent)
    local present = cache.stat(path) ~= nil
    if present then
      local real = text.realpath(path) or path
      local e, st
      if c then e, st = c:lookup(real, rule) end
      local part, bytes
      if e then
        part, bytes = { ids = e.tokens, n = e.a, keep = e }, e.a_bytes
      else
        local s, err = text.read_text(path, "data")
        if not s then return nil, err end
        local ids, n = nil, 0
        if #s > 0 then ids, n = tok.encode(s) end
        part, bytes = { ids = ids, n = n }, #s
        if st then c:put(real, st, rule, { a_ids = ids, a_n = n, b_n = 0, a_bytes = #s, b_bytes = 0 }) end
      end
      local parts = bytes > 0 and { part } or {}
      ds[f.split] = text.build_split(parts, dtype, tok.eot, f.name or f.split)
      ds[f.split].source = f.file
      ds.files[#ds.files + 1] = path
      ds.file_info[#ds.file_info + 1] = { path = path, real = real, split = f.split, bytes = bytes, tokens = part.n }
      ds.bytes = ds.bytes + bytes
    elseif f.split == "valid" then
      ds.valid = text.build_split({}, dtype, nil, "validation")
      ds.valid.source = "none: no wiki.valid.raw"
    end
  end
  ds.seconds = os.clock() - t0
  return setmetatable(ds, Dataset)
end

return M
