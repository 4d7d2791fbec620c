-- spec/helpers/util.lua -- small things the specs share.
local M = {}

-- sh(cmd) -> output (stdout and stderr), exit code
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a"); p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

function M.read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end

-- mpi_log() -> "ZTRAIN_MPI_LOG=PATH " (a command line's prefix: the
-- launcher writes Open MPI's own text there instead of the terminal), and a
-- function returning what it wrote ("" for nothing), removing the file
function M.mpi_log()
  local path = os.tmpname()
  os.remove(path)
  return ("ZTRAIN_MPI_LOG=%s "):format(path), function()
    local f = io.open(path, "rb")
    if not f then return "" end
    local s = f:read("*a"); f:close(); os.remove(path)
    return s
  end
end

function M.write(path, s)
  local f = assert(io.open(path, "wb")); f:write(s); f:close()
end

-- tmpdir() -> a new empty directory (remove it with rmdir_all)
function M.tmpdir()
  local d = os.tmpname(); os.remove(d)
  assert(os.execute("mkdir -p " .. d) == 0, "cannot make " .. d)
  return d
end

function M.rm(path) M.sh("rm -rf " .. path) end

-- a scratch path for a run's out= (not made: the run makes it)
function M.outdir() local d = os.tmpname(); os.remove(d); return d end

-- run(cmd, input) -> output (stdout and stderr), exit code; `input`, when
-- given, is the command's standard input
function M.run(cmd, input)
  if not input then return M.sh(cmd) end
  local tmp = os.tmpname()
  M.write(tmp, input)
  local out, rc = M.sh(cmd .. " < " .. tmp)
  os.remove(tmp)
  return out, rc
end

-- summary(dir) -> a run's summary.json; metrics(dir) -> its metrics.jsonl lines
function M.summary(dir)
  return require("cjson").decode(M.read(dir .. "/summary.json"))
end
function M.metrics(dir)
  local cjson, m = require "cjson", {}
  for line in io.lines(dir .. "/metrics.jsonl") do m[#m + 1] = cjson.decode(line) end
  return m
end

-- well_formed(path): an XML (SVG) file parses: xmllint when installed, else
-- its tags balance
function M.well_formed(path)
  if os.execute("command -v xmllint >/dev/null 2>&1") == 0 then
    local out, rc = M.sh("xmllint --noout " .. path)
    assert(rc == 0, path .. " is not well-formed XML:\n" .. out)
    return
  end
  local s = M.read(path):gsub("<%?.-%?>", ""):gsub("<[^>]-/>", "")
  local stack = {}
  for close, tag in s:gmatch("<(/?)([%w_:-]+)[^>]*>") do
    if close == "" then stack[#stack + 1] = tag
    else
      local open = table.remove(stack)
      assert(open == tag, ("%s: </%s> closes <%s>"):format(path, tag, tostring(open)))
    end
  end
  assert(#stack == 0, ("%s: %d tag(s) left open"):format(path, #stack))
end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- scratch() -> a fresh directory (mkdtemp) whose paths made through it are
-- removed by :clean(): d.path, d:file(name, content), d:dir(name),
-- d:symlink(target, name), each returning the new path
function M.scratch()
  local ffi, libc = require "ffi", require "ztrain.core.libc"
  local base = os.tmpname() -- a unique name (the file it creates is replaced by the dir)
  os.remove(base)
  local buf = ffi.new("char[?]", #base + 8)
  ffi.copy(buf, base .. "XXXXXX")
  assert(libc.mkdtemp(buf) ~= nil, "mkdtemp failed")
  local d = { path = ffi.string(buf), created = {} }
  function d:file(name, content)
    local p = self.path .. "/" .. name
    M.write(p, content)
    self.created[#self.created + 1] = p
    return p
  end
  function d:dir(name)
    local p = self.path .. "/" .. name
    assert(libc.mkdir(p, tonumber("755", 8)) == 0, "mkdir failed")
    self.created[#self.created + 1] = p
    return p
  end
  function d:symlink(target, name)
    local p = self.path .. "/" .. name
    assert(libc.symlink(target, p) == 0, "symlink failed")
    self.created[#self.created + 1] = p
    return p
  end
  function d:clean()
    for i = #self.created, 1, -1 do os.remove(self.created[i]) end
    os.remove(self.path)
  end
  return d
end

-- summary_of(args, timeout) -> the summary of a run of `build/ztrain ARGS
-- out=DIR` under `timeout` seconds (Open MPI let run as root), DIR removed
-- after; nil, output, exit code where it fails
function M.summary_of(args, timeout)
  local dir = M.outdir()
  local out, rc = M.sh(("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout %d build/ztrain %s out=%s")
                       :format(timeout or 120, args, dir))
  local s = rc == 0 and M.summary(dir) or nil
  M.rm(dir)
  return s, out, rc
end

-- ztrain(args, timeout) -> output, exit code, out dir: `build/ztrain ARGS
-- out=DIR` under `timeout` (seconds; none when nil), DIR a fresh scratch
-- path the run makes (remove it with rm)
function M.ztrain(args, timeout)
  local dir = M.outdir()
  local out, rc = M.sh(("%sbuild/ztrain %s out=%s"):format(timeout and ("timeout " .. timeout .. " ") or "", args, dir))
  return out, rc, dir
end

-- device_tensor(shape, values, dtype) -> a tensor on the device tier (the
-- active device's), holding values (a Lua list; bf16: each rounded by the
-- runtime's cast) or zeros (f32; a bf16 tensor without values is left as made)
function M.device_tensor(shape, values, dtype)
  local zt, ffi = require "ztrain", require "ffi"
  local t = zt.tensor.new(shape, { tier = "device", dtype = dtype })
  if values then
    local buf = ffi.new("float[?]", #values)
    for i, v in ipairs(values) do buf[i - 1] = v end
    if dtype == "bf16" then
      local f = zt.tensor.new(shape, { tier = "device" })
      f:write(buf)
      require("ztrain.core.ops").cast(t, f)
      f:free()
    else
      t:write(buf)
    end
  elseif dtype ~= "bf16" then
    t:fill(0)
  end
  return t
end

-- round_bf16(t): an fp32 tensor's values rounded to bf16 in place (a cast
-- there and back): what a bf16 activation holds, for specs that build the
-- bf16 path's account from the fp32 one
function M.round_bf16(t)
  local zt = require "ztrain"
  local h = zt.tensor.new(t:shape(), { dtype = "bf16" })
  zt.ops.cast(h, t); zt.ops.cast(t, h); h:free()
end

-- stream16_ops() -> restore: wraps the residual stream's ops so that an
-- fp32 activation set computes what the bf16 stream stores (bf16
-- activations end to end, model/activations.lua), with the f32 kernels:
-- the stream's values (a norm's input, the residual adds' operands and
-- sums, the embedding's out) rounded to bf16 in place, the residual sum
-- rounded before the layer norm reads it, and the gradient rounded after
-- each norm backward adds to it; and the GEMMs' input gradients the norms,
-- the attention and the SwiGLU read (their dout) rounded as the bf16 path
-- stores them. Rounding a value already on the bf16 grid changes nothing,
-- so the wrappers round whatever the bf16 path stores. restore() puts the
-- kernels back.
function M.stream16_ops()
  local o = require("ztrain").ops
  local r = M.round_bf16
  local saved = {}
  for _, k in ipairs({ "add3", "layernorm_residual_forward", "layernorm_forward", "rmsnorm_forward",
                       "layernorm_backward", "rmsnorm_backward", "encoder_forward",
                       "attention_backward", "swiglu_backward" }) do
    saved[k] = o[k]
  end
  o.add3 = function(out, a, b) r(a); r(b); saved.add3(out, a, b); r(out) end
  o.layernorm_residual_forward = function(resid, out, mean, rstd, a, b, w, bias)
    r(a); r(b); saved.add3(resid, a, b); r(resid)
    saved.layernorm_forward(out, mean, rstd, resid, w, bias)
  end
  o.layernorm_forward = function(out, mean, rstd, x, ...) r(x); saved.layernorm_forward(out, mean, rstd, x, ...) end
  o.rmsnorm_forward = function(out, rstd, x, ...) r(x); saved.rmsnorm_forward(out, rstd, x, ...) end
  o.layernorm_backward = function(d, dw, db, dout, ...)
    if d then r(d) end
    r(dout)
    saved.layernorm_backward(d, dw, db, dout, ...)
    if d then r(d) end
  end
  o.rmsnorm_backward = function(d, dw, dout, ...)
    if d then r(d) end
    r(dout)
    saved.rmsnorm_backward(d, dw, dout, ...)
    if d then r(d) end
  end
  o.attention_backward = function(dqkv, dout, ...) r(dout); return saved.attention_backward(dqkv, dout, ...) end
  o.swiglu_backward = function(dgu, dout, ...) r(dout); return saved.swiglu_backward(dgu, dout, ...) end
  o.encoder_forward = function(out, ...) saved.encoder_forward(out, ...); r(out) end
  return function() for k, f in pairs(saved) do o[k] = f end end
end

-- write_stream(t, floats): t (f32 or bf16) holds the floats rounded to
-- bf16 (a stream tensor's values either way); read_stream(t) -> its values
-- as a string of f32 bytes
function M.write_stream(t, hx)
  local zt = require "ztrain"
  local f = zt.tensor.new(t:shape())
  f:write(hx); M.round_bf16(f)
  if t:dtype() == "bf16" then zt.ops.cast(t, f) else zt.ops.copy(t, f) end
  f:free()
end

function M.read_stream(t)
  local zt, ffi = require "ztrain", require "ffi"
  local f = zt.tensor.new(t:shape())
  if t:dtype() == "bf16" then zt.ops.cast(f, t) else zt.ops.copy(f, t) end
  local raw = ffi.new("float[?]", f:numel())
  f:read(raw)
  local s = ffi.string(raw, f:numel() * 4)
  f:free()
  return s
end

-- lcg(n, seed, lo, hi) -> n numbers in [lo, hi) from a fixed linear
-- congruential stream: the same values on every machine, no math.random
function M.lcg(n, seed, lo, hi)
  local v, s = {}, seed
  for i = 1, n do
    s = (s * 1103515245 + 12345) % 2147483648
    v[i] = lo + (s / 2147483648) * (hi - lo)
  end
  return v
end

return M
