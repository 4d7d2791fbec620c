-- ztrain.cli.compare: `ztrain compare [--nproc N] [ITEM ...] [key=value ...] [out=DIR]`:
-- train a list of strategies on the same settings and tabulate what each
-- cost (insight/compare.lua does the work; this reads the command line and
-- says what happened).
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local usage = require "ztrain.cli.usage"
local compare = require "ztrain.insight.compare"

local M = {}

-- main(args) -> exit code: 0 when at least one run succeeded (failed runs
-- are rows with their error), 1 when every run failed or on bad input, 130
-- when Ctrl-C stopped a run (the outputs then cover the runs so far).
function M.main(args)
  if args[1] == "-h" or args[1] == "--help" then io.stdout:write(usage.command("compare")); return 0 end
  local o = compare.parse(args)
  compare.check_shared(o)
  o.out = o.out or ("runs/compare-%s"):format(os.date("%Y%m%d-%H%M%S"))
  local ok, err = fs.mkdirs(o.out, "output directory")
  if not ok then error(errors.user(err), 0) end
  local function say(s, nl)
    io.stdout:write(s, nl == false and "" or "\n")
    io.stdout:flush()
  end
  say(("comparing %d run(s) into %s (global batch: %d micro-batches per step)")
      :format(#o.runs, o.out, o.nproc * o.accumulate))
  local rows = compare.run_all(o, say)
  local paths = compare.write_outputs(o.out, rows, o)
  io.stdout:write(compare.markdown(rows, o))
  say("wrote " .. table.concat(paths, ", "))
  local failed = 0
  for _, r in ipairs(rows) do if r.failed then failed = failed + 1 end end
  if failed > 0 then
    io.stderr:write(("ztrain: compare: %d of %d run(s) failed (their rows say why; logs in %s/NAME/log.txt)\n")
                    :format(failed, #rows, o.out))
  end
  if o.interrupted then return 130 end
  return failed == #rows and 1 or 0
end

return M
