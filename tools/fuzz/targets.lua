-- tools/fuzz/targets.lua: what each fuzz harness (harness.c) does with an input.
--
-- setup(name) -> run(input) -> nil | finding (a string). run calls one of
-- ztrain's readers on the input (through a file where the reader takes a
-- path) and judges the outcome the way ztrain's CLI does (ztrain.errors):
-- a return, a user error (a message without a "file.lua:N:" location) or
-- nil, message are fine; a located Lua error, a non-string error or a broken
-- invariant (a reader that accepts what it should have refused) is a finding.
--
-- Targets:
--   safetensors      the file                   model/safetensors.lua open, read_f32, read_raw
--   tokbin           the file                   data/tokbin.lua read, header
--   bpe_vocab        vocab.json (merges fixed)  data/bpe.lua load, then encode/decode round trip
--   bpe_merges       merges.txt (vocab fixed)   data/bpe.lua load, then encode/decode round trip
--   checkpoint       sections (below)           checkpoint.lua open, read
--   recipe           overrides [+ recipe file]  recipe.lua resolve / load
local ffi = require "ffi"
local errors = require "ztrain.core.errors"
local libc = require "ztrain.core.libc"

local M = {}
local HOME = rawget(_G, "ZTRAIN_HOME") or "."
local dir                                   -- this process's scratch directory

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  assert(f:write(s))
  assert(f:close())
end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- judge(ok, err) -> nil | finding, for the result of xpcall(f, tb)
-- A C function's argument error ("bad argument #2 to 'format'") has no
-- location, yet it is a bug: a reader passed it what it did not check.
local function is_bug_text(e) return type(e) == "string" and e:find("^bad argument #%d+ to ") ~= nil end
local function tb(e)
  if errors.is_user(e) and not is_bug_text(e) then return e end
  return { bug = debug.traceback(errors.message(e), 2) }
end
local function judge(ok, err)
  if ok then return nil end
  if type(err) == "table" and err.bug then return err.bug end
  return nil
end

-- a reader's nil, message: the message must be a user error
local function judge_msg(msg)
  if type(msg) ~= "string" then return "the reader returned nil and a " .. type(msg) .. ", not a message" end
  if not errors.is_user(msg) or is_bug_text(msg) then return "the reader's message is a bug's: " .. msg end
  return nil
end

---------------------------------------------------------------------------
-- safetensors

local function safetensors(input)
  local st = require "ztrain.model.safetensors"
  local path = dir .. "/model.safetensors"
  write(path, input)
  local finding
  local ok, err = xpcall(function()
    local f = st.open(path)
    -- what open() promises: every span inside the data, sized by its shape
    for _, name in ipairs(f.names) do
      local t = f.tensors[name]
      local esize = st.DTYPE_SIZE[t.dtype]
      local n, dims = 1, 0
      for _ in pairs(t.shape) do dims = dims + 1 end
      for i = 1, #t.shape do n = n * t.shape[i] end
      if dims ~= #t.shape or n ~= t.numel then
        finding = ("open accepted tensor %s whose shape is not a list of sizes (%d entries, %d in sequence)")
                  :format(name, dims, #t.shape)
        return
      end
      if not (esize and t.lo >= 0 and t.lo <= t.hi and t.hi <= f.data_size and t.numel * esize == t.hi - t.lo) then
        finding = ("open accepted tensor %s with dtype %s, span [%s, %s), numel %s in %s data bytes")
                  :format(name, tostring(t.dtype), tostring(t.lo), tostring(t.hi), tostring(t.numel), f.data_size)
        return
      end
      if st.READABLE[t.dtype] and t.numel <= 1e6 then
        local dst = ffi.new("float[?]", math.max(t.numel, 1))
        f:read_f32(name, dst)
      end
      if t.hi - t.lo <= 1e6 and #f:read_raw(name) ~= t.hi - t.lo then
        finding = "read_raw of " .. name .. " returned the wrong number of bytes"
        return
      end
    end
  end, tb)
  return finding or judge(ok, err)
end

---------------------------------------------------------------------------
-- llm.c .bin token files

local function tokbin(input)
  local tb_ = require "ztrain.model.data.tokbin"
  local path = dir .. "/tokens.bin"
  write(path, input)
  local finding
  local ok, err = xpcall(function()
    local h, herr = tb_.header(path)
    local t, terr = tb_.read(path)
    if not h then finding = judge_msg(herr); if not t then return end end
    if not t then finding = finding or judge_msg(terr); return end
    if not h then finding = "read accepted a file that header refused: " .. tostring(herr); return end
    if t.n < 0 or tb_.HEADER_BYTES + t.n * t.width ~= #input then
      finding = ("read accepted %d tokens of %d bytes in a %d-byte file"):format(t.n, t.width, #input)
    end
  end, tb)
  return finding or judge(ok, err)
end

---------------------------------------------------------------------------
-- BPE vocabulary and merges

-- text that exercises the pre-tokenizer and merges: ASCII, contractions,
-- digits, spaces, non-ASCII letters, invalid UTF-8, the special token
local TEXT = "ab abc aab bcab aaa, it's 2024!  café \255\254 naïve <|endoftext|>cab\n\n x"

local function bpe_load()
  local bpe = require "ztrain.model.data.bpe"
  local tok = bpe.load(dir .. "/bpe")
  local ids, n = tok.encode(TEXT)
  local back = tok.decode(ids, n)
  if back ~= TEXT then
    return ("decode(encode(s)) ~= s: %q from %d ids"):format(back, n)
  end
end

local function bpe_vocab(input)
  write(dir .. "/bpe/vocab.json", input)
  local finding
  local ok, err = xpcall(function() finding = bpe_load() end, tb)
  return finding or judge(ok, err)
end

local function bpe_merges(input)
  write(dir .. "/bpe/merges.txt", input)
  local finding
  local ok, err = xpcall(function() finding = bpe_load() end, tb)
  return finding or judge(ok, err)
end

---------------------------------------------------------------------------
-- Checkpoints. The input is a checkpoint directory in one text: the
-- manifest, then sections "\n=== NAME\n" holding the other files (NAME one
-- of CK_FILES, so the fuzzer writes nowhere else). The caller's side --
-- which kinds and units it asks for, and their sizes -- is a real
-- trainer's: fixed, as make_seeds.lua saved them.

local CK_FILES = { ["rank-00000.json"] = true, ["rank-00000.bin"] = true, ["rank-00001.json"] = true,
                   ["rank-00001.bin"] = true }
M.CK_UNITS = { { name = "wte", numel = 1000 }, { name = "h0", numel = 300 } }
M.CK_KINDS = { "params", "optim.m" }
M.CK_MARK = "\n=== "

function M.ck_split(input)
  local files, pos = {}, 1
  local name = "manifest.json"
  while true do
    local a, b = input:find(M.CK_MARK, pos, true)
    local body = input:sub(pos, (a or #input + 1) - 1)
    if CK_FILES[name] or name == "manifest.json" then files[name] = body end
    if not a then break end
    local nl = input:find("\n", b + 1, true)
    if not nl then break end
    name = input:sub(b + 1, nl - 1)
    pos = nl + 1
  end
  return files
end

-- A destination as ck.read uses one (dst:view(off, {n}):write(p)), which
-- checks that the reader writes only inside what was asked.
local function fake_dst(len, finding)
  return {
    view = function(_, off, shape)
      local n = shape[1]
      if type(off) ~= "number" or type(n) ~= "number" or off < 0 or n < 0 or off + n > len then
        finding[1] = ("read wrote elements [%s, %s + %s) of a %d-element destination")
                     :format(tostring(off), tostring(off), tostring(n), len)
      end
      return { write = function() end, free = function() end }
    end,
  }
end

local function checkpoint(input)
  local ckpt = require "ztrain.train.checkpoint"
  local cdir = dir .. "/ck"
  for name in pairs(CK_FILES) do os.remove(cdir .. "/" .. name) end
  for name, body in pairs(M.ck_split(input)) do write(cdir .. "/" .. name, body) end
  local finding = {}
  local ok, err = xpcall(function()
    local ck = ckpt.open(cdir)
    local rok, rerr = pcall(function()
      for _, kind in ipairs(M.CK_KINDS) do
        for _, u in ipairs(M.CK_UNITS) do
          ck.read(kind, u.name, 0, u.numel, fake_dst(u.numel, finding), u.numel)
          ck.read(kind, u.name, 7, 7 + 100, fake_dst(100, finding), u.numel)
        end
      end
    end)
    ck.close()
    if not rok then error(rerr, 0) end
  end, tb)
  return finding[1] or judge(ok, err)
end

---------------------------------------------------------------------------
-- Recipes. The input: override lines ("key=value") up to the first empty
-- line, then (optionally) a recipe file. Without a file: resolve({},
-- overrides); with one: load(path, overrides). A recipe is Lua code, so it
-- runs in a sandbox (no io, os, loadfile; require of ztrain's own modules
-- only) under an instruction limit: a user's loop is the user's, not a
-- finding.

local LIMIT = 2e7   -- Lua VM instructions
local function sandbox()
  local env = {}
  for _, k in ipairs { "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber",
                       "tostring", "type", "unpack", "rawget", "rawset", "rawequal", "setmetatable",
                       "getmetatable" } do
    env[k] = _G[k]
  end
  env.math, env.string, env.table = math, string, table
  env.require = function(name)
    if type(name) == "string" and (name == "ztrain" or name:match("^ztrain%.[%w_%.]+$")) then return require(name) end
    error(("sandbox: require %q refused"):format(tostring(name)), 0)
  end
  return env
end

local function recipe(input)
  local R = require "ztrain.train.recipe"
  local cut = input:find("\n\n", 1, true)
  local head = cut and input:sub(1, cut - 1) or input
  local file = cut and input:sub(cut + 2) or nil
  local overrides = {}
  for line in head:gmatch("[^\n]+") do overrides[#overrides + 1] = line end
  local real_loadfile = loadfile
  local ok, err = xpcall(function()
    -- an infinite loop in a recipe (or an override's table literal) stops here
    if fuzz_budget then fuzz_budget(LIMIT) end
    local r, rerr
    if file then
      local path = dir .. "/recipe.lua"
      write(path, file)
      loadfile = function(p)
        local f, e = real_loadfile(p)
        if f then setfenv(f, sandbox()) end
        return f, e
      end
      r, rerr = R.load(path, overrides)
    else
      r, rerr = R.resolve({}, overrides)
    end
    if not r then
      local j = judge_msg(rerr)
      if j then error({ bug = j }, 0) end
    end
  end, function(e) if type(e) == "table" and e.bug then return e end return tb(e) end)
  if fuzz_budget then fuzz_budget(0) end
  loadfile = real_loadfile
  return judge(ok, err)
end

---------------------------------------------------------------------------

local TARGETS = { safetensors = safetensors, tokbin = tokbin, bpe_vocab = bpe_vocab, bpe_merges = bpe_merges,
                  checkpoint = checkpoint, recipe = recipe }

-- setup(name[, base]): scratch files go to BASE/ztrain-fuzz-NAME-PID (base:
-- $TMPDIR or /tmp)
function M.setup(name, base)
  local run = TARGETS[name]
  if not run then error("no fuzz target " .. tostring(name)) end
  dir = ("%s/ztrain-fuzz-%s-%d"):format(base or os.getenv("TMPDIR") or "/tmp", name, libc.getpid())
  libc.mkdir(dir, 448)
  libc.mkdir(dir .. "/bpe", 448)
  libc.mkdir(dir .. "/ck", 448)
  local fx = HOME .. "/spec/fixtures/bpe/tiny/"
  write(dir .. "/bpe/vocab.json", slurp(fx .. "vocab.json"))
  write(dir .. "/bpe/merges.txt", slurp(fx .. "merges.txt"))
  return run
end

return M
