"""A flipped byte in a stored chunk file is detected, quarantined, never served, and
replaced by a good copy from another replica.

Real peers, real chunk files: the test flips one bit in the file of a chunk on two of
its three holders (found on disk under ``<data>/chunks/<2 hex>/<id>``), then reads.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from pathlib import Path

import pytest
from support import HttpProbe, chunk_file, chunk_holders, metric_value

from ring import codec
from ring.client import Client
from sr3.local import LocalCluster
from sr3.statedata import state_bytes

CORRUPT_METRIC = "sr3_peer_chunks_corrupt_total"
RESTORE_WAIT_S = 20.0

# Byte ranges of the stored form (see ring.codec) where a bit is flipped.
REGIONS: dict[str, tuple[str, int, int | None]] = {
    "header magic": ("zstd", 0, 4),
    "header format version": ("zstd", 4, 5),
    "header codec": ("zstd", 5, 6),
    "header reserved": ("zstd", 6, 8),
    "header raw length": ("zstd", 8, 16),
    "header payload length": ("zstd", 16, 24),
    "header payload checksum": ("zstd", 24, 32),
    "header chunk id": ("zstd", 32, 48),
    "payload": ("zstd", codec.HEADER_BYTES, None),
    "raw chunk header raw length": ("raw", 8, 16),
    "raw chunk payload": ("raw", codec.HEADER_BYTES, None),
}


@functools.cache
def _state() -> bytes:
    return state_bytes(1024 * 1024, seed=77)  # generating state is slow: once per run


def _blob(kind: str, rng: random.Random) -> bytes:
    """A one-chunk blob no other test stores: compressible (zstd) or not (raw)."""
    size = 200 * 1024
    if kind == "raw":
        return rng.randbytes(size)
    offset = rng.randrange(len(_state()) - size)
    return rng.randbytes(16) + _state()[offset : offset + size - 16]


@pytest.mark.parametrize("region", list(REGIONS))
async def test_flipped_byte_is_detected_quarantined_and_read_elsewhere(
    ring: LocalCluster, rng: random.Random, region: str
) -> None:
    """Breaks: one bit in the chunk file of 2 of the 3 holders of a chunk, in ``region``.
    Must hold: the blob reads back correct (served by the intact replica); each damaged
    peer never serves its copy (direct GET is 422, or 404 once quarantined, or the good
    copy once fetched again), moves the file to ``<data>/quarantine``, reports it in
    /v1/info ``quarantined`` and in ``sr3_peer_chunks_corrupt_total``, fetches a good
    copy from the intact replica at once, and keeps running under the same pid."""
    kind, start, end = REGIONS[region]
    data = _blob(kind, rng)
    async with Client(ring.ring, ring.secret) as client:
        ref = await client.chunks.put_blob(data)
    (chunk_id,) = {extent.chunk_id for extent in ref.extents}
    holders = chunk_holders(ring, chunk_id)
    assert len(holders) == 3
    stored = chunk_file(ring, holders[0], chunk_id).read_bytes()
    expected_codec = codec.CODEC_RAW if kind == "raw" else codec.CODEC_ZSTD
    assert codec.parse_header(stored).codec == expected_codec

    damaged_peers = sorted(rng.sample(holders, 2))
    intact_peer = next(peer for peer in holders if peer not in damaged_peers)
    position = rng.randrange(start, end if end is not None else len(stored))
    damaged = bytearray(stored)
    damaged[position] ^= 1 << rng.randrange(8)
    for peer_id in damaged_peers:
        chunk_file(ring, peer_id, chunk_id).write_bytes(bytes(damaged))
    where = f"{region}: byte {position} flipped on {damaged_peers}"

    pids = {peer.peer_id: peer.pid for peer in ring.cluster.peers}
    async with HttpProbe(ring.secret) as probe:
        before = {p: await probe.info(ring.peer(p).address) for p in damaged_peers}
        metric_before = {
            p: metric_value(await probe.metrics(ring.peer(p).address), CORRUPT_METRIC)
            for p in damaged_peers
        }
        async with Client(ring.ring, ring.secret) as client:
            assert await client.chunks.get_blob(ref) == data, where

        for peer_id in damaged_peers:
            address = ring.peer(peer_id).address
            answer = await probe.signed(address, "GET", f"/v1/chunks/{chunk_id}")
            if answer.status == 200:  # already fetched again from the intact replica
                assert codec.decode(answer.body, chunk_id) == data, where
            else:
                assert answer.status in (404, 422), f"{where}: {peer_id} answered {answer.status}"
            assert answer.body != bytes(damaged)
            data_dir = Path(ring.peer(peer_id).data_dir)
            quarantined = [p for p in (data_dir / "quarantine").iterdir() if chunk_id in p.name]
            assert [p.read_bytes() for p in quarantined] == [bytes(damaged)], where
            # The peer fetches a good copy from the intact replica at once.
            deadline = time.monotonic() + RESTORE_WAIT_S
            while (info := await probe.info(address))["chunk_count"] != before[peer_id][
                "chunk_count"
            ]:
                assert time.monotonic() < deadline, f"{where}: {peer_id} did not restore it"
                await asyncio.sleep(0.1)
            assert chunk_file(ring, peer_id, chunk_id).read_bytes() == stored, where
            assert info["quarantined"] == before[peer_id]["quarantined"] + 1, where
            metric = metric_value(await probe.metrics(address), CORRUPT_METRIC)
            assert metric == metric_before[peer_id] + 1, where
            assert await probe.health(address) == 200

        intact = await probe.signed(ring.peer(intact_peer).address, "GET", f"/v1/chunks/{chunk_id}")
        assert intact.status == 200
        assert codec.decode(intact.body, chunk_id) == data

    async with Client(ring.ring, ring.secret) as client:
        assert await client.chunks.get_blob(ref) == data, f"{where}: second read"
    assert {peer.peer_id: peer.pid for peer in ring.cluster.peers} == pids
    assert all(ring.running(peer_id) for peer_id in pids)
