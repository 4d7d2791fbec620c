-- ztrain.parallel.schedule.csv_order: the receives of a schedule written for
-- PyTorch, in the order their sender sends.
--
-- PyTorch's pipelining runtime (torch 2.5.1, 2.15) posts its SEND/RECV as
-- untagged point-to-point operations: between two ranks, the k-th receive
-- one posts takes the k-th message the other sent, whatever the cell says.
-- ztrain's driver matches a message by its stage and micro-batch, and
-- schedules.with_comms places a RECV right before its reader, which need
-- not be the order the sender sends in (interleaved zero-bubble on 2 ranks:
-- rank 0 reads 0RECV_B0 before 2RECV_F2, rank 1 sends 1SEND_F2 first).
-- PyTorch then runs such a file without complaint and with the wrong
-- gradients (both versions, checked with gloo). PyTorch's own lowering
-- (_add_send_recv) posts each receive when its send is issued; here each
-- rank's receives from one peer are put in that peer's send order, each at
-- its own place or earlier (a posted receive does not block).
local M = {}

local function remote_recv(a, own, r)
  if type(a) ~= "table" or type(a.stage) ~= "number" then return nil end
  if a.op == "RECV_F" then return own[a.stage - 1] ~= r and own[a.stage - 1] or nil, "F" .. a.stage .. ":" .. a.mb end
  if a.op == "RECV_B" then return own[a.stage + 1] ~= r and own[a.stage + 1] or nil, "B" .. a.stage .. ":" .. a.mb end
end

-- fifo(lists, own) -> lists with each rank's remote receives in their
-- sender's order (own[stage] = the rank that computes it, 0-based); the
-- lists given are not changed
function M.fifo(lists, own)
  local sent = {}               -- sent[q][r] = message keys rank q sends rank r, in order
  for q, l in ipairs(lists) do
    sent[q - 1] = {}
    for _, a in ipairs(type(l) == "table" and l or {}) do
      local to, key
      if type(a) ~= "table" or type(a.stage) ~= "number" then a = {} end
      if a.op == "SEND_F" then to, key = own[a.stage + 1], "F" .. (a.stage + 1) .. ":" .. a.mb end
      if a.op == "SEND_B" then to, key = own[a.stage - 1], "B" .. (a.stage - 1) .. ":" .. a.mb end
      if to and to ~= q - 1 then
        sent[q - 1][to] = sent[q - 1][to] or {}
        table.insert(sent[q - 1][to], key)
      end
    end
  end
  local out = {}
  for r, l in ipairs(lists) do
    if type(l) ~= "table" then out[r] = l; goto next_rank end
    local recv, o, done, next_of = {}, {}, {}, {}
    for _, a in ipairs(l) do
      local from, key = remote_recv(a, own, r - 1)
      if from then recv[key] = a end
    end
    for _, a in ipairs(l) do
      local from, key = remote_recv(a, own, r - 1)
      local order = from and (sent[from] or {})[r - 1]
      if not order or not recv[key] then
        o[#o + 1] = a
      elseif not done[key] then
        -- this receive's place: post every earlier one from that peer first
        local k = next_of[from] or 1
        while not done[key] and order[k] do
          local kk = order[k]
          if recv[kk] and not done[kk] then o[#o + 1] = recv[kk]; done[kk] = true end
          k = k + 1
        end
        next_of[from] = k
        if not done[key] then o[#o + 1] = a; done[key] = true end
      end
    end
    out[r] = o
    ::next_rank::
  end
  return out
end

return M
