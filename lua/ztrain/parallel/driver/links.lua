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
-- other rank's number in comm) } on the two ranks a link joins, nothing
-- elsewhere; links.all: the communicators to free. Collective over pp:
-- every rank calls it with the same stage_rank and nstages.
function M.build(pp, stage_rank, nstages)
  local links = { all = {} }
  for b = 0, nstages - 2 do
    local x, y = stage_rank(b), stage_rank(b + 1)
    if x ~= y then
      for _, backward in ipairs({ false, true }) do
        local member = pp.rank == x or pp.rank == y
        -- the two members, numbered by pipeline rank; the others' group is freed
        local c = pp:split(member and 1 or 0, pp.rank)
        if member then
          local other = pp.rank == x and y or x
          links[M.key(b, backward)] = { comm = c, peer = other < pp.rank and 0 or 1 }
          links.all[#links.all + 1] = c
        else
          c:free()
        end
      end
    end
  end
  return links
end

-- free(links): every link's communicator (collective over its two ranks;
-- every rank frees its links in the order they were made).
function M.free(links)
  if not links then return end
  for _, c in ipairs(links.all) do c:free() end
  links.all = {}
end

return M
