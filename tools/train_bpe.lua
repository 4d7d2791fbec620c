-- tools/train_bpe.lua -- learn a GPT-2 byte-level BPE vocabulary from text files and
-- write vocab.json + merges.txt (Hugging Face's format; ztrain.model.data.bpe reads them).
--
--   luajit tools/train_bpe.lua --out DIR [--vocab-size 8192] [--min-frequency 2]
--          [--valid-fraction 0.05] [--exclude GLOB]... [GLOB...]
--   build/ztrain --script tools/train_bpe.lua --out DIR ...     (the same)
--
-- With no GLOB: the default corpus, /usr/share/games/fortunes/* excluding *.dat.
-- Files are selected and split exactly as data.text selects and splits them (symlinked
-- second names read once; every file UTF-8), and only the training part of each file
-- (all but its last valid_fraction, data.text's default 0.05) is learned from, so the
-- vocabulary never sees the validation text. Each file is one text: pre-tokens never
-- span two files. "<|endoftext|>" is added as a special token (the last id).
--
-- The shipped vocabulary, data/bpe/fortunes, is made by:
--   luajit tools/train_bpe.lua --out data/bpe/fortunes --vocab-size 8192
local root = (arg and arg[0] or ""):match("^(.*)/tools/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path

local ffi = require "ffi"
local train = require "ztrain.model.data.bpe_train"

local usage = [[
usage: luajit tools/train_bpe.lua --out DIR [--vocab-size N] [--min-frequency N]
                                  [--valid-fraction F] [--exclude GLOB]... [GLOB...]
  --out DIR            where vocab.json and merges.txt go (created if missing)
  --vocab-size N       total vocabulary: 256 bytes + merges + "<|endoftext|>" (8192)
  --min-frequency N    stop when the best pair occurs fewer than N times (2)
  --valid-fraction F   the end of each file kept out of training, as data.text (0.05)
  --exclude GLOB       skip files matching GLOB (as data.exclude); repeatable
  GLOB                 text files (as data.text); none: /usr/share/games/fortunes/*
                       with --exclude '*.dat'
]]

local function fail(msg)
  io.stderr:write("train_bpe: ", msg, "\n")
  os.exit(2)
end

-- arguments
local opts = { vocab_size = 8192, min_frequency = 2, valid_fraction = 0.05 }
local globs, excludes = {}, {}
local i = 1
local function value(name)
  local v = arg[i + 1]
  if v == nil then fail(name .. " needs a value\n" .. usage) end
  i = i + 1
  return v
end
local function number(name, v)
  local x = tonumber(v)
  if not x then fail(("%s must be a number, got %q"):format(name, v)) end
  return x
end
while i <= #arg do
  local a = arg[i]
  local k, v = a:match("^(%-%-[%w-]+)=(.*)$")
  k = k or a
  local function val() if v then return v end return value(k) end
  if k == "-h" or k == "--help" then io.write(usage); os.exit(0)
  elseif k == "--out" then opts.out = val()
  elseif k == "--vocab-size" then opts.vocab_size = number(k, val())
  elseif k == "--min-frequency" then opts.min_frequency = number(k, val())
  elseif k == "--valid-fraction" then opts.valid_fraction = number(k, val())
  elseif k == "--exclude" then excludes[#excludes + 1] = val()
  elseif a:sub(1, 2) == "--" then fail(("unknown option %s\n%s"):format(a, usage))
  else globs[#globs + 1] = a end
  i = i + 1
end
if not opts.out then fail("--out DIR is required\n" .. usage) end
if #globs == 0 then
  globs = { "/usr/share/games/fortunes/*" }
  if #excludes == 0 then excludes = { "*.dat" } end
end

local ok, err = pcall(function()
  -- the files and their training parts, as data.text reads them (bytes tokenizer:
  -- one token per byte, so the train stream is the text itself)
  local t0 = os.clock()
  local ds, derr = require("ztrain.model.data.text").text {
    text = globs, exclude = #excludes > 0 and excludes or nil,
    tokenizer = require("ztrain.model.data.bytes"), valid_fraction = opts.valid_fraction }
  if not ds then error(derr, 0) end
  local texts, at = {}, 0
  local buf = ffi.new("uint8_t[?]", math.max(ds.train.n, 1))
  local toks = ds.train.tokens
  for j = 0, ds.train.n - 1 do buf[j] = toks[j] end
  for j, info in ipairs(ds.file_info) do
    texts[j] = ffi.string(buf + at, info.train_bytes)
    at = at + info.train_bytes
  end
  assert(at == ds.train.n, "train_bpe: file parts do not add up to the train stream")
  local read_s = os.clock() - t0

  local last = os.clock()
  local v = train.train {
    texts = texts, vocab_size = opts.vocab_size, min_frequency = opts.min_frequency,
    progress = function(m, size, count)
      if os.clock() - last > 2 then
        last = os.clock()
        io.stderr:write(("  %d merges, vocabulary %d, last pair count %d\n"):format(m, size, count))
      end
    end,
  }
  local libc = require "ztrain.core.libc"
  local acc = opts.out:sub(1, 1) == "/" and "/" or ""
  for part in opts.out:gmatch("[^/]+") do -- mkdir -p (an existing directory is fine)
    acc = acc .. part
    libc.mkdir(acc, 493) -- 0755
    acc = acc .. "/"
  end
  train.write(opts.out, v)
  print(("train_bpe: %d files, %d training bytes (valid_fraction %g), %d pre-tokens, %d distinct")
    :format(#ds.files, ds.train.n, opts.valid_fraction, v.pretokens, v.words))
  print(("train_bpe: vocabulary %d (%d merges, stopped by %s) in %.2f s (+ %.2f s reading); wrote %s/vocab.json, %s/merges.txt")
    :format(v.vocab_size, #v.merges, v.stopped, v.seconds, read_s, opts.out, opts.out))
end)
if not ok then fail(require("ztrain.core.errors").message(err)) end
