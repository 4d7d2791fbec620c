-- spec/cuda/strategies.lua -- the same-math guarantee on one device backend:
-- dp and ZeRO 1/2/3 on 2 ranks (ztrain --nproc 2; on a GPU both ranks share
-- it, their device tensors staged through the MPI communicator) must end
-- with the same param_digest and the same per-step loss bits as one rank
-- accumulating 2 micro-batches -- the digest oracle's cases
-- (spec/fixtures/digest_cases.lua: "tiny n=2" = "single accum2"), run on
-- the backend asked for. Run by `make test-cuda`:
--
--   ZTRAIN_LIB=build-cuda/libztrain.so build-cuda/ztrain --script spec/cuda/strategies.lua
--
-- keys: backend=cuda, strategies=dp,zero1,zero2,zero3, break=1 (the
-- reference made one rank without accumulation, another batch: must fail),
-- ztrain=PATH. Without a GPU it prints one skip line and exits 0;
-- spec/cuda_step_harness_spec.lua checks it on the CPU.
local cjson = require "cjson"
local zt = require "ztrain"
local common = dofile(zt.home .. "/spec/cuda/common.lua")

local A = dofile(zt.home .. "/tools/args.lua")
local args = A(arg)
local backend = args.backend or "cuda"
local what = "cuda strategies"
common.need_backend(backend, what)
local prog = common.program(args)
local util, cases = common.util, common.cases

-- run(case) -> param_digest, "step:loss_hex ..." of one run on `backend`
local function run(c)
  local dir = util.outdir()
  local cmd = cases.command(c, dir, prog) .. (" device.backend=%s %s"):format(backend, common.DATA)
  common.run(cmd, ("%s: %s"):format(what, cases.key(c)))
  local s = cjson.decode(util.read(dir .. "/summary.json"))
  local losses = cases.loss_bits(dir)
  util.rm(dir)
  return s.param_digest, losses
end

local ref = { path = "recipes/single.lua", setting = args["break"] and "tiny" or "accum2", extra = "" }
local want_digest, want_losses = run(ref)
local failed = 0
for _, name in ipairs(A.list(args.strategies, "dp,zero1,zero2,zero3")) do
  local c = { path = "recipes/" .. name .. ".lua", setting = "tiny", nproc = 2, extra = "" }
  local digest, losses = run(c)
  local bad = {}
  if digest ~= want_digest then bad[#bad + 1] = ("param_digest %s, one rank accumulating %s"):format(digest, want_digest) end
  if losses ~= want_losses then bad[#bad + 1] = ("loss bits %s, one rank accumulating %s"):format(losses, want_losses) end
  print(("%s: %s on 2 ranks (%s) against one rank accumulating 2 micro-batches: %s")
        :format(what, name, backend, #bad == 0 and ("same digest " .. digest:sub(1, 16) .. ", same loss bits")
                                               or "FAILED"))
  for _, b in ipairs(bad) do print("  " .. b) end
  if #bad > 0 then failed = failed + 1 end
end
os.exit(failed == 0 and 0 or 1)
