-- ztrain.core.stream: streams and events over the runtime's (contracts in runtime/zt_stream.h).
--
--   local stream = require "ztrain.core.stream"
--   local cs = stream.new("copy")               -- "compute" | "copy" | "comm"
--   stream.copy_async(host_t, dev_t, cs)        -- or cs:copy_async(host_t, dev_t)
--   local ev = cs:record()                      -- an event at this point of cs
--   ev:sync()                                   -- host waits; or stream.default():wait(ev)
--   cs:wait(req)                                -- later work on cs waits for a comm request
--   cs:sync(); ev:free(); cs:free()
--
-- On the CPU backend the compute stream is the calling thread (its work is
-- done on return) and a copy or comm stream is a worker thread that runs its
-- queue in order: touching a tensor before the event after its copy has
-- completed is a real race, as on a GPU. Write strategies as if everything
-- were asynchronous.
--
-- :free() releases a stream or event at once and clears its handle (a later
-- use is a clear error); ffi.gc is the backstop. Freeing a stream waits for
-- its queued work.
local ffi = require "ffi"
local zffi = require "ztrain.core.ffi"
local C, check = zffi.C, zffi.check

local M = {}
local Stream, Event = {}, {}
Stream.__index, Event.__index = Stream, Event
M.Stream, M.Event = Stream, Event

local KIND = { compute = C.ZT_STREAM_COMPUTE, copy = C.ZT_STREAM_COPY, comm = C.ZT_STREAM_COMM }
local KNAME = {}
for k, v in pairs(KIND) do KNAME[tonumber(v)] = k end
M.KIND = KIND

local sbuf = ffi.new("zt_stream*[1]")
local ebuf = ffi.new("zt_event*[1]")
local ibuf = ffi.new("int[1]")

-- Lua objects by handle address, so current() returns the object new() made.
local objects = setmetatable({}, { __mode = "v" })
local function key(c) return tostring(tonumber(ffi.cast("uintptr_t", c))) end

local default = setmetatable({ c = C.zt_stream_default(), kind = "compute", is_default = true }, Stream)
objects[key(default.c)] = default

local function live(s, what)
  if getmetatable(s) ~= Stream then
    error(("%s: expected a stream (from stream.new or stream.default), got %s"):format(what, tostring(s)), 3)
  end
  if s.c == nil then error(what .. ": use of a freed stream", 3) end
  return s.c
end

local function live_event(e, what)
  if e.c == nil then error(what .. ": use of a freed event", 3) end
  return e.c
end

local function tensor_c(t, what, name)
  if type(t) ~= "table" or t.c == nil then
    error(("%s: %s is not a live tensor (freed, or not a zt.tensor)"):format(what, name), 3)
  end
  return t.c
end

-- new(kind) -> a new stream ("compute", "copy" or "comm").
function M.new(kind)
  local k = KIND[kind or "compute"]
  if k == nil then
    error(("stream.new: unknown kind %q (known: comm, compute, copy)"):format(tostring(kind)), 2)
  end
  check(C.zt_stream_new(sbuf, k), "stream.new")
  local c = sbuf[0]
  ffi.gc(c, C.zt_stream_free)
  local s = setmetatable({ c = c, kind = kind or "compute" }, Stream)
  objects[key(c)] = s
  return s
end

-- default() -> the default compute stream (never freed).
function M.default() return default end

-- current() -> this thread's current stream; set_current(s) (nil: the default).
function M.current()
  local c = C.zt_stream_current()
  return objects[key(c)] or setmetatable({ c = c, kind = "?" }, Stream)
end
function M.set_current(s)
  check(C.zt_stream_set_current(s and live(s, "stream.set_current") or nil), "stream.set_current")
end

-- event() -> a new event, not recorded (it counts as done).
function M.event()
  check(C.zt_event_new(ebuf), "stream.event")
  local c = ebuf[0]
  ffi.gc(c, C.zt_event_free)
  return setmetatable({ c = c }, Event)
end

-- copy_async(dst, src, s): dst = src on stream s (nil: the current stream);
-- same dtype and numel; device <-> host, within one of them, or nvme <->
-- host (ztrain.aio: the copy stream's worker moves the blocks through the
-- nvme engine, and an I/O error becomes the stream's error). Touch neither
-- tensor until an event recorded on s afterwards has completed (or s:sync()).
function M.copy_async(dst, src, s)
  local sc = s and live(s, "stream.copy_async") or nil
  check(C.zt_copy_async(tensor_c(dst, "stream.copy_async", "dst"),
                        tensor_c(src, "stream.copy_async", "src"), sc), "stream.copy_async")
end
function Stream:copy_async(dst, src) return M.copy_async(dst, src, self) end

-- s:sync(): the host waits for all work issued to s so far (and gets its error).
function Stream:sync() check(C.zt_stream_sync(live(self, "stream:sync")), "stream:sync") end

-- s:record([event]) -> the event (a new one unless given), completing when s
-- reaches this point.
function Stream:record(ev)
  local c = live(self, "stream:record")
  ev = ev or M.event()
  check(C.zt_event_record(live_event(ev, "stream:record"), c), "stream:record")
  return ev
end

-- s:wait(event_or_request): later work on s waits for an event, or for a
-- communication request (a ztrain.comm request, field r). Waiting on a
-- request does not consume it: call req:wait() once afterwards, and only
-- after s has passed this point (s:sync(), or an event recorded after it).
function Stream:wait(x)
  local c = live(self, "stream:wait")
  if getmetatable(x) == Event then
    check(C.zt_stream_wait_event(c, live_event(x, "stream:wait")), "stream:wait")
  elseif type(x) == "table" and x.what ~= nil and rawget(x, "r") == nil then
    error("stream:wait: the comm request (" .. tostring(x.what) .. ") was already waited on", 2)
  elseif type(x) == "table" and type(x.r) == "cdata" then
    check(C.zt_stream_wait_comm(c, x.r), "stream:wait")
  else
    error("stream:wait: expected an event (stream:record()) or a comm request, got " .. tostring(x), 2)
  end
end

function Stream:free()
  local c = self.c
  if c ~= nil and not self.is_default then
    self.c = nil
    objects[key(c)] = nil
    ffi.gc(c, nil)
    C.zt_stream_free(c)
  end
end

function Stream:__tostring()
  if self.c == nil then return "Stream(freed)" end
  return ("Stream(%s%s)"):format(self.kind, self.is_default and ", default" or "")
end

-- ev:sync(): the host waits for the event (and gets its stream's error).
function Event:sync() check(C.zt_event_sync(live_event(self, "event:sync")), "event:sync") end

-- ev:done() -> true once the event's latest record has completed (never blocks).
function Event:done()
  check(C.zt_event_query(live_event(self, "event:done"), ibuf), "event:done")
  return ibuf[0] ~= 0
end

function Event:free()
  local c = self.c
  if c ~= nil then
    self.c = nil
    ffi.gc(c, nil)
    C.zt_event_free(c)
  end
end

function Event:__tostring() return self.c == nil and "Event(freed)" or "Event" end

function M.is_stream(x) return getmetatable(x) == Stream end
function M.is_event(x) return getmetatable(x) == Event end

return M
