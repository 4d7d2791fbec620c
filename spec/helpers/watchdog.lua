-- spec/helpers/watchdog.lua -- run under `ztrain --nproc 2 --script`:
--   MODE TIMEOUT [keys]   one all_reduce that completes, then:
--   check  rank 0 all_reduces where rank 1 broadcasts (comm.check on)
--   stop   rank 1 stops itself (SIGSTOP) before the second all_reduce
--   stall  rank 1 sleeps 30 s before it
-- keys: the settings named as a run names them (the recipe's comm.timeout
-- and comm.check, train/run.lua); without: as the runtime does
local zt = require "ztrain"
local w = zt.comm.world()
local mode = arg[1]
zt.comm.watch{ timeout = tonumber(arg[2]) or 3, check = mode == "check",
               names = arg[3] == "keys" and { timeout = "comm.timeout", check = "comm.check" } or nil }
local t = zt.tensor.new({1024})
t:fill(w.rank + 1)
w:all_reduce(t)
print("rank", w.rank, "first ok")
if mode == "check" then
  if w.rank == 0 then w:all_reduce(t) else w:broadcast(t, 0) end
elseif mode == "stop" then
  if w.rank == 1 then os.execute("kill -STOP " .. require("ztrain.core.libc").getpid()) end
  w:all_reduce(t)
elseif mode == "stall" then
  if w.rank == 1 then os.execute("sleep 30") end
  w:all_reduce(t)
end
print("rank", w.rank, "done")
