-- tools/tokenize.lua -- write llm.c .bin token files from text globs or a WikiText
-- raw directory, with any ztrain tokenizer.
--
--   build/ztrain --script tools/tokenize.lua [key=value ...] SOURCE...
--   luajit tools/tokenize.lua [key=value ...] SOURCE...          (the data layer needs no runtime)
--
--   SOURCE     what data.text takes: "wikitext:DIR", a WikiText raw directory, or text
--              globs (quote them: '/usr/share/games/fortunes/*')
--   tokenizer= bytes | bpe (default) | bpe:DIR | hf:DIR
--   out=       output directory (default .; created)
--   name=      file name prefix (default: the source directory's base name)
--   exclude=   a glob left out (text globs; repeatable; default *.dat)
--   valid_fraction=  text globs: the validation cut of each file (default 0.05)
--   cache=     the tokenisation cache directory, or off (default: $ZTRAIN_CACHE / ~/.cache/ztrain)
--
-- Writes OUT/NAME_train.bin, OUT/NAME_val.bin (when the validation split is not
-- empty) and OUT/NAME_test.bin (WikiText's test split), each holding exactly the
-- token stream data.open gives for the same source (eot after each part when the
-- tokenizer has one), and prints the data.text that reads them back:
-- data.text = "OUT/NAME_*.bin" (llm.c's *_train / *_val naming).
if not pcall(require, "ztrain.model.data") then
  local root = (arg and arg[0] or ""):match("^(.*)/tools/[^/]*$") or "."
  package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
end
local data = require "ztrain.model.data"
local tokbin = require "ztrain.model.data.tokbin"

local function die(msg)
  io.stderr:write("tokenize: ", msg, "\n")
  os.exit(1)
end

local opts = { tokenizer = "bpe", out = ".", excludes = {}, valid_fraction = 0.05 }
local sources = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%a_]+)=(.*)$")
  if k == "exclude" then
    opts.excludes[#opts.excludes + 1] = v
  elseif k == "tokenizer" or k == "out" or k == "name" or k == "cache" then
    opts[k] = v
  elseif k == "valid_fraction" then
    opts.valid_fraction = tonumber(v) or die("valid_fraction must be a number, got " .. v)
  elseif k then
    die(("unknown option %s= (known: tokenizer, out, name, exclude, valid_fraction, cache)"):format(k))
  else
    sources[#sources + 1] = a
  end
end
if #sources == 0 then
  die("usage: tokenize.lua [tokenizer=bpe] [out=DIR] [name=NAME] [exclude=GLOB] [valid_fraction=F] SOURCE...")
end
if #opts.excludes == 0 then opts.excludes = { "*.dat" } end
if not opts.name then
  local s = sources[1]:gsub("^wikitext:", ""):gsub("/+$", "")
  local dir = s:match("[*?%[{]") and s:match("^(.*)/[^/]*$") or s
  opts.name = (dir or s):match("([^/]+)$") or "data"
  opts.name = opts.name:gsub("[^%w%-_.]", "_")
end

local ok, tok = pcall(data.tokenizer, opts.tokenizer)
if not ok then die(tostring(tok)) end
local t0 = os.clock()
local ds, err = data.open { text = #sources == 1 and sources[1] or sources, exclude = opts.excludes, tokenizer = tok,
                            valid_fraction = opts.valid_fraction, cache = opts.cache }
if not ds then die(err) end
if ds.kind == "bin" then die("the source is already llm.c token files") end
os.execute(("mkdir -p '%s'"):format(opts.out:gsub("'", "'\\''")))
local written = {}
for _, s in ipairs({ { "train", "train" }, { "valid", "val" }, { "test", "test" } }) do
  local sp = ds[s[1]]
  if sp and (sp.n > 0 or s[1] == "train") then
    local path = ("%s/%s_%s.bin"):format(opts.out, opts.name, s[2])
    local wok, werr = tokbin.write(path, sp.tokens, sp.n, { wide = tok.vocab_size > 65536 })
    if not wok then die(werr) end
    written[#written + 1] = ("  %s: %d tokens"):format(path, sp.n)
  end
end
print(ds:describe())
print(table.concat(written, "\n"))
print(("tokenised in %.2f s (CPU); train on them with data.text = \"%s/%s_*.bin\" data.tokenizer = %q")
      :format(os.clock() - t0, opts.out, opts.name, opts.tokenizer))
