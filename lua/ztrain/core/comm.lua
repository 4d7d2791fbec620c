-- ztrain.core.comm: communicators over the runtime's comm layer (MPI or local).
--
--   local world = comm.world()              -- world.rank, world.size, world.backend
--   local req = world:all_reduce(t, true)   -- async: a request; t summed in rank order
--   req:wait()
--   world:reduce_scatter(shard, full)       -- blocking when the last argument is absent
--
-- Collectives must be issued in the same order on every rank. A request must
-- be waited on exactly once (one never waited on keeps its operation's
-- memory); tensors involved stay untouched until then.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local interrupt = require "ztrain.core.interrupt"
local C, check, check_key = zffi.C, zffi.check, zffi.check_key
local poll = interrupt.poll

local M = {}
local Comm = {}
Comm.__index = Comm
local Req = {}
Req.__index = Req

local reqbuf = ffi.new("zt_comm_req*[1]")
local donebuf = ffi.new("int[1]")

local function wrap(c)
  return setmetatable({ c = c, rank = C.zt_comm_rank(c), size = C.zt_comm_size(c),
                        backend = ffi.string(C.zt_comm_backend(c)) }, Comm)
end

-- The watchdog and checker (runtime/comm_watch.c): timeout seconds
-- before a stuck collective ends the job naming who did not arrive (0 =
-- off), and check: signatures compared before every collective.
-- Defaults: ZTRAIN_COMM_TIMEOUT (else 300 s) and ZTRAIN_COMM_CHECK=1.
M.DEFAULT_TIMEOUT = tonumber(os.getenv("ZTRAIN_COMM_TIMEOUT") or "") or 300
M.DEFAULT_CHECK = os.getenv("ZTRAIN_COMM_CHECK") == "1"
local watching = { timeout = M.DEFAULT_TIMEOUT, check = M.DEFAULT_CHECK, names = { timeout = "", check = "" } }

-- watch{timeout=, check=, names=} -> the previous settings (to restore
-- them). names = { timeout = "comm.timeout", check = "comm.check" }: what
-- the watchdog's report and the check's errors call the two settings (the
-- caller's own names: a recipe's keys); "" = the runtime's (zt_comm_watch's).
function M.watch(opts)
  local prev = { timeout = watching.timeout, check = watching.check, names = watching.names }
  local t = opts.timeout == nil and watching.timeout or opts.timeout
  local c = opts.check == nil and watching.check or opts.check
  local names = opts.names or watching.names
  if type(t) ~= "number" or t < 0 or t ~= t then
    error(("comm.watch: timeout must be a number of seconds >= 0 (0 = off), got %s"):format(tostring(t)), 0)
  end
  check(C.zt_comm_watch(t, c and 1 or 0), "comm.watch")
  check(C.zt_comm_watch_names(names.timeout or "", names.check or ""), "comm.watch")
  watching.timeout, watching.check = t, c and true or false
  watching.names = { timeout = names.timeout or "", check = names.check or "" }
  return prev
end

-- hold_check(on) -> the previous hold. While held, a run checks its
-- collectives whatever its recipe's comm.check (train/run.lua): the
-- multi-rank REPL, whose fences must meet checked collectives
-- (repl/ranks.lua). check_held() -> whether it is held.
local held_check = false
function M.hold_check(on)
  local prev = held_check
  held_check = on and true or false
  return prev
end
function M.check_held() return held_check end

local world
-- world() -> the world communicator (MPI under a launcher, else one local rank).
function M.world()
  if not world then
    local out = ffi.new("zt_comm*[1]")
    check(C.zt_comm_world(out), "comm.world")
    world = wrap(out[0])
    M.watch({})
  end
  return world
end

-- With comm.check on, the Lua line that issues a collective travels with
-- its signature: a mismatch names both ranks' lines.
local getinfo = debug.getinfo
local function stamp_site()
  if not watching.check then return end
  for level = 3, 8 do
    local info = getinfo(level, "Sl")
    if not info then break end
    if not info.short_src:find("ztrain/comm.lua", 1, true) then
      C.zt_comm_set_site(("%s:%d"):format(info.short_src:match("[^/]*/?[^/]*$"), info.currentline))
      return
    end
  end
end
M.stamp_site = stamp_site

-- use_nccl(deterministic): collective; this communicator's device tensors
-- move over NCCL from now on (a CUDA build, device.backend = "cuda"; groups
-- split from it later too); host tensors stay on MPI. deterministic: the
-- rank-order sum (the MPI transport's bits). One local rank: unchanged.
-- key: the setting that asked for it ("comm.backend=nccl"), named by the
-- error in place of the C call.
function Comm:use_nccl(deterministic, key)
  local rc = C.zt_comm_use_nccl(self.c, deterministic and 1 or 0)
  if key then check_key(rc, key) else check(rc) end
  self.backend = ffi.string(C.zt_comm_backend(self.c))
end

-- Issue fn(..., reqptr); return a Req when async, else wait inside C.
-- A loop of them stops on Ctrl-C at the one-rank REPL: a poll first
-- (under several ranks only agreed polls raise: ztrain.core.interrupt).
local function issue(what, async, fn, ...)
  poll()
  stamp_site()
  local n = select("#", ...)
  local args = { ... }
  args[n + 1] = async and reqbuf or nil
  check(fn(unpack(args, 1, n + 1)), what)
  if async then return setmetatable({ r = reqbuf[0], what = what }, Req) end
end

function Req:wait()
  local r = self.r
  if r == nil then error("comm request waited on twice (" .. self.what .. ")", 2) end
  self.r = nil
  check(C.zt_comm_wait(r), self.what)
end

function Req:test()
  if self.r == nil then return true end
  check(C.zt_comm_test(self.r, donebuf), self.what)
  return donebuf[0] ~= 0
end

function Comm:all_reduce(x, async)
  return issue("all_reduce", async, C.zt_all_reduce, self.c, x.c)
end
function Comm:reduce_scatter(out, inp, async)
  return issue("reduce_scatter", async, C.zt_reduce_scatter, self.c, out.c, inp.c)
end
function Comm:all_gather(out, inp, async)
  return issue("all_gather", async, C.zt_all_gather, self.c, out.c, inp.c)
end
function Comm:broadcast(x, root, async)
  return issue("broadcast", async, C.zt_broadcast, self.c, x.c, root)
end
function Comm:send(x, peer, tag, async)
  return issue("send", async, C.zt_send, self.c, x.c, peer, tag or 0)
end
function Comm:recv(x, peer, tag, async)
  return issue("recv", async, C.zt_recv, self.c, x.c, peer, tag or 0)
end
function Comm:barrier(async) return issue("barrier", async, C.zt_barrier, self.c) end

-- the sub-communicators split and not yet freed, in the order they were made
local groups = {}

-- split(color, key) -> sub-communicator (collective over self).
function Comm:split(color, key)
  local out = ffi.new("zt_comm*[1]")
  stamp_site()
  check(C.zt_comm_split(out, self.c, color, key or self.rank), "comm.split")
  local g = wrap(out[0])
  groups[#groups + 1] = g
  return g
end

-- Free a sub-communicator (collective over its ranks; not the world).
function Comm:free()
  if self == world then error("the world communicator is not freed", 2) end
  if self.c ~= nil then C.zt_comm_free(self.c); self.c = nil end
  for i, g in ipairs(groups) do
    if g == self then table.remove(groups, i); break end
  end
end

-- live() -> { world, the groups split and not freed, ... } (what this rank holds)
function M.live()
  local all = { M.world() }
  for _, g in ipairs(groups) do all[#all + 1] = g end
  return all
end

-- fence(site, async): every rank of the group says it is here and in no
-- collective (zt_comm_fence). With comm.check on, a rank still in another
-- collective fails it, and the others' fence, with the check's message; off,
-- nothing moves. site: what the check's message calls this place ("the end
-- of the chunk (the REPL)"); else the Lua line, as a collective's.
function Comm:fence(site, async)
  if site then C.zt_comm_set_site(site) else stamp_site() end
  local rc = C.zt_comm_fence(self.c, async and reqbuf or nil)
  check(rc, "comm.fence")
  if async then return setmetatable({ r = reqbuf[0], what = "comm.fence" }, Req) end
end

-- gather_doubles({x1, x2, ...}) -> { [rank+1] = {x1, x2, ...} } (same count on all ranks).
function Comm:gather_doubles(values)
  local n = #values
  local inb = ffi.new("double[?]", math.max(n, 1))
  for i = 1, n do inb[i - 1] = values[i] end
  local out = ffi.new("double[?]", math.max(n, 1) * self.size)
  stamp_site()
  check(C.zt_comm_all_gather_host(self.c, out, inb, n * 8), "comm.gather_doubles")
  local res = {}
  for r = 0, self.size - 1 do
    local row = {}
    for i = 1, n do row[i] = out[r * n + i - 1] end
    res[r + 1] = row
  end
  return res
end

-- gather_strings(s) -> { [rank+1] = string } (any lengths).
function Comm:gather_strings(s)
  local lens = self:gather_doubles({ #s })
  local maxlen = 0
  for _, l in ipairs(lens) do maxlen = math.max(maxlen, l[1]) end
  local inb = ffi.new("char[?]", maxlen + 1)
  ffi.copy(inb, s, #s)
  local out = ffi.new("char[?]", (maxlen + 1) * self.size)
  stamp_site()
  check(C.zt_comm_all_gather_host(self.c, out, inb, maxlen + 1), "comm.gather_strings")
  local res = {}
  for r = 0, self.size - 1 do res[r + 1] = ffi.string(out + r * (maxlen + 1), lens[r + 1][1]) end
  return res
end

-- Communication counters (runtime/comm_stats.c; the contract is in
-- runtime/zt_comm.h): this rank's bytes and calls by kind over every
-- communicator, busy and exposed time.
-- stats() -> { sent=, recv=, calls=, busy_ms=, exposed_ms=,
--              by_kind = { all_reduce = { sent=, recv=, calls= }, ... } }
local statbuf = ffi.new("zt_comm_stats")
M.KINDS = {}
for k = 0, C.ZT_COMM_KINDS - 1 do M.KINDS[k + 1] = ffi.string(C.zt_comm_kind_name(k)) end

function M.stats()
  check(C.zt_comm_stats_get(nil, statbuf), "comm.stats")
  local by = {}
  for k, name in ipairs(M.KINDS) do
    local s = statbuf.kind[k - 1]
    by[name] = { sent = tonumber(s.sent), recv = tonumber(s.recv), calls = tonumber(s.calls) }
  end
  return { sent = tonumber(statbuf.sent), recv = tonumber(statbuf.recv),
           calls = tonumber(statbuf.calls), busy_ms = statbuf.busy_s * 1e3,
           exposed_ms = statbuf.exposed_s * 1e3, by_kind = by }
end

-- stats_delta(a, b) -> b - a, field by field (a, b from stats(); a taken first).
function M.stats_delta(a, b)
  local by = {}
  for _, name in ipairs(M.KINDS) do
    local x, y = a.by_kind[name], b.by_kind[name]
    by[name] = { sent = y.sent - x.sent, recv = y.recv - x.recv, calls = y.calls - x.calls }
  end
  return { sent = b.sent - a.sent, recv = b.recv - a.recv, calls = b.calls - a.calls,
           busy_ms = b.busy_ms - a.busy_ms, exposed_ms = b.exposed_ms - a.exposed_ms,
           by_kind = by }
end

-- reset_stats(): zero this rank's counters.
function M.reset_stats() C.zt_comm_stats_reset() end

-- True when the world will be MPI: a launcher started this process, or
-- ZTRAIN_COMM=mpi (the runtime's rule, zt_comm_launched).
function M.launched() return C.zt_comm_launched() == 1 end

function M.abort(code) C.zt_comm_abort(code or 1) end
function M.finalize() check(C.zt_comm_finalize(), "comm.finalize") end

return M
