-- The README's tour runs as written (issue 29, item 8): every line of its
-- `sh` block is run here, the training ones cut short (a few steps, no
-- evaluation, into a scratch out=), the files and placeholders it names
-- replaced by this tree's fixtures only where the README says DIR. A line
-- the table below does not know fails the spec: a new tour line needs a way
-- to run here. The REPL and the benches are named, not run (interactive;
-- minutes long), and docs_spec / repl_spec cover what they show.
local u = require "spec.helpers.util"

local SHORT = "train.steps=2 train.eval_every=0 train.log_every=1 -q"
local HF, WIKI = "spec/fixtures/hf/tiny", "spec/fixtures/wikitext"

-- the tour's lines, as in README.md (the command, comment dropped) ->
-- { the command run here (with $T: a scratch directory), the exit it must end with }
local function tour(T)
  return {
    ["build/ztrain recipes/single.lua train.steps=100 model.size=gpt2-mini"] =
      { "build/ztrain recipes/single.lua train.steps=100 model.size=gpt2-mini " .. SHORT .. " out=$T/a1", 0 },
    ["build/ztrain recipes/single.lua device.memory_limit=8MiB"] =
      { "build/ztrain recipes/single.lua device.memory_limit=8MiB out=$T/a2", 1, "fits" },
    ["build/ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB"] =
      { "build/ztrain plan model.size=gpt2-xl nproc=8 device.memory_limit=16GiB", 0, "zero3" },
    ["build/ztrain recipes/zero2.lua --nproc 2 --ds-config examples/ds_config.json"] =
      { "build/ztrain recipes/zero2.lua --nproc 2 --ds-config examples/ds_config.json " .. SHORT .. " out=$T/a3", 0 },
    ["build/ztrain --nproc 2 recipes/zero3.lua"] =
      { "build/ztrain --nproc 2 recipes/zero3.lua " .. SHORT .. " out=$T/a4", 0 },
    ["build/ztrain --nproc 4 recipes/dp.lua train.steps=50"] =
      { "build/ztrain --nproc 4 recipes/dp.lua " .. SHORT .. " model.size=gpt2-tiny out=$T/a5", 0 },
    ["build/ztrain recipes/pipeline_1f1b.lua"] =
      { "build/ztrain recipes/pipeline_1f1b.lua " .. SHORT .. " out=$T/a6", 0 },
    ["build/ztrain schedule compare p=4 m=8"] = { "build/ztrain schedule compare p=4 m=8 out=$T/s", 0, "bubble" },
    ["build/ztrain compare single dp zero3 zero3_offload out=runs/cmp"] =
      { "build/ztrain compare single dp zero3_offload train.steps=2 out=$T/cmp", 0, "results.md" },
    ["build/ztrain recipes/single.lua train.ckpt_every=50 out=runs/a"] =
      { "build/ztrain recipes/single.lua train.ckpt_every=1 " .. SHORT .. " out=$T/a", 0 },
    ["build/ztrain --nproc 2 recipes/zero1.lua resume=runs/a/checkpoints"] =
      { "build/ztrain --nproc 2 recipes/zero1.lua resume=$T/a/checkpoints train.steps=3 batch.micro=8 " ..
        "train.eval_every=0 -q out=$T/b", 0 },
    ["build/ztrain recipes/single.lua export.hf=runs/hf"] =
      { "build/ztrain recipes/single.lua export.hf=$T/hf " .. SHORT .. " out=$T/c", 0 },
    ['build/ztrain generate runs/hf "Q: what" max_tokens=40 temperature=0.8'] =
      { 'build/ztrain generate $T/hf "Q: what" max_tokens=40 temperature=0.8', 0, "Q: what" },
    ["build/ztrain recipes/single.lua model=hf:DIR data.text=wikitext:DIR"] =
      { ("build/ztrain recipes/single.lua model=hf:%s data.text=wikitext:%s data.seq_len=32 %s out=$T/d")
        :format(HF, WIKI, SHORT), 0 },
    -- a Llama directory made here first: the recipe's own demo run, exported
    ["build/ztrain recipes/llama_finetune.lua model=hf:DIR"] =
      { "build/ztrain recipes/llama_finetune.lua " .. SHORT .. " export.hf=$T/lh out=$T/l0 && " ..
        "build/ztrain recipes/llama_finetune.lua model=hf:$T/lh " .. SHORT .. " export.hf=$T/lh2 out=$T/l1", 0 },
    ["build/ztrain -e 'print(zt.gpt2.config(\"gpt2\").L)'"] = { "build/ztrain -e 'print(zt.gpt2.config(\"gpt2\").L)'", 0, "12" },
    ["build/ztrain --help"] = { "build/ztrain --help", 0, "usage: ztrain" },
    -- named, not run
    ["build/ztrain"] = false, ["build/ztrain --nproc 2"] = false, ["make bench"] = false, ["make bench-peers"] = false,
  }
end

-- the tour's commands, in order, from README.md
local function tour_lines()
  local text = u.read("README.md")
  local block = text:match("\n## A tour\n.-```sh\n(.-)```")
  assert.is_truthy(block, "README.md has no ## A tour with an sh block")
  local out = {}
  for line in block:gmatch("[^\n]+") do
    local cmd = line:gsub("%s+#.*$", ""):gsub("%s+$", "")
    if cmd ~= "" then out[#out + 1] = cmd end
  end
  return out
end

describe("the README's tour", function()
  local T
  setup(function() T = u.tmpdir() end)
  teardown(function() u.rm(T) end)

  it("every line is known here, and every file it names exists", function()
    local known = tour(T)
    for _, cmd in ipairs(tour_lines()) do
      assert.is_not_nil(known[cmd], "a tour line this spec does not know how to run: " .. cmd)
      for path in cmd:gmatch("[%w_/%.%-]+%.[%a]+") do
        if path:match("^recipes/") or path:match("^examples/") or path:match("%.json$") then
          assert.is_truthy(u.read(path), path)
        end
      end
    end
  end)

  it("each line runs as written, cut short", function()
    local known = tour(T)
    local ran = 0
    for _, cmd in ipairs(tour_lines()) do
      local how = known[cmd]
      if how then
        local run = how[1]:gsub("%$T", T)
        local out, rc = u.sh("timeout 300 " .. run .. " </dev/null")
        assert.are.equal(how[2], rc, run .. "\n" .. out)
        if how[3] then assert.matches(how[3], out, 1, true) end
        ran = ran + 1
      end
    end
    assert.is_true(ran >= 15, "only " .. ran .. " lines ran")
  end)
end)
