-- recipes/pipeline_dp.lua -- 2 pipeline stages x 2 data-parallel replicas on
-- 4 ranks: ranks 0-1 run stage 0, ranks 2-3 stage 1 (a stage's replicas are
-- consecutive ranks: data parallelism within a host, the pipeline across),
-- 1F1B within each replica, each stage's gradients reduced over its
-- data-parallel group by zero1.
--
--   build/ztrain recipes/pipeline_dp.lua
--
-- Same bits as dp on 2 ranks accumulating the same 8 micro-batches each.
local zt = require "ztrain"
local r = dofile((zt.home or ".") .. "/recipes/pipeline_1f1b.lua")
r.launch = { nproc = 4 }
r.strategy = zt.strategy.zero { stage = 1 }
r.batch = { micro = 4, accumulate = 8 }
return r
