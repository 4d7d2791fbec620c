-- device.backend=fakegpu (runtime/device_fakegpu.c): the CPU kernels behind
-- device memory the host cannot address (a tagged, non-canonical pointer:
-- a read or write of device bytes on the host faults). Every case of the
-- digest oracle -- every recipe and strategy, N = 1, 2, 4, offload to host
-- and nvme, pipelines -- run on it must give the recorded bits: the trainer,
-- the strategies and the runtime reach device bytes only through the device
-- table and the MPI staging (comm_stage.c), as a GPU needs. (That a host
-- read faults, and the device's own ops: spec/c/test_fakegpu.c.)
local digest = require "helpers.digest_check"

describe("fakegpu: the digest oracle on a device the host cannot address", function()
  for _, c in ipairs(digest.cases.cases) do
    it(digest.cases.key(c), function() digest.check(c, "device.backend=fakegpu") end)
  end
end)
