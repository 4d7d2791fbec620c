-- The kernels' bits class a checkpoint records (train/checkpoint/changes.lua
-- M.kernels): a resume on other kernels says so. The cuda device's knobs
-- that change bits are in it (the GELU epilogue, the tensor-core
-- attention's ordered dQ, and with it the wide backward at head size 128 or 64);
-- the ones that keep them are not (the wide forward at head size 128, the
-- wide backward with dQ by its own pass). Environment variables are stubbed.
local changes = require("ztrain.train.checkpoint.changes")

local function with_env(env, f)
  local real = os.getenv
  os.getenv = function(k) if env[k] ~= nil then return env[k] end return real(k) end
  local ok, r = pcall(f)
  os.getenv = real
  assert(ok, r)
  return r
end

local function tr(backend, attention, hs)
  return { recipe = { device = { backend = backend } }, model = { gemm16 = false }, attention = attention,
           cfg = { C = 4 * (hs or 64), NH = 4 } }
end

describe("checkpoint kernels class", function()
  it("names the ordered dQ on the cuda device's tensor-core attention, not elsewhere", function()
    local env = { ZTRAIN_ATTN_DQ = "ordered", ZTRAIN_ATTN_FWD128 = "wide" }
    assert.are.equal("bf16 ordered-dq", with_env(env, function() return changes.kernels(tr("cuda", "bf16")).attention end))
    assert.are.equal("bf16 ordered-dq", with_env(env, function() return changes.kernels(tr("cuda", "bf16", 128)).attention end))
    -- bf16 forced at a head size the tensor-core kernels do not take: the plain kernels run
    assert.are.equal("bf16", with_env(env, function() return changes.kernels(tr("cuda", "bf16", 96)).attention end))
    assert.are.equal("exact", with_env(env, function() return changes.kernels(tr("cuda", "exact")).attention end))
    assert.are.equal("bf16", with_env({ ZTRAIN_ATTN_DQ = "pass", ZTRAIN_ATTN_FWD128 = "wide" },
      function() return changes.kernels(tr("cuda", "bf16")).attention end))
    assert.are.equal("exact", with_env(env, function() return changes.kernels(tr("fakegpu-async", "exact")).attention end))
  end)
  it("names the wide backward's dQ parts (head size 128, 64) with the ordered dQ only", function()
    local env = { ZTRAIN_ATTN_DQ = "ordered", ZTRAIN_ATTN_BWD128 = "wide" }
    assert.are.equal("bf16 ordered-dq wide", with_env(env, function() return changes.kernels(tr("cuda", "bf16", 128)).attention end))
    -- each head size its own switch; with dQ by its own pass the wide one keeps the bits
    assert.are.equal("bf16 ordered-dq", with_env(env, function() return changes.kernels(tr("cuda", "bf16", 64)).attention end))
    assert.are.equal("bf16 ordered-dq wide", with_env({ ZTRAIN_ATTN_DQ = "ordered", ZTRAIN_ATTN_BWD64 = "wide" },
      function() return changes.kernels(tr("cuda", "bf16", 64)).attention end))
    assert.are.equal("bf16 ordered-dq", with_env({ ZTRAIN_ATTN_DQ = "ordered", ZTRAIN_ATTN_BWD64 = "wide" },
      function() return changes.kernels(tr("cuda", "bf16", 128)).attention end))
    assert.are.equal("bf16", with_env({ ZTRAIN_ATTN_DQ = "pass", ZTRAIN_ATTN_BWD64 = "wide" },
      function() return changes.kernels(tr("cuda", "bf16", 64)).attention end))
    assert.are.equal("bf16", with_env({ ZTRAIN_ATTN_DQ = "pass", ZTRAIN_ATTN_BWD128 = "wide" },
      function() return changes.kernels(tr("cuda", "bf16", 128)).attention end))
    assert.are.equal("cpu", with_env(env, function() return changes.kernels(tr("fakegpu", "exact")).device end))
  end)
end)
