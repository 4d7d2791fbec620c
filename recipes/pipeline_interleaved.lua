-- recipes/pipeline_interleaved.lua -- GPT-2 cut into 4 pipeline stages on 2
-- ranks, 2 chunks per rank (rank 0: stages 0 and 2; rank 1: stages 1 and
-- 3), run by Megatron's interleaved 1F1B: the bubble shrinks to
-- (p-1)/(v*m) of the busy time, at the cost of more messages.
--
--   build/ztrain recipes/pipeline_interleaved.lua
--   build/ztrain schedule interleaved_1f1b p=2 m=8 v=2   # its ideal timeline
--
-- Same bits as one rank accumulating the same 8 micro-batches.
local r = dofile((require("ztrain").home or ".") .. "/recipes/pipeline_1f1b.lua")
r.pipeline = { stages = 2, chunks = 2, split = "params" }
r.schedule = "interleaved_1f1b"
return r
