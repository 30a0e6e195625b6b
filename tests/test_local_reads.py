"""A peer's file namespace reads the chunks the peer holds from its own store.

A read of ``sr3://`` goes to one peer, which fetches the file's chunks and streams them
on. The chunks that peer holds itself (R of N peers hold each one) are read from its
chunk store and verified as a replica's copy is, instead of through its own HTTP server;
a local copy that fails is quarantined and the replicas are asked, as for a bad replica.
"""

from __future__ import annotations

import random
from pathlib import Path

from support import HttpProbe, chunk_file, metric_value

from ring import codec
from ring.chunkstore import ChunkStore
from ring.client import Client
from ring.node import OwnChunks
from ring.ratelimit import ForegroundGate
from spark_connector.fs_client import FsClient
from sr3.local import LocalCluster

SECRET = "s" * 32
LOCAL_METRIC = "sr3_peer_chunk_bytes_read_locally"
CORRUPT_METRIC = "sr3_peer_chunks_corrupt_total"
CHUNK_BYTES = 4 * 1024 * 1024


def _store(tmp_path: Path) -> ChunkStore:
    store = ChunkStore(tmp_path / "data")
    store.open()
    return store


def _own(store: ChunkStore) -> OwnChunks:
    """The store as a peer's namespace client reads it."""
    return OwnChunks(store, ForegroundGate(lambda: 0.0))


async def test_a_chunk_held_here_is_read_without_the_network(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: no peer reachable (the seed's port is closed). Must hold: a chunk in the
    client's local store reads back verified, and is counted as a local read."""
    store = _store(tmp_path)
    raw = rng.randbytes(100_000)
    chunk_id, stored = codec.encode(raw)
    await store.put(chunk_id, stored)
    own = _own(store)
    async with Client("127.0.0.1:9", SECRET, local_chunks=own) as client:
        assert await client.chunks.fetch_chunk(chunk_id) == raw
    assert own.bytes_read == len(stored)


async def test_a_local_read_is_foreground_traffic(tmp_path: Path, rng: random.Random) -> None:
    """Must hold: a read from the peer's own store holds off repair and scrubbing as a
    chunk GET does (the foreground gate is busy until a quiet moment after it)."""
    now = [100.0]
    gate = ForegroundGate(lambda: now[0])
    store = _store(tmp_path)
    chunk_id, stored = codec.encode(rng.randbytes(10_000))
    await store.put(chunk_id, stored)
    now[0] += 10.0
    assert not gate.busy
    assert await OwnChunks(store, gate).read_local(chunk_id) == stored
    assert gate.busy
    now[0] += 2 * ForegroundGate.QUIET_S
    assert not gate.busy


async def test_a_bad_local_copy_is_quarantined_and_a_replica_read_instead(
    ring: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: the local store's copy of a chunk has a flipped bit in its payload; the
    ring holds good copies. Must hold: the read gives the chunk's bytes from a replica,
    the local copy is quarantined (no longer held), and nothing counts as read locally."""
    raw = rng.randbytes(50_000)
    async with Client(ring.ring, ring.secret) as client:
        chunk_id = await client.chunks.store_raw_chunk(raw)
    store = _store(tmp_path)
    _id, stored = codec.encode(raw)
    await store.put(chunk_id, stored)
    path = tmp_path / "data" / "chunks" / chunk_id[:2] / chunk_id
    damaged = bytearray(path.read_bytes())
    damaged[codec.HEADER_BYTES + 100] ^= 0x04
    path.write_bytes(bytes(damaged))
    own = _own(store)
    async with Client(ring.ring, ring.secret, local_chunks=own) as client:
        assert await client.chunks.fetch_chunk(chunk_id) == raw
    assert not store.has(chunk_id)
    assert own.bytes_read == 0


async def _metric(address: str, secret: str, name: str) -> float:
    async with HttpProbe(secret) as probe:
        return metric_value(await probe.metrics(address), name)


async def test_a_peer_serves_a_file_from_its_own_chunks(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: nothing; a file of three chunks read through each peer in turn. Must
    hold: the bytes are the file's, and every peer that holds some of its chunks read
    those from its own store (R of 5 peers hold each chunk: each is read locally by
    three of the five readers)."""
    path = f"/tests/local-reads-{rng.randrange(10**12)}/file.bin"
    data = rng.randbytes(3 * 4 * 1024 * 1024 - 12345)
    addresses = ring.cluster.addresses
    async with FsClient(addresses[0], ring.secret) as fs:
        await fs.write(path, data)
    local_readers = 0
    for address in addresses:
        before = await _metric(address, ring.secret, LOCAL_METRIC)
        async with FsClient(address, ring.secret) as fs:
            assert await fs.read(path) == data
        if await _metric(address, ring.secret, LOCAL_METRIC) > before:
            local_readers += 1
    # Each of the 3 chunks is held by 3 of the 5 peers: at least 3 readers held one.
    assert local_readers >= 3, local_readers


async def test_a_large_read_reads_local_copies_and_reads_bad_ones_from_replicas(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a file of five chunks (a large read: recovery's executor); then a flipped
    payload bit in every copy the coordinating peer holds of them. Must hold: read whole
    through that peer, the file is byte-identical both times; the first time the peer
    read its own copies, the second time it quarantined them, read replicas' and kept
    no bad copy."""
    path = f"/tests/local-large-{rng.randrange(10**12)}/file.bin"
    data = rng.randbytes(5 * CHUNK_BYTES - 777)
    async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
        await fs.write(path, data)
    # The namespace cuts a file into 4 MiB chunks: their ids; the coordinator is the peer
    # holding most of them.
    ids = [codec.chunk_id(data[at : at + CHUNK_BYTES]) for at in range(0, len(data), CHUNK_BYTES)]

    def held(peer_id: str) -> list[Path]:
        copies = [chunk_file(ring, peer_id, chunk_id) for chunk_id in ids]
        return [copy for copy in copies if copy.is_file()]

    peer = max(ring.cluster.peers, key=lambda candidate: len(held(candidate.peer_id)))
    own = held(peer.peer_id)
    assert own, "no peer holds the file's chunks where expected"
    async with FsClient(peer.address, ring.secret) as fs:
        before = await _metric(peer.address, ring.secret, LOCAL_METRIC)
        assert await fs.read(path) == data
        assert await _metric(peer.address, ring.secret, LOCAL_METRIC) > before
        for chunk in own:
            damaged = bytearray(chunk.read_bytes())
            damaged[codec.HEADER_BYTES + 1000] ^= 0x10
            chunk.write_bytes(bytes(damaged))
        corrupt_before = await _metric(peer.address, ring.secret, CORRUPT_METRIC)
        local_before = await _metric(peer.address, ring.secret, LOCAL_METRIC)
        assert await fs.read(path) == data
    assert await _metric(peer.address, ring.secret, CORRUPT_METRIC) - corrupt_before == len(own)
    assert await _metric(peer.address, ring.secret, LOCAL_METRIC) == local_before
    # The bad copies left the chunk folders; a copy there now (the peer fetched a good
    # one back after quarantining its own) is good.
    for chunk in own:
        if chunk.exists():
            codec.check_content(chunk.read_bytes(), chunk.name)
