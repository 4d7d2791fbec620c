-- ztrain.parallel.schedule.csv_format: the vocabulary of PyTorch's
-- pipelining CSV (csv.lua's header describes the format), shared by its
-- reader (csv.lua) and its writer (csv_dump.lua).
local M = {}

-- PyTorch's action types; with_mb: written with a micro-batch.
M.TYPES = {
  F = true, I = true, W = true, B = true,
  SEND_F = true, RECV_F = true, SEND_B = true, RECV_B = true,
  WAIT_SEND_F = true, WAIT_RECV_F = true, WAIT_SEND_B = true, WAIT_RECV_B = true,
  UNSHARD = false, RESHARD = false, REDUCE_GRAD = false, WAIT_REDUCE_GRAD = false,
}
M.COMM = { SEND_F = true, RECV_F = true, SEND_B = true, RECV_B = true }
-- the newer dumps' waits on a posted send or receive: ztrain's runtime waits
-- for a receive before its reader and for its sends at the step's end, so
-- load drops them (told in the notes)
M.WAIT = { WAIT_SEND_F = true, WAIT_RECV_F = true, WAIT_SEND_B = true, WAIT_RECV_B = true,
               WAIT_REDUCE_GRAD = true }
M.KNOWN = "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, WAIT_SEND_F, WAIT_RECV_F, WAIT_SEND_B, WAIT_RECV_B, " ..
              "UNSHARD, RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD, (F;B)OVERLAP_F_B"
M.COMPUTE = { F = true, B = true, I = true, W = true }

function M.whole(x) return type(x) == "number" and x == x and x % 1 == 0 and x >= 0 end

return M
