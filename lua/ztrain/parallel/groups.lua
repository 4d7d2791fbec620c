-- ztrain.parallel.groups: the world cut into data-parallel and pipeline groups.
--
-- With p pipeline stages and d = world / p data-parallel replicas, rank r
-- runs stage s = floor(r / d) as replica q = r % d: the ranks of one stage
-- are consecutive (on one host, when hosts hold consecutive ranks), so the
-- heavy data-parallel reductions stay inside a host and the pipeline's
-- point-to-point traffic crosses hosts -- "pipeline parallelism across
-- nodes, data parallelism within nodes".
--
--   local g = groups.build(world, { pp = 2 })
--   g.dp    -- communicator of the ranks running my stage (strategies use it)
--   g.pp    -- communicator of my replica's stages, rank = stage (nil when p = 1)
--   g.stage, g.replica, g.stages, g.replicas
local M = {}

-- check(size, p) -> true | nil, err: whether a world of size ranks cuts
-- into p pipeline stages (the launcher asks before it starts the ranks)
function M.check(size, p)
  if type(p) ~= "number" or p < 1 or p % 1 ~= 0 then
    return nil, ("pipeline stages must be a whole number >= 1, got %s"):format(tostring(p))
  end
  if size % p ~= 0 then
    local ok = {}
    for k = 1, size do if size % k == 0 then ok[#ok + 1] = tostring(k) end end
    return nil, ("%d rank(s) do not divide into %d pipeline stages; use %s stages, or a multiple of %d ranks")
                :format(size, p, table.concat(ok, ", "), p)
  end
  return true
end

-- build(world, { pp = p }) -> groups. Collective over the world.
function M.build(world, opts)
  local p = (opts and opts.pp) or 1
  local okc, cerr = M.check(world.size, p)
  if not okc then error(cerr, 0) end
  local d = world.size / p
  local r = world.rank
  local g = { stages = p, replicas = d, stage = math.floor(r / d), replica = r % d, world = world }
  if p == 1 then
    g.dp = world
  else
    g.dp = world:split(g.stage, g.replica)     -- same stage, ordered by replica
    g.pp = world:split(g.replica, g.stage)     -- same replica, ordered by stage
  end
  return g
end

-- free(g): free the sub-communicators (collective over their ranks).
function M.free(g)
  if g.dp and g.dp ~= g.world then g.dp:free() end
  if g.pp then g.pp:free() end
  g.dp, g.pp = nil, nil
end

return M
