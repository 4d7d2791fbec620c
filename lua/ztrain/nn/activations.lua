-- ztrain.nn.activations: one slab for a GPT-2 micro-batch's activations.
--
-- Everything forward saves for backward, plus the backward pass's shared
-- scratch, as views into a single f32 tensor (category "activations"), and
-- the (B,T) i32 token and target tensors. Sizes for N = B*T rows:
--   per layer: ln1, atty, resid2, ln2 (N,C); qkv (N,3C); fch, fch_gelu (N,4C);
--              ln1/ln2 mean+rstd (N); lse (B,NH,T)
--   shared:    resid[0..L] (N,C); proj (N,C); lnf (N,C) + mean/rstd;
--              logits (N,V) (overwritten in place by dlogits); losses (N);
--   backward:  dresid, dln, datty (N,C); dqkv (N,3C); dfch (N,4C)
local T = require "ztrain.tensor"

local M = {}
local Acts = {}
Acts.__index = Acts

function M.new(cfg, B, Tlen, tier)
  local N, C, V, NH = B * Tlen, cfg.C, cfg.V, cfg.NH
  local plan, total = {}, 0
  local function add(name, shape)
    local n = 1
    for i = 1, #shape do n = n * shape[i] end
    plan[#plan + 1] = { name, shape, total }
    total = total + math.ceil(n / 16) * 16          -- keep views 64-byte aligned
  end
  for l = 0, cfg.L do add("resid." .. l, { B, Tlen, C }) end
  for l = 0, cfg.L - 1 do
    local p = "layer." .. l .. "."
    add(p .. "ln1", { B, Tlen, C }); add(p .. "ln1_mean", { N }); add(p .. "ln1_rstd", { N })
    add(p .. "qkv", { B, Tlen, 3 * C }); add(p .. "atty", { B, Tlen, C }); add(p .. "lse", { B, NH, Tlen })
    add(p .. "resid2", { B, Tlen, C })
    add(p .. "ln2", { B, Tlen, C }); add(p .. "ln2_mean", { N }); add(p .. "ln2_rstd", { N })
    add(p .. "fch", { B, Tlen, 4 * C }); add(p .. "fch_gelu", { B, Tlen, 4 * C })
  end
  add("proj", { B, Tlen, C })
  add("lnf", { B, Tlen, C }); add("lnf_mean", { N }); add("lnf_rstd", { N })
  add("logits", { B, Tlen, V }); add("losses", { N })
  add("dresid", { B, Tlen, C }); add("dln", { B, Tlen, C }); add("datty", { B, Tlen, C })
  add("dqkv", { B, Tlen, 3 * C }); add("dfch", { B, Tlen, 4 * C })

  local self = setmetatable({ cfg = cfg, B = B, T = Tlen, N = N, views = {},
                              resid = {}, layer = {}, nfloats = total }, Acts)
  self.slab = T.new({ total }, { tier = tier, category = "activations" })
  for _, e in ipairs(plan) do
    local v = self.slab:view(e[3], e[2])
    self.views[#self.views + 1] = v
    local name = e[1]
    local r = name:match("^resid%.(%d+)$")
    local l, field = name:match("^layer%.(%d+)%.(.+)$")
    if r then self.resid[tonumber(r)] = v
    elseif l then
      l = tonumber(l)
      self.layer[l] = self.layer[l] or {}
      self.layer[l][field] = v
    else self[name] = v end
  end
  self.tokens = T.new({ B, Tlen }, { dtype = "i32", tier = tier, category = "activations" })
  self.targets = T.new({ B, Tlen }, { dtype = "i32", tier = tier, category = "activations" })
  return self
end

function Acts:bytes() return self.nfloats * 4 + 2 * self.N * 4 end

function Acts:free()
  for _, v in ipairs(self.views) do v:free() end
  self.views = {}
  self.slab:free(); self.tokens:free(); self.targets:free()
end

return M
