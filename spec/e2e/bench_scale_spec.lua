-- tools/bench_scale.lua (make bench-scale) run by the program against a
-- stand-in for tools/netcluster.sh: the cluster is taken down when a step
-- fails (the fit and the report: spec/unit/scale_fit_spec.lua).
describe("bench_scale: the cluster", function()
  local util = require "helpers.util"

  it("is taken down when a step fails, and the error names the step", function()
    local dir = util.outdir()
    util.sh("mkdir -p " .. dir)
    local stub = dir .. "/netcluster.sh"
    -- a stand-in for tools/netcluster.sh: logs its calls; `hostfile` fails
    util.write(stub, ('#!/bin/sh\necho "$*" >> %s/calls\n[ "$1" = hostfile ] && { echo "no hosts" >&2; exit 3; }\n' ..
                      'exit 0\n'):format(dir))
    util.sh("chmod +x " .. stub)
    local out, rc = util.sh(("build/ztrain --script tools/bench_scale.lua netcluster=%s results=%s/res baseline=0 " ..
                             "hosts=2 rates=1gbit only=dp doc=%s/scaling.md svg=%s/scaling.svg"):format(stub, dir, dir, dir))
    assert.are_not.equal(0, rc, out)
    assert.matches("hostfile failed: no hosts", out, 1, true)
    assert.are.equal("up 2 --rate 1gbit --slots 1\nhostfile\ndown\n", util.read(dir .. "/calls"))
    util.rm(dir)
  end)
end)
