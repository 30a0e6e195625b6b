"""Committed state survives peer failures: SIGKILLs of any R-1 peers, and restarts.

Real peer processes on loopback, real files and fsync. Data is located on disk (which
files each peer's data folder holds), not derived from placement code, so a placement bug
cannot hide a durability bug.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import xxhash
from support import HttpProbe, chunk_holders

from ring import codec
from ring.blobs import BlobRef
from ring.client import Client, ClientOptions, Source
from sr3.local import LocalCluster
from sr3.statedata import state_bytes

MIB = 1024 * 1024


async def _read(cluster: LocalCluster, ref: BlobRef) -> bytes:
    async with Client(cluster.ring, cluster.secret) as client:
        return await client.chunks.get_blob(ref)


@pytest.mark.slow
async def test_64mib_blob_survives_sigkill_of_any_two_of_five_peers(
    make_cluster: Callable[..., LocalCluster], rng: random.Random
) -> None:
    """Breaks: every one of the 10 pairs of 5 peers, SIGKILLed together (R=3, W=2).
    Must hold (invariant 2): a 64 MiB blob written once with all peers up reads back
    byte-identical through a fresh client with any 2 peers dead; every chunk sat on 3
    peers, so each pair leaves some chunks with a single surviving replica."""
    cluster = make_cluster(5)
    data = state_bytes(64 * MIB, seed=rng.randrange(2**32))
    digest = xxhash.xxh3_128_hexdigest(data)
    async with Client(cluster.ring, cluster.secret) as client:
        ref = await client.chunks.put_blob(data)
    chunk_ids = sorted({extent.chunk_id for extent in ref.extents})
    holders = {chunk_id: set(chunk_holders(cluster, chunk_id)) for chunk_id in chunk_ids}
    assert all(len(peers) == 3 for peers in holders.values()), holders

    peer_ids = [peer.peer_id for peer in cluster.cluster.peers]
    pairs = list(itertools.combinations(peer_ids, 2))
    rng.shuffle(pairs)
    single_survivor_reads = 0
    timings = []
    for pair in pairs:
        started = time.monotonic()
        for peer_id in pair:
            await asyncio.to_thread(cluster.kill, peer_id)
        restored = await _read(cluster, ref)
        assert xxhash.xxh3_128_hexdigest(restored) == digest, f"killed {pair}"
        assert restored == data, f"killed {pair}"
        single_survivor_reads += sum(1 for peers in holders.values() if len(peers - set(pair)) == 1)
        for peer_id in pair:
            await asyncio.to_thread(cluster.start, peer_id, wait=False)
        await asyncio.to_thread(cluster.wait_healthy, list(pair))
        timings.append(time.monotonic() - started)
    # Every chunk had 3 holders, and each of its 3 holder pairs was killed once.
    assert single_survivor_reads == 3 * len(chunk_ids)
    print(
        f"64 MiB, {len(chunk_ids)} chunks, {len(pairs)} pairs: "
        f"{sum(timings):.1f} s (kill+read+restart {min(timings):.2f}-{max(timings):.2f} s each)"
    )


def _state_sources(rng: random.Random) -> tuple[list[bytes], list[Source]]:
    """One multi-chunk file and a few small files that get packed together."""
    base = state_bytes(2 * MIB, seed=rng.randrange(2**32))
    blobs = [base[: 3 * MIB // 2]] + [
        rng.randbytes(16) + base[offset : offset + rng.randrange(100, 20_000)]
        for offset in (rng.randrange(MIB) for _ in range(6))
    ]
    sources = [
        Source(len(blob), lambda offset, length, blob=blob: blob[offset : offset + length])
        for blob in blobs
    ]
    return blobs, sources


async def _peer_chunk_ids(data_dir: Path) -> set[str]:
    return {path.name for path in (data_dir / "chunks").glob("*/*") if codec.is_chunk_id(path.name)}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_peer_restart_keeps_its_chunks(
    ring: LocalCluster, rng: random.Random, how: str
) -> None:
    """Breaks: one peer holding chunks is SIGKILLed (or SIGTERMed, which must stop it
    cleanly by itself) and started again on the same data folder. Must hold: its
    /v1/info reports the same chunk_count and stored_bytes, every chunk file it held is
    served again by that peer alone and verifies, and the blobs read back identical."""
    options = ClientOptions(chunk_bytes=256 * 1024, pack_below_bytes=64 * 1024)
    blobs, sources = _state_sources(rng)
    async with Client(ring.ring, ring.secret, options=options) as client:
        refs = await client.chunks.put_sources(sources)
    ours = {extent.chunk_id for ref in refs for extent in ref.extents}
    assert len(ours) >= 5
    candidates = sorted({peer for chunk_id in ours for peer in chunk_holders(ring, chunk_id)})
    victim = rng.choice(candidates)
    member = ring.peer(victim)
    data_dir = Path(member.data_dir)
    held = await _peer_chunk_ids(data_dir)
    assert held & ours

    async with HttpProbe(ring.secret) as probe:
        before = await probe.info(member.address)
        assert before["chunk_count"] == len(held)
        if how == "SIGKILL":
            await asyncio.to_thread(ring.kill, victim)
        else:
            await asyncio.to_thread(ring.signal, victim, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while ring.running(victim):
                assert time.monotonic() < deadline, "peer did not stop on SIGTERM"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(ring.stop, victim)  # reap it and clear its pid
            log_path = Path(member.log_file or data_dir / "peer.log")
            log = await asyncio.to_thread(log_path.read_text)
            assert "stopping" in log
        assert not ring.running(victim)
        with pytest.raises(aiohttp.ClientConnectionError):
            await probe.health(member.address)
        await asyncio.to_thread(ring.start, victim)
        assert ring.peer(victim).pid != member.pid
        after = await probe.info(member.address)
        assert (after["chunk_count"], after["stored_bytes"]) == (
            before["chunk_count"],
            before["stored_bytes"],
        )
        assert after["quarantined"] == before["quarantined"]
        for chunk_id in sorted(held):
            answer = await probe.signed(member.address, "GET", f"/v1/chunks/{chunk_id}")
            assert answer.status == 200, (chunk_id, answer.status)
            codec.decode(answer.body, chunk_id)  # raises unless it verifies end to end
        listed = sorted(held & ours)
        body = ('{"ids": ["' + '", "'.join(listed) + '"]}').encode()
        present = (
            await probe.signed(member.address, "POST", "/v1/chunks/exists", body=body)
        ).json()
        assert present["present"] == listed

    async with Client(ring.ring, ring.secret) as client:
        for blob, ref in zip(blobs, refs, strict=True):
            assert await client.chunks.get_blob(ref) == blob
