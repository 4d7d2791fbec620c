-- ztrain: GPT-2 training on a C runtime, driven from Lua.
--
--   local zt = require "ztrain"
--   zt.train("recipes/single.lua", { "train.steps=20" })   -- run a recipe
--   local s, tr = zt.train("recipes/single.lua", nil, { keep = true })  -- and keep the trainer
--   local t = zt.tensor.new({ 2, 3 }); t:fill(1); print(t:totable()[1]); t:free()
local generate = require "ztrain.model.generate"
local launch = require "ztrain.job.launch"
local run = require "ztrain.train.run"
local M = {}

M.ffi      = require "ztrain.core.ffi"
M.tensor   = require "ztrain.core.tensor"
M.ops      = require "ztrain.core.ops"
M.memory   = require "ztrain.core.memory"
M.gpt2     = require "ztrain.model.gpt2"
M.adamw    = require "ztrain.model.adamw"
M.lr       = require "ztrain.model.lr"
M.data     = require "ztrain.model.data"
M.strategy = require "ztrain.parallel.strategy"
M.schedule = require "ztrain.parallel.schedule"
M.stream   = require "ztrain.core.stream"
M.aio      = require "ztrain.core.aio"
M.groups   = require "ztrain.parallel.groups"
M.recipe   = require "ztrain.train.recipe"
M.comm     = require "ztrain.core.comm"
M.errors   = require "ztrain.core.errors"
M.digest   = require "ztrain.core.digest"
M.trainer  = require "ztrain.train.trainer"
M.interrupt = require "ztrain.core.interrupt"
M.home     = M.ffi.home

function M.version() return require("ffi").string(M.ffi.C.zt_version()) end

-- threads(n): kernel threads (OpenMP) of this process; threads() reads it.
-- OpenBLAS itself always runs one thread per call (matmul.c spreads blocks).
function M.threads(n)
  local C = M.ffi.C
  if n then M.ffi.check(C.zt_set_threads(n), "threads") end
  return C.zt_get_threads()
end

-- generate(model, prompt, opts) -> new ids, text, info: text generation with
-- a KV cache (ztrain.model.generate): opts max_tokens, temperature (0: greedy),
-- top_k, top_p, seed, tokenizer (an object or a name; else model.tokenizer).
function M.generate(model, prompt, opts)
  return generate.generate(model, prompt, opts)
end

-- train(recipe_path_or_table, overrides, opts) -> summary[, trainer].
-- opts.quiet: no progress; opts.keep: also return the live trainer, to keep
-- exploring (tr:evaluate(), tr:sample{prompt=...}, tr.model, tr:state(),
-- tr:param_digest()); free it with tr:free(). With keep, Ctrl-C at the REPL
-- ends the run between steps and returns what was trained so far
-- (summary.exit = "interrupted"); without, the call raises "interrupted".
function M.train(r, overrides, opts)
  local resolved, err
  if type(r) == "string" then resolved, err = M.recipe.load(r, overrides)
  else resolved, err = M.recipe.resolve(r, overrides) end
  if not resolved then error(err, 0) end
  if resolved.name == "" then resolved.name = "repl" end
  -- at the REPL the world is what it is: a recipe asking for another rank
  -- count is refused rather than launched
  local ok, lerr = launch.check_world(resolved.launch.nproc, M.comm.world().size, "session")
  if not ok then error(lerr, 0) end
  return run.run(resolved, opts)
end

return M
