-- ztrain.parallel.schedule.csv: schedules to and from PyTorch's pipelining CSV.
--
-- The format (torch/distributed/pipelining/schedules.py: _Action.__repr__ /
-- _Action.from_str, PipelineScheduleMulti._dump_csv / _load_csv): one CSV
-- row per rank, in rank order; each cell one action "{stage}{TYPE}{mb}",
-- TYPE one of F, I, W, B (full backward), SEND_F, RECV_F, SEND_B, RECV_B,
-- or "{stage}{TYPE}" with no micro-batch for UNSHARD, RESHARD, REDUCE_GRAD;
-- an empty cell is an idle slot (None) of the time-aligned "compute_only"
-- grid. Python's csv.writer ends rows with CRLF; either ending is read.
--
-- The two IRs differ in three places, and this module bridges them:
--   * REDUCE_GRAD: PyTorch has one per stage, right after its last
--     backward; ztrain's is rank-wide (the strategy's finish_grads). load
--     merges a rank's per-stage ones into one rank-wide REDUCE_GRAD where
--     the last of them stood; dump writes the rank-wide one as one
--     "{s}REDUCE_GRAD" per stage the rank holds, ascending.
--   * STEP is ours (PyTorch steps the optimizer outside the schedule):
--     dump omits the final STEP, load appends it.
--   * UNSHARD / RESHARD are FSDP's prefetch hints: load drops them.
--   * PyTorch's WAIT_* (the comms format's waits on a posted send, and
--     WAIT_REDUCE_GRAD) are the driver's business: dropped.
--   * DualPipeV's "(F;B)OVERLAP_F_B" cell: its sub-actions, in order.
--   * The comms format sends nothing between two stages of one rank (the
--     V's turn); ztrain's driver hands them over by a local SEND/RECV pair,
--     which load adds.
-- Everything load changes is told in info.notes.
local S = require "ztrain.parallel.schedule"
local schedules = require "ztrain.parallel.schedule.library"
local errors = require "ztrain.core.errors"
local csv_dump = require "ztrain.parallel.schedule.csv_dump"
local F = require "ztrain.parallel.schedule.csv_format"

local M = {}

local TYPES, COMM, WAIT, KNOWN, COMPUTE, whole = F.TYPES, F.COMM, F.WAIT, F.KNOWN, F.COMPUTE, F.whole

-- dump(lists, path, opts): lists written as PyTorch's CSV (csv_dump.lua)
M.dump = csv_dump.dump

-- split one CSV line into fields (RFC 4180 quoting; PyTorch never quotes,
-- but a spreadsheet may). nil, err on an unterminated quote.
local function fields(line)
  local out, i, n = {}, 1, #line
  while true do
    if line:sub(i, i) == '"' then
      local buf, j = {}, i + 1
      while true do
        local q = line:find('"', j, true)
        if not q then return nil, "unterminated quote" end
        buf[#buf + 1] = line:sub(j, q - 1)
        if line:sub(q + 1, q + 1) == '"' then buf[#buf + 1] = '"'; j = q + 2 else j = q + 1; break end
      end
      local c = line:find(",", j, true)
      out[#out + 1] = table.concat(buf) .. line:sub(j, (c or n + 1) - 1)
      if not c then return out end
      i = c + 1
    else
      local c = line:find(",", i, true)
      out[#out + 1] = line:sub(i, (c or n + 1) - 1)
      if not c then return out end
      i = c + 1
    end
  end
end

-- SHOWN: the longest cell text an error echoes. A cell is the user's own
-- text, but a file may hold anything: a 2 MB cell or terminal escape
-- bytes must not go to the terminal whole.
local SHOWN = 60

-- shown(text) -> text quoted for an error message: at most SHOWN bytes of
-- it, bytes outside printable ASCII as \xHH, and its length where cut
local function shown(text)
  local head = text:sub(1, SHOWN):gsub('[\\"]', "\\%0"):gsub("[^\32-\126]", function(c)
    return ("\\x%02X"):format(c:byte())
  end)
  if #text <= SHOWN then return '"' .. head .. '"' end
  return ('"%s..." (%d bytes; the first %d shown)'):format(head, #text, SHOWN)
end

-- named(text) -> text as it is where short and plain (a sub-action, a
-- type), else shown(text)
local function named(text)
  if #text <= SHOWN and not text:find('[^\32-\126]') then return text end
  return shown(text)
end

local cell

-- "(0F3;3B1)OVERLAP_F_B" (PyTorch's DualPipeV: a forward of one chunk
-- overlapped with a backward of the other) -> its sub-actions, in order
-- (ztrain's driver runs them back to back), or nil, err
local function overlapped(s)
  local inner, ty = s:match("^%((.-)%)([%u_]+)$")
  if not inner or ty ~= "OVERLAP_F_B" then
    return nil, "expected (F;B)OVERLAP_F_B, e.g. (0F3;3B1)OVERLAP_F_B"
  end
  local out = {}
  for part in (inner .. ";"):gmatch("([^;]*);") do
    local a, err = cell(part)
    if err then return nil, "sub-action " .. named(part) .. ": " .. err end
    if a and not COMPUTE[a.op] then
      return nil, "sub-action " .. named(part) .. " is not a compute action (F, B, I, W)"
    end
    if a then out[#out + 1] = a end
  end
  if #out == 0 then return nil, "OVERLAP_F_B with no sub-action" end
  out.overlap = true
  return out
end

-- one cell -> { op, stage, mb } (or a list of them: OVERLAP_F_B) or nil
-- (empty), or nil, err
cell = function(text)
  local s = text:match("^%s*(.-)%s*$")
  if s == "" then return nil end
  if s:sub(1, 1) == "(" then return overlapped(s) end
  local st, ty, mb = s:match("^(%d+)([%u_]+)(%d*)$")
  if not st then
    return nil, "expected {stage}{TYPE}{micro-batch}, e.g. 0F3, 1SEND_B2, 0REDUCE_GRAD"
  end
  if TYPES[ty] == nil then
    return nil, ("unknown action type %s (known: %s)"):format(named(ty), KNOWN)
  end
  if TYPES[ty] and mb == "" then return nil, ty .. " needs a micro-batch, e.g. 0" .. ty .. "1" end
  if not TYPES[ty] and mb ~= "" then return nil, ty .. " takes no micro-batch, e.g. 0" .. ty end
  return { op = ty, stage = tonumber(st), mb = mb ~= "" and tonumber(mb) or nil }
end

local b_before_w

-- Errors in the helpers of load below point at load's caller, as load's
-- own do (error level 2 there): level 3 from a helper that load calls
-- itself, never in a tail call.
local CALLER = 3

-- the path and the options load takes, checked
local function check_args(path, opts)
  if type(path) ~= "string" or path == "" then error("pipeline csv load: path must be a file name", CALLER) end
  for _, k in ipairs({ "stages", "microbatches" }) do
    if opts[k] ~= nil and (not whole(opts[k]) or opts[k] < 1) then
      error(("pipeline csv load %s: %s must be a whole number >= 1, got %s"):format(path, k, tostring(opts[k])),
            CALLER)
    end
  end
end

-- the file's rows as lines (a BOM, CRLF endings and the final newline gone)
local function read_lines(path)
  local f, err = io.open(path, "rb")
  if not f then error(("pipeline csv load %s: cannot open (%s)"):format(path, tostring(err)), CALLER) end
  -- a directory opens, then fails to read (nil, "Is a directory")
  local text, rerr = f:read("*a")
  f:close()
  if not text then
    error(("pipeline csv load %s: cannot read (%s); give the path of a CSV file"):format(path, tostring(rerr)), CALLER)
  end
  if text:sub(1, 3) == "\239\187\191" then text = text:sub(4) end   -- a UTF-8 BOM
  local lines = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line:gsub("\r$", "") end
  if lines[#lines] == "" then lines[#lines] = nil end   -- the final newline
  if #lines == 0 then error(("pipeline csv load %s: empty file (expected one row per rank)"):format(path), CALLER) end
  return lines
end

-- keep only the last REDUCE_GRAD placeholder (false, at last_rg), as the
-- rank-wide one
local function merge_reduce_grads(row, last_rg)
  local out = {}
  for k, a in ipairs(row) do
    if a then out[#out + 1] = a elseif k == last_rg then out[#out + 1] = { op = "REDUCE_GRAD", col = 0 } end
  end
  return out
end

-- parse_row(path, r, line, seen) -> rank r - 1's actions ({ op, stage, mb,
-- col }, and one rank-wide { op = "REDUCE_GRAD" } where the file has any),
-- UNSHARD/RESHARD dropped. seen gathers what the rows use: placed[stage] =
-- rank, maxs, maxmb, has_comm, and the counts dropped and merged.
local function parse_row(path, r, line, seen)
  local cells, ferr = fields(line)
  if not cells then error(("pipeline csv load %s: row %d (rank %d): %s"):format(path, r, r - 1, ferr), CALLER) end
  local row, last_rg = {}, nil
  local c, txt
  local function add(a)
    local other = seen.placed[a.stage]
    if other and other ~= r - 1 then
      error(("pipeline csv load %s: row %d (rank %d) column %d: cell %s: stage %d is already on rank %d")
            :format(path, r, r - 1, c, shown(txt), a.stage, other), CALLER + 1)
    end
    seen.placed[a.stage] = r - 1
    if a.stage > seen.maxs then seen.maxs = a.stage end
    if a.mb and a.mb > seen.maxmb then seen.maxmb = a.mb end
    if COMM[a.op] then seen.has_comm = true end
    if a.op == "UNSHARD" or a.op == "RESHARD" then
      seen.dropped = seen.dropped + 1
    elseif WAIT[a.op] then          -- (a compute-only dump has WAIT_REDUCE_GRAD too)
      seen.has_comm, seen.waits = seen.has_comm or a.op ~= "WAIT_REDUCE_GRAD", seen.waits + 1
    elseif a.op == "REDUCE_GRAD" then
      seen.merged = seen.merged + 1
      last_rg = #row + 1
      row[#row + 1] = false          -- placeholder: where the last one stood
    else
      row[#row + 1] = { op = a.op, stage = a.stage, mb = a.mb, col = c }
    end
  end
  for k, t in ipairs(cells) do
    c, txt = k, t
    local a, cerr = cell(txt)
    if cerr then
      error(("pipeline csv load %s: row %d (rank %d) column %d: cell %s: %s")
            :format(path, r, r - 1, c, shown(txt), cerr), CALLER)
    end
    if a and a.overlap then
      seen.overlaps = seen.overlaps + 1
      for _, sa in ipairs(a) do add(sa) end
    elseif a then
      add(a)
    end
  end
  return merge_reduce_grads(row, last_rg)
end

-- b_before_w(rows) -> how many B actions became I: PyTorch 2.5 wrote the
-- input-gradient backward as B, so a B whose stage and micro-batch also
-- has a W is an I (a full backward and a W of one micro-batch cannot both be)
b_before_w = function(rows)
  local has_w = {}
  for _, row in ipairs(rows) do
    for _, a in ipairs(row) do
      if a.op == "W" then has_w[a.stage .. ":" .. a.mb] = true end
    end
  end
  local n = 0
  for _, row in ipairs(rows) do
    for _, a in ipairs(row) do
      if a.op == "B" and has_w[a.stage .. ":" .. a.mb] then a.op = "I"; n = n + 1 end
    end
  end
  return n
end

-- extent(path, seen, opts) -> stages, microbatches: the options', or what
-- the file uses; either must cover the file's indices.
local function extent(path, seen, opts)
  local nst = opts.stages or (seen.maxs + 1)
  local m = opts.microbatches or (seen.maxmb + 1)
  if seen.maxs + 1 > nst then
    error(("pipeline csv load %s: the file uses stage %d but stages = %d"):format(path, seen.maxs, nst), CALLER)
  end
  if seen.maxmb + 1 > m then
    error(("pipeline csv load %s: the file uses micro-batch %d but microbatches = %d"):format(path, seen.maxmb, m),
          CALLER)
  end
  if nst < 1 or m < 1 then
    error(("pipeline csv load %s: no actions in the file (expected one row per rank)"):format(path), CALLER)
  end
  return nst, m
end

-- the file's placement of nst stages on R ranks: "loop" (stage s on rank
-- s % R, any number of chunks) or "v" (two chunks, ranks r and 2R - 1 - r:
-- ZB-V, DualPipe-V), or nil, the first stage that fits neither
local function placement_of(seen, nst, R)
  local loop, v = true, nst == 2 * R
  local bad
  for s = 0, nst - 1 do
    local r = seen.placed[s]
    if r then
      if r ~= s % R then loop = false; bad = bad or s end
      if r ~= (s < R and s or 2 * R - 1 - s) then v = false; bad = bad or s end
    end
  end
  if loop then return "loop" end
  if v then return "v" end
  return nil, bad
end

-- A compute-only file: its order per rank, then ztrain's communication
-- (schedules.with_comms), with the file's placement (looped or V) and
-- chunks = stages / ranks.
local function lists_with_comms(path, rows, seen, nst, m)
  local R = #rows
  -- the bounds on a schedule (parallel/schedule/library.lua), said of the
  -- file: its numbers are not p, m or v a user could lower on a command line
  if nst > schedules.MAX_STAGES then
    error(("pipeline csv load %s: the file uses %.0f stages (its highest stage index + 1), more than the bound " ..
           "of %d pipeline stages a schedule may have"):format(path, nst, schedules.MAX_STAGES), CALLER)
  end
  if nst * m > schedules.MAX_PAIRS then
    error(("pipeline csv load %s: the file uses %.0f stages x %.0f micro-batches (its highest indices + 1) = %.0f " ..
           "(stage, micro-batch) pairs, more than the bound of %d a schedule's action lists may hold")
          :format(path, nst, m, nst * m, schedules.MAX_PAIRS), CALLER)
  end
  if nst % R ~= 0 then
    error(("pipeline csv load %s: a compute-only file needs stages = ranks x chunks: %d stages on %d ranks")
          :format(path, nst, R), CALLER)
  end
  local placement, bad = placement_of(seen, nst, R)
  if not placement then
    error(("pipeline csv load %s: compute-only file has stage %d on rank %d, neither looped (stage s on rank " ..
           "s %% %d) nor V (ranks r and %d - r); write the file with its SEND/RECV to use another placement")
          :format(path, bad, seen.placed[bad], R, 2 * R - 1), CALLER)
  end
  -- (the bounds are checked above: what params could still refuse names the file alone)
  local ok, q = pcall(schedules.params, { stages = nst, microbatches = m, ranks = R, chunks = nst / R,
                                          placement = placement }, "pipeline csv load " .. path)
  if not ok then error(errors.message(q), CALLER) end
  local orders = {}
  for r, row in ipairs(rows) do
    local o = {}
    for _, a in ipairs(row) do
      if a.op ~= "REDUCE_GRAD" then o[#o + 1] = { op = a.op, stage = a.stage, mb = a.mb } end
    end
    orders[r] = o
  end
  return schedules.with_comms(orders, q)
end

-- A file with its communication: taken as it is, plus REDUCE_GRAD (where
-- the rank has none) and STEP.
local function lists_as_written(path, rows)
  local lists = {}
  for r, row in ipairs(rows) do
    local l = {}
    local has_rg = false
    for _, a in ipairs(row) do
      if a.op == "REDUCE_GRAD" then
        has_rg = true
        l[#l + 1] = { op = "REDUCE_GRAD" }
      else
        l[#l + 1] = S.action(a.op, a.stage, a.mb)
      end
      -- a rank-wide reduction before this rank's last backward would
      -- reduce gradients that are not complete yet
      if a.op ~= "REDUCE_GRAD" and has_rg and (a.op == "B" or a.op == "W" or a.op == "I") then
        error(("pipeline csv load %s: row %d (rank %d) column %d: %d%s%d comes after this rank's " ..
               "REDUCE_GRAD; ztrain reduces a rank's gradients once, after all its backwards")
              :format(path, r, r - 1, a.col, a.stage, a.op, a.mb), CALLER)
      end
    end
    if not has_rg then l[#l + 1] = { op = "REDUCE_GRAD" } end
    l[#l + 1] = { op = "STEP" }
    lists[r] = l
  end
  return lists
end

-- PyTorch's comms format sends nothing between two stages of one rank (the
-- V's turn, stages p - 1 and p on rank p - 1): ztrain's driver hands them
-- over with a local SEND/RECV pair, put right before the reader (F, or the
-- B or I of the earlier stage). Returns the lists and how many pairs.
local function local_handoffs(lists, placed, nst)
  local n = 0
  for r, l in ipairs(lists) do
    local has = {}
    for _, a in ipairs(l) do if COMM[a.op] then has[a.op .. a.stage .. ":" .. a.mb] = true end end
    local out = {}
    for _, a in ipairs(l) do
      local s, i = a.stage, a.mb
      if a.op == "F" and s > 0 and placed[s - 1] == r - 1 and not has["RECV_F" .. s .. ":" .. i] then
        out[#out + 1] = S.action("SEND_F", s - 1, i); out[#out + 1] = S.action("RECV_F", s, i); n = n + 1
      elseif (a.op == "B" or a.op == "I") and s < nst - 1 and placed[s + 1] == r - 1 and
             not has["RECV_B" .. s .. ":" .. i] then
        out[#out + 1] = S.action("SEND_B", s + 1, i); out[#out + 1] = S.action("RECV_B", s, i); n = n + 1
      end
      out[#out + 1] = a
    end
    lists[r] = out
  end
  return lists, n
end

-- load(path, { stages = S, microbatches = m, validate = true })
--   -> lists, info
-- Reads PyTorch's CSV (one row per rank). stages / microbatches default to
-- what the file uses (highest index + 1). A file with no SEND/RECV cell is
-- compute-only: its order per rank goes through schedules.with_comms (RECV
-- right before the reader, SEND right after the producer), which needs
-- stages = ranks x chunks and stage s on rank s % ranks. A file with comms
-- is taken as it is. Either way per-stage REDUCE_GRADs become one rank-wide
-- REDUCE_GRAD, UNSHARD/RESHARD are dropped, and STEP is appended. With
-- validate (the default) the result must pass schedule.validate.
-- info: { notes = { "..." }, compute_only, stages, microbatches, ranks,
--         stage_rank = fn(s) -> rank (as the file places the stages) }.
-- Raises an error naming the file (and row = rank, column, cell text).
function M.load(path, opts)
  opts = opts or {}
  check_args(path, opts)
  local lines = read_lines(path)
  local seen = { placed = {}, maxs = -1, maxmb = -1, has_comm = false, dropped = 0, merged = 0, waits = 0,
                 overlaps = 0 }
  local rows, notes = {}, {}
  for r, line in ipairs(lines) do rows[r] = parse_row(path, r, line, seen) end
  local converted = b_before_w(rows)
  if converted > 0 then
    notes[#notes + 1] = ("%d B action(s) read as I: a W of the same stage and micro-batch follows them " ..
                         "(PyTorch 2.5's dumps write the input-gradient backward as B)"):format(converted)
  end
  if seen.waits > 0 then
    notes[#notes + 1] = ("dropped %d WAIT_* action(s): ztrain waits for a receive before its reader and for its " ..
                         "sends at the step's end"):format(seen.waits)
  end
  if seen.overlaps > 0 then
    notes[#notes + 1] = ("%d OVERLAP_F_B cell(s) read as their forward then their backward (ztrain's driver runs " ..
                         "the pair back to back)"):format(seen.overlaps)
  end
  if seen.dropped > 0 then
    notes[#notes + 1] = ("dropped %d UNSHARD/RESHARD action(s): FSDP's prefetch hints, not ztrain's")
                        :format(seen.dropped)
  end
  local nst, m = extent(path, seen, opts)
  local lists
  if not seen.has_comm then
    lists = lists_with_comms(path, rows, seen, nst, m)
    notes[#notes + 1] = "compute-only file: SEND/RECV placed by schedules.with_comms, REDUCE_GRAD and STEP appended"
  else
    local handed
    lists, handed = local_handoffs(lists_as_written(path, rows), seen.placed, nst)
    notes[#notes + 1] = "STEP appended to every rank"
    if handed > 0 then
      notes[#notes + 1] = ("%d SEND/RECV pair(s) added between two stages of one rank (PyTorch's comms format " ..
                           "hands those over without them)"):format(handed)
    end
  end
  if seen.merged > 0 then
    notes[#notes + 1] = ("%d per-stage REDUCE_GRAD(s) merged into one rank-wide REDUCE_GRAD per rank")
                        :format(seen.merged)
  end
  local R, placed = #rows, seen.placed
  local info = { notes = notes, compute_only = not seen.has_comm, stages = nst, microbatches = m, ranks = R,
                 stage_rank = function(s) return placed[s] or s % R end }
  if opts.validate ~= false then
    local ok, verr = S.validate(lists, info)
    if not ok then error(("pipeline csv load %s: not a valid schedule: %s"):format(path, verr), 2) end
  end
  return lists, info
end

return M
