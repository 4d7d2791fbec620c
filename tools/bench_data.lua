-- tools/bench_data.lua -- `make bench`'s data row: how fast text becomes
-- training tokens on this machine (the speed goals the specs used to assert
-- with a stopwatch; the specs check the tokens, this measures the time).
--
--   build/ztrain --script tools/bench_data.lua
--
-- 1. BPE encoding (data/bpe/fortunes, the GPT-2-style vocabulary ztrain
--    ships) over Debian's fortunes corpus: M tokens/s, cold cache (a fresh
--    tokenizer). Target: >= 0.2 M tokens/s.
-- 2. Loading that corpus as a dataset (data.text, bytes tokenizer, 5%
--    validation cut): seconds. Target: < 1 s.
-- Without the fortunes package it says so and measures nothing.
local bpe = require "ztrain.model.data.bpe"
local data = require "ztrain.model.data"
local fs = require "ztrain.util.fs"

local DIR = "/usr/share/games/fortunes"
local files = {}
for _, p in ipairs(fs.glob(DIR .. "/*") or {}) do
  if not p:match("%.dat$") and not p:match("%.u8$") then files[#files + 1] = p end
end
if #files == 0 then
  print(("data: %s is absent (apt-get install fortunes): nothing measured"):format(DIR))
  return
end
table.sort(files)

local tok = bpe.load("data/bpe/fortunes")
local tokens, bytes, secs = 0, 0, 0
for _, p in ipairs(files) do
  local s = assert(fs.read_file(p))
  local t0 = os.clock()
  local _, n = tok.encode(s)
  secs = secs + os.clock() - t0
  tokens, bytes = tokens + n, bytes + #s
end
local rate = tokens / secs / 1e6
print(("data: BPE encode, %d files, %.2f MB -> %d tokens in %.2f s: %.2f M tokens/s (target >= 0.20: %s)")
      :format(#files, bytes / 1e6, tokens, secs, rate, rate >= 0.2 and "met" or "NOT met"))

local t0 = os.clock()
local ds = assert(data.text { text = DIR .. "/*", exclude = "*.dat", tokenizer = "bytes", valid_fraction = 0.05,
                              cache = "off" })
local load = os.clock() - t0
print(("data: data.text load of the same corpus (bytes tokenizer): %.3f s, %d bytes (target < 1 s: %s)")
      :format(load, ds.bytes, load < 1 and "met" or "NOT met"))
