-- Errors as a user meets them in the ztrain program: a user error prints
-- "ztrain: MESSAGE" with no Lua file and line; a bug keeps its "file.lua:N:"
-- location (and a traceback where the host prints one). The rule lives in
-- lua/ztrain/core/errors.lua (spec/unit/errors_spec.lua).

local util = require "helpers.util"

-- run(args, input) -> output (stdout and stderr), exit code of build/ztrain ARGS
local function run(args, input) return util.run("timeout 120 build/ztrain " .. args, input) end

local tmpdir = util.outdir

-- write(text) -> a new .lua file holding text
local function write(text)
  local p = os.tmpname() .. ".lua"
  util.write(p, text)
  return p
end

-- a Lua location: "path/file.lua:12:"
local LOCATION = "%.lua:%d+:"

describe("the ztrain program", function()
  it("prints user errors as 'ztrain: MESSAGE' without a Lua location", function()
    local dir = tmpdir()
    local cases = {
      { "recipes/single.lua batch.mirco=2", 'unknown recipe key "batch.mirco"' },
      { "recipes/single.lua lr.schedule=steep", 'unknown lr.schedule "steep"' },
      { "recipes/single.lua data.tokenizer=gpt9", 'unknown tokenizer "gpt9"' },
      { "recipes/single.lua data.text=/nonexistent/*.txt", "no file matches" },
      { "recipes/single.lua data.seq_len=512", "exceeds gpt2-tiny's context of 128" },
      { "--frobnicate", "unknown option --frobnicate" },
    }
    for _, c in ipairs(cases) do
      local out, rc = run(c[1] .. " train.steps=1 -q out=" .. dir)
      assert.are.equal(1, rc, out)
      assert.matches("ztrain: [^\n]*" .. c[2]:gsub("%p", "%%%0"), out)
      assert.is_nil(out:find(LOCATION), c[1] .. " shows a Lua location:\n" .. out)
      assert.is_nil(out:find("stack traceback", 1, true), out)
    end
  end)

  it("keeps the location of a bug reached through a user's recipe", function()
    -- a strategy hook with a bug of its own, and one that misuses a ztrain
    -- function so that the error is raised inside lua/ztrain
    local own = write([[
      local zt = require "ztrain"
      local S = zt.strategy.single()
      S.step = function(ctx, lr)
        local state = nil
        return state.scale
      end
      return { strategy = S, data = { seq_len = 32 }, batch = { micro = 2 } }
    ]])
    local deep = write([[
      local zt = require "ztrain"
      local S = zt.strategy.single()
      S.step = function(ctx, lr) return zt.lr.make(1e-3, {}, nil) end   -- no step count
      return { strategy = S, data = { seq_len = 32 }, batch = { micro = 2 } }
    ]])
    local out, rc = run(own .. " train.steps=2 -q out=" .. tmpdir())
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: [^\n]*" .. own:match("[^/]+$"):gsub("%p", "%%%0") .. ":5: attempt to index local 'state'",
                   out)
    out, rc = run(deep .. " train.steps=2 -q out=" .. tmpdir())
    assert.are.equal(1, rc, out)
    assert.matches("ztrain: [^\n]*lua/ztrain/model/lr%.lua:%d+: attempt to compare", out)
    os.remove(own); os.remove(deep)
  end)

  it("shows -e and REPL bugs with a traceback and user errors without", function()
    local out, rc = run([[-e 'local t = nil; print(t.x)']])
    assert.are.equal(1, rc)
    assert.matches("ztrain: repl:1: attempt to index local 't'", out, 1, true)
    assert.matches("stack traceback:", out, 1, true)
    out, rc = run([[-e 'zt.data.tokenizer("gpt9")']])
    assert.are.equal(1, rc)
    assert.matches('ztrain: data.tokenizer: unknown tokenizer "gpt9"', out, 1, true)
    assert.is_nil(out:find("traceback", 1, true), out)
    out, rc = run("", "zt.lr.make(1, { schedule = 'steep' }, 10)\nlocal t = nil; print(t.x)\n'alive'\n")
    assert.are.equal(0, rc)
    assert.matches('error: unknown lr.schedule "steep" (known: cosine, linear, constant)\nzt> ', out, 1, true)
    assert.matches("error: repl:1: attempt to index local 't' (a nil value)\nstack traceback:", out, 1, true)
    assert.matches("alive", out, 1, true)
  end)

  it("a bad optim.betas on dp is reported as such (not a crash in free)", function()
    local out, rc = run("recipes/dp.lua 'optim.betas={2,3}' -q out=" .. os.tmpname() .. ".d")
    assert.are.equal(1, rc)
    assert.matches("optim.betas must be a pair of numbers in [0, 1)", out, 1, true)
    assert.is_nil(out:find("attempt to", 1, true), out)
  end)

  it("a standard output that cannot be written (a full disk) is a failed write: exit 3, said", function()
    -- (a generated text, an exported listing, -e's prints: the output is the result)
    local out = util.sh("{ build/ztrain -e 'print((\"x\"):rep(100000))' >/dev/full; }")
    assert.matches("ztrain: cannot write standard output: No space left on device", out, 1, true)
    assert.are.equal(3, tonumber(out:match("rc=(%d+)")))
    local ok = util.sh("build/ztrain -e 'print(1)' >/dev/null")
    assert.matches("rc=0", ok, 1, true)
  end)
end)

-- The rows of docs/errors.md that unit specs check in-process (recipe_spec,
-- dsconfig_spec, hostfile_bounds_spec, dataset_spec, comm_backend_spec), run
-- through the program: its message, exit status 1, no output directory made.
describe("docs/errors.md's rows checked in-process, through the program", function()
  -- files(d) -> the inputs the cases name, written under d
  local function files(d)
    util.write(d .. "/ds.json", '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, ' ..
                                '"gradient_accumulation_steps": 2}')
    util.write(d .. "/h1", "nodeA slots=99999999999999999999\n")
    util.write(d .. "/h2", "a slots=2000000000\nb slots=2000000000\n")
    util.write(d .. "/x.txt", "good\n\255bad\n")
    assert(require("ztrain.model.data.tokbin").write(d .. "/o.bin", { 1, 2, 3 }))
    local f = assert(io.open(d .. "/o.bin", "ab")); f:write("x"); f:close()   -- an odd byte
  end

  it("says what the row says and exits 1", function()
    local d = util.tmpdir()
    files(d)
    local R = "recipes/single.lua: "
    local cases = {
      { "learning_rate=1", R .. 'unknown recipe key "learning_rate"; did you mean "optim.lr"?' },
      { "batch.size=2", R .. 'unknown recipe key "batch.size"; did you mean "batch.micro"?' },
      { "lr=3e-4", R .. "lr is a table of keys; set one of them (lr.min_ratio, lr.schedule, lr.warmup); " ..
                   "the learning rate itself is optim.lr" },
      { "train.steps=0", R .. "train.steps must be an integer in [1, 1099511627776], got 0" },
      { "--ds-config " .. d .. "/ds.json", "ds-config: Check batch related parameters. train_batch_size is not " ..
        "equal to micro_batch_per_gpu * gradient_acc_step * world_size: 32 != 4 * 2 * 1" },
      { "--hostfile " .. d .. "/h1", "hostfile " .. d .. "/h1 line 1: slots=99999999999999999999 is more than " ..
        "Open MPI takes (at most 2147483647: it counts slots in a 32-bit int); write one line per host, " },
      { "--hostfile " .. d .. "/h2", "hostfile " .. d .. "/h2 has 4000000000 slots in all, more than Open MPI " ..
        "takes (at most 2147483647: it counts slots in a 32-bit int); give each host the slots it has" },
      { "'data.text=/nonexistent/*.txt'", 'data.text: no file matches "/nonexistent/*.txt"; check data.text ' ..
        "(the glob must name existing files)" },
      { "data.text=" .. d .. "/x.txt", "data.text: " .. d .. "/x.txt is not valid UTF-8 (invalid byte 0xFF) at " ..
        "byte offset 5 (line 2, column 1); only UTF-8 text can be used: convert it, or add it to data.exclude" },
      { "data.text=bin:" .. d .. "/o.bin", "data: token file " .. d .. "/o.bin: header token count (int32 2) is 3, " ..
        "expected none (7 bytes after the header is not a whole number of 2-byte tokens)" },
      { "comm.backend=nccl", R .. 'comm.backend = "nccl" needs device.backend = "cuda" (NCCL moves GPU memory), ' ..
        'got "cpu"' },
    }
    for _, c in ipairs(cases) do
      local out_dir = d .. "/out"
      local out, rc = run(("recipes/single.lua train.steps=1 -q out=%s %s"):format(out_dir, c[1]))
      assert.are.equal(1, rc, c[1] .. ":\n" .. out)
      assert.matches("ztrain: " .. c[2], out, 1, true)
      assert.is_false(util.exists(out_dir), c[1] .. " left " .. out_dir)
    end
    util.rm(d)
  end)

  it("an unreadable directory: permission denied, exit 1 (as a user: root reads it)", function()
    local uid = util.sh("id -u"):match("^(%d+)")
    local as_user = ""
    if uid == "0" then
      if not util.sh("command -v setpriv"):match("/") then pending("root without setpriv"); return end
      as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    end
    local d = util.tmpdir()
    util.sh(("chmod 755 %s && mkdir %s/closed %s/w && chmod 777 %s/w && echo x > %s/closed/x.txt && " ..
             "chmod 000 %s/closed"):format(d, d, d, d, d, d))
    local out, rc = util.sh(("%sbuild/ztrain recipes/single.lua train.steps=1 -q out=%s/w/out 'data.text=%s/closed/*.txt'")
                            :format(as_user, d, d))
    util.sh("chmod 755 " .. d .. "/closed")
    util.rm(d)
    assert.are.equal(1, rc, out)
    assert.matches(("ztrain: data.text: cannot list %s/closed (for the pattern \"%s/closed/*.txt\"): permission " ..
                    "denied; make the directory readable (chmod a+rx) or point data.text elsewhere"):format(d, d),
                   out, 1, true)
  end)
end)
