"""Manifest records on the real ring: compare-and-set, restarts and a dead replica.

What must hold: ``put_record`` is a compare-and-set on the version: a stale expected
version is refused with ``RecordConflict`` (each replica answers 409 with its
``current_version``) and changes nothing; a record survives the restart of its replicas;
with one replica dead, ``get_record`` still returns the newest version.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import xxhash
from support import HttpProbe

from ring.client import Client
from ring.errors import RecordConflict
from sr3.local import LocalCluster


def _record_holders(cluster: LocalCluster, key: str) -> list[str]:
    """Peers whose data folder holds the record file of ``key`` (found on disk)."""
    name = f"{xxhash.xxh3_128_hexdigest(key.encode())}.rec"
    return [
        peer.peer_id
        for peer in cluster.cluster.peers
        if (Path(peer.data_dir) / "records" / name).is_file()
    ]


async def test_compare_and_set_refuses_a_stale_version(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a writer that read version 0 writes after another writer made version 1.
    Must hold: RecordConflict naming the current version; the stored value is untouched;
    a writer that expects the current version succeeds and gets the next one."""
    key = f"manifest/query-{rng.randrange(10**9)}/latest"
    async with Client(ring.ring, ring.secret) as client:
        assert await client.get_record(key) is None
        assert await client.put_record(key, b"batch-1", expected_version=0) == 1
        with pytest.raises(RecordConflict) as conflict:
            await client.put_record(key, b"stale writer", expected_version=0)
        assert (conflict.value.expected, conflict.value.current) == (0, 1)
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (1, b"batch-1")
        assert await client.put_record(key, b"batch-2", expected_version=1) == 2
        with pytest.raises(RecordConflict) as conflict:
            await client.put_record(key, b"stale again", expected_version=1)
        assert conflict.value.current == 2
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (2, b"batch-2")
        assert not record.conflict
        assert (await client.list_records("manifest/"))[key] == 2

    holders = _record_holders(ring, key)
    assert len(holders) == 3, holders
    async with HttpProbe(ring.secret) as probe:
        for peer_id in holders:
            address = ring.peer(peer_id).address
            answer = await probe.signed(
                address, "PUT", f"/v1/records/{key}?expected_version=0", body=b"direct stale"
            )
            assert answer.status == 409, (peer_id, answer)
            assert answer.json()["current_version"] == 2
            assert answer.json()["error"]
            current = await probe.signed(address, "GET", f"/v1/records/{key}")
            assert (current.status, current.body) == (200, b"batch-2")
            assert current.headers["X-SR3-Version"] == "2"


async def test_concurrent_writers_of_one_version_exactly_one_wins(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: four writers race to replace version 0 (each replica accepts the first
    that reaches it). Must hold: at most one writer is told it succeeded (two would need
    2 of 3 replicas each), every other gets RecordConflict; readers then see the winner's
    value, or, if the replicas split three ways, a version-1 value flagged ``conflict``."""
    key = f"manifest/race-{rng.randrange(10**9)}"
    clients = [Client(ring.ring, ring.secret) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                client.put_record(key, f"writer-{index}".encode(), expected_version=0)
                for index, client in enumerate(clients)
            ),
            return_exceptions=True,
        )
        winners = [index for index, result in enumerate(results) if result == 1]
        assert len(winners) <= 1, results
        assert all(result == 1 or isinstance(result, RecordConflict) for result in results)
        record = await clients[0].get_record(key)
        assert record is not None and record.version == 1
        if winners:
            assert record.value == f"writer-{winners[0]}".encode(), results
        else:
            assert record.conflict, results
    finally:
        for client in clients:
            await client.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_record_survives_restart_of_its_replicas(
    ring: LocalCluster, rng: random.Random, how: str
) -> None:
    key = f"manifest/restart-{rng.randrange(10**9)}"
    async with Client(ring.ring, ring.secret) as client:
        await client.put_record(key, b"v1", expected_version=0)
        await client.put_record(key, b"v2", expected_version=1)
    holders = _record_holders(ring, key)
    assert len(holders) == 3
    for peer_id in holders:
        await asyncio.to_thread(ring.kill if how == "kill" else ring.stop, peer_id)
    await asyncio.to_thread(lambda: [ring.start(peer_id, wait=False) for peer_id in holders])
    await asyncio.to_thread(ring.wait_healthy, holders)
    async with HttpProbe(ring.secret) as probe:
        for peer_id in holders:
            answer = await probe.signed(ring.peer(peer_id).address, "GET", f"/v1/records/{key}")
            assert (answer.status, answer.body, answer.headers["X-SR3-Version"]) == (
                200,
                b"v2",
                "2",
            )
    async with Client(ring.ring, ring.secret) as client:
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (2, b"v2")
        with pytest.raises(RecordConflict):
            await client.put_record(key, b"stale", expected_version=1)


async def test_get_record_returns_newest_version_with_one_replica_dead(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: one replica of a record is SIGKILLed after version 2 was written. Must
    hold: get_record returns version 2 from the other replicas; a stale write is still
    refused; a write expecting 2 succeeds (W=2 of the remaining peers)."""
    key = f"manifest/dead-replica-{rng.randrange(10**9)}"
    async with Client(ring.ring, ring.secret) as client:
        await client.put_record(key, b"v1", expected_version=0)
        await client.put_record(key, b"v2", expected_version=1)
    holders = _record_holders(ring, key)
    victim = rng.choice(holders)
    await asyncio.to_thread(ring.kill, victim)
    async with Client(ring.ring, ring.secret) as client:
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (2, b"v2"), victim
        with pytest.raises(RecordConflict):
            await client.put_record(key, b"stale", expected_version=1)
        assert await client.put_record(key, b"v3", expected_version=2) == 3
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (3, b"v3")
    await asyncio.to_thread(ring.start, victim)
    # Back up with version 2 on disk: readers still see 3 (newest of the replicas).
    async with Client(ring.ring, ring.secret) as client:
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (3, b"v3")
