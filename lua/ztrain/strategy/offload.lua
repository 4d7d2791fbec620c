-- ztrain.strategy.offload: the optimizer step where the optimizer state
-- lives off the device (ZeRO-Offload), streamed through a bounded pool of
-- staging buffers.
--
-- The moments (exp_avg, exp_avg_sq) live on the host tier; the step walks
-- every unit's shard in chunks: copy the gradient chunk (and the parameter
-- chunk, when parameters live on the device) into a host staging slot on a
-- copy stream, update it on the host with the same AdamW kernel, copy the
-- parameters back. Two slots: chunk i+1 is copied in while chunk i is
-- updated and chunk i-1 is copied out, so copies overlap the update. The
-- copy stream runs in order, so a slot is refilled only after its previous
-- chunk was copied out. The update is elementwise: the bits are those of
-- the step on the device, chunk by chunk or whole.
--
-- Memory: 2 slots x (gradient + parameter) chunks of host memory, category
-- "comm" -- the staging pool, sized by the recipe's offload.staging.
local T = require "ztrain.tensor"
local stream = require "ztrain.stream"
local memory = require "ztrain.memory"

local M = {}
local Off = {}
Off.__index = Off

-- Elements per chunk for a staging budget of `bytes` (2 slots x 2 buffers
-- of f32), a multiple of 16 (views stay 64-byte aligned), at least 4096.
function M.chunk_elems(bytes)
  local n = math.floor(bytes / (2 * 2 * 4) / 16) * 16
  return math.max(n, 4096)
end

-- new{ tier = "host", staging = bytes } -> off. Allocates the staging slots
-- and a copy stream; :free() releases them.
function M.new(opts)
  local self = setmetatable({ tier = opts.tier or "host", chunk = M.chunk_elems(opts.staging) }, Off)
  self.slots = {}
  local ok, err = pcall(function()
    for i = 1, 2 do
      self.slots[i] = { g = T.new({ self.chunk }, { tier = "host", category = "comm" }),
                        p = T.new({ self.chunk }, { tier = "host", category = "comm" }) }
    end
    self.copies = stream.new("copy")
  end)
  if not ok then self:free(); error(err, 0) end
  return self
end

function Off:staging_bytes() return 2 * 2 * 4 * self.chunk end

-- The chunks of one step: { u, lo (unit element), off (in the shard), len,
-- P, G, moments }, in unit order.
local function plan(self, work)
  local chunks = {}
  for _, w in ipairs(work) do
    for off = 0, w.size - 1, self.chunk do
      chunks[#chunks + 1] = { w = w, off = off, len = math.min(self.chunk, w.size - off) }
    end
  end
  return chunks
end

-- step(optim, work, lr, scale): work is a list of { u, lo, size, P, G, st }
-- per unit: P (params over [lo, lo+size): device or host), G (the reduced
-- gradient shard, device), st (moments on the host). Returns once every
-- updated parameter is back where it lives.
function Off:step(optim, work, lr, scale)
  local chunks, cs, views = plan(self, work), self.copies, {}
  local function view(t, off, len)
    local v = t:view(off, { len })
    views[#views + 1] = v
    return v
  end
  local function copy_in(i)
    local c = chunks[i]
    local slot, w = self.slots[(i - 1) % 2 + 1], c.w
    c.g = view(slot.g, 0, c.len)
    cs:copy_async(c.g, view(w.G, c.off, c.len))
    if w.P:tier() ~= "host" then
      c.p = view(slot.p, 0, c.len)
      c.pdev = view(w.P, c.off, c.len)
      cs:copy_async(c.p, c.pdev)
    else
      c.p = view(w.P, c.off, c.len)
    end
    c.ready = cs:record()
  end
  local ok, err = pcall(function()
    if #chunks > 0 then copy_in(1) end
    for i, c in ipairs(chunks) do
      if chunks[i + 1] then copy_in(i + 1) end       -- the next chunk comes in meanwhile
      c.ready:sync(); c.ready:free(); c.ready = nil
      local w = c.w
      local mom = {}
      for k, t in pairs(w.st) do mom[k] = view(t, c.off, c.len) end
      optim:update_range(w.u, w.lo + c.off, w.lo + c.off + c.len, c.p, c.g, mom, lr, scale)
      if c.pdev then cs:copy_async(c.pdev, c.p) end  -- back to the device
    end
    cs:sync()
  end)
  if not ok then
    for _, c in ipairs(chunks) do if c.ready then c.ready:free() end end
    pcall(cs.sync, cs)
  end
  for _, v in ipairs(views) do v:free() end         -- copies retain what they use
  if not ok then error(err, 0) end
end

-- copy(dst, src): a copy between tiers, waited for (set-up, gathers).
function Off:copy(dst, src)
  self.copies:copy_async(dst, src)
  local ev = self.copies:record()
  ev:sync(); ev:free()
end

function Off:free()
  if self.copies then pcall(self.copies.sync, self.copies); self.copies:free(); self.copies = nil end
  for _, s in ipairs(self.slots or {}) do
    if s.g then s.g:free() end
    if s.p then s.p:free() end
  end
  self.slots = {}
end

-- parse the recipe's staging size (bytes).
function M.staging_bytes(recipe)
  local o = recipe and recipe.offload
  local b, err = memory.parse_size(o and o.staging or "16MiB")
  if not b then error("offload.staging: " .. err, 0) end
  return b
end

return M
