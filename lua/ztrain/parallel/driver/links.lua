-- ztrain.parallel.driver.links: a communicator for each direction of each
-- pipeline boundary that joins two ranks, which the schedule driver's
-- sends and receives go over (driver/schedule.lua).
--
-- Why not the pipeline group itself: NCCL has no tags. On one communicator
-- the n-th send from a rank to a peer is the peer's n-th receive from it,
-- and each rank's transfers run in issue order on the communicator's one
-- stream (runtime/comm_nccl.c). Over the pipeline group a V placement's
-- two chunks cross between the same two ranks interleaved differently on
-- each side (ZB-V: messages of the same size paired wrongly, no error),
-- and 1F1B's steady state has each rank of a pair sending to the other
-- before either receives (a send waits for its receive: both wait).
-- A link carries one boundary's messages in one direction: one sender
-- issuing them in its list's order, one receiver posting in its list's
-- order (parallel/schedule/nccl_order.lua refuses lists where these
-- differ), each link on a stream of its own -- what MPI's tags give, so the
-- simulator's model (parallel/schedule/simulate.lua) holds for both
-- transports. MPI runs the same links (the tags stay, harmless).
local M = {}

-- key(b, backward) -> the link of boundary b (stage b to b + 1) forward,
-- or (backward) its gradients from b + 1 to b
function M.key(b, backward) return b * 2 + (backward and 1 or 0) end

-- build(pp, stage_rank, nstages) -> links: links[key] = { comm, peer (the
-- other rank's number in comm), send (this rank sends on it) } on the two
-- ranks a link joins, nothing elsewhere; links.all: the links in the order
-- made (the same on every rank). Collective over pp: every rank calls it
-- with the same stage_rank and nstages. A failure part-way frees what was
-- made before it raises.
function M.build(pp, stage_rank, nstages)
  local links = { all = {} }
  local ok, err = pcall(function()
    for b = 0, nstages - 2 do
      local x, y = stage_rank(b), stage_rank(b + 1)
      if x ~= y then
        for _, backward in ipairs({ false, true }) do
          local member = pp.rank == x or pp.rank == y
          -- the two members, numbered by pipeline rank; the others' group is freed
          local c = pp:split(member and 1 or 0, pp.rank)
          if member then
            local other = pp.rank == x and y or x
            local l = { comm = c, peer = other < pp.rank and 0 or 1, send = pp.rank == (backward and y or x) }
            links[M.key(b, backward)] = l
            links.all[#links.all + 1] = l
          else
            c:free()
          end
        end
      end
    end
  end)
  if not ok then M.free(links); error(err, 0) end
  return links
end

-- connect(links, buf): one message of buf (a device-tier tensor, its first
-- element) over every link, sender to receiver, waited for, in the order
-- the links were made. NCCL connects two ranks the first time they
-- exchange, blocking the communication thread (runtime/comm.c: one a
-- process) until the peer does too: first uses in crossing orders (a
-- link's first receive on one rank, another's first send on the other, or
-- the tied embedding's communicator) would hang the first step. Made here
-- in one order on every rank, none is first during a step. MPI: a few
-- microseconds a link.
function M.connect(links, buf)
  local one = buf:view(0, { 1 })
  local ok, err = pcall(function()
    for _, l in ipairs(links.all) do
      if l.send then l.comm:send(one, l.peer, 0) else l.comm:recv(one, l.peer, 0) end
    end
  end)
  one:free()
  if not ok then error(err, 0) end
end

-- free(links): every link's communicator (the engine frees them in its own
-- time, runtime/comm.c; under NCCL a local destroy, one GPU a process).
function M.free(links)
  if not links then return end
  for _, l in ipairs(links.all) do l.comm:free() end
  links.all = {}
end

return M
