-- comm.backend / comm.deterministic: the recipe's checks, and the refusal of
-- NCCL by a build without CUDA (these specs run on the CPU build).
local recipe = require "ztrain.train.recipe"

describe("comm.backend", function()
  it("defaults to mpi with deterministic reductions", function()
    local r = assert(recipe.resolve({}))
    assert.are.equal("mpi", r.comm.backend)
    assert.are.equal(true, r.comm.deterministic)
  end)

  it("knows mpi and nccl only", function()
    local r, err = recipe.resolve({}, { "comm.backend=gloo" })
    assert.is_nil(r)
    assert.are.equal('comm.backend must be "mpi" or "nccl", got "gloo"', err)
  end)

  it("nccl needs the CUDA device", function()
    local r, err = recipe.resolve({}, { "comm.backend=nccl" })
    assert.is_nil(r)
    assert.are.equal('comm.backend = "nccl" needs device.backend = "cuda" (NCCL moves GPU memory), got "cpu"', err)
  end)

  it("deterministic is a boolean", function()
    local r, err = recipe.resolve({}, { "comm.deterministic=yes" })
    assert.is_nil(r)
    assert.are.equal('recipe key "comm.deterministic" must be a boolean, got string (yes)', err)
  end)

  it("a build without CUDA refuses NCCL with what to do: the runtime names its call, the trainer the key", function()
    local world = require("ztrain.core.comm").world()
    -- as the trainer calls it for comm.backend=nccl
    local ok, err = pcall(world.use_nccl, world, true, "comm.backend=nccl")
    assert.is_false(ok)
    assert.are.equal("comm.backend=nccl: built without CUDA (NCCL); rebuild with make CUDA=1, " ..
                     "or keep the MPI transport [EINVAL]", err)
    assert.are.equal("local", world.backend)
    -- without a key: the runtime's message, in C terms, with no recipe key
    ok, err = pcall(world.use_nccl, world, true)
    assert.is_false(ok)
    assert.are.equal("zt_comm_use_nccl: built without CUDA (NCCL); rebuild with make CUDA=1, " ..
                     "or keep the MPI transport [EINVAL]", err)
    assert.is_nil(err:find("comm.backend", 1, true), err)
    assert.are.equal("local", world.backend)
  end)
end)
