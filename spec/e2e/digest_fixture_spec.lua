-- The refactor oracle: every case of spec/fixtures/digest_cases.lua (every
-- recipe in recipes/ and examples/, at a few settings, N = 1, 2 and 4) must
-- give the param_digest, per-step loss bits and eval loss recorded in
-- spec/fixtures/digests.json from main before the Seams issue.
local util = require "helpers.util"
local digest = require "helpers.digest_check"
local cases = digest.cases

local read = util.read

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
    it(cases.key(c), function() digest.check(c) end)
  end
end)
