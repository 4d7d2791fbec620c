-- recipes/pipeline_gpipe.lua -- GPT-2 cut into 2 pipeline stages on 2 ranks,
-- run by GPipe: every micro-batch's forward, then every backward. Simple,
-- and every micro-batch's activations are held at once (1F1B holds fewer).
--
--   build/ztrain --nproc 2 recipes/pipeline_gpipe.lua
--   build/ztrain schedule gpipe p=2 m=8        # its ideal timeline, without training
--
-- Same bits as one rank accumulating the same 8 micro-batches.
local r = dofile((require("ztrain").home or ".") .. "/recipes/pipeline_1f1b.lua")
r.schedule = "gpipe"
return r
