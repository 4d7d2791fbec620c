-- recipes/pipeline_zb.lua -- GPT-2 cut into 2 pipeline stages on 2 ranks,
-- run by ZB-H1 (Qi et al., ICLR 2024): each backward split into its input
-- gradient (I, on the critical path) and its weight gradient (W, delayed to
-- fill the bubble); a third of 1F1B's bubble at the same activation memory.
--
--   build/ztrain --nproc 2 recipes/pipeline_zb.lua
--   build/ztrain schedule zb_h1 p=2 m=8        # its ideal timeline, without training
--
-- Same bits as one rank accumulating the same 8 micro-batches: I then W
-- gives the fused backward's bits, and W's complete in micro-batch order.
local r = dofile((require("ztrain").home or ".") .. "/recipes/pipeline_1f1b.lua")
r.schedule = "zb_h1"
return r
