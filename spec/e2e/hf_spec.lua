-- Hugging Face GPT-2 checkpoints (model/hf.lua, model/safetensors.lua) against the
-- fixture tools/make_hf_fixture.py made with transformers (spec/fixtures/hf):
-- the loaded parameters have the digest PyTorch computed over the same
-- values in ztrain's layout; the forward gives PyTorch's logits; every
-- strategy loads the same bits; an export loads back (and into
-- transformers, where installed); bad files are refused naming the file,
-- the tensor and the inconsistency.
local ffi = require "ffi"
local cjson = require "cjson"
local util = require "helpers.util"
local zt = require "ztrain"
local hf = require "ztrain.model.hf"
local st = require "ztrain.model.safetensors"
local digest = require "ztrain.core.digest"

local FIX = "spec/fixtures/hf"
local TINY = FIX .. "/tiny"
local expected = cjson.decode(util.read(TINY .. "/expected.json"))
local sh, read, write = util.sh, util.read, util.write

-- Logits ztrain computes on the fixture's input ids (B x T x V floats, 0-based).
local function ztrain_logits(model)
  local B, Tn = #expected.input_ids, #expected.input_ids[1]
  local a = model:activations(B, Tn)
  local ids, tg = ffi.new("int32_t[?]", B * Tn), ffi.new("int32_t[?]", B * Tn)
  for b = 1, B do
    for t = 1, Tn do
      ids[(b - 1) * Tn + t - 1] = expected.input_ids[b][t]
      tg[(b - 1) * Tn + t - 1] = expected.targets[b][t]
    end
  end
  a.tokens:write(ids); a.targets:write(tg)
  local loss = model:forward_all(a)
  local out, n = a:read_logits()     -- (B*T, V), the padding left out
  a:free()
  return out, n, loss
end

local function max_abs_diff(a, b, n)
  local m = 0
  for i = 0, n - 1 do m = math.max(m, math.abs(a[i] - b[i])) end
  return m
end

-- The fixture's PyTorch logits (a cdata copy: a pointer into a Lua string
-- would not keep the string alive).
local torch_raw = read(TINY .. "/" .. expected.logits.file)
local torch_logits = ffi.new("float[?]", #torch_raw / 4)
ffi.copy(torch_logits, torch_raw, #torch_raw)

-- fp32 rounding noise: the two sides sum the same products in different
-- orders (OpenBLAS vs PyTorch's GEMM blocking, a tiled online softmax vs a
-- full one, LayerNorm statistics in double vs float), each step off by a
-- few ulps of values up to |logit| = 3.2 (1 ulp = 2.4e-7 there). Measured:
-- 1.25e-6. A mapping mistake (an untransposed weight, a swapped bias, a
-- missed LayerNorm) moves logits by 0.01 to 1.
local LOGIT_TOL = 1e-5

-- A copy of the tiny checkpoint's safetensors whose JSON header went
-- through edit(header table) and whose data went through data_edit(str).
local function header_of(path)
  local raw = read(path)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + raw:byte(i) end
  return cjson.decode(raw:sub(9, 8 + n)), raw:sub(9 + n)
end

local function pack(header, data)
  local text = cjson.encode(header)
  text = text .. (" "):rep((8 - #text % 8) % 8)
  local len, n = {}, #text
  for i = 1, 8 do len[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(len) .. text .. data
end

local tmp
local function bad_dir(name, fn)
  local dir = tmp .. "/" .. name
  sh("rm -rf " .. dir .. " && mkdir -p " .. dir .. " && cp " .. TINY .. "/config.json " .. dir .. "/")
  local header, data = header_of(TINY .. "/model.safetensors")
  local bytes = fn(header, data, dir)
  if bytes then write(dir .. "/model.safetensors", bytes) end
  return dir
end

local function open_error(dir)
  local ok, err = pcall(hf.open, dir)
  assert.is_false(ok, "hf.open accepted " .. dir)
  return tostring(err)
end

-- (the byte tokenizer: the tiny fixture's 381-token vocabulary holds its 256 ids)
local RUN = "model.seed=1 data.seq_len=32 batch.micro=2 train.eval_every=0 train.log_every=1 data.tokenizer=bytes -q"

local function run_summary(args, out)
  local o, rc = sh(("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 180 build/ztrain %s %s out=%s")
                   :format(args, RUN, out))
  assert.are.equal(0, rc, o)
  local s = cjson.decode(read(out .. "/summary.json"))
  util.rm(out)
  return s
end

describe("Hugging Face GPT-2 checkpoints", function()
  setup(function() tmp = util.tmpdir() end)
  teardown(function() util.rm(tmp) end)

  describe("loading the fixture", function()
    it("reads config.json into a gpt2 config", function()
      local cfg = hf.config(TINY)
      local c = expected.config
      assert.are.same({ c.L, c.C, c.NH, c.maxT, c.V }, { cfg.L, cfg.C, cfg.NH, cfg.maxT, cfg.V })
      assert.are.equal("hf:" .. TINY, cfg.name)
    end)

    -- the digest tools/make_hf_fixture.py computed in PyTorch over the same
    -- values in ztrain's canonical layout (Conv1D weights transposed): every
    -- name, transpose and dtype conversion is checked at once
    for _, case in ipairs({ { "tiny", "f32" }, { "tiny-f16", "f16" }, { "tiny-bf16", "bf16" } }) do
      it(("loads %s (%s tensors) to PyTorch's values, bit for bit"):format(case[1], case[2]:upper()), function()
        local m = hf.load(FIX .. "/" .. case[1], { tier = "host" })
        local d = digest.params(m)
        m:free()
        assert.are.equal(expected.param_digest[case[2]], d)
      end)
    end

    it("F16 and BF16 values are the F32 ones rounded (spot values)", function()
      local f32 = st.open(TINY .. "/model.safetensors")
      local f16 = st.open(FIX .. "/tiny-f16/model.safetensors")
      local bf16 = st.open(FIX .. "/tiny-bf16/model.safetensors")
      local n = f32.tensors["transformer.wte.weight"].numel
      local a, b, c = ffi.new("float[?]", n), ffi.new("float[?]", n), ffi.new("float[?]", n)
      f32:read_f32("transformer.wte.weight", a)
      f16:read_f32("wte.weight", b)          -- no prefix in this copy
      bf16:read_f32("transformer.wte.weight", c)
      for i = 0, n - 1 do
        -- half: 11 significant bits (values here are normal halves);
        -- bfloat16: 8 (both round to nearest)
        assert(math.abs(b[i] - a[i]) <= math.abs(a[i]) * 2 ^ -11 + 2 ^ -25, ("f16 element %d: %g vs %g"):format(i, b[i], a[i]))
        assert(math.abs(c[i] - a[i]) <= math.abs(a[i]) * 2 ^ -8, ("bf16 element %d: %g vs %g"):format(i, c[i], a[i]))
      end
      -- a slice read equals the same elements of a whole read
      local part = ffi.new("float[7]")
      bf16:read_f32("transformer.wte.weight", part, 1000, 7)
      for i = 0, 6 do assert.are.equal(c[1000 + i], part[i]) end
    end)

    it("gives PyTorch's logits and loss within fp32 rounding noise", function()
      local m = hf.load(TINY)
      local lg, n, loss = ztrain_logits(m)
      m:free()
      local B, Tn, V = unpack(expected.logits.shape)
      assert.are.equal(B * Tn * V, n)
      local d = max_abs_diff(lg, torch_logits, n)
      print(("\n  max |logit - PyTorch| = %.3g (|logit| up to %.2f; tolerance %g)"):format(d, expected.logits.max_abs, LOGIT_TOL))
      assert.is_true(d < LOGIT_TOL, ("max abs logit difference %g"):format(d))
      assert.is_true(math.abs(loss - expected.loss) < 1e-5, ("loss %.9g vs PyTorch %.9g"):format(loss, expected.loss))
    end)

    it("load_into fills buffers placed by the caller", function()
      local cfg = hf.config(TINY)
      local m = zt.gpt2.new(cfg, { tier = "host" })
      hf.load_into(m, TINY)
      local d = digest.params(m)
      m:free()
      assert.are.equal(expected.param_digest.f32, d)
    end)

    it("accepts GPT-2 124M's real layout: names without a prefix, attn.bias buffers, 1024 positions", function()
      -- the header of openai-community/gpt2's model.safetensors, over a
      -- sparse file (the checks read headers, not values)
      local cfg = zt.gpt2.config("gpt2")
      local m = zt.gpt2.new(cfg, { alloc = false })
      local header, off = { __metadata__ = { format = "pt" } }, 0
      local function add(name, shape, dtype)
        local n = dtype == "F32" and 4 or 1
        for _, d in ipairs(shape) do n = n * d end
        header[name] = { dtype = dtype, shape = shape, data_offsets = { off, off + n } }
        off = off + n
      end
      for _, t in m:each_tensor() do
        local name = (t.name == "wte" or t.name == "wpe") and t.name .. ".weight" or t.name
        local shape = t.shape
        if name:match("c_attn%.weight$") or name:match("c_proj%.weight$") or name:match("c_fc%.weight$") then
          shape = { t.shape[2], t.shape[1] }
        end
        add(name, shape, "F32")
      end
      for l = 0, cfg.L - 1 do add("h." .. l .. ".attn.bias", { 1, 1, 1024, 1024 }, "F32") end
      local dir = tmp .. "/gpt2-124M"
      sh("mkdir -p " .. dir)
      write(dir .. "/config.json", cjson.encode({ model_type = "gpt2", architectures = { "GPT2LMHeadModel" },
        n_layer = 12, n_embd = 768, n_head = 12, n_positions = 1024, n_ctx = 1024, vocab_size = 50257,
        activation_function = "gelu_new", layer_norm_epsilon = 1e-5 }))
      local bytes = pack(header, "")
      write(dir .. "/model.safetensors", bytes)
      assert.are.equal(0, select(2, sh(("truncate -s %d %s/model.safetensors"):format(#bytes + off, dir))))
      local src = hf.open(dir)
      assert.are.equal(124439808, m.nparams)
      assert.are.same({ 12, 768, 12, 1024, 50257 }, { src.cfg.L, src.cfg.C, src.cfg.NH, src.cfg.maxT, src.cfg.V })
      assert.are.equal("", src.prefix)
      util.rm(dir)
    end)
  end)

  describe("under every strategy", function()
    -- optim.lr = 0 leaves every parameter as loaded (p - 0 * update = p):
    -- the summary's digest is then the digest of what the strategy loaded
    local base = "model=hf:" .. TINY .. " train.steps=1 optim.lr=0"
    for _, case in ipairs({
      { "single", "recipes/single.lua" },
      { "dp N=2", "--nproc 2 recipes/dp.lua" },
      { "zero1 N=2", "--nproc 2 recipes/zero1.lua" },
      { "zero3 N=2", "--nproc 2 recipes/zero3.lua" },
      { "zero3_offload N=2 (parameter shards on the host)", "--nproc 2 recipes/zero3_offload.lua" },
      { "zero2 N=2", "--nproc 2 recipes/zero2.lua" },
      { "zero2_offload N=2", "--nproc 2 recipes/zero2_offload.lua" },
      { "ZeRO-Infinity N=2 (shards on nvme)", "--nproc 2 recipes/infinity.lua" },
      { "a 2-stage pipeline (1f1b)", "--nproc 2 recipes/pipeline_1f1b.lua" },
      { "an interleaved pipeline (2 ranks x 2 chunks)", "--nproc 2 recipes/pipeline_interleaved.lua" },
      { "ZB-V (first and last stage on one rank)", "--nproc 2 recipes/pipeline_zbv.lua" },
      { "PipeDream (a replica of the tied embedding on the last stage)", "--nproc 2 recipes/pipeline_pipedream.lua" },
      { "2 stages x 2 data-parallel replicas", "--nproc 4 recipes/pipeline_dp.lua" },
    }) do
      it(case[1] .. " loads PyTorch's parameters", function()
        local s = run_summary(case[2] .. " " .. base, util.outdir())
        assert.are.equal("hf:" .. TINY, s.model.name)
        assert.are.equal(expected.params, s.model.params)
        assert.are.equal(expected.param_digest.f32, s.param_digest)
      end)
    end

    it('model = "hf:DIR" in a recipe file is short for model.from', function()
      local r = assert(zt.recipe.resolve({ model = "hf:" .. TINY }))
      assert.are.equal("hf:" .. TINY, r.model.from)
      local bad, err = zt.recipe.resolve({ model = { from = TINY } })
      assert.is_nil(bad)
      assert.matches('model.from must be "hf:DIR"', err, 1, true)
    end)
  end)

  describe("export", function()
    local function trained_export(args)
      local dir = tmp .. "/export-" .. tostring(math.random(1e9))
      local s = run_summary(("%s model=hf:%s train.steps=3 export.hf=%s"):format(args, TINY, dir), util.outdir())
      assert.are.equal("ok", s.exit)
      assert.are.same({ hf = dir }, s.export)
      return s, dir
    end

    it("writes a directory ztrain loads back to the trained digest (single, zero3 N=2, 2 stages)", function()
      local want
      for _, args in ipairs({ "recipes/single.lua batch.accumulate=2", "--nproc 2 recipes/zero3.lua",
                              "--nproc 2 recipes/pipeline_1f1b.lua batch.accumulate=2" }) do
        local s, dir = trained_export(args)
        -- the same math: one rank accumulating 2 = zero3 on 2 = 2 stages over 2 micro-batches
        want = want or s.param_digest
        assert.are.equal(want, s.param_digest, args)
        assert.are_not.equal(expected.param_digest.f32, s.param_digest)   -- it trained
        local m = hf.load(dir)
        assert.are.equal(s.param_digest, digest.params(m), args)
        m:free()
        local cfg = cjson.decode(read(dir .. "/config.json"))
        assert.are.same({ "gpt2", 2, 64, 4, 128, 381, true },
                        { cfg.model_type, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, cfg.vocab_size,
                          cfg.tie_word_embeddings })
        -- nothing left over from the atomic writes
        local ls = sh("ls -a " .. dir)
        assert.is_nil(ls:match("tmp"), ls)
        util.rm(dir)
      end
    end)

    it("under ZeRO-Infinity, interleaved stages and 2 stages x 2 replicas too", function()
      for _, args in ipairs({ "--nproc 2 recipes/infinity.lua", "--nproc 2 recipes/pipeline_interleaved.lua",
                              "--nproc 4 recipes/pipeline_dp.lua" }) do
        local s, dir = trained_export(args)
        local m = hf.load(dir)
        assert.are.equal(s.param_digest, digest.params(m), args)
        m:free()
        util.rm(dir)
      end
    end)

    it("an untrained round trip writes the fixture's bytes back", function()
      local m = hf.load(TINY)
      local dir = tmp .. "/roundtrip"
      assert(hf.save(m, dir))
      m:free()
      -- same header layout and data as transformers' file, up to tensor order:
      -- compare tensor by tensor
      local a, b = st.open(TINY .. "/model.safetensors"), st.open(dir .. "/model.safetensors")
      assert.are.same(a.names, b.names)
      for _, name in ipairs(a.names) do assert.are.equal(a:read_raw(name), b:read_raw(name), name) end
      assert.are.equal("pt", b.metadata.format)
    end)

    it("loads into transformers' GPT2LMHeadModel with the logits ztrain computes", function()
      -- ZTRAIN_HF_PYTHON names the interpreter to try (e.g. to see the skip)
      local py
      local cands = os.getenv("ZTRAIN_HF_PYTHON") and { os.getenv("ZTRAIN_HF_PYTHON") } or
                    { "/opt/hfvenv/bin/python", "/usr/bin/python3", "python3" }
      for _, cand in ipairs(cands) do
        local _, rc = sh(cand .. ' -c "import torch, transformers, safetensors"')
        if rc == 0 then py = cand; break end
      end
      if not py then
        pending("transformers is not installed: apt-get install python3-torch python3-venv; " ..
                "/usr/bin/python3 -m venv --system-site-packages /opt/hfvenv; " ..
                '/opt/hfvenv/bin/pip install "transformers<4.41" safetensors')
        return
      end
      local s, dir = trained_export("recipes/single.lua")
      local out = dir .. "/torch_logits.f32"
      local o, rc = sh(("%s %s/transformers_logits.py %s %s %s"):format(py, FIX, dir, TINY .. "/expected.json", out))
      assert.are.equal(0, rc, o)
      local m = hf.load(dir)
      assert.are.equal(s.param_digest, digest.params(m))
      local lg, n = ztrain_logits(m)
      m:free()
      local raw = read(out)
      assert.are.equal(n * 4, #raw)
      local theirs = ffi.new("float[?]", n)
      ffi.copy(theirs, raw, n * 4)
      local d = max_abs_diff(lg, theirs, n)
      print(("\n  exported model: max |logit(ztrain) - logit(transformers)| = %.3g"):format(d))
      assert.is_true(d < LOGIT_TOL, ("max abs logit difference %g"):format(d))
      util.rm(dir)
    end)
  end)

  describe("bad input", function()
    it("a truncated file", function()
      local dir = bad_dir("truncated", function(h, data) return pack(h, data:sub(1, #data - 1000)) end)
      local err = open_error(dir)
      assert.matches(dir .. "/model.safetensors: tensor ", err, 1, true)
      assert.matches("reach past the end of the data", err, 1, true)
      assert.matches("truncated", err, 1, true)
    end)

    it("a file shorter than its header length", function()
      local dir = bad_dir("short", function()
        return string.char(0x00, 0x10, 0, 0, 0, 0, 0, 0) .. '{"a":1}'
      end)
      local err = open_error(dir)
      assert.matches(dir .. "/model.safetensors: header length 4096 runs past the end of the file (15 bytes", err, 1, true)
    end)

    it("a header that is not JSON", function()
      local dir = bad_dir("notjson", function() return string.char(4, 0, 0, 0, 0, 0, 0, 0) .. "{{{{" end)
      assert.matches("the header is not a JSON object", open_error(dir), 1, true)
    end)

    it("an offset outside the data", function()
      local dir = bad_dir("offset", function(h, data)
        local e = h["transformer.h.1.mlp.c_fc.bias"]
        e.data_offsets = { #data + 16, #data + 16 + 1024 }
        return pack(h, data)
      end)
      local err = open_error(dir)
      assert.matches("tensor transformer.h.1.mlp.c_fc.bias: data_offsets [", err, 1, true)
      assert.matches("reach past the end of the data", err, 1, true)
    end)

    it("offsets that end before they begin, and tensors that overlap", function()
      local dir = bad_dir("backwards", function(h, data)
        local e = h["transformer.ln_f.bias"]
        e.data_offsets = { e.data_offsets[2], e.data_offsets[1] }
        return pack(h, data)
      end)
      assert.matches("tensor transformer.ln_f.bias: data_offsets %[%d+, %d+%] end before they begin", open_error(dir))
      dir = bad_dir("overlap", function(h, data)
        local a, b = h["transformer.ln_f.bias"], h["transformer.ln_f.weight"]
        b.data_offsets = { a.data_offsets[1], a.data_offsets[2] }
        return pack(h, data)
      end)
      local err = open_error(dir)
      assert.matches("overlap", err, 1, true)
      assert.matches("transformer.ln_f.bias", err, 1, true)
      assert.matches("transformer.ln_f.weight", err, 1, true)
    end)

    it("a dtype ztrain does not read, and one the format does not know", function()
      local dir = bad_dir("dtype", function(h, data)
        h["transformer.h.0.attn.c_proj.weight"].dtype = "I32"       -- same size: a consistent file
        return pack(h, data)
      end)
      local err = open_error(dir)
      assert.matches("tensor transformer.h.0.attn.c_proj.weight has dtype I32; ztrain reads F32, F16 and BF16", err, 1, true)
      dir = bad_dir("dtype2", function(h, data)
        h["transformer.wpe.weight"].dtype = "Q7"
        return pack(h, data)
      end)
      assert.matches('tensor transformer.wpe.weight: unknown dtype "Q7"', open_error(dir), 1, true)
    end)

    it("a shape that does not match the bytes, and one that does not match config.json", function()
      local dir = bad_dir("numel", function(h, data)
        h["transformer.h.0.attn.c_attn.bias"].shape = { 193 }
        return pack(h, data)
      end)
      local err = open_error(dir)
      assert.matches("tensor transformer.h.0.attn.c_attn.bias: shape [193] is 193 elements = 772 bytes of F32, " ..
                     "but data_offsets [", err, 1, true)
      assert.matches("span 768 bytes", err, 1, true)
      dir = bad_dir("shape", function(h, data)
        h["transformer.h.0.attn.c_attn.weight"].shape = { 192, 64 }   -- ztrain's layout, not Conv1D's
        return pack(h, data)
      end)
      assert.matches("tensor transformer.h.0.attn.c_attn.weight has shape [192, 64], but config.json " ..
                     "(n_embd 64, n_positions 128, vocab_size 381) makes it [64, 192]", open_error(dir), 1, true)
    end)

    it("a missing tensor, an extra layer, an untied head", function()
      local dir = bad_dir("missing", function(h, data)
        h["transformer.h.1.ln_2.bias"] = nil
        return pack(h, data)
      end)
      assert.matches("model.safetensors: missing tensor transformer.h.1.ln_2.bias (h.1.ln_2.bias of unit block.1",
                     open_error(dir), 1, true)
      dir = bad_dir("extra", function(h, data)
        h["transformer.h.2.ln_1.weight"] = { dtype = "F32", shape = { 0 }, data_offsets = { 0, 0 } }
        return pack(h, data)
      end)
      assert.matches("tensor transformer.h.2.ln_1.weight is not part of a GPT-2 with config.json's n_layer = 2",
                     open_error(dir), 1, true)
      dir = bad_dir("untied", function(h, data)
        local w = h["transformer.wte.weight"]
        local n = w.data_offsets[2] - w.data_offsets[1]
        h["lm_head.weight"] = { dtype = "F32", shape = w.shape, data_offsets = { #data, #data + n } }
        return pack(h, data .. data:sub(w.data_offsets[1] + 1, w.data_offsets[2] - 4) .. "\0\0\0\0")
      end)
      assert.matches("lm_head.weight differs from transformer.wte.weight: an untied LM head", open_error(dir), 1, true)
      dir = bad_dir("tied", function(h, data)             -- a stored head equal to wte is fine
        local w = h["transformer.wte.weight"]
        local n = w.data_offsets[2] - w.data_offsets[1]
        h["lm_head.weight"] = { dtype = "F32", shape = w.shape, data_offsets = { #data, #data + n } }
        return pack(h, data .. data:sub(w.data_offsets[1] + 1, w.data_offsets[2]))
      end)
      assert.is_table(hf.open(dir))
    end)

    it("a config that is not GPT-2, or GPT-2 with settings ztrain does not compute", function()
      local function with_config(name, edit)
        local dir = bad_dir(name, function() end)
        sh(("cp %s/model.safetensors %s/"):format(TINY, dir))
        local j = cjson.decode(read(TINY .. "/config.json"))
        edit(j)
        write(dir .. "/config.json", cjson.encode(j))
        return dir
      end
      local dir = with_config("bert", function(j) j.model_type = "bert" end)
      assert.matches(dir .. '/config.json: model_type is "bert"; ztrain loads GPT-2 ("gpt2") and the Llama family ' ..
                     '("llama", "qwen2", "mistral")', open_error(dir), 1, true)
      -- a GPT-2 config relabelled "llama": read as the Llama family, whose fields it lacks
      dir = with_config("llama", function(j) j.model_type = "llama" end)
      assert.matches(dir .. "/config.json: num_attention_heads must be a whole number >= 1, got nothing",
                     open_error(dir), 1, true)
      dir = with_config("act", function(j) j.activation_function = "relu" end)
      assert.matches('activation_function "relu"', open_error(dir), 1, true)
      dir = with_config("heads", function(j) j.n_head = 5 end)
      assert.matches("n_embd 64 does not divide into n_head 5 heads", open_error(dir), 1, true)
      dir = with_config("layers", function(j) j.n_layer = nil end)
      assert.matches("n_layer must be a whole number >= 1, got nothing", open_error(dir), 1, true)
      -- a number written as a string, and one past what ztrain takes: each said as what it is
      dir = with_config("string", function(j) j.n_embd = "64" end)
      assert.matches('n_embd must be a whole number >= 1, got the string "64" (write it without quotes)',
                     open_error(dir), 1, true)
      dir = with_config("huge", function(j) j.n_positions = 1e12 end)
      assert.matches("n_positions 1000000000000 is larger than ztrain takes (at most 2^31)", open_error(dir), 1, true)
      dir = with_config("layers3", function(j) j.n_layer = 3 end)
      assert.matches("missing tensor transformer.h.2.ln_1.weight", open_error(dir), 1, true)
      local err = open_error(tmp .. "/nowhere")
      assert.matches("the directory does not exist", err, 1, true)
    end)

    it("the command line says what is wrong, exits 1 and writes no output", function()
      local dir = bad_dir("cli", function(h, data) return pack(h, data:sub(1, 100)) end)
      local out = util.outdir()
      local o, rc = sh(("timeout 60 build/ztrain recipes/single.lua model=hf:%s %s out=%s"):format(dir, RUN, out))
      assert.are.equal(1, rc, o)
      assert.matches("^ztrain: " .. dir:gsub("%p", "%%%0") .. "/model.safetensors: tensor ", o)
      assert.is_nil(io.open(out .. "/summary.json"), "a failed load left " .. out)
      -- under 2 ranks: every rank stops cleanly, one message
      local env, mpi = util.mpi_log()
      o, rc = sh(("%sOMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 build/ztrain --nproc 2 " ..
                  "recipes/zero3.lua model=hf:%s %s out=%s"):format(env, dir, RUN, out))
      assert.are.equal(1, rc, o)
      assert.matches("/model.safetensors: tensor ", o, 1, true)
      local said = o .. mpi()
      assert.is_nil(said:match("MPI_ABORT"), said)
    end)

    it("a tokenizer with more tokens than the checkpoint's vocabulary", function()
      -- a 200-token model: the byte tokenizer's 256 ids have no rows past 199
      local cfg = zt.gpt2.custom({ name = "small", L = 1, C = 16, NH = 2, maxT = 32, V = 200 })
      local m = zt.gpt2.new(cfg, { tier = "host" })
      m:init(1)
      local dir = tmp .. "/v200"
      assert(hf.save(m, dir))
      m:free()
      local out = util.outdir()
      local o, rc = sh(("timeout 60 build/ztrain recipes/single.lua model=hf:%s %s out=%s"):format(dir, RUN, out))
      assert.are.equal(1, rc, o)
      assert.matches("ztrain: the checkpoint hf:" .. dir .. " has a vocabulary of 200 tokens, fewer than the bytes " ..
                     "tokenizer's 256", o, 1, true)
      o, rc = sh(("timeout 60 build/ztrain recipes/single.lua model=hf:%s model.vocab_size=300 %s out=%s"):format(TINY, RUN, out))
      assert.are.equal(1, rc, o)
      assert.matches("model.vocab_size 300 differs from the checkpoint's vocab_size 381", o, 1, true)
    end)

    it("an export directory that cannot be written stops the run before training", function()
      local blocker = tmp .. "/a-file"
      write(blocker, "x")
      local out = util.outdir()
      local o, rc = sh(("timeout 60 build/ztrain recipes/single.lua export.hf=%s/sub %s out=%s"):format(blocker, RUN, out))
      assert.are.equal(1, rc, o)
      assert.matches("ztrain: export.hf: cannot write into " .. blocker .. "/sub", o, 1, true)
      assert.is_nil(io.open(out .. "/summary.json"))
    end)

    it("a write that fails or is abandoned leaves no file behind", function()
      local path = tmp .. "/w.safetensors"
      local w = st.writer(path, { { name = "a", shape = { 4 } } })
      w:write(ffi.new("float[2]"), 8)
      local ok, err = pcall(w.commit, w)                 -- 8 of 16 bytes
      assert.is_false(ok)
      assert.matches("8 of the header's 16 data bytes written", tostring(err), 1, true)
      w:abort()
      assert.is_nil(io.open(path))
      local ls = sh("ls -a " .. tmp)
      assert.is_nil(ls:match("w%.safetensors"), ls)           -- neither the file nor its temporary
      w = st.writer(path, { { name = "a", shape = { 4 } } })
      w:write(ffi.new("float[4]", { 1, 2, 3, 4 }), 16)
      w:commit()
      local f = st.open(path)
      local v = ffi.new("float[4]")
      f:read_f32("a", v)
      assert.are.same({ 1, 2, 3, 4 }, { v[0], v[1], v[2], v[3] })
    end)
  end)
end)
