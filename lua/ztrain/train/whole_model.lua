-- ztrain.train.whole_model: what a run does with the whole model, across its
-- pipeline stages and data-parallel ranks: evaluation (the batches split
-- over the replicas, the loss bits those of one rank), samples, the
-- parameter digest, every unit's full parameters on rank 0, the Hugging
-- Face export. Installed as methods of the trainer (trainer.lua).
local ops = require "ztrain.core.ops"
local errors = require "ztrain.core.errors"
local digest = require "ztrain.core.digest"
local stage_run = require "ztrain.parallel.driver.stage"
local pipeline_stages = require "ztrain.parallel.schedule.stages"
local zffi = require "ztrain.core.ffi"
local T = require "ztrain.core.tensor"
local family = require "ztrain.model.family"
local stream = require "ztrain.core.stream"
local generate = require "ztrain.model.generate"
local utf8 = require "ztrain.model.data.utf8"
local hf = require "ztrain.model.hf"

local agree = errors.agree

-- the methods, installed on the trainer's class by the function returned below
local Trainer = {}

-- Mean loss over up to train.eval_batches batches of a split's loader
-- (default: validation; forward only). The batches are split over the
-- data-parallel ranks (batch b on dp rank b % N, each replica through its
-- pipeline); every rank runs the same number of forwards, repeating its
-- first batch where it has none left, so a sharded strategy's gathers stay
-- matched. The per-batch losses are gathered and summed in batch order:
-- the same bits whatever N.
function Trainer:evaluate(L)
  L = L or self.valid_loader
  if not L then return nil end
  local B = self.recipe.batch.micro
  local n = math.min(self.recipe.train.eval_batches, math.floor(L.windows / B))
  if n < 1 then return nil end
  local ctx, pp = self.ctx, self.pp
  local N, r = self.dp.size, self.dp.rank
  ctx.training = false
  local losses = {}           -- [b] = mean loss, where this rank holds the head
  -- this rank's stages, in order (one per rank, or v interleaved chunks)
  local mine = {}
  for i, st in ipairs(self.stages) do if self.pools[i] then mine[#mine + 1] = i end end
  local sets = {}
  for _, i in ipairs(mine) do
    self.pools[i]:reset()
    sets[i] = self.pools[i]:acquire(0)
    sets[i].dscale = nil
  end
  local S, at = #self.stages, self.stage_rank
  local rounds = math.ceil(n / N)
  local ok, err = pcall(function()
    for k = 0, rounds - 1 do
      local b = k * N + r
      local real = b < n
      if not real then b = r end          -- a forward to keep the collectives matched; not counted
      for _, i in ipairs(mine) do
        local stage, a = self.stages[i], sets[i]
        self:load_batch(a, L, b)
        -- across stages: the input from the previous stage, the output to the next
        local tag = 30000 + (stage.index * 64 + k) % 2048
        local prank = pp and pp.rank
        if pp and stage.index > 0 and at(stage.index - 1) ~= prank then pp:recv(a.input, at(stage.index - 1), tag) end
        local y = stage_run.forward(ctx, self.strategy, stage, a, 0)
        if pp and stage.index < S - 1 then
          local nxt = at(stage.index + 1)
          if nxt == prank then ops.copy(sets[i + 1].input, y)      -- the next stage is here too
          else pp:send(y, nxt, 30000 + ((stage.index + 1) * 64 + k) % 2048) end
        end
        if stage.has_head and real then losses[b] = self.model:mean_loss(a) end
      end
    end
  end)
  for _, i in ipairs(mine) do self.pools[i]:release(0) end
  if not ok then error(err, 0) end
  -- a GPU counts bad token ids on the device and reports them at its next
  -- sync: an evaluation ends with one, so it never returns a loss over
  -- skipped targets
  zffi.check(zffi.C.zt_device_sync(), "device sync")
  -- every rank's losses (exact: %.17g round-trips a double), summed in batch order
  local parts = {}
  for b, l in pairs(losses) do parts[#parts + 1] = ("%d:%.17g"):format(b, l) end
  local all = { [0] = table.concat(parts, " ") }
  if self.world_size > 1 then all = self.world:gather_strings(all[0]) end
  local by = {}
  for _, s in pairs(all) do
    for b, l in s:gmatch("(%d+):(%S+)") do by[tonumber(b)] = tonumber(l) end
  end
  local total = 0.0
  for b = 0, n - 1 do
    if not by[b] then error(("evaluate: no loss for batch %d (a bug: every batch has one replica's head)"):format(b)) end
    total = total + by[b]
  end
  return total / n
end


function Trainer:param_digest()
  local S = self.strategy
  if self.pp then
    local with = S.with_full_params and function(u, fn) return S.with_full_params(self.ctx, u, fn) end
    return pipeline_stages.digest(self.pp, #self.stages, function(st, s)
      digest.update(st, self.stages[s + 1].units, with)
    end, self.stage_rank)
  end
  return digest.params(self.model, S.with_full_params and function(u, fn)
    return S.with_full_params(self.ctx, u, fn)
  end)
end


-- each_full_unit(visit): visit(u, flat) on world rank 0 for every unit in
-- order, flat its full parameters; a collective over the world: a sharded
-- strategy gathers each unit (with_full_params), a pipeline sends every
-- other stage's units to its rank 0. Other ranks take part and visit nothing
-- (rank 0 of each data-parallel replica's pipeline also visits, with the
-- same values).
function Trainer:each_full_unit(visit)
  local S, ctx, pp = self.strategy, self.ctx, self.pp
  local function with(u, fn)
    if S.with_full_params then return S.with_full_params(ctx, u, fn) end
    return fn(u.params)
  end
  if not pp then
    for _, u in ipairs(self.model.units) do with(u, function(flat) visit(u, flat) end) end
    return
  end
  for _, stage in ipairs(self.stages) do
    local owner = self.stage_rank(stage.index)
    for _, u in ipairs(stage.units) do
      local tag = 31000 + u.index % 1000
      if owner == pp.rank then
        with(u, function(flat)
          if pp.rank == 0 then visit(u, flat) else pp:send(flat, 0, tag) end
        end)
      elseif pp.rank == 0 then
        local buf = T.new({ u.padded }, { tier = self.model.tier, category = "comm" })
        local ok, err = pcall(function() pp:recv(buf, owner, tag); visit(u, buf) end)
        buf:free()
        if not ok then error(err, 0) end
      end
    end
  end
end


-- sample(opts) -> text on world rank 0 (nil elsewhere): sample.tokens new
-- tokens after sample.prompt (the tokenizer's end-of-text, or a newline,
-- when empty), by model/generate.lua on a full copy of the model gathered on
-- rank 0 (each_full_unit; a collective). A failure to sample is reported
-- in the text, never fatal to the run.
function Trainer:sample(o)
  -- every unit's full parameters already here (replicated, no pipeline): no copy
  local here = not self.pp and not self.strategy.with_full_params
  local copy
  if self.rank == 0 then
    copy = here and self.model or family.new(self.cfg, { tier = self.model.tier, alloc = false })
    if not here then
      -- parameters only, accounted as "other": a transient copy, not model state
      for _, u in ipairs(copy.units) do
        copy:set_params(u, T.new({ u.padded }, { tier = copy.tier, category = "other" }))
      end
    end
  end
  local ok, err = pcall(self.each_full_unit, self, function(u, flat)
    if copy and not here then
      local cu = copy.units[u.index]
      local v = flat:view(0, { cu.padded })
      local okc, cerr = pcall(function()
        if v:tier() == cu.params:tier() then return ops.copy(cu.params, v) end
        stream.copy_async(cu.params, v)
        stream.current():sync()
      end)
      v:free()
      if not okc then error(cerr, 0) end
    end
  end)
  local text
  if copy then
    if ok then
      local prompt = o.prompt
      if prompt == "" then prompt = self.tokenizer.eot and { self.tokenizer.eot } or "\n" end
      local okg, ids, t = pcall(generate.generate, copy, prompt, {
        tokenizer = self.tokenizer, max_tokens = math.min(o.tokens, self.cfg.maxT - 1),
        temperature = o.temperature, top_k = o.top_k, top_p = o.top_p, seed = o.seed })
      text = okg and ((type(o.prompt) == "string" and o.prompt or "") .. (t or "")) or
             ("(no sample: " .. errors.message(ids) .. ")")
      -- a byte tokenizer's sample may end inside a character: valid UTF-8 for JSON
      text = utf8.sanitize(text)
    end
    if not here then copy:free() end
  end
  if not ok then error(err, 0) end
  return text
end


-- export_hf(dir): write the model as a Hugging Face GPT-2 directory
-- (model/hf.lua's save) from world rank 0. A collective over the world
-- (each_full_unit). A failure to write stops every rank alike; nothing
-- half-written is left.
function Trainer:export_hf(dir)
  local each = function(visit) return self:each_full_unit(visit) end
  local tok = self.recipe.data.tokenizer
  if self.tokenizer_name then tok = self.tokenizer_name end -- the model's own (trainer_build.choose_tokenizer)
  local tdir = type(tok) == "string" and (tok:match("^hf:(.+)$") or tok:match("^bpe:(.+)$")) or nil
  if tok == "bpe" then tdir = zffi.home .. "/data/bpe/fortunes" end
  local files = tok == "bytes" and hf.byte_tokenizer_files() or nil
  local ok, err = hf.save(self.model, dir, { each = each, write = self.rank == 0,
                                             eot = self.tokenizer and self.tokenizer.eot, tokenizer_dir = tdir,
                                             tokenizer_json = type(tok) == "string" and tok:match("^hf:") ~= nil,
                                             tokenizer_files = files })
  err = agree(self.world, ok and "" or ("export.hf: " .. tostring(err)))
  if err ~= "" then error(errors.all_ranks(err), 0) end
end


return function(class)
  for name, method in pairs(Trainer) do class[name] = method end
end
