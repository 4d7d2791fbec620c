-- The ztrain program as a user meets it: help, -e, the REPL, errors, exit codes.
local function run(cmd, input)
  local tmp = os.tmpname()
  if input then
    local f = assert(io.open(tmp, "w")); f:write(input); f:close()
    cmd = cmd .. " < " .. tmp
  end
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  os.remove(tmp)
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out, rc
end

describe("ztrain program", function()
  it("prints help with the recipe keys", function()
    local out, rc = run("build/ztrain --help")
    assert.are.equal(0, rc)
    assert.matches("usage: ztrain", out, 1, true)
    assert.matches("device.memory_limit", out, 1, true)
  end)

  it("runs -e code with ztrain loaded", function()
    local out, rc = run([[build/ztrain -e 'print(zt.gpt2.config("gpt2").C * 2)']])
    assert.are.equal(0, rc)
    assert.matches("1536", out, 1, true)
  end)

  it("has a REPL that prints results, survives errors and reads multi-line input", function()
    local out, rc = run("build/ztrain", "1+1\nerror('boom')\nfor i = 1, 2 do\nprint('line' .. i)\nend\n" ..
                        "zt.ops.fill(nil, 1)\n'still here'\n")
    assert.are.equal(0, rc)
    assert.matches("zt> 2", out, 1, true)
    assert.matches("error: [^\n]*boom", out)
    assert.matches("line1\nline2", out, 1, true)
    assert.matches("x is NULL", out, 1, true)
    assert.matches("still here", out, 1, true)
  end)

  it("exits 1 naming an unknown recipe key and its nearest valid key", function()
    local out, rc = run("build/ztrain recipes/single.lua batch.mirco=2")
    assert.are.equal(1, rc)
    assert.matches('unknown recipe key "batch.mirco"; did you mean "batch.micro"?', out, 1, true)
  end)

  it("says what to do when --nproc cannot find mpirun", function()
    local out, rc = run("env PATH=/nonexistent " .. os.getenv("PWD") .. "/build/ztrain --nproc 2 recipes/dp.lua")
    assert.are.equal(1, rc)
    assert.matches("cannot run mpirun", out, 1, true)
  end)

  it("exits 1 on arguments it cannot read", function()
    local out, rc = run("build/ztrain --frobnicate")
    assert.are.equal(1, rc)
    assert.matches("unknown option --frobnicate", out, 1, true)
  end)

  it("trains a recipe and prints plain progress lines when not on a terminal", function()
    local dir = os.tmpname(); os.remove(dir)
    local out, rc = run("build/ztrain recipes/single.lua train.steps=4 train.log_every=2 " ..
                        "data.seq_len=32 batch.micro=2 train.eval_batches=2 out=" .. dir)
    assert.are.equal(0, rc)
    assert.matches("step     2/4  loss", out, 1, true)
    assert.is_nil(out:find("\r", 1, true))
    assert.matches("digest      %x+", out)
    assert.truthy(io.open(dir .. "/summary.json"))
  end)
end)
