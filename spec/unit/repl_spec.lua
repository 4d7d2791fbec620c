-- The REPL's parts, called without a terminal: completion, pretty-printing,
-- help, interrupt polls, the multi-rank display. (The REPL in a terminal,
-- `ztrain --nproc 2 -i` on two ranks: e2e/repl_terminal_spec.lua.)
local zt = require "ztrain"
_G.zt = zt
local complete = require "ztrain.repl.complete"
local pretty = require "ztrain.repl.pretty"
local help = require "ztrain.repl.help"
local repl = require "ztrain.repl"
local ranks = require "ztrain.repl.ranks"
local interrupt = require "ztrain.core.interrupt"
local util = require "helpers.util"


describe("REPL completion", function()
  local env = setmetatable({ zt = zt, myvar = 1, mytab = { alpha = 1, beta = { gamma = 2 } },
                             t = zt.tensor.new({ 2 }), s = "text" }, { __index = _G })
  teardown(function() env.t:free() end)

  it("completes zt. names, fields, methods, globals and keywords", function()
    assert.same({ "zt.tensor" }, complete.candidates("zt.tens", env))
    assert.same({ "zt.tensor.new" }, complete.candidates("zt.tensor.ne", env))
    local all = complete.candidates("zt.", env)
    assert.truthy(#all > 15)
    for _, name in ipairs({ "zt.train", "zt.tensor", "zt.comm", "zt.interrupt" }) do
      assert.truthy(table.concat(all, " "):find(name, 1, true), name)
    end
    assert.same({ "mytab.beta.gamma" }, complete.candidates("mytab.beta.g", env))
    assert.same({ "mytab.alpha", "mytab.beta" }, complete.candidates("mytab.", env))
    assert.same({ "t:shape" }, complete.candidates("t:sha", env))           -- a tensor's methods
    assert.same({ "s:upper" }, complete.candidates("s:up", env))            -- a string's
    assert.same({ "myvar", "mytab" }, (function()
      local c = complete.candidates("my", env); table.sort(c, function(a, b) return a > b end); return c end)())
    assert.same({ "while" }, complete.candidates("whi", env))
    assert.same({}, complete.candidates("nosuch.x", env))
    assert.same({}, complete.candidates("mytab..", env))
  end)
end)

describe("REPL pretty-printing", function()
  it("shows a tensor's shape, dtype, tier, category, bytes and values", function()
    local t = zt.tensor.new({ 2, 5 }, { category = "grads" })
    t:fill(0.5)
    local text = pretty.show(t)
    assert.truthy(text:find("Tensor f32 [2, 5]  device  grads  40 B (10 elements)", 1, true), text)
    assert.truthy(text:find("values 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, ...", 1, true), text)
    assert.truthy(text:find("min 0.5  max 0.5  mean 0.5", 1, true), text)
    local b = zt.tensor.new({ 3 }, { dtype = "bf16", tier = "host" })
    local f = zt.tensor.new({ 3 }, { tier = "host" }):fill(-2)
    zt.ops.cast(b, f)
    f:free()
    text = pretty.show(b)
    assert.truthy(text:find("Tensor bf16 [3]  host  other  6 B (3 elements)", 1, true), text)
    assert.truthy(text:find("values -2, -2, -2\n", 1, true), text)
    b:free(); t:free()
    assert.equal("Tensor (freed)", pretty.show(t))
  end)

  it("shows a model's units and sizes", function()
    local m = zt.gpt2.new(zt.gpt2.config("gpt2-tiny", { vocab_size = 256 }), { alloc = false })
    local text = pretty.show(m)
    assert.truthy(text:find("GPT-2 gpt2-tiny: 124672 parameters, 2 layers, 64 channels", 1, true), text)
    assert.truthy(text:find("block.0 +49984 +195.25 KiB +%-"), text)
    assert.truthy(text:find("head +128"), text)
  end)

  it("shows summaries as the seeds' results table", function()
    local function summ(strategy, digest, loss)
      return { recipe = "r", strategy = strategy, world_size = 2, steps = 10, step_ms_median = 12.5,
               tokens_per_s = 4096, final_loss = loss, eval_loss = 2.5, param_digest = digest, exit = "ok",
               model = { name = "gpt2-tiny", params = 124672 },
               memory = { { device_peak = 2 * 1048576, host_peak = 0 }, { device_peak = 3 * 1048576, host_peak = 1024 } } }
    end
    local text = pretty.show({ summ("dp", "aaaaaaaaaaaaaaaa", 2.25), summ("zero3", "bbbbbbbbbbbbbbbb", 2.5) })
    assert.truthy(text:find("| Strategy | Ranks | Steps | Time/step | Tokens/s | Peak device | Peak host |", 1, true), text)
    assert.truthy(text:find("| dp       | 2     | 10    | 12.5 ms   | 4096     | 3.00 MiB    | 1.00 KiB  | 2.2500", 1, true), text)
    assert.truthy(text:find("aaaaaaaaaaaa (=)", 1, true), text)
    assert.truthy(text:find("bbbbbbbbbbbb (differs)", 1, true), text)
    assert.equal('{ a = "x" }', pretty.show({ a = "x" }))
  end)
end)

describe("REPL help", function()
  it("prints a function's or module's source comments, or says there is none", function()
    local text = help.text(zt.train, "zt.train")
    assert.truthy(text:find("^zt.train  %(lua/ztrain/init.lua:%d+%)\ntrain%(recipe_path_or_table"), text)
    text = help.text(zt.tensor)
    assert.truthy(text:find("^zt.tensor  %(lua/ztrain/core/tensor.lua%)\nztrain.core.tensor: tensors"), text)
    assert.truthy(text:find("zt.tensor.new  new(shape", 1, true), text)
    assert.truthy(help.text(zt.ops.sum):find("Sum of x in fp64", 1, true))     -- through the poll wrapper
    local t = zt.tensor.new({ 1 })
    local ht = help.text(t, "t")
    assert.truthy(ht:find("t is a ztrain.core.tensor object", 1, true), ht)
    t:free()
    assert.equal("no documentation for print", help.text(print, "print"))
    assert.equal("no documentation for x", help.text(42, "x"))
  end)

  it("reads ?x as help(x), and a leading local as a global", function()
    assert.equal('help((function() return zt.train end)(), "zt.train")', repl.question("?zt.train"))
    assert.falsy(repl.question("zt.train"))
    assert.same({ "x" }, repl.exports("local x = 1"))
    assert.same({ "a", "b" }, repl.exports("local a, b = 1, 2"))
    assert.same({ "f" }, repl.exports("local function f() end"))
    assert.same({ "z" }, repl.exports("local z"))
    assert.is_nil(repl.exports("y = local_x"))
    local ok, text = repl.run("local replvar = 5")
    assert.truthy(ok)
    ok, text = repl.run("replvar * 2")
    assert.equal("10", text)
    ok, text = repl.run("local function replfn() return 7 end")
    ok, text = repl.run("replfn()")
    assert.equal("7", text)
    ok, text = repl.run("local nilvar = nil; return nilvar.x")      -- still a local inside its chunk
    assert.falsy(ok)
    assert.truthy(text:find("attempt to index local 'nilvar'", 1, true), text)
    ok, text = repl.run("splitvar = 3; splitvar + 1")     -- statements, then an expression
    assert.equal("4", text)
    ok, text = repl.run("nil")
    assert.equal("nil", text)
    assert.truthy(repl.incomplete("for i = 1, 2 do"))
    assert.falsy(repl.incomplete("?zt"))
  end)
end)

describe("interrupt polls", function()
  after_each(function() interrupt.set_action(nil); interrupt.clear() end)

  it("do nothing without an action, raise 'interrupted' with one", function()
    interrupt.raise()
    interrupt.poll()                                   -- no action: nothing
    assert.equal(1, interrupt.count())
    interrupt.set_action("raise")
    local ok, e = pcall(interrupt.poll)
    assert.falsy(ok)
    assert.truthy(interrupt.is_interrupt(e))
    assert.equal("interrupted", zt.errors.message(e))
    assert.equal(0, interrupt.count())
    interrupt.poll()                                   -- cleared: nothing
  end)

  it("wait inside shield, and under `agreed` only poll_all raises", function()
    interrupt.set_action("raise")
    interrupt.raise()
    interrupt.shield(function() interrupt.poll() end) -- held: nothing
    assert.equal(1, interrupt.count())
    interrupt.set_action("raise", { agreed = true })
    interrupt.poll()                                   -- agreed: one rank alone never raises
    assert.equal(1, interrupt.count())
    local ok, e = pcall(interrupt.poll_all, zt.comm.world())
    assert.falsy(ok)
    assert.truthy(zt.errors.is_all_ranks(e) and interrupt.is_interrupt(e))
  end)

  it("stop a loop of kernels between two ops", function()
    local t = zt.tensor.new({ 4 })
    interrupt.set_action("raise")
    local done = 0
    local ok, e = pcall(function()
      for i = 1, 100 do
        if i == 10 then interrupt.raise() end
        zt.ops.fill(t, i)
        done = i
      end
    end)
    t:free()
    assert.falsy(ok)
    assert.equal("interrupted", zt.errors.message(e))
    assert.equal(9, done)
  end)

  it("stop loops of tensor, memory and comm calls, compiled ones too, before the call", function()
    interrupt.set_action("raise")
    local w = zt.comm.world()
    local loops = {
      tensor = function(i) local t = zt.tensor.new({ 4 }); t:fill(i); t:free() end,
      memory = function() zt.memory.current("device") end,
      comm = function() w:barrier() end,
    }
    local before = zt.memory.current("device")
    for name, body in pairs(loops) do
      local done = 0
      local ok, e = pcall(function()
        for i = 1, 20000 do                            -- long enough for the JIT to compile it
          if i == 10000 then interrupt.raise() end
          body(i)
          done = i
        end
      end)
      assert.falsy(ok, name)
      assert.equal("interrupted", zt.errors.message(e), name)
      assert.equal(9999, done, name)
    end
    assert.equal(before, zt.memory.current("device"))
  end)

  it("stop zt.gpt2.new between allocations, which frees what it made", function()
    interrupt.set_action("raise")
    local T = require "ztrain.core.tensor"
    local new, n = T.new, 0
    T.new = function(...)                              -- Ctrl-C while the 5th buffer is asked for
      n = n + 1
      if n == 5 then interrupt.raise() end
      return new(...)
    end
    local before = zt.memory.current("device")
    local ok, e = pcall(zt.gpt2.new, "gpt2-mini")
    T.new = new
    assert.falsy(ok)
    assert.equal("interrupted", zt.errors.message(e))
    assert.equal(5, n)
    assert.equal(before, zt.memory.current("device"))     -- at once: no collectgarbage
    local m = zt.gpt2.new("gpt2-mini")                     -- (a size's name is a config)
    assert.equal(4, m.cfg.L)
    m:free()
  end)

  it("at the REPL, release what an interrupted chunk made and dropped", function()
    interrupt.set_action("raise")
    local before = zt.memory.current("device")
    collectgarbage("stop")                              -- only the REPL's own collection counts
    local ok, err = repl.run("local ts = {} for i = 1, 50 do ts[i] = zt.tensor.new({ 1024 }) end " ..
                             "local i = require('ztrain.core.interrupt') i.raise() i.poll()")
    local after = zt.memory.current("device")
    collectgarbage("restart")
    assert.falsy(ok)
    assert.equal("interrupted", err)
    assert.equal(before, after)
  end)

  it("stop zt.train between steps; with keep the trainer trained so far comes back", function()
    interrupt.set_action("raise")
    -- an interrupt arriving during step 2 (the step is shielded: it finishes)
    local trainer = require "ztrain.train.trainer"
    local orig = trainer.new
    trainer.new = function(...)
      local tr = orig(...)
      local step = tr.train_step
      tr.train_step = function(self)
        if self.step == 1 then interrupt.raise() end
        return step(self)
      end
      return tr
    end
    local out = util.outdir()
    local ok, s, tr = pcall(zt.train, "recipes/single.lua", { "train.steps=50", "train.eval_every=0",
                                                               "out=" .. out }, { keep = true, quiet = true })
    trainer.new = orig
    util.rm(out)
    assert.truthy(ok, s)
    assert.equal("interrupted", s.exit)
    assert.equal(2, s.steps)
    assert.equal(2, tr.step)
    assert.truthy(tr.model.units[1].params)
    tr:free()
  end)
end)

describe("multi-rank REPL display", function()
  it("shows equal texts once, different ones per rank, and nothing for none", function()
    assert.equal("[all ranks] 2\n", ranks.show({ "2", "2" }))
    assert.equal("[rank 0] 0\n[rank 1] 1\n", ranks.show({ "0", "1" }))
    assert.equal("[rank 0] true\n[rank 1] error: boom\n[rank 1] more\n", ranks.show({ "true", "error: boom\nmore" }))
    assert.equal("[rank 1] x\n", ranks.show({ "", "x" }))
    assert.equal("", ranks.show({ "", "" }))
    assert.equal("R5\n1 + 1", ranks.frame("R", "1 + 1"))
  end)
end)
