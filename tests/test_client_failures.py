"""How the client fails: clearly, naming what is missing, never with partial data.

Real peers on the shared ring; which peers hold a chunk is read from their data folders.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from support import HttpProbe, chunk_holders, peer_address

from recovery.executor import recover_blob
from ring.blobs import BlobRef
from ring.client import Client, ClientOptions
from ring.errors import DataUnavailable, NotFound, QuorumError
from ring.sync_client import SyncClient
from sr3.local import LocalCluster

SMALL_CHUNKS = ClientOptions(chunk_bytes=64 * 1024, pack_below_bytes=16 * 1024)


async def _kill(cluster: LocalCluster, peer_ids: list[str]) -> None:
    for peer_id in peer_ids:
        await asyncio.to_thread(cluster.kill, peer_id)


async def test_read_with_every_replica_gone_raises_data_unavailable_naming_chunks(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: a blob written with R=1, then the single holder of some of its chunks is
    SIGKILLed. Must hold: reading raises DataUnavailable whose ``missing`` lists exactly
    the chunks on the dead peer (and the message names them); ``get_file`` leaves no
    file, partial or whole; chunks on live peers still read."""
    data = rng.randbytes(6 * 64 * 1024 + 123)
    options = ClientOptions(replication=1, write_quorum=1, chunk_bytes=64 * 1024)
    async with Client(ring.ring, ring.secret, options=options) as client:
        ref = await client.chunks.put_blob(data)
    chunk_ids = [extent.chunk_id for extent in ref.extents]
    holder_of = {}
    for chunk_id in chunk_ids:
        holders = chunk_holders(ring, chunk_id)
        assert len(holders) == 1, (chunk_id, holders)
        holder_of[chunk_id] = holders[0]
    victim = rng.choice(sorted(set(holder_of.values())))
    lost = [chunk_id for chunk_id in chunk_ids if holder_of[chunk_id] == victim]
    await _kill(ring, [victim])

    output = tmp_path / "restored.bin"
    async with Client(ring.ring, ring.secret) as client:
        with pytest.raises(DataUnavailable) as unavailable:
            await client.chunks.get_blob(ref)
        assert unavailable.value.missing == list(dict.fromkeys(lost))
        assert lost[0] in str(unavailable.value)
        with pytest.raises(DataUnavailable):
            await client.get_file(ref, output)
        assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []
        for extent in ref.extents:
            if holder_of[extent.chunk_id] != victim:
                raw = await client.fetch_chunk(extent.chunk_id)
                assert raw[extent.offset : extent.offset + extent.length]


async def test_read_with_all_three_replicas_killed_raises_data_unavailable(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: all R=3 holders of a chunk are SIGKILLed (beyond what R tolerates). Must
    hold: DataUnavailable naming that chunk, not a hang, not wrong bytes."""
    data = rng.randbytes(50_000)
    async with Client(ring.ring, ring.secret) as client:
        ref = await client.chunks.put_blob(data)
    (chunk_id,) = {extent.chunk_id for extent in ref.extents}
    holders = chunk_holders(ring, chunk_id)
    assert len(holders) == 3
    await _kill(ring, holders)
    async with Client(ring.ring, ring.secret) as client:
        with pytest.raises(DataUnavailable) as unavailable:
            await client.chunks.get_blob(ref)
    assert unavailable.value.missing == [chunk_id]


async def test_write_without_a_write_quorum_raises_quorum_error(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: 4 of 5 peers are SIGKILLed, so only 1 peer is reachable (W=2). Must hold:
    chunk and record writes raise QuorumError (1 of 2 acknowledged); a file whose chunks
    failed is not named by any record once the ring is back (invariant 1)."""
    source = tmp_path / "state.bin"
    await asyncio.to_thread(source.write_bytes, rng.randbytes(20_000))
    key = f"quorum/{rng.randrange(10**9)}"
    survivor = rng.choice([peer.peer_id for peer in ring.cluster.peers])
    await _kill(ring, [p.peer_id for p in ring.cluster.peers if p.peer_id != survivor])
    async with Client(ring.ring, ring.secret) as client:
        with pytest.raises(QuorumError) as blob_error:
            await client.chunks.put_blob(rng.randbytes(10_000))
        assert (blob_error.value.acks, blob_error.value.needed) == (1, 2)
        with pytest.raises(QuorumError):
            await client.put_record(f"manifest/q-{rng.randrange(10**9)}", b"v", expected_version=0)
        with pytest.raises(QuorumError):
            await client.store_file(source, key)
    await asyncio.to_thread(ring.start)
    async with Client(ring.ring, ring.secret) as client:
        with pytest.raises(NotFound):
            await client.lookup_file(key)


async def test_write_quorum_counts_reachable_peers(ring: LocalCluster, rng: random.Random) -> None:
    """Breaks: 3 of 5 peers are SIGKILLed. Must hold: with W=3 a write raises
    QuorumError (2 reachable); with W=2 the write succeeds on the 2 live peers and reads
    back."""
    await _kill(ring, rng.sample([peer.peer_id for peer in ring.cluster.peers], 3))
    data = rng.randbytes(10_000)
    strict = ClientOptions(write_quorum=3)
    async with Client(ring.ring, ring.secret, options=strict) as client:
        with pytest.raises(QuorumError):
            await client.chunks.put_blob(data)
    async with Client(ring.ring, ring.secret) as client:
        ref = await client.chunks.put_blob(data)
        assert await client.chunks.get_blob(ref) == data


def test_sync_client_from_a_plain_thread(ring: LocalCluster, rng: random.Random) -> None:
    """The blocking facade works from a thread that has no event loop."""
    data = rng.randbytes(300_000)
    key = f"sync/{rng.randrange(10**9)}"
    results: dict[str, object] = {}

    def work() -> None:
        try:
            with SyncClient(ring.ring, ring.secret, options=SMALL_CHUNKS) as client:
                results["ref"] = client.put_bytes(data, key).ref
                results["data"] = client.get_bytes(key)
                results["version"] = client.put_record(key, b"v1", expected_version=0)
                results["record"] = client.get_record(key)
                results["status"] = client.status()
                try:
                    client.lookup_file(f"missing-{key}")
                except NotFound as exc:
                    results["not_found"] = exc
        except BaseException as exc:
            results["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "error" not in results, results.get("error")
    assert isinstance(results["ref"], BlobRef)
    assert results["data"] == data
    assert results["version"] == 1
    record = results["record"]
    assert record is not None and getattr(record, "value", None) == b"v1"
    assert len(getattr(results["status"], "peers", ())) == 5
    assert isinstance(results["not_found"], NotFound)


async def test_sync_client_inside_a_running_event_loop(
    ring: LocalCluster, rng: random.Random
) -> None:
    """The facade is also safe on a thread that runs an event loop of its own."""
    data = rng.randbytes(70_000)
    client = SyncClient(ring.ring, ring.secret)
    try:
        client.put_bytes(data, "sync/in-a-loop")
        assert client.get_bytes("sync/in-a-loop") == data
    finally:
        client.close()
    client.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="closed"):
        client.put_bytes(b"after close", "sync/closed")


@pytest.fixture
async def partial_seed(ring: LocalCluster) -> AsyncIterator[tuple[str, list[str]]]:
    """A seed that serves the ring's member table without two of its members, the way a
    peer that joined moments ago can (it has not heard of them yet). It answers only
    ``GET /v1/ring``: the table peer-3 serves, less peer-4 and peer-5. Yields its address
    and the member ids it names."""
    async with HttpProbe(ring.secret) as probe:
        full = (await probe.signed(peer_address(ring, "peer-3"), "GET", "/v1/ring")).json()
    assert len(full["members"]) == 5
    # One epoch behind: a peer that has not learned the newest configuration yet.
    partial = {
        **full,
        "members": [m for m in full["members"] if m["peer_id"] <= "peer-3"],
        "epoch": full["epoch"] - 1,
    }

    async def ring_table(_request: web.Request) -> web.Response:
        return web.json_response(partial)

    app = web.Application()
    app.router.add_get("/v1/ring", ring_table)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", [m["peer_id"] for m in partial["members"]]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("how", ["get_blob", "recover_blob", "get_record"])
async def test_read_through_a_seed_with_a_partial_member_table_reaches_the_other_members(
    ring: LocalCluster,
    partial_seed: tuple[str, list[str]],
    rng: random.Random,
    tmp_path: Path,
    how: str,
) -> None:
    """Breaks: a client's first seed serves a member table without peer-4 and peer-5
    (a peer still joining), and peer-1 and peer-2 are SIGKILLed, so chunks whose
    replicas are peer-1/2/4/5 are on no member that table names. Must hold: the read
    (chunk by chunk, and along a star recovery) widens its table from the other peers it
    can reach and returns the blob byte-identical, instead of DataUnavailable. Records:
    their acceptors refuse a round from a client whose table names other acceptors, so
    the client widens its table and reads every record back (with peer-1 alone killed:
    a record with two of its three acceptors dead cannot be read linearizably)."""
    seed, named = partial_seed
    data = rng.randbytes(24 * 64 * 1024 + 99)
    records = {f"partial-view/{how}/{index}": rng.randbytes(40) for index in range(16)}
    async with Client(ring.ring, ring.secret, options=SMALL_CHUNKS) as client:
        ref = await client.chunks.put_blob(data)
        for key, value in records.items():
            await client.put_record(key, value, expected_version=0)
        full = (await client.ring()).ring
    off_peer3 = [
        key for key in records if all(m.peer_id != "peer-3" for m in full.preference_list(key, 3))
    ]
    assert off_peer3, "some record must sit on peer-1/2/4/5 only for the test to mean anything"
    chunk_ids = list(dict.fromkeys(extent.chunk_id for extent in ref.extents))
    beyond = [c for c in chunk_ids if not set(chunk_holders(ring, c)) & {"peer-3"}]
    assert beyond, "some chunk must sit on peer-1/2/4/5 only for the test to mean anything"
    await _kill(ring, ["peer-1"] if how == "get_record" else ["peer-1", "peer-2"])

    seeds = [seed, *(peer_address(ring, peer_id) for peer_id in named)]
    async with Client(seeds, ring.secret, options=SMALL_CHUNKS) as client:
        assert {m.peer_id for m in (await client.ring()).ring.members} == set(named)
        if how == "get_blob":
            assert await client.chunks.get_blob(ref) == data
        elif how == "get_record":
            for key, value in records.items():
                record = await client.get_record(key)
                assert record is not None and record.value == value, key
        else:
            out = tmp_path / "recovered.bin"
            await recover_blob(client, ref, out, "star")
            assert out.read_bytes() == data
        widened = {m.peer_id for m in (await client.ring()).ring.members}
    assert widened == {f"peer-{index}" for index in range(1, 6)}
