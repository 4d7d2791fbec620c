-- spec/helpers/digest_check.lua -- one case of spec/fixtures/digest_cases.lua
-- run and held to the recorded oracle (spec/fixtures/digests.json): per-step
-- loss bits, eval loss bits, param_digest. Shared by digest_fixture_spec
-- (as recorded) and fakegpu_spec (the same runs on device.backend=fakegpu).
local util = require "helpers.util"
local cjson = require "cjson"
local assert = require "luassert"

local M = {}
M.cases = dofile("spec/fixtures/digest_cases.lua")

-- the fixture of the OpenBLAS core in use (digest_cases.fixture_path)
M.fixture_path, M.core = M.cases.fixture_path()
local ok, text = pcall(util.read, M.fixture_path)
M.fixture = ok and cjson.decode(text) or nil
local fixture = M.fixture or {}

-- check(case, extra): runs the case with `extra` overrides appended and
-- asserts the fixture's bits
function M.check(c, extra)
  local key = M.cases.key(c)
  assert.is_table(M.fixture, ("no digest fixture for OpenBLAS core %s (%s): record one from a commit " ..
    "before your change: luajit tools/record_digests.lua %s"):format(tostring(M.core), M.fixture_path, M.fixture_path))
  local want = fixture[c.same_as or key]
  assert.is_table(want, "no fixture entry for " .. key .. "; run tools/record_digests.lua")
  local dir = os.tmpname(); os.remove(dir)
  local cmd = M.cases.command(c, dir) .. (extra and extra ~= "" and (" " .. extra) or "")
  local out, rc = util.sh(cmd)
  assert.are.equal(0, rc, cmd .. "\n" .. out)
  local s = cjson.decode(util.read(dir .. "/summary.json"))
  local losses = M.cases.loss_bits(dir)
  util.sh("rm -rf " .. dir)
  assert.are.equal(want.losses, losses, "per-step loss bits")
  assert.are.equal(want.eval_loss, ("%a"):format(s.eval_loss), "eval loss bits")
  assert.are.equal(want.param_digest, s.param_digest, "param_digest")
  return s
end

return M
