-- The Lua tree's dependency graph (issue 28, Layers): every `require` of a
-- ztrain module, at the top of a file or inside a function (a lazy require
-- is still a dependency), parsed from the sources; no module may reach
-- itself through them. The cycles this spec was written against -- trainer
-- -> plan -> plan_report -> cli -> run -> trainer (a usage text), cli <->
-- compare, compare <-> compare_tables, plan <-> plan_report,
-- schedule <-> pipeline.schedules, data <-> data.text -- were broken by
-- moving the thing to where it belongs (ztrain.cli.usage, plan.preflight.refusal,
-- compare_tables.DEFAULTS, schedule.registry, data.tokenizer).
--
-- And the layers: LAYERS below, lowest first, is the one place the order is
-- written; each layer is a folder of lua/ztrain/ (the public API, init.lua,
-- is the layer "api"). A module may require its own layer or lower ones,
-- never higher; every module must be in a layer (a new folder is placed on
-- purpose).
local ROOT = (require "ztrain").home or "."

local LAYERS = {
  -- the C binding and its objects
  { "core", { "core." } },
  -- no training knowledge: files, host facts, JSON, durable writes, SVG, suggestions
  { "util", { "util." } },
  -- a job's processes: the launcher, hosts, the registry ranks write, run directories
  { "job", { "job." } },
  -- the model and its math: GPT-2, generation, HF files, optimizer, lr, precision, data
  { "model", { "model." } },
  -- placement and order: groups, strategies, the schedule IR and library, the drivers
  { "parallel", { "parallel." } },
  -- predictions: the memory plan (the trainer's pre-flight) and step times
  { "plan", { "plan", "plan." } },
  -- what a run records: metrics and summaries, communication, timelines, op profiles
  { "record", { "record." } },
  -- a training run: recipe, trainer, the loop, checkpoints, whole-model tools
  { "train", { "train." } },
  -- reading runs afterwards: compare, charts, the planner's tables
  { "insight", { "insight." } },
  -- the public Lua API (require "ztrain")
  { "api", { "" } },
  { "repl", { "repl", "repl." } },
  { "cli", { "cli", "cli." } },
}

-- Requires sit at the top of a file, so its header says what it depends
-- on; a require inside a function is allowed only in a file listed here,
-- with the reason (a real load-time cost), which the file's header states too.
local LAZY = {
  ["ztrain.cli"] = "every process ztrain starts runs it; the launcher, schedule and --help load no runtime",
  ["ztrain.cli.commands"] = "a command's module (and the runtime it uses) loads only when that command runs",
}

-- layer_of(name) -> index, layer name: the layer whose entry names the module
-- (name without "ztrain."), an exact name before a prefix; nil if none does
local function layer_of(name)
  local short = name == "ztrain" and "" or name:gsub("^ztrain%.", "")
  local best, best_len
  for i, l in ipairs(LAYERS) do
    for _, e in ipairs(l[2]) do
      local exact = e == short
      local prefix = e:sub(-1) == "." and short:sub(1, #e) == e
      if exact then return i, l[1] end
      if prefix and (not best_len or #e > best_len) then best, best_len = i, #e end
    end
  end
  if best then return best, LAYERS[best][1] end
end

-- upward(g) -> "a (layer) -> b (layer), line N" for each require of a higher layer
local function upward(g, where)
  local out = {}
  for name, deps in pairs(g) do
    local li, ln = layer_of(name)
    for dep, line in pairs(deps) do
      local di, dn = layer_of(dep)
      if li and di and di > li then
        out[#out + 1] = ("%s (%s) -> %s (%s), %s:%d"):format(name, ln, dep, dn, where and where[name] or name, line)
      end
    end
  end
  table.sort(out)
  return out
end

-- modules() -> { [name] = path } for every lua/ztrain file
local function modules(root)
  local p = io.popen(("cd %q && find ztrain -name '*.lua' | sort"):format(root .. "/lua"))
  local mods = {}
  for f in p:lines() do
    mods[(f:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))] = root .. "/lua/" .. f
  end
  p:close()
  return mods
end

-- edges(mods) -> { [name] = { [dep] = line } }: requires of other ztrain modules
local function edges(mods)
  local out = {}
  for name, path in pairs(mods) do
    out[name] = {}
    local n = 0
    for line in io.lines(path) do
      n = n + 1
      -- comments and single-quoted strings out (code that writes a recipe
      -- holds 'require "ztrain"' as text; no require here uses single quotes)
      local code = line:gsub("%-%-.*$", ""):gsub("'[^']*'", "''")
      for dep in code:gmatch("require%s*%(?%s*[\"']([%w%._]+)[\"']") do
        if mods[dep] and dep ~= name and not out[name][dep] then out[name][dep] = n end
      end
    end
  end
  return out
end

-- cycles(g) -> the strongly connected components of more than one module
-- (Tarjan), each sorted, as "a -> b -> ... -> a" chains found by a walk
local function cycles(g)
  local index, low, on, stack, idx, out = {}, {}, {}, {}, 0, {}
  local function strong(v)
    idx = idx + 1; index[v] = idx; low[v] = idx; stack[#stack + 1] = v; on[v] = true
    local deps = {}
    for w in pairs(g[v]) do deps[#deps + 1] = w end
    table.sort(deps)
    for _, w in ipairs(deps) do
      if not index[w] then strong(w); low[v] = math.min(low[v], low[w])
      elseif on[w] then low[v] = math.min(low[v], index[w]) end
    end
    if low[v] == index[v] then
      local c = {}
      repeat local w = table.remove(stack); on[w] = nil; c[#c + 1] = w until w == v
      if #c > 1 then table.sort(c); out[#out + 1] = table.concat(c, ", ") end
    end
  end
  local names = {}
  for n in pairs(g) do names[#names + 1] = n end
  table.sort(names)
  for _, n in ipairs(names) do if not index[n] then strong(n) end end
  return out
end

-- lazy(mods) -> "module:line" for each require of a ztrain module inside a
-- function (an indented line) of a module not in LAZY
local function lazy(mods, allowed)
  local out = {}
  for name, path in pairs(mods) do
    if not allowed[name] then
      local n, seen_fn = 0, false
      for line in io.lines(path) do
        n = n + 1
        local code = line:gsub("%-%-.*$", ""):gsub("'[^']*'", "''")
        local req = code:find("require%s*%(?%s*[\"']ztrain[%w%._]*[\"']")
        if code:match("^local%s+function") or code:match("^function") then seen_fn = true end
        -- inside a function (indented, or a one-line function), or at the
        -- top level but below the first function: not in the file's header
        if req and (code:match("^%s+") or code:sub(1, req):find("function") or seen_fn) then
          out[#out + 1] = ("%s:%d"):format(name, n)
        end
      end
    end
  end
  table.sort(out)
  return out
end

describe("layers: the Lua tree's requires", function()
  it("the cycle finder finds a cycle (a -> b -> c -> a) and none in a chain", function()
    assert.are.same({ "a, b, c" }, cycles({ a = { b = 1 }, b = { c = 1 }, c = { a = 1 }, d = { a = 1 } }))
    assert.are.same({}, cycles({ a = { b = 1 }, b = { c = 1 }, c = {} }))
  end)

  it("no module reaches itself through requires, lazy ones included", function()
    local mods = modules(ROOT)
    local g = edges(mods)
    local n = 0
    for _, e in pairs(g) do for _ in pairs(e) do n = n + 1 end end
    assert.is_true(n > 200, ("only %d require edges parsed: the parser is broken"):format(n))
    assert.is_truthy(g["ztrain.train.trainer"]["ztrain.plan.preflight"], "trainer's require of plan.preflight not seen")
    local found = cycles(g)
    assert.are.same({}, found, "require cycles (each a set of modules that reach each other):\n  " ..
                    table.concat(found, "\n  "))
  end)

  it("the layer check places names and finds an upward require", function()
    assert.are.equal("core", select(2, layer_of("ztrain.core.ops")))
    assert.are.equal("model", select(2, layer_of("ztrain.model.data.text")))
    assert.are.equal("record", select(2, layer_of("ztrain.record.timeline")))
    assert.are.equal("parallel", select(2, layer_of("ztrain.parallel.schedule.csv")))
    assert.are.equal("api", select(2, layer_of("ztrain")))
    assert.is_nil(layer_of("ztrain.nowhere"))
    assert.are.same({ "ztrain.core.ops (core) -> ztrain.train.trainer (train), ztrain.core.ops:3" },
                    upward({ ["ztrain.core.ops"] = { ["ztrain.train.trainer"] = 3, ["ztrain.core.ffi"] = 1 },
                             ["ztrain.train.trainer"] = { ["ztrain.core.ops"] = 9 } }))
  end)

  it("requires sit at the top of a file, except where LAZY says why", function()
    local mods = modules(ROOT)
    for name in pairs(LAZY) do assert.is_truthy(mods[name], name .. " is in LAZY but is no module") end
    local found = lazy(mods, LAZY)
    assert.are.same({}, found, "requires inside functions (move them to the top, or list the file in LAZY " ..
                    "with the load-time cost it avoids):\n  " .. table.concat(found, "\n  "))
    -- and the check sees one: an indented require in a module not allowed
    local tmp = os.tmpname()
    local f = io.open(tmp, "w"); f:write('local M = {}\nfunction M.f()\n  return require("ztrain.core.ops")\nend\n' ..
            'function M.g() return require "ztrain.core.tensor" end\nlocal late = require "ztrain.core.ops"\n'); f:close()
    assert.are.same({ "probe:3", "probe:5", "probe:6" }, lazy({ probe = tmp }, {}))
    os.remove(tmp)
  end)

  it("the CLI loads only what every start needs", function()
    local out = io.popen(("cd %q && luajit -e 'package.path=\"lua/?.lua;lua/?/init.lua;\"..package.path; " ..
      "require \"ztrain.cli\"; local n = {} for k in pairs(package.loaded) do " ..
      "if k:match(\"^ztrain\") then n[#n+1] = k end end table.sort(n) print(table.concat(n, \" \"))'"):format(ROOT))
    local got = out:read("*a"):gsub("%s+$", "")
    out:close()
    assert.are.equal("ztrain.cli ztrain.cli.commands ztrain.cli.usage ztrain.core.errors", got)
  end)

  -- Sizes a reader takes in at once: a file of about 500 lines, a function
  -- of about 80 (each function's line span from LuaJIT's own bytecode
  -- listing, nested functions inside their parents). A longer one is two
  -- things, or LONG says why it is one.
  it("no file over about 500 lines, no function over about 80", function()
    local LONG = {}
    local big = {}
    for name, path in pairs(modules(ROOT)) do
      local n = 0
      for _ in io.lines(path) do n = n + 1 end
      if n > 520 then big[#big + 1] = ("%s: %d lines"):format(name, n) end
      local p = io.popen(("luajit -bl %q 2>&1"):format(path))
      for first, last in p:read("*a"):gmatch("%-%- BYTECODE %-%- [^\n]-:(%d+)%-(%d+)") do
        local len = tonumber(last) - tonumber(first) + 1
        local at = ("%s:%s"):format(name, first)
        if tonumber(first) > 0 and len > 90 and not LONG[at] then big[#big + 1] = ("%s: a function of %d lines"):format(at, len) end
      end
      p:close()
    end
    table.sort(big)
    assert.are.same({}, big, "too long (split it, or add it to LONG with the reason):\n  " .. table.concat(big, "\n  "))
  end)

  it("every module has a layer and requires only its own layer or lower ones", function()
    local mods = modules(ROOT)
    local unplaced = {}
    for name in pairs(mods) do if not layer_of(name) then unplaced[#unplaced + 1] = name end end
    table.sort(unplaced)
    assert.are.same({}, unplaced, "modules in no layer (add them to LAYERS in spec/unit/layers_spec.lua)")
    local where = {}
    for name, path in pairs(mods) do where[name] = path:gsub("^.*/lua/", "lua/") end
    local up = upward(edges(mods), where)
    assert.are.same({}, up, "requires of a higher layer:\n  " .. table.concat(up, "\n  "))
  end)
end)
