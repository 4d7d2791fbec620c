-- tools/record_digests.lua -- run every case of spec/fixtures/digest_cases.lua
-- and write spec/fixtures/digests.json (param_digest, per-step loss bits and
-- the eval loss of each). Run from the tree root after `make`:
--
--   luajit tools/record_digests.lua [OUT.json]
--
-- The spec (spec/e2e/digest_fixture_spec.lua) compares against that file: every
-- refactor must leave every entry bit-identical.
package.path = "spec/?.lua;lua/?.lua;" .. package.path
local cjson = require "cjson"
local cases = dofile("spec/fixtures/digest_cases.lua")

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a"); p:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- digests.json holds SkylakeX's bits; another OpenBLAS core writes its own
-- file (the one spec/helpers/digest_check.lua reads on this machine)
local out_path = arg[1] or cases.fixture_path()

local function result(dir)
  local f = assert(io.open(dir .. "/summary.json"))
  local s = cjson.decode(f:read("*a")); f:close()
  return { param_digest = s.param_digest, losses = cases.loss_bits(dir),
           eval_loss = ("%a"):format(s.eval_loss), world_size = s.world_size, strategy = s.strategy }
end

local fixture = {}
local keys = {}
for _, c in ipairs(cases.cases) do
  if c.same_as then goto continue end
  local dir = os.tmpname(); os.remove(dir)
  local out, rc = sh(cases.command(c, dir))
  assert(rc == 0, cases.key(c) .. " failed:\n" .. out)
  local key = cases.key(c)
  fixture[key] = result(dir)
  keys[#keys + 1] = key
  sh("rm -rf " .. dir)
  io.stderr:write(key, " ", fixture[key].param_digest:sub(1, 12), "\n")
  ::continue::
end
-- one entry per line, in case order, so diffs read well
table.sort(keys)
local lines = {}
local FIELDS = { "param_digest", "losses", "eval_loss", "world_size", "strategy" }
for _, k in ipairs(keys) do
  local parts = {}
  for _, f in ipairs(FIELDS) do parts[#parts + 1] = cjson.encode(f) .. ":" .. cjson.encode(fixture[k][f]) end
  lines[#lines + 1] = ("  %s: {%s}"):format(cjson.encode(k), table.concat(parts, ","))
end
local f = assert(io.open(out_path, "w"))
f:write("{\n", table.concat(lines, ",\n"), "\n}\n")
f:close()
io.stderr:write(("%d cases written to %s\n"):format(#keys, out_path))
