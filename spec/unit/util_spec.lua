-- The shared helpers of lua/ztrain/util/ called directly: suggest.lua's edit
-- distance against worked examples and its choice of the nearest name, and
-- fs.lua's read_file, exists, mkdirs and glob against the file system.
-- (json.lua: json_spec.lua.)
local util = require "helpers.util"
local suggest = require "ztrain.util.suggest"
local fs = require "ztrain.util.fs"

describe("util.suggest", function()
  it("distance is Levenshtein's: insertions, deletions and substitutions, one each", function()
    for _, c in ipairs({
      { "kitten", "sitting", 3 }, { "flaw", "lawn", 2 }, { "", "abc", 3 }, { "abc", "", 3 }, { "", "", 0 },
      { "micro", "micro", 0 }, { "mirco", "micro", 2 }, { "stpes", "steps", 2 }, { "lr", "optim.lr", 6 },
    }) do
      assert.are.equal(c[3], suggest.distance(c[1], c[2]), c[1] .. " / " .. c[2])
      assert.are.equal(c[3], suggest.distance(c[2], c[1]), "symmetric: " .. c[2] .. " / " .. c[1])
    end
  end)

  it("nearest is the least distance, the earlier name on a tie, a bonus lowering a candidate", function()
    assert.are.same({ "batch.micro", 2 }, { suggest.nearest("batch.mirco", { "batch.global", "batch.micro" }) })
    assert.are.same({ "ab", 1 }, { suggest.nearest("a", { "ab", "ba", "b" }) })   -- ab and ba tie: the first
    local last = function(w, c) return w:match("[^.]+$") == c:match("[^.]+$") and 3 or 0 end
    assert.are.same({ "optim.lr", 3 }, { suggest.nearest("lr", { "lr.min", "optim.lr" }, last) })
    assert.are.same({ nil, math.huge }, { suggest.nearest("x", {}) })
  end)
end)

describe("util.fs", function()
  local d
  before_each(function() d = util.tmpdir() end)
  after_each(function() util.rm(d) end)

  it("read_file gives the bytes, or nil and the path with the reason", function()
    util.write(d .. "/f", "a\0b")
    assert.are.equal("a\0b", fs.read_file(d .. "/f"))
    local s, err = fs.read_file(d .. "/none")
    assert.is_nil(s)
    assert.are.equal(("cannot read %s/none: No such file or directory"):format(d), err)
  end)

  it("exists is true for a file and a directory, false for nothing", function()
    util.write(d .. "/f", "")
    assert.is_true(fs.exists(d .. "/f"))
    assert.is_true(fs.exists(d))
    assert.is_false(fs.exists(d .. "/none"))
  end)

  it("mkdirs makes every missing parent, accepts an existing directory, and names what it could not make", function()
    assert.is_true(fs.mkdirs(d .. "/a/b/c"))
    assert.is_true(fs.exists(d .. "/a/b/c"))
    assert.is_false(fs.exists(d .. "/a/b/c/.probe"), "the write probe is removed")
    assert.is_true(fs.mkdirs(d .. "/a/b/c"))
    util.write(d .. "/file", "")
    local ok, err = fs.mkdirs(d .. "/file/x", "checkpoint directory")
    assert.is_nil(ok)
    assert.are.equal(("cannot create checkpoint directory %s/file/x: Not a directory"):format(d), err)
    -- a file in the way: mkdir's "exists" is not the reason, the probe's is
    ok, err = fs.mkdirs(d .. "/file")
    assert.are.equal(("cannot create directory %s/file: Not a directory"):format(d), err)
  end)

  it("glob lists matches sorted, {} for none", function()
    for _, n in ipairs({ "b.txt", "a.txt", "c.md" }) do util.write(d .. "/" .. n, "") end
    assert.are.same({ d .. "/a.txt", d .. "/b.txt" }, fs.glob(d .. "/*.txt"))
    assert.are.same({}, fs.glob(d .. "/*.none"))
  end)
end)

describe("util.host.git_commit", function()
  it("reads a worktree's branch from the main repository's refs (a worktree's .git is a file)", function()
    local host = require "ztrain.util.host"
    local d = util.tmpdir()
    local out, rc = util.sh(("cd %s && git init -q main && cd main && git -c user.name=t -c user.email=t@t "
                             .. "commit -q --allow-empty -m one && git worktree add -q ../wt -b side && "
                             .. "git rev-parse HEAD"):format(d))
    assert.are.equal(0, rc, out)
    local sha = out:match("(%x+)%s*rc=%d+%s*$")
    assert.are.equal(sha, host.git_commit(d .. "/main"))
    assert.are.equal(sha, host.git_commit(d .. "/wt"))
    util.rm(d)
  end)
end)
