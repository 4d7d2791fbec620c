-- ztrain.model.data.text: a tokenized text dataset from file globs, split into train and
-- validation token streams.
--
--   local ds, err = data.text{
--     text = "/usr/share/games/fortunes/*",   -- glob or list of globs (glob(3): * ? [..] {a,b} ~)
--     exclude = "*.dat",                      -- glob or list; nil = nothing excluded
--     tokenizer = tok,                        -- tokenizer object or name ("bytes")
--     valid_fraction = 0.05,                  -- in [0, 1); default 0.05
--     cache = nil,                            -- tokenisation cache dir ("" = the default one);
--                                             -- nil or false = none (data.open caches by default)
--   }
--
-- Files. Every pattern in `text` must match something. Matches are merged and sorted
-- (byte order). Directories are skipped. An `exclude` pattern without '/' is matched
-- against the file's base name, one with '/' against the whole path (fnmatch(3),
-- FNM_PATHNAME); a file is excluded if either the name that matched or the path it
-- resolves to (symlinks followed) matches. Symlinks are followed, and a file reached
-- under several names is read once, under the first name in sorted order (for the
-- fortunes corpus: `art` is kept, its symlink `art.u8` is skipped). Every file read
-- must be valid UTF-8 without NUL bytes; otherwise data.text returns nil and an error
-- naming the file, byte offset and line, and how to exclude it.
--
-- Split. Each file is split in two at one point: the last `valid_fraction` of its
-- bytes goes to validation, the rest to training. The point is moved forward to a
-- document boundary: the start of a line after a line holding only "%" (the fortune
-- separator; not the one ending the file), else the next line start, else the next
-- UTF-8 character start; if there is none, the whole file goes to training. The
-- split is made on text, before tokenization, so it works for any tokenizer.
-- Training stream = the train parts of all files in file order; validation stream
-- likewise; the two never share a byte.
-- Files are concatenated as they are; when the tokenizer has an `eot` id, it is
-- appended after every non-empty part.
--
-- Cache. With `cache`, each file's two token parts are looked up in the tokenisation
-- cache (cache.lua; keyed by the file's path, size and mtime, the tokenizer and the
-- split rule "valid_fraction + this cut") and stored there on a miss: a hit does not
-- read the file. The streams are the same bytes either way.
--
-- Result: ds.files (sorted paths read), ds.train / ds.valid = { tokens = uint16_t[n]
-- (int32_t[n] when vocab_size > 65536), n = count, dtype = "uint16_t" | "int32_t",
-- name = "train" | "validation" (for messages) },
-- ds.bytes (bytes read), ds.vocab_size, ds.tokenizer, ds.valid_fraction,
-- ds.file_info[i] = { path, real (resolved path), bytes, train_bytes, valid_bytes,
-- train_tokens, valid_tokens }, ds.cache (the cache object, its hits and misses, or
-- nil), ds.kind = "text", ds.skipped = { {path =, reason =}, ... } (directories,
-- excluded files, second names), ds.seconds (CPU time of the load), ds:describe().
local ffi = require "ffi"
local utf8 = require "ztrain.model.data.utf8"
local libc = require "ztrain.core.libc"
local fs = require "ztrain.util.fs"
local tokenizer = require "ztrain.model.data.tokenizer"
local cache = require "ztrain.model.data.cache"
local interrupt = require "ztrain.core.interrupt"

if ffi.os ~= "Linux" then
  -- glob_t's layout (ztrain.libc) is glibc's; other libcs differ.
  error("ztrain.model.data.text: file globs are implemented for Linux (glibc) only", 0)
end

local GLOB_MARK, GLOB_BRACE, GLOB_TILDE = libc.GLOB_MARK, libc.GLOB_BRACE, libc.GLOB_TILDE
local FNM_PATHNAME = libc.FNM_PATHNAME

local M = {}

-- glob(pattern) -> list of paths (directories end in '/'), or nil, err
-- ("nomatch" when nothing matches)
local function glob(pattern)
  local list, err = fs.glob(pattern, GLOB_MARK + GLOB_BRACE + GLOB_TILDE)
  if list and #list == 0 then return nil, "nomatch" end
  return list, err
end

local function realpath(path)
  local p = libc.realpath(path, nil)
  if p == nil then return nil end
  local s = ffi.string(p)
  libc.free(p)
  return s
end

local function basename(path) return path:match("([^/]*)$") end

local function fnmatch(pattern, path)
  if pattern:find("/", 1, true) then
    return libc.fnmatch(pattern, path, FNM_PATHNAME) == 0
  end
  return libc.fnmatch(pattern, basename(path), 0) == 0
end

-- string or non-empty list of strings -> list; `what` names the field for errors
local function string_list(v, what, optional)
  if v == nil and optional then return {} end
  if type(v) == "string" then
    if v == "" then error("data.text: " .. what .. " is an empty string", 0) end
    return { v }
  end
  if type(v) == "table" then
    if #v == 0 and not optional then error("data.text: " .. what .. " is an empty list", 0) end
    local out = {}
    for i = 1, #v do
      if type(v[i]) ~= "string" or v[i] == "" then
        error(("data.text: %s[%d] must be a non-empty string, got %s"):format(what, i, type(v[i])), 0)
      end
      out[i] = v[i]
    end
    return out
  end
  error(("data.text: %s must be a glob string or a list of them, got %s"):format(what, type(v)), 0)
end

local function shell_list(list)
  local q = {}
  for i, s in ipairs(list) do q[i] = ("%q"):format(s) end
  return #q == 1 and q[1] or "{ " .. table.concat(q, ", ") .. " }"
end

-- Suggested exclude pattern for a rejected file: "*.ext" if it has an extension.
local function exclude_hint(path)
  local ext = basename(path):match("^.+(%.[^.]+)$")
  if ext then return ('"*%s" (all %s files) or %q'):format(ext, ext, path) end
  return ("%q"):format(path)
end

-- 1-based index where the validation part of `s` starts (#s + 1: none).
local function split_index(s, f)
  local n = #s
  if f <= 0 or n == 0 then return n + 1 end
  local v = math.floor(n * (1 - f)) + 1 -- first validation byte before snapping
  if v <= 1 then return 1 end
  -- after a line "%" (fortune separator): "\n%\n" at a, boundary a + 3 >= v
  local a = s:find("\n%\n", math.max(1, v - 3), true)
  if a and a + 3 <= n then return a + 3 end
  -- next line start: "\n" at a, boundary a + 1 >= v
  a = s:find("\n", v - 1, true)
  if a then return a + 1 end
  -- next UTF-8 character start
  while v <= n do
    local b = s:byte(v)
    if b < 0x80 or b >= 0xC0 then return v end
    v = v + 1
  end
  return n + 1
end

local function resolve_tokenizer(t)
  if type(t) == "string" then return tokenizer.get(t) end
  if type(t) == "table" and type(t.encode) == "function" and type(t.vocab_size) == "number" then
    return t
  end
  error("data.text: tokenizer must be a tokenizer object (from data.tokenizer) or a name, got " .. type(t), 0)
end

-- Why a pattern matched nothing: "permission denied" when the directory it lists
-- cannot be read (glob(3) then skips it silently), else "no file matches".
local function nomatch_message(pat)
  local fixed = pat:match("^[^*?%[{~]*") -- the part before the first wildcard
  local dir = fixed:match("^(.*)/[^/]*$")
  if dir then
    if dir == "" then dir = "/" end
    local f, err = io.open(dir, "rb")
    if f then f:close()
    elseif tostring(err):find("Permission denied", 1, true) then
      return ("data.text: cannot list %s (for the pattern %q): permission denied; make the directory readable "
              .. "(chmod a+rx) or point data.text elsewhere"):format(dir, pat)
    end
  end
  return ("data.text: no file matches %q; check data.text (the glob must name existing files)"):format(pat)
end

-- expand(patterns, excludes) -> files, reals, skipped | nil, err
-- The file selection rules above: globs merged and sorted, directories, excluded
-- files and second names of one file skipped.
function M.expand(patterns, excludes)
  local seen, paths = {}, {}
  for _, pat in ipairs(patterns) do
    local list, err = glob(pat)
    if not list then
      if err == "nomatch" then return nil, nomatch_message(pat) end
      return nil, ("data.text: %s for pattern %q"):format(err, pat)
    end
    for _, p in ipairs(list) do
      if not seen[p] then seen[p] = true; paths[#paths + 1] = p end
    end
  end
  table.sort(paths)

  local skipped, files, reals, first_name = {}, {}, {}, {}
  for _, p in ipairs(paths) do
    if p:sub(-1) == "/" then
      skipped[#skipped + 1] = { path = p, reason = "directory" }
    else
      local real = realpath(p)
      local excluded
      for _, x in ipairs(excludes) do
        if fnmatch(x, p) or (real and fnmatch(x, real)) then excluded = x; break end
      end
      if excluded then
        skipped[#skipped + 1] = { path = p, reason = "excluded by " .. excluded }
      elseif not real then
        return nil, ("data.text: cannot resolve %q (dangling symlink?); fix it or add it to data.exclude"):format(p)
      elseif libc.file_kind(real) ~= "file" then
        -- reading a FIFO, socket or device would block or never end
        return nil, ("data.text: %s is a %s, not a regular file; add it to data.exclude (e.g. exclude = %s) " ..
                     "or point data.text elsewhere"):format(p, libc.file_kind(real) or "special file",
                                                            exclude_hint(p))
      elseif first_name[real] then
        skipped[#skipped + 1] = { path = p, reason = "same file as " .. first_name[real] }
      else
        first_name[real] = p
        files[#files + 1] = p
        reals[#reals + 1] = real
      end
    end
  end
  if #files == 0 then
    return nil, ("data.text: no file left to read: %d path(s) matched %s, all excluded (%s) or directories")
      :format(#paths, shell_list(patterns), shell_list(excludes))
  end
  return files, reals, skipped
end

-- read_text(path, who) -> string | nil, err: the whole file, checked to be UTF-8
-- without NUL bytes. `who` prefixes messages ("data.text").
function M.read_text(path, who)
  who = who or "data.text"
  local fh, oerr = io.open(path, "rb")
  if not fh then
    local why = tostring(oerr):match(": ([^:]+)$") or tostring(oerr)
    local hint = why == "Permission denied" and "make it readable (chmod a+r) or add it to data.exclude"
                 or "check the path"
    return nil, ("%s: cannot read %s: %s; %s"):format(who, path, why:lower(), hint)
  end
  local s, rerr = fh:read("*a")
  fh:close()
  if not s then
    return nil, ("%s: cannot read %s: %s"):format(who, path, tostring(rerr))
  end
  local ok, off, reason = utf8.check(s, #s, { nul = false })
  if not ok then
    local line, col = utf8.line_col(s, off)
    local what = reason == "NUL byte" and "looks binary (NUL byte)" or "is not valid UTF-8 (" .. reason .. ")"
    return nil, ("%s: %s %s at byte offset %d (line %d, column %d); "
                 .. "only UTF-8 text can be used: convert it, or add it to data.exclude, e.g. exclude = %s")
                :format(who, path, what, off, line, col, exclude_hint(path))
  end
  return s
end

-- Parts -> one compact token array per split. A part is { ids = 0-based array, n =,
-- keep = (anything that must stay alive while ids is read) }; eot (an id or nil)
-- follows every part.
function M.build_split(parts, dtype, eot, name)
  local n = 0
  for _, part in ipairs(parts) do n = n + part.n + (eot and 1 or 0) end
  local out = ffi.new(dtype .. "[?]", math.max(n, 1))
  local k = 0
  for _, part in ipairs(parts) do
    local ids = part.ids
    for j = 0, part.n - 1 do out[k + j] = ids[j] end
    k = k + part.n
    if eot then out[k] = eot; k = k + 1 end
  end
  assert(k == n)
  return { tokens = out, n = n, dtype = dtype, name = name }
end

-- Storage type of a split for a vocabulary of V ids.
function M.dtype(V) return V <= 65536 and "uint16_t" or "int32_t" end

M.resolve_tokenizer = resolve_tokenizer
M.realpath = realpath
M.string_list = string_list

local known_keys = { text = true, exclude = true, tokenizer = true, valid_fraction = true, cache = true,
                     seq_len = true --[[ used by the loader; accepted so a recipe's data block can be passed as is ]] }

local Dataset = {}
Dataset.__index = Dataset

function Dataset:describe()
  return ("%d files, %d bytes; train %d tokens, valid %d tokens (%s, vocab %d); loaded in %.3f s%s")
    :format(#self.files, self.bytes, self.train.n, self.valid.n, self.tokenizer.name or "?",
            self.vocab_size, self.seconds, self.cache and "; " .. self.cache:describe() or "")
end
M.Dataset = Dataset

function M.text(opts)
  local t0 = os.clock()
  if type(opts) ~= "table" then error("data.text: expected a table of options, got " .. type(opts), 0) end
  for k in pairs(opts) do
    if not known_keys[k] then
      local names = {}
      for n in pairs(known_keys) do names[#names + 1] = n end
      table.sort(names)
      error(("data.text: unknown option %q (known: %s)"):format(tostring(k), table.concat(names, ", ")), 0)
    end
  end
  local patterns = string_list(opts.text, "text", false)
  local excludes = string_list(opts.exclude, "exclude", true)
  if opts.tokenizer == nil then error("data.text: tokenizer is required (e.g. data.tokenizer(\"bytes\"))", 0) end
  local tok = resolve_tokenizer(opts.tokenizer)
  local f = opts.valid_fraction
  if f == nil then f = 0.05 end
  if type(f) ~= "number" or f ~= f or f < 0 or f >= 1 then
    error("data.text: valid_fraction must be a number in [0, 1), got " .. tostring(f), 0)
  end
  -- cache: data.text caches only when asked (opts.cache = a directory, or "" / true
  -- for the default one); data.open asks by default
  local c
  if opts.cache ~= nil and opts.cache ~= false then
    c = cache.open(cache.dir(opts.cache), tok)
  end
  -- the split rule, for the cache key: where a file is cut into train and validation
  local rule = ("text valid_fraction=%.17g split=v1"):format(f)

  -- 1, 2. expand the globs; drop directories, excluded files and second names
  local files, reals, skipped = M.expand(patterns, excludes)
  if not files then return nil, reals end

  -- 3. per file: the cached tokens, or read, validate, split, tokenize (and cache)
  local parts = { train = {}, valid = {} }
  local file_info, total_bytes = {}, 0
  local poll = interrupt.poll
  for i, p in ipairs(files) do
    poll()                       -- Ctrl-C at the REPL stops between two files
    local e, st
    if c then e, st = c:lookup(reals[i], rule) end
    local info = { path = p, real = reals[i] }
    if e then
      info.train_bytes, info.valid_bytes = e.a_bytes, e.b_bytes
      info.train_tokens, info.valid_tokens = e.a, e.b
      -- a part is in the stream (with its eot) when its text was non-empty, as below
      if e.a_bytes > 0 then parts.train[#parts.train + 1] = { ids = e.tokens, n = e.a, keep = e } end
      if e.b_bytes > 0 then parts.valid[#parts.valid + 1] = { ids = e.tokens + e.a, n = e.b, keep = e } end
    else
      local s, rerr = M.read_text(p)
      if not s then return nil, rerr end
      local v = split_index(s, f)
      local tr, va = s:sub(1, v - 1), s:sub(v)
      local a_ids, a_n, b_ids, b_n = nil, 0, nil, 0
      if #tr > 0 then a_ids, a_n = tok.encode(tr); parts.train[#parts.train + 1] = { ids = a_ids, n = a_n } end
      if #va > 0 then b_ids, b_n = tok.encode(va); parts.valid[#parts.valid + 1] = { ids = b_ids, n = b_n } end
      info.train_bytes, info.valid_bytes = #tr, #va
      info.train_tokens, info.valid_tokens = a_n, b_n
      if st then
        c:put(reals[i], st, rule, { a_ids = a_ids, a_n = a_n, b_ids = b_ids, b_n = b_n,
                                    a_bytes = #tr, b_bytes = #va })
      end
    end
    info.bytes = info.train_bytes + info.valid_bytes
    file_info[i] = info
    total_bytes = total_bytes + info.bytes
  end

  -- 4. concatenate into one compact array per split
  local dtype = M.dtype(tok.vocab_size)
  local ds = setmetatable({
    files = files, file_info = file_info, skipped = skipped,
    train = M.build_split(parts.train, dtype, tok.eot, "train"),
    valid = M.build_split(parts.valid, dtype, tok.eot, "validation"),
    bytes = total_bytes, vocab_size = tok.vocab_size, tokenizer = tok, valid_fraction = f,
    cache = c, kind = "text",
  }, Dataset)
  ds.seconds = os.clock() - t0
  return ds
end

return M
