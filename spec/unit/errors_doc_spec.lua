-- docs/errors.md is checked against the code and the specs, row by row
-- (reading files; no ztrain is run). For every row of its tables:
--  (a) the specs it names exist (`cli_spec`, `unit/hostfile_bounds_spec`,
--      `e2e/bounds_spec`: under spec/unit or spec/e2e);
--  (b) its message -- the code spans of the message cell outside
--      parentheses, with `...`, the placeholders and the texts ztrain passes
--      on from others as wildcards (spec/helpers/errors_doc.lua, PLACEHOLDERS
--      and EXTERNAL) -- is what the source says: every word of it stands in a
--      string literal of lua/, runtime/ or host/, the runs between format
--      directives (%s, %d, ...) matched whole (a one-word run only with its
--      literal's next or previous run beside it), or it is a value (a number,
--      a path, a key, a quoted name, a word of VALUES). Runs of different
--      literals may make up one message (as "ztrain: " .. msg does), so a word
--      changed to one another literal has in that place can pass (b): (c),
--      which a run of the program backs, holds the message to what is seen;
--  (c) the specs it names assert it: their literals (plain, as format strings,
--      as Lua patterns) cover every word of its wording (the words no value
--      looks like), and one of them is an e2e spec (it runs the program)
--      that checks the row's exit status.
-- And docs/cli.md's exit-status table has the statuses errors.md's rows
-- have, and the code's (ztrain.core.errors EXIT); so does ztrain --help.
local util = require "helpers.util"
local D = require "helpers.errors_doc"

local rows = D.rows(util.read("docs/errors.md"))

local function where(r)
  return ("docs/errors.md:%d (%s: %s)"):format(r.line, r.section, r.input:sub(1, 60))
end

local function check(list)
  assert(#list == 0, #list .. " row(s):\n" .. table.concat(list, "\n"))
end

-- the exit statuses a cell names: "1", "130 (SIGINT), 143 (SIGTERM)"; "128 +
-- signal" names none
local function statuses(cell)
  local out = {}
  for n in cell:gsub("%d+%s*%+", ""):gmatch("%d+") do out[#out + 1] = tonumber(n) end
  return out
end

-- unasserted(r, idxs) -> the words of the row's message (its wording: the
-- words no value looks like; the prefix "ztrain:" aside, which a unit spec
-- does not see) that the texts of idxs do not cover, and how many words it has
local function unasserted(r, idxs)
  local missing, total = {}, 0
  for _, span in ipairs(D.spans(r.message)) do
    for _, seg in ipairs(D.segments(span)) do
      local c = {}
      for _, idx in ipairs(idxs) do
        for k in pairs(D.covered(seg, idx)) do c[k] = true end
      end
      for a, word, b in seg.text:gmatch("()(%S+)()") do
        if not D.value_like(word) and not (a == 1 and word == "ztrain:") then   -- the program's prefix
          total = total + 1
          for k = a, b - 1 do
            if not c[k] and seg.text:sub(k, k):find("%a") then missing[#missing + 1] = word; break end
          end
        end
      end
    end
  end
  return missing, total
end

-- checks_status(text, n): a spec's text asserts exit status n
local function checks_status(text, n)
  return text:find("equal%(%s*" .. n .. "%s*,") or text:find("==%s*" .. n .. "%f[%D]")
      or text:find("%f[%d]" .. n .. "%s*==") or text:find("exit=" .. n .. "%f[%D]")
end

describe("docs/errors.md", function()
  it("has its tables (every row: input | message | exit | spec)", function()
    assert.is_true(#rows >= 80, #rows .. " rows")
    for _, r in ipairs(rows) do assert.is_true(#r.specs > 0, where(r) .. ": no spec named") end
    -- its opening names the placeholders this spec takes as wildcards
    local said = util.read("docs/errors.md"):match("stands for the parts that vary, and (.-) for a value of that kind")
    assert.are.equal(table.concat(D.PLACEHOLDERS, ", "), (assert(said, "no list of placeholders"):gsub("%s+", " ")))
  end)

  it("names specs that exist", function()
    local bad = {}
    for _, r in ipairs(rows) do
      for _, s in ipairs(r.specs) do
        if not D.spec_path(s) then bad[#bad + 1] = where(r) .. ": no spec " .. s end
      end
    end
    check(bad)
  end)

  it("says what the source says, word for word", function()
    local src, bad = D.source_index(), {}
    for _, r in ipairs(rows) do
      for _, span in ipairs(D.spans(r.message)) do
        for _, seg in ipairs(D.segments(span)) do
          for _, gap in ipairs(D.gaps(seg, D.covered(seg, src))) do
            bad[#bad + 1] = ("%s: %q is in no string of lua/, runtime/, host/ (message `%s`)")
                            :format(where(r), gap, span)
          end
        end
      end
    end
    check(bad)
  end)

  it("has each row's message and exit status asserted by the specs it names", function()
    local cache, bad = {}, {}
    for _, r in ipairs(rows) do
      local idxs, text, e2e = {}, {}, false
      for _, s in ipairs(r.specs) do
        local p = D.spec_path(s)
        if p then
          cache[p] = cache[p] or D.spec_index(p)
          idxs[#idxs + 1] = cache[p]
          text[#text + 1] = util.read(p)
          e2e = e2e or p:find("^spec/e2e/") ~= nil
        end
      end
      local missing, total = unasserted(r, idxs)
      if #missing > 0 then
        bad[#bad + 1] = ("%s: %s assert %d of its message's %d words; not: %s")
                        :format(where(r), table.concat(r.specs, ", "), total - #missing, total,
                                table.concat(missing, " "))
      end
      for _, n in ipairs(statuses(r.exit)) do
        if not e2e then
          bad[#bad + 1] = ("%s: %s run no program: none observes exit status %d"):format(where(r),
                          table.concat(r.specs, ", "), n)
        elseif not checks_status(table.concat(text, "\n"), n) then
          bad[#bad + 1] = ("%s: %s check no exit status %d"):format(where(r), table.concat(r.specs, ", "), n)
        end
      end
    end
    check(bad)
  end)
end)

describe("docs/cli.md's exit-status table", function()
  it("has the statuses of errors.md's rows and the code's", function()
    local cli, doc = {}, {}
    local tbl = util.read("docs/cli.md"):match("\n| exit status | meaning |\n(.-)\n\n")
    assert.is_truthy(tbl, "docs/cli.md has no table | exit status | meaning |")
    for first in tbl:gmatch("\n| ([^|]-) |") do
      for n in first:gmatch("%d+") do cli[tonumber(n)] = true end
    end
    for _, r in ipairs(rows) do
      for _, n in ipairs(statuses(r.exit)) do doc[n] = true end
    end
    local bad = {}
    for n in pairs(doc) do
      if not cli[n] then bad[#bad + 1] = ("errors.md has exit status %d, cli.md's table does not"):format(n) end
    end
    for n in pairs(cli) do
      if not doc[n] then bad[#bad + 1] = ("cli.md's table has exit status %d, no row of errors.md does"):format(n) end
    end
    for name, n in pairs(require("ztrain.core.errors").EXIT) do
      if not cli[n] then bad[#bad + 1] = ("the code's EXIT.%s = %d is not in cli.md's table"):format(name, n) end
    end
    check(bad)
  end)

  it("and so does ztrain --help", function()
    local help = (require("ztrain.cli.usage").text .. "\n\n"):match("\nExit status: (.-)\n\n")
    assert.is_truthy(help, "ztrain --help has no paragraph 'Exit status: ...'")
    for name, n in pairs(require("ztrain.core.errors").EXIT) do
      assert.is_truthy(help:find("%f[%d]" .. n .. " "), ("--help's exit statuses lack %s = %d"):format(name, n))
    end
    assert.is_truthy(help:find("128 + N", 1, true), "--help's exit statuses lack 128 + N (a signal)")
  end)
end)
