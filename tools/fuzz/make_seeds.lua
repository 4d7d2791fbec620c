-- tools/fuzz/make_seeds.lua: (re)write the seed corpora under spec/fuzz/ --
-- small valid inputs, written by ztrain's own writers, and near-valid ones
-- (one field wrong each). Regression inputs of fixed findings live beside
-- them as crash-*.* and are never rewritten here.
--
--   ZTRAIN_HOME=$PWD luajit tools/fuzz/make_seeds.lua
package.path = "lua/?.lua;lua/?/init.lua;tools/fuzz/?.lua;" .. package.path
local ffi = require "ffi"
local libc = require "ztrain.core.libc"
local targets = require "targets"

local OUT = "spec/fuzz"
local function slurp(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end
local function put(target, name, s)
  libc.mkdir(OUT, 493); libc.mkdir(OUT .. "/" .. target, 493)
  local f = assert(io.open(OUT .. "/" .. target .. "/" .. name, "wb"))
  f:write(s); f:close()
end
local tmp = os.tmpname(); os.remove(tmp); libc.mkdir(tmp, 448)

-- safetensors ---------------------------------------------------------
do
  local st = require "ztrain.model.safetensors"
  local path = tmp .. "/a.safetensors"
  local w = st.writer(path, { { name = "wte", shape = { 4, 3 } }, { name = "b", shape = { 3 } },
                              { name = "empty", shape = { 0, 2 } } }, { metadata = { format = "pt" } })
  local v = ffi.new("float[15]")
  for i = 0, 14 do v[i] = i * 0.5 - 1 end
  w:write(v, 60); w:commit()
  local good = slurp(path)
  put("safetensors", "valid_f32", good)
  local function raw(header, data)
    local n, len = #header, {}
    for i = 1, 8 do len[i] = string.char(n % 256); n = math.floor(n / 256) end
    return table.concat(len) .. header .. data
  end
  put("safetensors", "valid_bf16_f16", raw('{"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},' ..
      '"y":{"dtype":"F16","shape":[2,1],"data_offsets":[4,8]},"z":{"dtype":"I8","shape":[],"data_offsets":[8,9]}}',
      "\0\63\128\191\0\60\0\188\7"))
  put("safetensors", "overlap", raw('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
      '"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', ("\0"):rep(8)))
  put("safetensors", "past_end", raw('{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', ("\0"):rep(8)))
  put("safetensors", "bad_dtype", raw('{"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(4)))
  put("safetensors", "truncated", good:sub(1, #good - 7))
  put("safetensors", "not_object", raw("[1,2,3]", ""))
  put("safetensors", "huge_length", "\255\255\255\255\255\255\255\127{}")
end

-- llm.c .bin token files --------------------------------------------------
do
  local tb = require "ztrain.model.data.tokbin"
  local p = tmp .. "/t.bin"
  assert(tb.write(p, { 1, 2, 3, 50256, 0, 65535 }))
  local g16 = slurp(p)
  put("tokbin", "valid_u16", g16)
  assert(tb.write(p, { 5, 70000, 2 ^ 31 - 1 }, nil, { wide = true }))
  put("tokbin", "valid_u32", slurp(p))
  assert(tb.write(p, {}, 0))
  put("tokbin", "valid_empty", slurp(p))
  put("tokbin", "truncated", g16:sub(1, #g16 - 1))
  put("tokbin", "short_header", g16:sub(1, 100))
  put("tokbin", "bad_version", g16:sub(1, 4) .. "\2\0\0\0" .. g16:sub(9))
  put("tokbin", "negative_count", g16:sub(1, 8) .. "\255\255\255\255" .. g16:sub(13))
end

-- BPE vocabulary and merges -----------------------------------------------------
do
  local vocab = slurp("spec/fixtures/bpe/tiny/vocab.json")
  local merges = slurp("spec/fixtures/bpe/tiny/merges.txt")
  put("bpe_vocab", "valid", vocab)
  put("bpe_vocab", "no_byte_symbol", (vocab:gsub('"a": %d+,\n', "", 1)))
  put("bpe_vocab", "shared_id", (vocab:gsub('"b": %d+', '"b": 0', 1)))
  put("bpe_vocab", "array", "[1, 2, 3]")
  put("bpe_vocab", "fraction", (vocab:gsub('"c": %d+', '"c": 1.5', 1)))
  put("bpe_merges", "valid", merges)
  put("bpe_merges", "crlf", (merges:gsub("\n", "\r\n")))
  put("bpe_merges", "unknown_token", merges .. "zz q\n")
  put("bpe_merges", "three_parts", "#version: 0.2\na b c\n")
  put("bpe_merges", "empty", "")
end

-- checkpoints: saved by checkpoint.save itself, on one rank ---------------------
do
  local ckpt = require "ztrain.train.checkpoint"
  local world = { rank = 0, size = 1, gather_strings = function(_, s) return { s } end }
  local entries = {}
  for _, kind in ipairs(targets.CK_KINDS) do
    for _, u in ipairs(targets.CK_UNITS) do
      -- a tensor stand-in: what write_rank uses (view(at, {n}):read(buf), free)
      local tensor = { view = function(_, at, shape)
        return { read = function(_, buf) for i = 0, shape[1] - 1 do buf[i] = (at + i) * 0.25 end end,
                 free = function() end }
      end }
      entries[#entries + 1] = { kind = kind, unit = u.name, lo = 0, hi = u.numel, tensor = tensor }
    end
  end
  local path = ckpt.save { world = world, root = tmp .. "/ck", step = 3, export = { entries = entries }, keep = 1,
                           meta = { model = { name = "fuzz", units = targets.CK_UNITS }, strategy = "single" } }
  local man = slurp(path .. "/manifest.json")
  local idx, bin = slurp(path .. "/rank-00000.json"), slurp(path .. "/rank-00000.bin")
  local M = targets.CK_MARK
  local function pack(m, i, b) return m .. M .. "rank-00000.json\n" .. i .. M .. "rank-00000.bin\n" .. b end
  put("checkpoint", "valid", pack(man, idx, bin))
  put("checkpoint", "no_index", man)
  put("checkpoint", "bad_block", pack(man, idx, bin:sub(1, 100) .. "\1" .. bin:sub(102)))
  put("checkpoint", "truncated_bin", pack(man, idx, bin:sub(1, #bin - 8)))
  put("checkpoint", "bad_version", pack((man:gsub('"version":1', '"version":2')), idx, bin))
  put("checkpoint", "not_json", pack("{", idx, bin))
  os.execute("rm -rf '" .. tmp .. "'")
end

-- recipes: overrides, then (after an empty line) a recipe file --------------
do
  put("recipe", "overrides", "train.steps=20\nmodel.size=gpt2\noptim.betas={0.9,0.99}\nbatch.micro=2\n")
  put("recipe", "override_unknown", "batch.size=8\n")
  put("recipe", "override_table", "lr=3e-4\n")
  put("recipe", "override_number", "train.steps=many\n")
  put("recipe", "override_strategy", "strategy=zero3\nprecision=bf16\ndevice.bf16_gemm=on\n")
  put("recipe", "override_schedule", "schedule=1f1b\npipeline.placement=v\ntrain.checkpoint_activations=2\n")
  for _, name in ipairs { "zero3", "zero3_offload", "pipeline_1f1b", "single" } do
    put("recipe", "file_" .. name, "train.steps=5\n\n" .. slurp("recipes/" .. name .. ".lua"))
  end
  put("recipe", "file_bad_key", "\n\nreturn { train = { stpes = 1 }, batch = 4 }\n")
end
print("seed corpora written under " .. OUT)
