-- The Lua tree's dependency graph (issue 28, Layers): every `require` of a
-- ztrain module, at the top of a file or inside a function (a lazy require
-- is still a dependency), parsed from the sources; no module may reach
-- itself through them. The cycles this spec was written against -- trainer
-- -> plan -> plan_report -> cli -> run -> trainer (a usage text), cli <->
-- compare, compare <-> compare_tables, plan <-> plan_report,
-- schedule <-> pipeline.schedules, data <-> data.text -- were broken by
-- moving the thing to where it belongs (ztrain.usage, plan.refusal,
-- compare_tables.DEFAULTS, schedule.registry, data.tokenizer). The layer
-- order (lower folders never requiring higher ones) comes with the folders.
local ROOT = (require "ztrain").home or "."

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
      local code = line:gsub("%-%-.*$", "")
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
    assert.is_truthy(g["ztrain.trainer"]["ztrain.plan"], "trainer's require of plan not seen")
    local found = cycles(g)
    assert.are.same({}, found, "require cycles (each a set of modules that reach each other):\n  " ..
                    table.concat(found, "\n  "))
  end)
end)
