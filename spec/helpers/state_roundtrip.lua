-- spec/helpers/state_roundtrip.lua -- run under `ztrain [--nproc N] --script`:
--   save DIR STRATEGY STEPS ACCUM [MODEL]   train, then each rank writes its
--                                           Trainer:state() to DIR/rank-R.bin
--   load DIR STRATEGY STEPS ACCUM NFILES [MODEL]  read every rank's file (into
--                                           host-tier tensors), load, train
--   ref  -   STRATEGY STEPS ACCUM          train uninterrupted
-- Prints "digest <hex>" on rank 0. A deliberately plain file format: the
-- Lifecycle issue brings real checkpoints; this only carries state() across
-- processes and world sizes.
local ffi = require "ffi"
local zt = require "ztrain"
local trainer = require "ztrain.train.trainer"
local T = require "ztrain.core.tensor"

local mode, dir, strat, steps, accum = arg[1], arg[2], arg[3], tonumber(arg[4]), arg[5]
local nfiles = tonumber(arg[6])
local model = (mode == "load" and arg[7]) or (mode == "save" and arg[6]) or "gpt2-tiny"
local r = assert(zt.recipe.resolve({ strategy = strat }, { "model.size=" .. model, "data.seq_len=32",
  "batch.micro=2", "lr.warmup=1", "train.eval_every=0", "optim.clip=0.05", "batch.accumulate=" .. accum }))
local tr = trainer.new(r)
local w = zt.comm.world()

if mode == "save" then
  for _ = 1, steps do tr:train_step() end
  local ex = tr:state()
  local f = assert(io.open(("%s/rank-%d.bin"):format(dir, w.rank), "wb"))
  f:write(("step %d\n"):format(ex.step))
  for _, u in ipairs(ex.units) do f:write(("unit %s %d\n"):format(u.name, u.numel)) end
  for _, e in ipairs(ex.entries) do
    local n = e.hi - e.lo
    local buf = ffi.new("float[?]", n)
    e.tensor:read(buf)
    f:write(("entry %s %s %d %d\n"):format(e.kind, e.unit, e.lo, e.hi), ffi.string(buf, 4 * n))
  end
  f:close(); ex.free()
elseif mode == "load" then
  local exports, step, made = {}, nil, {}
  for rk = 0, nfiles - 1 do
    local f = assert(io.open(("%s/rank-%d.bin"):format(dir, rk), "rb"))
    local ex = { entries = {}, units = {} }
    while true do
      local line = f:read("*l")
      if not line then break end
      local tag, a, b, c, d = line:match("^(%a+) (%S+) ?(%S*) ?(%S*) ?(%S*)$")
      if tag == "step" then step = tonumber(a)
      elseif tag == "unit" then ex.units[#ex.units + 1] = { name = a, numel = tonumber(b) }
      else
        local lo, hi = tonumber(c), tonumber(d)
        local t = T.new({ hi - lo }, { tier = "host" })     -- saved state on the host tier
        t:write(f:read(4 * (hi - lo)))
        made[#made + 1] = t
        ex.entries[#ex.entries + 1] = { kind = a, unit = b, lo = lo, hi = hi, tensor = t }
      end
    end
    f:close()
    exports[#exports + 1] = ex
  end
  local ok, err = pcall(tr.load_state, tr, zt.strategy.state.reader(exports), step)
  for _, t in ipairs(made) do t:free() end
  if not ok then io.stderr:write("ztrain: ", tostring(err), "\n"); tr:free(); os.exit(1) end
  for _ = 1, steps do tr:train_step() end
else
  for _ = 1, steps do tr:train_step() end
end
local d = tr:param_digest()
if w.rank == 0 then print("digest " .. d) end
tr:free()
