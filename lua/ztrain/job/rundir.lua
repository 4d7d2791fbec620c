-- ztrain.job.rundir: a run's output directory. Unique by default (even for runs
-- started in the same second), never an earlier run's unless the user says
-- so, and never two runs' at once.
--
--   local out, lock = rundir.claim(recipe, world)   -- a collective
--   ... train, write outputs into out ...
--   lock:release()
--
-- Rank 0 decides: with out = "" it creates runs/<name>-<date>-<time>[-k]
-- (mkdir is atomic: two runs never get one directory); with out = DIR it
-- creates DIR if needed and refuses one that holds an earlier run
-- (summary.json or metrics.jsonl) unless `overwrite = true` (--overwrite) or
-- the run resumes (resume = ...: a continuation writes where it left off).
-- Either way it holds an flock on DIR/.lock until release(), so a second run
-- on DIR is refused with the holder's pid; the kernel drops the lock when a
-- process dies, so a killed run never leaves DIR locked. Every rank learns
-- the same path, or raises the same error (errors.all_ranks).
--
-- The run's checkpoint directory (train.ckpt_dir, or DIR/checkpoints) is
-- claimed the same way, before anything is written: made (when the run
-- writes checkpoints) and locked with ROOT/.ckpt.lock (holder's pid and
-- out=), so two runs never share one; with --overwrite (and no resume=)
-- the replaced run's files, its checkpoints there and in DIR/checkpoints
-- among them, move aside (DIR/.replaced, ROOT/.replaced) and are removed
-- when the new run ends (or stops with its checkpoint), put back when it
-- fails: a later resume=latest never continues the run that was replaced,
-- and a failed --overwrite loses nothing.
local ffi = require "ffi"
local libc = require "ztrain.core.libc"
local errors = require "ztrain.core.errors"
local fs = require "ztrain.util.fs"
local registry = require "ztrain.job.registry"

local M = {}

local LOCK_EX, LOCK_NB, LOCK_UN = 2, 4, 8
local EEXIST, EWOULDBLOCK = 17, 11

local function strip(p) return (p:gsub("(.)/+$", "%1")) end
local function reason() return ffi.string(libc.strerror(ffi.errno())) end

local Lock = {}
Lock.__index = Lock

-- release(): unlock; remove the directory when this run created it and
-- left nothing in it (a run that failed before writing anything)
function Lock:release()
  if self.ckpt then self.ckpt:release(); self.ckpt = nil end
  if not self.fd then return end
  libc.unlink(self.path)
  libc.flock(self.fd, LOCK_UN)
  libc.close(self.fd)
  self.fd = nil
  if self.created then libc.rmdir(self.dir) end     -- fails (fine) unless empty
end

-- lock(dir, created[, what, file, holder]) -> Lock, or raises naming the run
-- that holds dir. what: the key the refusal names (out=); file: the lock's
-- name in dir (.lock); holder: a second line written after the pid.
local function lock(dir, created, what, file, holder)
  what = what or "out"
  local path = dir .. "/" .. (file or ".lock")
  local fd = libc.open(path, libc.O_RDWR + libc.O_CREAT + libc.O_CLOEXEC, ffi.cast("int", 420))
  if fd < 0 then error(("cannot create %s %s: %s"):format(what == "out" and "output directory" or what, dir,
                       reason()), 0) end
  if libc.flock(fd, LOCK_EX + LOCK_NB) ~= 0 then
    local e = ffi.errno()
    local buf = ffi.new("char[512]")
    local n = tonumber(libc.pread(fd, buf, 511, 0))
    libc.close(fd)
    if e == EWOULDBLOCK then
      local text = n > 0 and ffi.string(buf, n) or ""
      local pid, by = text:match("%d+") or "?", text:match("\n([^\n]+)")
      error(("%s=%s is in use by another run (pid %s%s); wait for it to end, or choose another %s="):format(
            what, dir, pid, by and ", " .. by or "", what), 0)
    end
    error(("cannot lock %s %s: %s"):format(what == "out" and "output directory" or what, dir,
          ffi.string(libc.strerror(e))), 0)
  end
  local text = tostring(libc.getpid()) .. "\n" .. (holder and holder .. "\n" or "")
  libc.ftruncate(fd, 0)
  libc.pwrite(fd, text, #text, 0)
  return setmetatable({ fd = fd, path = path, dir = dir, created = created }, Lock)
end

-- a new directory runs/<name>-<date>-<time>, -2, -3, ... if taken
local function fresh(r)
  local ok, err = fs.mkdirs("runs", "output directory")
  if not ok then error(err, 0) end
  local base = ("runs/%s-%s"):format(r.name ~= "" and r.name or "run", os.date("%Y%m%d-%H%M%S"))
  for k = 1, 1000 do
    local dir = k == 1 and base or ("%s-%d"):format(base, k)
    if libc.mkdir(dir, 493) == 0 then return dir end
    if ffi.errno() ~= EEXIST then error(("cannot create output directory %s: %s"):format(dir, reason()), 0) end
  end
  error(("cannot create an output directory under runs/: %s-* are all taken"):format(base), 0)
end

local entries = fs.entries

-- remove_tree(p): p and, for a directory, what it holds. unlink first: a
-- symlink (to a directory too) is removed as a link, never followed
local function remove_tree(p)
  if libc.unlink(p) == 0 then return end
  for _, e in ipairs(entries(p)) do remove_tree(e) end
  libc.rmdir(p)
end

-- An --overwrite replaces an earlier run only when it succeeds: at the claim
-- what a run writes in out= (OUT_NAMES) moves into OUT/.replaced, and what
-- checkpoint.save writes in an outside train.ckpt_dir (CKPT_NAMES) into
-- ROOT/.replaced-ckpt; nothing else there is touched. Lock:commit (the run
-- ended, or was stopped with its checkpoint written) removes them,
-- Lock:rollback (it failed) puts them back in place of the new run's.
local OUT_NAMES = { ["summary.json"] = true, ["metrics.jsonl"] = true, ["metrics.csv"] = true,
                    ["tensorboard"] = true, ["timeline.svg"] = true, ["timeline.json"] = true,
                    ["checkpoints"] = true, ["mpirun.log"] = true }
local function out_name(n) return OUT_NAMES[n] end
local function ckpt_name(n)
  return n == "latest" or n == ".latest.tmp" or n:match("^step%-%d+$") ~= nil or n:match("^%.step%-%d+%.tmp$") ~= nil
end

-- restore(dir, st): the staged entries back into dir, the stage removed
local function restore(dir, st)
  for _, e in ipairs(entries(st)) do os.rename(e, dir .. "/" .. e:match("[^/]+$")) end
  libc.rmdir(st)
end

-- stage(dir, st_name, wanted) -> the stage directory, holding dir's
-- entries whose names wanted() takes; a failure puts back what moved
local function stage(dir, st_name, wanted)
  local st = dir .. "/" .. st_name
  if fs.exists(st) then
    -- a replacing run killed outright (kill -9, a rank lost) left it
    io.stderr:write(("ztrain: dropping %s, left by an --overwrite that was killed: the run it was to replace " ..
                     "is gone; replacing what %s holds now\n"):format(st, dir))
    remove_tree(st)
  end
  if libc.mkdir(st, 493) ~= 0 then error(("cannot replace the run in %s: %s"):format(dir, reason()), 0) end
  for _, e in ipairs(entries(dir)) do
    local name = e:match("[^/]+$")
    if wanted(name) then
      local ok, err = os.rename(e, st .. "/" .. name)
      if not ok then
        restore(dir, st)
        error(("cannot replace the run in %s (%s); its files are as they were"):format(dir, err), 0)
      end
    end
  end
  return st
end

-- unstage(dir, st, wanted): the new run's files of those names out of dir,
-- the staged ones back
local function unstage(dir, st, wanted)
  for _, e in ipairs(entries(dir)) do
    if wanted(e:match("[^/]+$")) then remove_tree(e) end
  end
  restore(dir, st)
end

-- commit(): the new run stands; the staged earlier run is removed
function Lock:commit()
  if self.ckpt then self.ckpt:commit() end
  if self.staged then remove_tree(self.staged); self.staged = nil end
end

-- rollback(): the new run failed; the earlier run's files are back as they
-- were (the launcher then keeps Open MPI's text out of them: registry)
function Lock:rollback()
  if self.ckpt then self.ckpt:rollback() end
  if self.staged then
    unstage(self.dir, self.staged, self.wanted)
    self.staged = nil
    if self.wanted == out_name then
      registry.note("out-restored " .. self.dir)
      io.stderr:write(("ztrain: %s holds the run it was to replace again, as it was (--overwrite replaces a " ..
                       "run only when the new one ends)\n"):format(self.dir))
    end
  end
end

local function claim_out(r)
  if r.out == "" then
    local dir = fresh(r)
    return dir, lock(dir, true)
  end
  local dir = strip(r.out)
  local created = not fs.exists(dir)
  local ok, err = fs.mkdirs(dir, "output directory")
  if not ok then error(err .. "; choose another out=", 0) end
  local lk = lock(dir, created)
  if r.overwrite and r.resume == "" and not created then
    local okst, st = pcall(stage, dir, ".replaced", out_name)
    if not okst then lk:release(); error(st, 0) end
    lk.staged, lk.wanted = st, out_name
  end
  if not r.overwrite and r.resume == "" then
    for _, f in ipairs({ "summary.json", "metrics.jsonl" }) do
      if fs.exists(dir .. "/" .. f) then
        lk:release()
        error(("out=%s holds an earlier run (%s); choose another out=, continue it with resume=latest, " ..
               "or replace it with --overwrite"):format(dir, f), 0)
      end
    end
  end
  return dir, lk
end

-- earlier_checkpoints(root) -> a short description of the checkpoints a
-- run left in root ("latest -> step-00000006", "step-00000002"), or nil;
-- a failed write's .step-*.tmp is not one (checkpoint.save removes those)
local function earlier_checkpoints(root)
  local steps = {}
  for _, e in ipairs(entries(root)) do
    local name = e:match("[^/]+$")
    if name:match("^step%-%d+$") then steps[#steps + 1] = name end
  end
  local f = io.open(root .. "/latest", "rb")
  if f then
    local target = (f:read("*l") or ""):match("^%s*(.-)%s*$")
    f:close()
    return "latest -> " .. target
  end
  table.sort(steps)
  return steps[#steps]
end

-- claim_ckpt(r, out) -> the checkpoint root's Lock, or nil when the run
-- neither writes checkpoints nor finds the root already there
local function claim_ckpt(r, out)
  local t = r.train or {}
  local root = (t.ckpt_dir or "") ~= "" and strip(t.ckpt_dir) or out .. "/checkpoints"
  local created = not fs.exists(root)
  if (t.ckpt_every or 0) > 0 then
    local ok, err = fs.mkdirs(root, "output directory")
    if not ok then error("train.ckpt_dir: " .. tostring(err) .. "; choose another train.ckpt_dir", 0) end
  elseif created then
    return nil
  end
  local lk = lock(root, created, "train.ckpt_dir", ".ckpt.lock", "out=" .. out)
  if not created and not r.overwrite and (r.resume or "") == "" then
    -- an earlier run's checkpoints: this run's would join them (a graceful
    -- stop writes one even with train.ckpt_every = 0), its pruning remove
    -- them, and `latest` then point at a mix of the two runs
    local held = earlier_checkpoints(root)
    if held then
      lk:release()
      error(("train.ckpt_dir=%s holds an earlier run's checkpoints (%s); choose another train.ckpt_dir, " ..
             "continue that run with resume=latest, or replace them with --overwrite"):format(root, held), 0)
    end
  end
  if r.overwrite and (r.resume or "") == "" then
    -- out=/checkpoints moved with out='s files (claim_out); an outside
    -- root's checkpoints are staged in it
    if root ~= out .. "/checkpoints" and not created then
      local okst, st = pcall(stage, root, ".replaced-ckpt", ckpt_name)
      if not okst then lk:release(); error(st, 0) end
      lk.staged, lk.wanted = st, ckpt_name
    end
    lk.created = true          -- release removes the root if this run leaves it empty
  end
  return lk
end

-- out=, then its checkpoint directory; neither held when either is refused
local function claim_here(r)
  local dir, lk = claim_out(r)
  local ok, ck = pcall(claim_ckpt, r, dir)
  if not ok then
    if lk.staged then restore(dir, lk.staged); lk.staged = nil end   -- the earlier run as it was
    lk:release()
    error(ck, 0)
  end
  lk.ckpt = ck
  return dir, lk
end

function M.claim(r, world)
  local out, err, lk = "", "", nil
  if world.rank == 0 then
    local ok, dir, l = pcall(claim_here, r)
    if ok then
      out, lk = dir, l
      registry.note("out " .. dir)   -- the launcher puts Open MPI's messages there (launch.lua)
    else
      err = errors.message(dir)
    end
  end
  err = errors.agree(world, err)
  if err ~= "" then error(errors.all_ranks(err), 0) end
  if world.size > 1 then out = world:gather_strings(out)[1] end
  -- ranks other than 0 hold no lock: an object whose release does nothing
  return out, lk or setmetatable({}, Lock)
end

return M
