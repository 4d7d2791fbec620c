-- What a checkpoint is on disk (lua/ztrain/train/checkpoint/format.lua):
-- its SHA-256 helpers against FIPS 180-2's test vectors, the manifest's
-- checksum of the block checksums, and the format's constants. (Writing and
-- reading whole checkpoints: e2e/checkpoint_spec.lua.)
local ffi = require "ffi"
local format = require "ztrain.train.checkpoint.format"

describe("checkpoint format", function()
  it("sha_hex is SHA-256 (FIPS 180-2's vectors), over any bytes", function()
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", format.sha_hex("abc", 3))
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format.sha_hex("", 0))
    local s = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
    assert.are.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", format.sha_hex(s, #s))
    local m = ffi.new("uint8_t[?]", 1000000, 0x61)                 -- a million 'a's
    assert.are.equal("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", format.sha_hex(m, 1000000))
    assert.are.equal(format.sha_hex("ab", 2), format.sha_hex("abc", 2))   -- n bytes, not the string
  end)

  it("blocks_sha is the SHA-256 of the blocks' hex checksums, concatenated in order", function()
    local a, b = format.sha_hex("a", 1), format.sha_hex("b", 1)
    local ab = a .. b
    assert.are.equal(format.sha_hex(ab, #ab), format.blocks_sha({ a, b }))
    assert.are_not.equal(format.blocks_sha({ a, b }), format.blocks_sha({ b, a }))
  end)

  it("names the format, version 1, 1 MiB checksummed blocks", function()
    assert.are.same({ "ztrain-checkpoint", 1, 1048576 }, { format.FORMAT, format.VERSION, format.BLOCK })
  end)
end)
