-- `ztrain generate hf:DIR PROMPT`: the program's generate command on the
-- tiny Hugging Face fixture (the generator itself: spec/unit/generate_spec.lua).
local util = require "helpers.util"

describe("ztrain generate", function()
  local dir = "spec/fixtures/hf/tiny"
  local ok_hf = pcall(require, "ztrain.model.hf")
  local f = io.open(dir .. "/expected.json")
  local expected = f and f:read("*a")
  if f then f:close() end

  it("`ztrain generate hf:DIR` prints the text and exits 0; bad input exits 1", function()
    if not ok_hf or not expected then
      pending("needs lua/ztrain/model/hf.lua and " .. dir .. "/expected.json")
      return
    end
    -- run(args) -> the output, ending with its "rc=N" line
    local function run(args) return (util.sh("build/ztrain generate " .. args)) end
    local out = run("hf:" .. dir .. " 'Hi' tokenizer=bytes max_tokens=5 temperature=0")
    assert.matches("rc=0\n$", out)
    assert.matches("^Hi", out)
    local again = run("hf:" .. dir .. " 'Hi' tokenizer=bytes max_tokens=5 temperature=0")
    assert.are.equal(out, again)
    assert.matches("ztrain: generate: temperature=%-1 must be a number >= 0.*rc=1\n$",
                   run("hf:" .. dir .. " 'Hi' tokenizer=bytes temperature=-1"))
    assert.matches("ztrain: .*rc=1\n$", run("hf:/nonexistent 'Hi'"))
    assert.matches("ztrain: generate: unknown key \"topk\".*rc=1\n$",
                   run("hf:" .. dir .. " 'Hi' tokenizer=bytes topk=3"))
    -- a recipe key is an unknown key too, not an unreadable argument
    assert.matches("ztrain: generate: unknown key \"device.backend\" %(known: max_tokens,.*rc=1\n$",
                   run("hf:" .. dir .. " 'Hi' tokenizer=bytes device.backend=cuda"))
    -- a ztrain checkpoint given where an HF directory goes: pointed at export
    local ck = util.tmpdir()
    util.write(ck .. "/manifest.json", "{}")
    assert.matches(("; %s is a ztrain checkpoint: `ztrain export %s DIR` makes one"):format(ck, ck),
                   run(ck .. " 'Hi'"), 1, true)
    util.rm(ck)
  end)
end)
