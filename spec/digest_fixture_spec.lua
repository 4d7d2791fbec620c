-- The refactor oracle: every case of spec/fixtures/digest_cases.lua (every
-- recipe in recipes/ and examples/, at a few settings, N = 1, 2 and 4) must
-- give the param_digest, per-step loss bits and eval loss recorded in
-- spec/fixtures/digests.json from main before the Seams issue.
local util = require "helpers.util"
local cjson = require "cjson"
local cases = dofile("spec/fixtures/digest_cases.lua")

local read = util.read

local sh = util.sh

local fixture = cjson.decode(read("spec/fixtures/digests.json"))

describe("digest fixture (bit-identical to before the refactor)", function()
  it("covers every recipe in recipes/ and examples/", function()
    local covered = {}
    for _, c in ipairs(cases.cases) do covered[c.path] = true end
    for path in io.popen("ls recipes/*.lua examples/*.lua"):lines() do
      local src = read(path)
      -- examples that are modules (return M) rather than recipes are exempt
      local is_recipe = not src:match("\nreturn M%s*$")
      if is_recipe and not cases.exempt[path] then
        assert.is_true(covered[path] == true, path .. " has no digest case")
      end
    end
  end)

  for _, c in ipairs(cases.cases) do
    local key = cases.key(c)
    it(key, function()
      local want = fixture[c.same_as or key]
      assert.is_table(want, "no fixture entry for " .. key .. "; run tools/record_digests.lua")
      local dir = os.tmpname(); os.remove(dir)
      local out, rc = sh(cases.command(c, dir))
      assert.are.equal(0, rc, out)
      local s = cjson.decode(read(dir .. "/summary.json"))
      local losses = {}
      for line in io.lines(dir .. "/metrics.jsonl") do
        local m = cjson.decode(line)
        losses[#losses + 1] = ("%d:%s"):format(m.step, m.loss_hex)
      end
      sh("rm -rf " .. dir)
      assert.are.equal(want.losses, table.concat(losses, " "), "per-step loss bits")
      assert.are.equal(want.eval_loss, ("%a"):format(s.eval_loss), "eval loss bits")
      assert.are.equal(want.param_digest, s.param_digest, "param_digest")
    end)
  end
end)
