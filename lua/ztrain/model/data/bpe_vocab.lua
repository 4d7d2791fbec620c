-- ztrain.model.data.bpe_vocab: the two files of a GPT-2 byte-level BPE vocabulary in
-- Hugging Face's format, read and checked: vocab.json (token string -> id) and
-- merges.txt (one merge a line, in rank order). The tokenizer itself
-- (ztrain.model.data.bpe) builds on what these return; bpe.read_vocab and
-- bpe.read_merges are these functions.
--
-- Input rules (bad input raises error(msg, 0) naming the file, and the line where
-- there is one): vocab.json is a JSON object of token string -> distinct integer id
-- in [0, ID_LIMIT); merges.txt: an optional "#version" line (every line starting
-- "#version" is skipped, as tokenizers does), then one merge per line, two tokens
-- separated by one space; a final empty line and "\r\n" endings are accepted.
local M = {}

-- Ids are below 2^26: the encoder packs a pair of ids into one double
-- (left id * ID_LIMIT + right id, exact).
M.ID_LIMIT = 67108864
local K = M.ID_LIMIT

local function read_file(path, what)
  local f, err = io.open(path, "rb")
  if not f then
    error(("bpe: cannot read %s %s: %s (a BPE directory holds vocab.json and merges.txt)")
      :format(what, path, err or "?"), 0)
  end
  local s = f:read("*a")
  f:close()
  if s == nil then error(("bpe: cannot read %s %s"):format(what, path), 0) end
  return s
end

local function line_of(text, offset) -- 1-based line of a 1-based byte offset
  local line, pos = 1, 1
  while true do
    local nl = text:find("\n", pos, true)
    if not nl or nl >= offset then return line end
    line, pos = line + 1, nl + 1
  end
end

-- the line where token `tok` is a key in vocab.json text (best effort: nil if the
-- file spells it with escapes)
local function key_line(text, tok)
  local at = text:find('"' .. tok .. '"', 1, true)
  return at and line_of(text, at)
end

-- quote(s) -> s as a quoted string for messages (a newline as \n)
local function json_str(s) return (("%q"):format(s):gsub("\\\n", "\\n")) end
M.quote = json_str

-- read_vocab(path) -> vocab (token string -> id), max id
function M.read_vocab(path)
  local text = read_file(path, "vocabulary")
  local cjson = require("cjson").new()
  local ok, t = pcall(cjson.decode, text)
  if not ok then
    local at = tostring(t):match("at character (%d+)")
    local where = at and (":" .. line_of(text, tonumber(at))) or ""
    error(("bpe: %s%s: not valid JSON (%s); vocab.json must be a JSON object of token -> id")
      :format(path, where, tostring(t)), 0)
  end
  if type(t) ~= "table" or not text:match("^%s*{") then
    error(("bpe: %s: expected a JSON object of token string -> integer id, got a JSON %s")
      :format(path, type(t) == "table" and "array" or type(t)), 0)
  end
  local by_id, max_id, count = {}, -1, 0
  for k, v in pairs(t) do
    if type(k) ~= "string" then
      error(("bpe: %s: expected a JSON object of token string -> integer id"):format(path), 0)
    end
    if type(v) ~= "number" or v ~= v or v < 0 or v >= K or v % 1 ~= 0 then
      local line = key_line(text, k)
      error(("bpe: %s%s: token %s has id %s; ids must be integers in [0, %d)")
        :format(path, line and (":" .. line) or "", json_str(k),
                type(v) == "string" and json_str(v) or tostring(v), K), 0)
    end
    if by_id[v] then
      local a, b = by_id[v], k
      if a > b then a, b = b, a end
      error(("bpe: %s: tokens %s and %s share the id %d; ids must be distinct")
        :format(path, json_str(a), json_str(b), v), 0)
    end
    by_id[v] = k
    count = count + 1
    if v > max_id then max_id = v end
  end
  if count == 0 then error(("bpe: %s: the vocabulary is empty"):format(path), 0) end
  return t, max_id
end

-- read_merges(path) -> list of { left, right, line }
function M.read_merges(path)
  local text = read_file(path, "merges file")
  local merges = {}
  local lineno, pos, n = 0, 1, #text
  while pos <= n do
    local nl = text:find("\n", pos, true)
    local line = text:sub(pos, (nl or n + 1) - 1)
    lineno = lineno + 1
    pos = (nl or n) + 1
    if line:sub(-1) == "\r" then line = line:sub(1, -2) end
    if line:sub(1, 8) ~= "#version" then
      local a, b = line:match("^([^ ]+) ([^ ]+)$")
      if not a then
        error(("bpe: %s:%d: malformed merge %s: expected two tokens separated by one space " ..
               "(as \"Ġ t\"), after an optional \"#version: 0.2\" first line")
          :format(path, lineno, json_str(line)), 0)
      end
      merges[#merges + 1] = { a, b, lineno }
    end
  end
  return merges
end


return M
