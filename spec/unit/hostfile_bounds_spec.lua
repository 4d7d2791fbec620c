-- Bounds (issue 30, family 7): the hostfile validator refuses slot counts
-- Open MPI cannot take (mpirun 4.1: "a bad parameter in the hostfile" past
-- 2147483647), naming the line, before mpirun is started.
local hosts = require "ztrain.job.hosts"

describe("hostfile bounds", function()
  it("refuses slots past what Open MPI takes, on a line and in all", function()
    local h, err = hosts.parse("localhost slots=99999999999999999999\n", "hf")
    assert.is_nil(h)
    assert.are.equal("hostfile hf line 1: slots=99999999999999999999 is more than Open MPI takes (at most " ..
                     "2147483647: it counts slots in a 32-bit int); write one line per host, `HOST slots=N` " ..
                     "(tools/netcluster.sh hostfile prints one for the test cluster on this machine)", err)
    h, err = hosts.parse("a slots=2\nb max_slots=2147483648\n", "hf")
    assert.is_nil(h)
    assert.matches("hostfile hf line 2: max_slots=2147483648 is more than Open MPI takes", err, 1, true)
    h, err = hosts.parse("a slots=2000000000\nb slots=2000000000\n", "hf")
    assert.is_nil(h)
    assert.are.equal("hostfile hf has 4000000000 slots in all, more than Open MPI takes (at most 2147483647: " ..
                     "it counts slots in a 32-bit int); give each host the slots it has", err)
    -- the largest it takes
    h = hosts.parse("a slots=2147483647\n", "hf")
    assert.are.equal(2147483647, h[1].slots)
  end)

  it("netns_subnet runs no shell word a host name carries (only namespace characters reach ip(8))", function()
    local mark = os.tmpname()
    os.remove(mark)
    assert.is_nil(hosts.netns_subnet("x$(touch " .. mark .. ")"))
    local f = io.open(mark)
    if f then f:close(); os.remove(mark) end
    assert.is_nil(f, "the name's $(...) ran")
  end)
end)
