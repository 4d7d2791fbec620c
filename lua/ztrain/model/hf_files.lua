-- ztrain.model.hf_files: the files of a Hugging Face model directory that
-- every family reads alike -- config.json (and other JSON objects), and
-- the weights in model.safetensors or in the shards its index names.
-- model/hf.lua (GPT-2) and model/hf_llama.lua (the Llama family) share it.
local cjson = require "cjson.safe"
local st = require "ztrain.model.safetensors"
local files = require "ztrain.util.fs"

local M = {}

M.SLICE = 1024 * 1024   -- elements a read moves (fill_tensor)

-- whole_problem(key, v) -> nil when config.json's v is a whole number from
-- 1 to 2^31 (gpt2.whole_numbers' bound), else what is wrong, naming the key
-- as the file does: a string is quoted (and said to be one), a number past
-- the bound named as too large, not as not whole
function M.whole_problem(key, v)
  if type(v) == "number" and v >= 1 and v == math.floor(v) and v <= 2 ^ 31 then return nil end
  if type(v) == "number" and v > 2 ^ 31 then
    return ("%s %.17g is larger than ztrain takes (at most 2^31)"):format(key, v)
  end
  if type(v) == "string" then
    return ("%s must be a whole number >= 1, got the string %q (write it without quotes)"):format(key, v)
  end
  return ("%s must be a whole number >= 1, got %s"):format(key, v == nil and "nothing" or tostring(v))
end

local function fail(msg) error(msg, 0) end

-- read_json(path, what) -> the decoded object; raises naming path and what
function M.read_json(path, what)
  local f, err = io.open(path, "rb")
  if not f then fail(("cannot open %s (%s): %s"):format(path, what, err)) end
  local text = f:read("*a")
  f:close()
  local v, jerr = cjson.decode(text)
  if type(v) ~= "table" or text:match("^%s*%[") then
    fail(("%s: not a JSON object (%s)"):format(path, jerr or type(v)))
  end
  return v
end

-- The checkpoint's safetensors file(s): model.safetensors, or the shards a
-- model.safetensors.index.json names. -> { lookup = name -> (file, entry), files }
function M.open_files(dir)
  local single, index = dir .. "/model.safetensors", dir .. "/model.safetensors.index.json"
  if files.exists(single) then
    local f = st.open(single)
    return { files = { f }, lookup = function(name) return f, f.tensors[name] end, what = single }
  end
  if files.exists(index) then
    local j = M.read_json(index, "the checkpoint's shard index")
    if type(j.weight_map) ~= "table" then fail(("%s: no \"weight_map\" object"):format(index)) end
    local byfile, files = {}, {}
    for name, fname in pairs(j.weight_map) do
      if type(fname) ~= "string" or fname:find("/") or fname:find("^%.") then
        fail(("%s: tensor %s maps to %s, not a file name in %s"):format(index, name, tostring(fname), dir))
      end
      if not byfile[fname] then
        byfile[fname] = st.open(dir .. "/" .. fname)
        files[#files + 1] = byfile[fname]
      end
    end
    return { files = files, what = index, lookup = function(name)
      local fname = j.weight_map[name]
      local f = fname and byfile[fname]
      if not f then return nil, nil end
      if not f.tensors[name] then
        fail(("%s: the index puts tensor %s in %s, which has no such tensor"):format(index, name, f.path))
      end
      return f, f.tensors[name]
    end }
  end
  local other = files.exists(dir .. "/pytorch_model.bin") and "pytorch_model.bin" or
                files.exists(dir .. "/model.bin") and "model.bin" or nil
  if other then
    fail(("%s holds %s (PyTorch pickle), which ztrain does not read: convert it with transformers, " ..
          "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"):format(dir, other))
  end
  fail(("hf:%s: no model.safetensors (or model.safetensors.index.json) in %s"):format(dir, dir))
end

-- fill_tensor(flat, t, file, name, scratch): tensor t of a unit (its
-- offset and numel in the unit's flat buffer) from the checkpoint's tensor
-- `name` in `file`, SLICE elements at a time through scratch (a float[SLICE])
function M.fill_tensor(flat, t, file, name, scratch)
  for off = 0, t.numel - 1, M.SLICE do
    local n = math.min(M.SLICE, t.numel - off)
    file:read_f32(name, scratch, off, n)
    local v = flat:view(t.offset + off, { n })
    local ok, err = pcall(v.write, v, scratch)
    v:free()
    if not ok then error(err, 0) end
  end
end

return M
