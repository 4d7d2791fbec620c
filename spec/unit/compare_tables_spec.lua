-- `ztrain compare`'s CSV (lua/ztrain/insight/compare_tables.lua) from rows
-- written here, read back by an RFC 4180 reader of the spec's own: one
-- header of the columns, text with commas, quotes and newlines quoted and
-- read back as written, numbers read back as summary.json holds them,
-- missing values empty.
-- (From real runs' summaries: e2e/compare_spec.lua.)
local tables = require "ztrain.insight.compare_tables"

-- RFC 4180: records of fields; "..." quotes, "" inside is one quote
local function read_csv(text)
  local records, rec, i, n = {}, {}, 1, #text
  while i <= n do
    local f
    if text:sub(i, i) == '"' then
      local buf, j = {}, i + 1
      while true do
        local q = assert(text:find('"', j, true), "unterminated quote")
        buf[#buf + 1] = text:sub(j, q - 1)
        if text:sub(q + 1, q + 1) == '"' then buf[#buf + 1] = '"'; j = q + 2 else i = q + 1; break end
      end
      f = table.concat(buf)
    else
      local j = text:find("[,\n]", i) or n + 1
      f, i = text:sub(i, j - 1), j
    end
    rec[#rec + 1] = f
    local c = text:sub(i, i)
    i = i + 1
    if c == "\n" or c == "" then records[#records + 1] = rec; rec = {} end
  end
  return records
end

local function column(name)
  for i, c in ipairs(tables.COLUMNS) do if c.name == name then return i end end
  error("no column " .. name)
end

describe("compare tables: the CSV", function()
  local rows = {
    { label = "zero3", recipe = "recipes/zero3.lua", ranks = 2, accumulate = 1, code = 0, step_ms = 12.345678901234567,
      tokens_per_s = 1 / 3, final_loss = 0 / 0, digest = "ab12", same = true, summary = { threads = 2 } },
    { label = 'zero1,train.stepz=1', ranks = 2, accumulate = 1, code = 1, digest = "two\nlines",
      failed = 'unknown recipe key "train.stepz"; did you mean "train.steps"?\nsecond line' },
  }
  local recs = read_csv(tables.csv(rows))

  it("has a header of the columns and one record per row, each as wide", function()
    assert.are.equal(3, #recs)
    for i, c in ipairs(tables.COLUMNS) do assert.are.equal(c.name, recs[1][i]) end
    for _, r in ipairs(recs) do assert.are.equal(#tables.COLUMNS, #r) end
  end)

  it("reads back text as written, quotes, commas and newlines included", function()
    assert.are.equal("zero1,train.stepz=1", recs[3][column("strategy")])
    assert.are.equal(rows[2].failed, recs[3][column("error")])
    assert.are.same({ "ok", "failed" }, { recs[2][column("status")], recs[3][column("status")] })
    assert.are.equal("two\nlines", recs[3][column("param_digest")])    -- a newline alone is quoted too
    assert.are.equal("true", recs[2][column("same_bits")])
  end)

  it("writes numbers that read back equal to summary.json's, nan as nan, and nothing for what a row lacks", function()
    -- summary.json's numbers are cjson's (14 significant digits)
    local cjson = require "cjson"
    local function json(x) return cjson.decode(cjson.encode({ x }))[1] end
    assert.are.equal(json(rows[1].step_ms), tonumber(recs[2][column("step_ms_median")]))
    assert.are.equal(json(1 / 3), tonumber(recs[2][column("tokens_per_s")]))
    assert.are.equal("nan", recs[2][column("final_loss")])
    assert.are.equal("2", recs[2][column("threads")])
    assert.are.same({ "", "", "" }, { recs[3][column("recipe")], recs[3][column("threads")],
                                      recs[3][column("model_state_predicted")] })
  end)
end)
