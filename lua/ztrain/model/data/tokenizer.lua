-- ztrain.model.data.tokenizer: tokenizers by name (data.tokenizer, data.tokenizers):
-- the byte tokenizer, the shipped BPE vocabulary, and BPE / Hugging Face
-- directories. Its own module so that data.text, which takes a tokenizer by
-- name too, need not require the data package that requires it (issue 28).
local fs = require "ztrain.util.fs"
local bytes = require "ztrain.model.data.bytes"

local M = {}

-- The tree root (for the shipped vocabulary), found as ztrain.ffi finds it, without
-- loading the runtime.
local function tree_root()
  if rawget(_G, "ZTRAIN_HOME") then return ZTRAIN_HOME end
  local env = os.getenv("ZTRAIN_HOME")
  if env and env ~= "" then return env end
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/lua/ztrain/model/data/tokenizer%.lua$")
  if dir then return dir == "" and "/" or dir end
  if src == "lua/ztrain/model/data/tokenizer.lua" then return "." end
  return "."
end
M.home = tree_root()

-- The shipped vocabulary (trained on the default corpus by tools/, see data/bpe/).
M.BPE_DEFAULT = "data/bpe/fortunes"

-- Tokenizer names (data.tokenizer): a fixed name, or a prefix with a directory.
--   bytes      byte-level, 256 ids, no eot (ztrain.model.data.bytes)
--   bpe        GPT-2 byte-level BPE with the shipped vocabulary (M.home/data/bpe/fortunes)
--   bpe:DIR    the same with DIR/vocab.json + DIR/merges.txt
--   hf:DIR     a Hugging Face model or tokenizer directory: its tokenizer.json (BPE:
--              byte-level as Llama 3, Qwen 2.5, SmolLM; SentencePiece-style as Llama 2,
--              Mistral; ztrain.model.data.hf_tokenizer), or the
--              same two files as bpe:DIR where there is none or it is GPT-2's own pipeline
local fixed = { "bytes", "bpe" }
local prefixes = { "bpe:DIR", "hf:DIR" }

function M.names()
  local names = {}
  for _, k in ipairs(fixed) do names[#names + 1] = k end
  for _, k in ipairs(prefixes) do names[#names + 1] = k end
  return names
end

local function module_file(name)
  return package.searchpath(name, package.path)
end

-- A BPE tokenizer from DIR/vocab.json + DIR/merges.txt. `what` names it in errors.
-- name: the tokenizer's name in reports (what the recipe said)
local function load_bpe(dir, what, name)
  if dir == "" then error(("data.tokenizer: %s needs a directory after the colon"):format(what), 0) end
  dir = dir:gsub("/+$", "")
  if dir == "" then dir = "/" end
  local missing = {}
  for _, f in ipairs({ "vocab.json", "merges.txt" }) do
    if not fs.exists(dir .. "/" .. f) then missing[#missing + 1] = f end
  end
  if #missing > 0 then
    local hint = "a GPT-2 tokenizer directory holds vocab.json and merges.txt (Hugging Face format)"
    if fs.exists(dir .. "/tokenizer.json") then
      hint = ("it has tokenizer.json only: name it as hf:%s"):format(dir)
    end
    error(("data.tokenizer: %s: no %s in %s; %s"):format(what, table.concat(missing, " or "), dir, hint), 0)
  end
  local ok, bpe = pcall(require, "ztrain.model.data.bpe")
  if not ok then
    error(("data.tokenizer: %s: the BPE tokenizer module ztrain.model.data.bpe cannot be loaded: %s")
          :format(what, tostring(bpe)), 0)
  end
  local tok = bpe.load(dir, { name = name })
  -- what the tokenisation cache keys this tokenizer by (cache.lua): its vocabulary
  -- files and the encoder's own source (with its vocabulary readers), so a fix invalidates old tokens
  if tok.cache_key == nil and tok.cache_files == nil then
    local files = { dir .. "/vocab.json", dir .. "/merges.txt" }
    for _, m in ipairs({ "ztrain.model.data.bpe", "ztrain.model.data.bpe_vocab", "ztrain.model.data.pcre2" }) do
      local p = module_file(m)
      if p then files[#files + 1] = p end
    end
    tok.cache_files = files
  end
  tok.dir = tok.dir or dir
  return tok
end

-- A tokenizer from DIR/tokenizer.json, or nil when GPT-2's vocab.json + merges.txt beside
-- it give the same ids (bpe.lua reads those: the GPT-2 path as before tokenizer.json).
local function load_tokenizer_json(dir, what, name)
  local ok, hft = pcall(require, "ztrain.model.data.hf_tokenizer")
  if not ok then
    error(("data.tokenizer: %s: the module ztrain.model.data.hf_tokenizer cannot be loaded: %s")
          :format(what, tostring(hft)), 0)
  end
  local spec, rerr = hft.read(dir .. "/tokenizer.json")
  if not spec then error(("data.tokenizer: %s: %s"):format(what, rerr), 0) end
  if fs.exists(dir .. "/vocab.json") and fs.exists(dir .. "/merges.txt") and hft.gpt2_like(spec) then return nil end
  local tok, err = hft.from_spec(spec, dir .. "/tokenizer.json", { name = name })
  if not tok then error(("data.tokenizer: %s: %s"):format(what, err), 0) end
  local files = { dir .. "/tokenizer.json" }
  for _, m in ipairs({ "ztrain.model.data.hf_tokenizer", "ztrain.model.data.bpe", "ztrain.model.data.bpe_vocab",
                       "ztrain.model.data.pcre2", "ztrain.model.data.unorm", "ztrain.model.data.spm_bpe" }) do
    local p = module_file(m)
    if p then files[#files + 1] = p end
  end
  tok.cache_files = files
  return tok
end

-- get(name) (data.tokenizer) -> tokenizer { name, vocab_size, eot, encode, decode }.
-- A tokenizer object is returned as is. Unknown names and missing vocabulary files
-- raise errors that say what to give instead.
function M.get(name)
  if type(name) == "table" and type(name.encode) == "function" then return name end
  if type(name) ~= "string" then
    error("data.tokenizer: expected a tokenizer name, got " .. type(name), 0)
  end
  if name == "bytes" then
    -- not cached (no cache_key): reading its tokens back costs as much as making them
    return bytes
  end
  if name == "bpe" then
    local dir = M.home .. "/" .. M.BPE_DEFAULT
    if not fs.exists(dir .. "/vocab.json") then
      error(("data.tokenizer: \"bpe\" is the shipped vocabulary %s, which is missing from this tree; "
             .. "restore it (git checkout %s), or name one with \"bpe:DIR\" / \"hf:DIR\", or use \"bytes\"")
            :format(dir, M.BPE_DEFAULT), 0)
    end
    return load_bpe(dir, '"bpe"', "bpe")
  end
  local prefix, dir = name:match("^(%a+):(.*)$")
  if prefix == "hf" and dir ~= "" then
    local d = dir:gsub("/+$", "")
    if d == "" then d = "/" end
    if fs.exists(d .. "/tokenizer.json") then
      local tok = load_tokenizer_json(d, ("%q"):format(name), name)
      if tok then return tok end
    end
  end
  if prefix == "bpe" or prefix == "hf" then return load_bpe(dir, ("%q"):format(name), name) end
  error(("data.tokenizer: unknown tokenizer %q (known: %s)"):format(name, table.concat(M.names(), ", ")), 0)
end

return M
