-- recipes/pipeline_zbv.lua -- GPT-2 in 4 pipeline stages on 2 ranks, placed
-- in a V and run by ZB-V (Qi et al., ICLR 2024, section 6): rank 0 holds
-- stages 0 and 3, rank 1 stages 1 and 2, so a micro-batch goes down the
-- ranks and back up, and the tied embedding and head share rank 0 (no
-- replica, no gradient message). The backward is split into I and W, and
-- W's fill what would be idle: about half of ZB-H1's bubble at 1F1B's
-- activation memory (`ztrain schedule compare p=2 m=8`).
--
--   build/ztrain --nproc 2 recipes/pipeline_zbv.lua
--   build/ztrain schedule zbv p=2 m=8          # its ideal timeline, without training
--
-- Same bits as one rank accumulating the same 8 micro-batches.
local r = dofile((require("ztrain").home or ".") .. "/recipes/pipeline_1f1b.lua")
r.schedule = "zbv"
r.pipeline = { stages = 2, chunks = 2, split = "params" }
return r
