-- ztrain.cli.generate: `ztrain generate SRC "PROMPT" [key=value ...]`: text
-- from a Hugging Face GPT-2 directory (hf:DIR, or a run's export.hf).
local usage = require "ztrain.cli.usage"
local hf = require "ztrain.model.hf"
local zt = require "ztrain"

local M = {}

local GENERATE_KEYS = { max_tokens = "number", temperature = "number", top_k = "number",
                        top_p = "number", seed = "number", tokenizer = "string" }

-- generate(args) -> exit code. args = { SRC, PROMPT, key=value ... }.
function M.main(args)
  local synopsis = 'ztrain generate SRC "PROMPT" [max_tokens=N temperature=T top_k=K top_p=P seed=S ' ..
                   'tokenizer=NAME]'
  local src, prompt = args[1], args[2]
  if src == "-h" or src == "--help" then io.stdout:write(usage.command("generate")); return 0 end
  if not src or not prompt or src:find("=") then
    error("generate: give a model directory and a prompt: " .. synopsis, 0)
  end
  local key = prompt:match("^([%w_]+)=")
  if key and GENERATE_KEYS[key] then
    error(("generate: the prompt is missing (%q is an option): give the prompt after the model directory, " ..
           "quoted: %s"):format(prompt, synopsis), 0)
  end
  local o = {}
  for j = 3, #args do
    local k, v = args[j]:match("^([%w_.]+)=(.*)$")
    if not k then error(("generate: cannot read argument %q: expected key=value (%s)"):format(args[j], synopsis), 0) end
    local kind = GENERATE_KEYS[k]
    if not kind then
      local known = {}
      for name in pairs(GENERATE_KEYS) do known[#known + 1] = name end
      table.sort(known)
      error(("generate: unknown key %q (known: %s)"):format(k, table.concat(known, ", ")), 0)
    end
    if kind == "number" then
      local n = tonumber(v)
      if not n then error(("generate: %s=%s is not a number"):format(k, v), 0) end
      o[k] = n
    else
      o[k] = v
    end
  end
  local dir = hf.dir_of(src) or src
  local function has(f)
    local h = io.open(dir .. "/" .. f, "rb")
    if h then h:close() end
    return h ~= nil
  end
  if not has("config.json") then
    -- a ztrain checkpoint (its manifest.json, or the directory holding `latest`): exported first
    local ckpt = has("manifest.json") or has("latest")
    error(("generate: %s has no config.json: SRC must be a Hugging Face GPT-2 directory " ..
           "(hf:DIR, or a run's export.hf directory)%s"):format(dir, ckpt and
           ("; %s is a ztrain checkpoint: `ztrain export %s DIR` makes one"):format(dir, dir) or ""), 0)
  end
  local tok = o.tokenizer
  if not tok then
    if not ((has("vocab.json") and has("merges.txt")) or has("tokenizer.json")) then
      error(("generate: %s has no vocab.json + merges.txt or tokenizer.json: name a tokenizer with tokenizer=NAME " ..
             "(bytes, bpe, bpe:DIR, hf:DIR)"):format(dir), 0)
    end
    tok = "hf:" .. dir
  end
  o.tokenizer = zt.data.tokenizer(tok)
  local model = hf.load(dir)
  local ok, ids, text = pcall(zt.generate, model, prompt, o)
  model:free()
  if not ok then error(ids, 0) end
  io.stdout:write(prompt, text, "\n")
  return 0
end

return M
