-- ztrain.core.tensor: tensors of the C runtime as Lua objects.
--
-- A Tensor is a small table holding the zt_tensor* in field `c`. `:free()`
-- releases it at once and clears `c` (so a later use is a clear error, not a
-- crash); ffi.gc is only the backstop, because the Lua GC cannot see tensor
-- bytes and would free them late.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local interrupt = require "ztrain.core.interrupt"
local C, check = zffi.C, zffi.check

local M = {}
local Tensor = {}
Tensor.__index = Tensor
M.Tensor = Tensor

local DTYPE = { f32 = C.ZT_F32, bf16 = C.ZT_BF16, f16 = C.ZT_F16, i32 = C.ZT_I32, u16 = C.ZT_U16 }
local TIER = { device = C.ZT_TIER_DEVICE, host = C.ZT_TIER_HOST, nvme = C.ZT_TIER_NVME }
local CAT = { params = C.ZT_CAT_PARAMS, grads = C.ZT_CAT_GRADS, optim = C.ZT_CAT_OPTIM,
              activations = C.ZT_CAT_ACTIVATIONS, comm = C.ZT_CAT_COMM, other = C.ZT_CAT_OTHER }
local CTYPE = { f32 = "float*", bf16 = "uint16_t*", f16 = "uint16_t*", i32 = "int32_t*",
                u16 = "uint16_t*" }
local DNAME = {}
for k, v in pairs(DTYPE) do DNAME[tonumber(v)] = k end
M.DTYPE, M.TIER, M.CATEGORY = DTYPE, TIER, CAT

local function enum(tbl, key, what)
  local v = tbl[key]
  if v == nil then
    local names = {}
    for k in pairs(tbl) do names[#names + 1] = k end
    table.sort(names)
    error(("unknown %s %q (known: %s)"):format(what, tostring(key), table.concat(names, ", ")), 3)
  end
  return v
end

local shape_buf = ffi.new("int64_t[4]")
local out_buf = ffi.new("zt_tensor*[1]")

local function wrap(c)
  ffi.gc(c, C.zt_tensor_release)
  return setmetatable({ c = c }, Tensor)
end

-- fill_shape(shape) -> its number of dimensions, shape in shape_buf. A
-- misuse raises at the caller of new/view (level 3): a dimension must be a
-- whole number (2.5 would truncate, NaN and inf convert to garbage; the
-- runtime checks it is >= 1)
local function fill_shape(shape)
  if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
    error("tensor shape must be a table of 1 to 4 dimensions", 3)
  end
  for i = 1, #shape do
    local d = shape[i]
    if type(d) ~= "number" or d ~= math.floor(d) or math.abs(d) >= 2 ^ 62 then
      error(("tensor shape: dimension %d must be a whole number, got %s"):format(i, tostring(d)), 3)
    end
    shape_buf[i - 1] = d
  end
  return #shape
end

-- new(shape, {dtype=, tier=, category=}) -> zero-filled tensor.
-- Defaults: f32, device tier, category "other".
function M.new(shape, opts)
  opts = opts or {}
  local nd = fill_shape(shape)
  local rc = C.zt_tensor_new(out_buf, enum(TIER, opts.tier or "device", "tier"),
                             enum(CAT, opts.category or "other", "category"),
                             enum(DTYPE, opts.dtype or "f32", "dtype"), nd, shape_buf)
  check(rc, "tensor.new")
  return wrap(out_buf[0])
end

-- t:view(offset, shape): a tensor over elements [offset, offset+numel(shape)).
function Tensor:view(offset, shape)
  local nd = fill_shape(shape)
  check(C.zt_tensor_view(out_buf, self.c, offset, nd, shape_buf), "tensor:view")
  return wrap(out_buf[0])
end

function Tensor:free()
  local c = self.c
  if c ~= nil then
    self.c = nil
    ffi.gc(c, nil)
    C.zt_tensor_release(c)
  end
end

local function live(t)
  local c = t.c
  if c == nil then error("use of a freed tensor", 3) end
  return c
end

-- (zt_tensor is opaque: the runtime's accessors read it)
function Tensor:numel() return tonumber(C.zt_tensor_numel(live(self))) end
function Tensor:dtype() return DNAME[C.zt_tensor_dtype(live(self))] end
function Tensor:shape()
  local c, s = live(self), {}
  for i = 0, C.zt_tensor_ndim(c) - 1 do s[#s + 1] = tonumber(C.zt_tensor_dim(c, i)) end
  return s
end
function Tensor:nbytes()
  local c = live(self)
  return tonumber(C.zt_tensor_numel(c) * C.zt_dtype_size(C.zt_tensor_dtype(c)))
end
function Tensor:tier() return ffi.string(C.zt_tier_name(C.zt_tensor_tier(live(self)))) end
function Tensor:category() return ffi.string(C.zt_category_name(C.zt_tensor_category(live(self)))) end

-- Pointer to the data of a host-tier tensor. Device-tier bytes are not the
-- host's to touch (on a GPU they are not even addressable): use :read/:write,
-- or stream.copy_async into a host tensor and wait for it.
function Tensor:ptr()
  local c = live(self)
  if C.zt_tensor_tier(c) ~= C.ZT_TIER_HOST then
    error(("tensor:ptr(): %s is on the %s tier; only host-tier tensors are addressable from Lua: "
           .. "use :read()/:write(), or stream.copy_async it into a host tensor and wait for it")
          :format(tostring(self), self:tier()), 2)
  end
  return ffi.cast(CTYPE[DNAME[C.zt_tensor_dtype(c)]], C.zt_tensor_data(c))
end

-- Copy from / into host memory (a cdata array or pointer of nbytes bytes);
-- synchronous on every tier (nvme: a blocking request to the aio engine).
function Tensor:write(src) check(C.zt_tensor_write(live(self), src, self:nbytes()), "tensor:write") end
-- write in stream order (no host wait on a GPU; src reusable on return)
function Tensor:upload(src) check(C.zt_tensor_upload(live(self), src, self:nbytes()), "tensor:upload") end
function Tensor:read(dst) check(C.zt_tensor_read(live(self), dst, self:nbytes()), "tensor:read") end

-- Values as a Lua array (for tests and the REPL; copies).
function Tensor:totable()
  local n, p = self:numel(), nil
  local dt = self:dtype()
  local ct = (dt == "f32") and "float[?]" or (dt == "i32") and "int32_t[?]" or "uint16_t[?]"
  p = ffi.new(ct, n)
  self:read(p)
  local t = {}
  for i = 0, n - 1 do t[i + 1] = tonumber(p[i]) end
  return t
end

function Tensor:fill(v)
  if type(v) ~= "number" then error(("tensor:fill: the value must be a number, got %s"):format(type(v)), 2) end
  check(C.zt_fill(live(self), v), "tensor:fill")
  return self
end

function Tensor:__tostring()
  if self.c == nil then return "Tensor(freed)" end
  return ("Tensor(%s [%s] on %s, %s)"):format(self:dtype(), table.concat(self:shape(), ","),
                                           self:tier(), self:category())
end

function M.is_tensor(x) return getmetatable(x) == Tensor end

-- Ctrl-C (at the REPL) stops a loop of tensor calls: each polls first, so an
-- interrupted call built nothing (ztrain.core.interrupt; free never polls)
interrupt.check_all(M, { "new" })
interrupt.check_all(Tensor, { "view", "fill", "write", "upload", "read", "totable", "ptr", "numel", "dtype",
                              "shape", "nbytes", "tier", "category" })

return M
