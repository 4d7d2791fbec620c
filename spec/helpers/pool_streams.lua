-- spec/helpers/pool_streams.lua -- run by spec/e2e/fakegpu_spec.lua under build/ztrain
-- --script, with a device backend as arg[1]: a pooled buffer released on
-- one stream (a fill still queued there) and got on another must not be
-- overwritten by the old stream's work after its new user wrote it
-- (strategy/shard.lua pool: the release point is waited for). Prints the
-- count of wrong reads over 10 rounds.
local C = require("ztrain.core.ffi").C
assert(C.zt_device_init(arg[1]) == 0)
local T, ops, stream = require "ztrain.core.tensor", require "ztrain.core.ops", require "ztrain.core.stream"
local shard = require "ztrain.parallel.strategy.shard"
local pool = shard.pool("device")
local a = stream.new("compute")
local bad = 0
for i = 1, 10 do
  stream.set_current(a)
  local x = pool.get(4096)
  ops.fill(x, 1)                 -- the old user, still queued on a
  pool.put(x)                    -- released on a
  stream.set_current(nil)
  local y = pool.get(4096)       -- the same buffer, on the default stream
  assert(y == x)
  ops.fill(y, 2)
  local v = y:totable()[1]       -- waits for the default stream only
  if v ~= 2 then bad = bad + 1 end
  pool.put(y)
  a:sync()
end
print("wrong reads: " .. bad)
