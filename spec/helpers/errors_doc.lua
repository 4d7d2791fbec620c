-- spec/helpers/errors_doc.lua -- docs/errors.md read as data, for
-- spec/unit/errors_doc_spec.lua: its table rows, the messages in them, and
-- whether a set of texts (the source's literals, a spec's) covers a message.
local literals = require "helpers.literals"
local util = require "helpers.util"

local M = {}

-- The doc's placeholders: a word that stands for what varies (whole words).
-- (docs/errors.md's opening lists them, in this order)
M.PLACEHOLDERS = { "FILE", "DIR", "PATH", "OUT", "CKPT", "RECIPE", "HOST", "N", "LINE", "L", "C",
                   "MESSAGE", "FIRST", "LAST", "TEXTHASH", "UPVALUESHASH" }
-- Texts ztrain passes on from others (strerror, Open MPI), not its own.
M.EXTERNAL = { "No space left on device", "Is a directory", "Read-only file system",
               "Not a directory", "No such file or directory", "File too large",
               "ORTE has lost communication with a remote daemon" }
-- The doc's example values that are plain words (a value with a digit or a
-- sign -- 16, batch.mirco, "gpt9" -- needs no entry).
M.VALUES = { lr = true, inf = true, nodeB = true, orted = true, hf = true, single = true, SIGKILL = true,
             FIFO = true, batch = true, data = true, precision = true }   -- the last: allow_changes's groups
-- The prefixes of every message (cli/init.lua, host/main.c).
M.PREFIXES = { ["ztrain: "] = true }
M.MIN_PIECE = 4      -- a source text shorter than this covers nothing
M.MIN_OVERLAP = 6    -- a text cut by "..." matches a source text on this much at least

-- the cells of a table line, split at "|" outside code spans
local function cells(line)
  local out, cur, i, fence = {}, {}, 2, nil
  while i <= #line do
    local ticks = line:match("^`+", i)
    if ticks then
      if not fence then fence = ticks elseif ticks == fence then fence = nil end
      cur[#cur + 1] = ticks; i = i + #ticks
    else
      local c = line:sub(i, i)
      if c == "|" and not fence then out[#out + 1] = table.concat(cur):match("^%s*(.-)%s*$"); cur = {}
      else cur[#cur + 1] = c end
      i = i + 1
    end
  end
  return out
end

-- rows(text) -> { line, section, input, message, exit, specs = {...} } for
-- every body row of every four-column table
function M.rows(text)
  local out, section, n = {}, nil, 0
  for line in (text .. "\n"):gmatch("(.-)\n") do
    n = n + 1
    section = line:match("^## (.*)") or section
    if line:match("^|") and not line:match("^|%-") then
      local c = cells(line)
      if #c == 4 and c[3] ~= "exit" then
        local specs = {}
        for s in c[4]:gmatch("[^,%s]+") do specs[#specs + 1] = s end
        out[#out + 1] = { line = n, section = section, input = c[1], message = c[2],
                          exit = c[3], specs = specs }
      end
    end
  end
  return out
end

-- spans(cell) -> the code spans of a message cell outside parentheses (those
-- inside are notes: summary.json fields, other inputs), each its text
function M.spans(cell)
  local out, depth, i = {}, 0, 1
  while i <= #cell do
    local ticks = cell:match("^`+", i)
    if ticks then
      local s, e = cell:find(ticks, i + #ticks, true)
      local body = cell:sub(i + #ticks, (s or #cell + 1) - 1)
      if #ticks > 1 then body = body:gsub("^ ", ""):gsub(" $", "") end
      if depth == 0 then out[#out + 1] = body end
      i = (e or #cell) + 1
    else
      local c = cell:sub(i, i)
      depth = depth + (c == "(" and 1 or c == ")" and -1 or 0)
      i = i + 1
    end
  end
  return out
end

-- segments(msg) -> the literal runs of a message between its wildcards
-- ("...", placeholders, external texts), each { text, soft_before,
-- soft_after, span, at }: soft where a wildcard or the span's edge is beside
-- it (the source text there may go on); span the message with its wildcards
-- as "\0", at where text starts in it
function M.segments(msg)
  local s = msg
  for _, x in ipairs(M.EXTERNAL) do s = s:gsub(x:gsub("%p", "%%%0"), "\0") end
  s = s:gsub("%.%.%.", "\0")
  for _, p in ipairs(M.PLACEHOLDERS) do s = s:gsub("%f[%w_]" .. p .. "%f[^%w_]", "\0") end
  local out = {}
  for at, run in (s .. "\0"):gmatch("()([^%z]*)%z") do
    if run:find("%S") then
      out[#out + 1] = { text = run, soft_before = true, soft_after = true, span = s, at = at }
    end
  end
  return out
end

-- index(texts, near) -> what covered() looks texts up in: by their first and
-- last four characters, and all of them joined (for a run inside one). A
-- text of one word counts only as a message's prefix (M.PREFIXES), as the
-- whole of a message's segment (exact[t]), beside a ".." (near[t] = true),
-- or beside a format directive with its literal's next or previous run in
-- the message too (near[t] = { { text = run, after = bool }, ... }: "hostfile "
-- of "hostfile %s line %d: ..." where " line " follows), or between two
-- directives ({ infix = true }: " under " of "%s under %s"): a literal such as
-- "backend" or "device %s" stands somewhere in any source, not for a message.
function M.index(texts, near)
  local first, last, seen, all, exact = {}, {}, {}, {}, {}
  for _, t in ipairs(texts) do
    exact[t] = true
    if #t >= M.MIN_PIECE and not seen[t] and not t:find("%z")
       and (t:find("%S%s+%S") or M.PREFIXES[t] or (near and near[t])) then
      seen[t] = true
      local a, z = t:sub(1, 4), t:sub(-4)
      first[a] = first[a] or {}; table.insert(first[a], t)
      last[z] = last[z] or {}; table.insert(last[z], t)
      all[#all + 1] = t
    end
  end
  return { first = first, last = last, exact = exact, near = near or {},
           joined = "\0" .. table.concat(all, "\0") .. "\0" }
end

local function mark(covered, a, b) for k = a, b do covered[k] = true end end

-- placed(p, seg, a, b, idx): text p, matched at seg.text[a..b], may count
-- there (see index: a one-word text needs its literal's neighbour)
local function placed(p, seg, a, b, idx)
  local near = idx.near[p]
  if p:find("%S%s+%S") or M.PREFIXES[p] or near == true then return true end
  for _, q in ipairs(near or {}) do
    if q.infix then return true end
    local key = q.after and q.text:sub(1, 12) or q.text:sub(-12)
    if q.after and seg.span:find(key, seg.at + b, true) then return true end
    if not q.after and seg.span:sub(1, seg.at + a - 2):find(key, 1, true) then return true end
  end
  return false
end

-- covered(seg, idx) -> a boolean per character of seg.text: the texts of idx
-- that stand there whole, or cut by the segment's soft edges
function M.covered(seg, idx)
  local s, covered = seg.text, {}
  local lo, hi = s:find("%S"), #s:match("^(.-)%s*$")      -- the text within its blanks
  if (hi - lo + 1 >= M.MIN_PIECE and idx.joined:find(s:sub(lo, hi), 1, true)) or idx.exact[s:sub(lo, hi)] then
    mark(covered, 1, #s); return covered
  end
  for i = 1, #s - 3 do
    local rest = hi - i + 1
    for _, p in ipairs(idx.first[s:sub(i, i + 3)] or {}) do
      if s:sub(i, i + #p - 1) == p then
        if placed(p, seg, i, i + #p - 1, idx) then mark(covered, i, i + #p - 1) end
      elseif seg.soft_after and rest >= M.MIN_OVERLAP and p:sub(1, rest) == s:sub(i, hi)
             and placed(p, seg, i, hi, idx) then
        mark(covered, i, #s)
      end
    end
  end
  if seg.soft_before then
    for j = hi, lo + M.MIN_OVERLAP - 1, -1 do
      for _, p in ipairs(idx.last[s:sub(j - 3, j)] or {}) do
        local n = j - lo + 1
        if #p >= n and p:sub(-n) == s:sub(lo, j) and placed(p, seg, lo, j, idx) then
          mark(covered, 1, j); return covered
        end
      end
    end
  end
  return covered
end

-- a word that can be a value put into a message (a number, a path, a key, a
-- quoted name, a word of M.VALUES): it holds a digit or a sign beyond the
-- sentence's own
function M.value_like(word)
  local w = word:gsub("^[,;:()!?]+", ""):gsub("[,;:.()!?]+$", "")
  return #w <= 1 or M.VALUES[w] or w:find("[%d\"'/=_.%-%[%]#<>+*:]") ~= nil
end

-- gaps(seg, covered) -> the runs of words that the source has no text for
-- (a word with a letter not covered) and that no value looks like
function M.gaps(seg, covered)
  local out, run, s = {}, {}, seg.text
  for a, word, b in s:gmatch("()(%S+)()") do
    local whole = true
    for k = a, b - 1 do whole = whole and (covered[k] or not s:sub(k, k):find("%a")) end
    if not whole and not M.value_like(word) then run[#run + 1] = word
    elseif #run > 0 then out[#out + 1] = table.concat(run, " "); run = {} end
  end
  if #run > 0 then out[#out + 1] = table.concat(run, " ") end
  return out
end

-- the source files whose literals messages come from
function M.source_files()
  local out = {}
  local p = io.popen("find lua runtime host -type f \\( -name '*.lua' -o -name '*.c' -o -name '*.h' \\) | sort")
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

-- source_index() -> an index of every literal run of lua/, runtime/, host/
function M.source_index()
  local texts, near = {}, {}
  for _, f in ipairs(M.source_files()) do
    for _, lit in ipairs(literals.literals(util.read(f), f:match("%.lua$") and "lua" or "c")) do
      -- the runtime's messages open with the C call, which core/ffi.lua's
      -- check_key replaces by the recipe key
      local text = lit.text:gsub("^zt_[%w_]+%b(): ", ""):gsub("^zt_[%w_]+: ", "")
      local pieces = literals.pieces(text)
      for k, p in ipairs(pieces) do
        texts[#texts + 1] = p
        if lit.concat then near[p] = true
        elseif near[p] ~= true and #pieces > 1 then
          near[p] = near[p] or {}
          for _, d in ipairs({ -1, 1 }) do
            local q = pieces[k + d]
            if q and #q >= 3 then table.insert(near[p], { text = q, after = d > 0 }) end
          end
          if k > 1 and k < #pieces then table.insert(near[p], { infix = true }) end   -- "%s under %s"
        end
      end
    end
  end
  return M.index(texts, near)
end

-- unpattern(t) -> the plain runs of a Lua pattern ("%." is ".", a class
-- such as ".-", "%d+" or "[^x]" separates runs)
function M.unpattern(t)
  local out, cur, i = {}, {}, 1
  local function cut() out[#out + 1] = table.concat(cur); cur = {} end
  while i <= #t do
    local c = t:sub(i, i)
    if c == "%" and t:sub(i + 1, i + 1):match("%p") then cur[#cur + 1] = t:sub(i + 1, i + 1); i = i + 2
    elseif c == "%" or c == "." or c == "[" then
      cut()
      i = c == "[" and (t:find("]", i + 2, true) or #t) + 1 or i + (c == "%" and 2 or 1)
      if t:sub(i, i):match("[-*+?]") then i = i + 1 end
    elseif (c == "^" and i == 1) or (c == "$" and i == #t) then i = i + 1
    else cur[#cur + 1] = c; i = i + 1 end
  end
  cut()
  return out
end

-- spec_index(path) -> an index of a spec's literals: as plain text, as
-- format strings and as Lua patterns
function M.spec_index(path)
  local texts = {}
  for _, lit in ipairs(literals.literals(util.read(path), "lua")) do
    texts[#texts + 1] = lit.text
    for _, p in ipairs(M.unpattern(lit.text)) do texts[#texts + 1] = p end
    for _, p in ipairs(literals.pieces(lit.text)) do               -- a format making a pattern too
      texts[#texts + 1] = p
      for _, q in ipairs(M.unpattern(p)) do texts[#texts + 1] = q end
    end
  end
  return M.index(texts, setmetatable({}, { __index = function() return true end }))   -- a word counts
end

-- spec_path(name) -> the file a row's spec name stands for, or nil
function M.spec_path(name)
  local base = name:gsub("%.lua$", "")
  local tries = base:find("/") and { "spec/" .. base .. ".lua" }
                or { "spec/unit/" .. base .. ".lua", "spec/e2e/" .. base .. ".lua" }
  for _, p in ipairs(tries) do if util.exists(p) then return p end end
  return nil
end

return M
