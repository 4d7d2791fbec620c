-- ztrain.parallel.schedule.csv_dump: action lists written as PyTorch's
-- pipelining CSV (the format and how ztrain's IR maps onto it: csv.lua's
-- header; csv.dump is this module's dump).
local durable = require "ztrain.util.durable"
local errors = require "ztrain.core.errors"
local recv_order = require "ztrain.parallel.schedule.csv_order"
local F = require "ztrain.parallel.schedule.csv_format"

local TYPES, COMM, COMPUTE, whole = F.TYPES, F.COMM, F.COMPUTE, F.whole

local M = {}

-- the rank each stage's compute runs on, over every list
local function owners(lists)
  local own = {}
  for r, list in ipairs(lists) do
    if type(list) == "table" then
      for _, a in ipairs(list) do
        if type(a) == "table" and COMPUTE[a.op] and whole(a.stage) then own[a.stage] = own[a.stage] or r - 1 end
      end
    end
  end
  return own
end

-- one rank's cells (see dump); err(k, what) raises for its action k
local function row_cells(list, rank, own, format, err)
  local waits, old = format == "compute_comms", format == "2.5"
  local held, hs = {}, {}       -- stages this rank holds, for the rank-wide REDUCE_GRAD
  for _, a in ipairs(list) do
    if type(a) == "table" and whole(a.stage) and not held[a.stage] then held[a.stage] = true; hs[#hs + 1] = a.stage end
  end
  table.sort(hs)
  local cells, sent = {}, {}
  local function reduce(s)
    if old then return end        -- torch 2.5 has no REDUCE_GRAD (its regex refuses the cell)
    cells[#cells + 1] = s .. "REDUCE_GRAD"
    if waits then cells[#cells + 1] = s .. "WAIT_REDUCE_GRAD" end
  end
  for k, a in ipairs(list) do
    local op = type(a) == "table" and a.op or nil
    if op == "STEP" then
      if k ~= #list then err(k, "STEP must be the last action") end
    elseif op == "REDUCE_GRAD" and a.stage == nil then
      if #hs == 0 then err(nil, "REDUCE_GRAD on a rank that runs no stage") end
      for _, s in ipairs(hs) do reduce(s) end
    elseif op == "REDUCE_GRAD" and whole(a.stage) then
      reduce(a.stage)
    elseif op and TYPES[op] and whole(a.stage) and whole(a.mb) then
      local peer = (op == "SEND_F" or op == "RECV_B") and a.stage + 1 or a.stage - 1
      -- torch 2.15 hands two stages of one rank over without a SEND/RECV
      if not (waits and COMM[op] and own[peer] == rank) then
        cells[#cells + 1] = ("%d%s%d"):format(a.stage, old and op == "I" and "B" or op, a.mb)
        if waits and (op == "SEND_F" or op == "SEND_B") then sent[#sent + 1] = ("%dWAIT_%s%d"):format(a.stage, op, a.mb) end
      end
    else
      err(k, ("not an action PyTorch's format can hold (%s)"):format(type(a) == "table" and
          ("{op=%s, stage=%s, mb=%s}"):format(tostring(a.op), tostring(a.stage), tostring(a.mb)) or tostring(a)))
    end
  end
  for _, w in ipairs(sent) do cells[#cells + 1] = w end     -- each send's wait, once it is surely received
  return cells
end

-- dump(lists, path, { format = "compute_comms" | "2.5" }): writes lists (one
-- action list per rank) as PyTorch's CSV, atomically (path .. ".tmp" then
-- rename). "compute_comms" (the default) is what torch 2.15's
-- _load_csv(format="compute_comms") reads: each REDUCE_GRAD followed by its
-- WAIT_REDUCE_GRAD, a WAIT_SEND_F/B for every send (at the row's end), no
-- SEND/RECV between two stages of one rank. "2.5" writes what torch
-- 2.5.1's _PipelineScheduleRuntime._load_csv(format="compute_comms") reads:
-- no waits, no REDUCE_GRAD (2.5 has none), the input-gradient backward I
-- as B (load reads it back as I: its W follows); 2.5's B is full or
-- input-only for the whole schedule, so one with both B and I is refused.
-- Raises an error naming the file, or the rank and action that cannot be
-- written.
function M.dump(lists, path, opts)
  if type(path) ~= "string" or path == "" then error("pipeline csv dump: path must be a file name", 2) end
  if type(lists) ~= "table" or #lists < 1 then
    error(("pipeline csv dump %s: expected one action list per rank"):format(path), 2)
  end
  local format = opts and opts.format or "compute_comms"
  if format ~= "compute_comms" and format ~= "2.5" then
    error(('pipeline csv dump %s: format must be "compute_comms" (torch 2.15) or "2.5", got %s')
          :format(path, tostring(format)), 2)
  end
  local own, rows, ops = owners(lists), {}, {}
  lists = recv_order.fifo(lists, own)      -- PyTorch matches untagged messages in send order
  for _, list in ipairs(lists) do
    for _, a in ipairs(type(list) == "table" and list or {}) do ops[type(a) == "table" and a.op or ""] = true end
  end
  if format == "2.5" and ops.B and ops.I then
    error(("pipeline csv dump %s: torch 2.5 writes B for a full backward or, where a W follows, for I, one " ..
           "meaning per schedule: a schedule with both B and I cannot be written so"):format(path), 2)
  end
  for r, list in ipairs(lists) do
    if type(list) ~= "table" then
      error(("pipeline csv dump %s: rank %d's list is not a table"):format(path, r - 1), 2)
    end
    local cells = row_cells(list, r - 1, own, format, function(k, what)
      error(("pipeline csv dump %s: rank %d%s: %s"):format(path, r - 1, k and (" action " .. k) or "", what), 3)
    end)
    rows[#rows + 1] = table.concat(cells, ",") .. "\r\n"
  end
  local ok, err = durable.write_atomic(path, table.concat(rows))
  if not ok then error(errors.io("pipeline csv dump: " .. err), 0) end
end

return M
