"""Manifest records on the real ring: compare-and-set, restarts and a dead replica.

What must hold: ``put_record`` is a compare-and-set on the version, decided by consensus
among the key's acceptors: a stale expected version is refused with ``RecordConflict``
and changes nothing, and a stale prepare or accept sent straight to an acceptor is
pre-empted (409) without touching the chosen value; of concurrent writers of one version
exactly one wins; a record survives the restart of its replicas; with one replica dead,
``get_record`` still returns the newest version.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import xxhash
from faultlab import faketime_env, require_faketime
from support import HttpProbe, MakeCluster

from ring import api, paxos, records_api
from ring.client import Client
from ring.client.proposer import Acceptors
from ring.errors import RecordConflict, RecordUnknown
from ring.paxos import FAST, Ballot, Slot, Value
from sr3.local import LocalCluster


def _record_holders(cluster: LocalCluster, key: str) -> list[str]:
    """Peers whose data folder holds the record file of ``key`` (found on disk)."""
    name = f"{xxhash.xxh3_128_hexdigest(key.encode())}.rec"
    return [
        peer.peer_id
        for peer in cluster.cluster.peers
        if (Path(peer.data_dir) / "records" / name).is_file()
    ]


async def _slot(probe: HttpProbe, address: str, key: str) -> Slot:
    """The slot a peer holds for ``key``, as it is."""
    answer = await probe.signed(address, "GET", records_api.record_raw_path(key))
    assert answer.status == 200, answer
    return paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)[0]


async def test_compare_and_set_refuses_a_stale_version(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a writer that read version 0 writes after another writer made version 1;
    then stale rounds are sent straight to each acceptor (a fast create, accepts and
    prepares at ballots below the ones the writers used). Must hold: RecordConflict
    naming the current version; the stored value is untouched; a writer that expects the
    current version succeeds and gets the next one; every direct stale message is 409
    "preempted" and each acceptor's slot, and the value a client reads, stay as chosen."""
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

        acceptors = Acceptors.of(await client.ring(), key)

    holders = _record_holders(ring, key)
    assert sorted(holders) == sorted(m.peer_id for m in acceptors.members), holders
    stale = Value(1, b"direct stale", op="0bad")
    async with HttpProbe(ring.secret) as probe:
        for member in acceptors.members:
            chosen = await _slot(probe, member.address, key)
            assert (chosen.value.version, chosen.value.data) == (2, b"batch-2"), member
            assert chosen.accepted is not None and chosen.accepted.counter >= 1
            low = Ballot(1, "0")
            assert low < chosen.accepted
            for path, body in [
                (records_api.accept_path(key, FAST.wire(), acceptors.view), stale),
                (records_api.accept_path(key, low.wire(), acceptors.view), stale),
                (records_api.prepare_path(key, low.wire(), acceptors.view), None),
            ]:
                sent = None if body is None else paxos.encode_slot(Slot(low, low, body))
                answer = await probe.signed(member.address, "POST", path, body=sent)
                assert answer.status == 409, (member.peer_id, path, answer)
                assert answer.json()["error"] == "preempted"
                assert Ballot.parse(answer.json()["promised"]) >= chosen.accepted
            assert await _slot(probe, member.address, key) == chosen
    async with Client(ring.ring, ring.secret) as client:
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (2, b"batch-2")


async def test_a_create_with_an_acceptor_down_is_still_one_round_trip(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: the first of a new key's five acceptors is SIGKILLed, then the key is
    created. Must hold: the create is decided in the fast round (a fast quorum is four of
    the five: the acceptor the create did not ask stands in for the dead one), in one
    attempt; it reads back, and a second create of the key is a RecordConflict."""
    key = f"manifest/fast-{rng.randrange(10**9)}"
    async with Client(ring.ring, ring.secret) as client:
        acceptors = Acceptors.of(await client.ring(), key)
        assert (len(acceptors.members), acceptors.fast_quorum) == (5, 4)
        await asyncio.to_thread(ring.kill, acceptors.members[0].peer_id)
        stats = client.records.proposer.stats
        assert await client.put_record(key, b"created", expected_version=0) == 1
        assert (stats.fast_creates, stats.operations, stats.rounds) == (1, 1, 1)
        record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (1, b"created")
        with pytest.raises(RecordConflict):
            await client.put_record(key, b"again", expected_version=0)


async def test_a_peer_whose_wall_clock_is_600_s_behind_costs_one_acceptor(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: one peer of five runs under libfaketime, and once the ring is up its wall
    clock jumps 600 s behind (past the 120 s signatures allow; the monotonic clock
    stays, as an NTP step leaves it): it refuses what the others sign, and they refuse
    what it signs. Must hold: records whose acceptors include it are created, updated
    and read as if it were down (every call succeeds), and it did answer 401
    ``clock_skew``; before, a client took that answer as its own credentials being
    wrong and every such call failed with AuthError."""
    require_faketime()
    cluster = make_cluster(5)
    victim = cluster.cluster.peers[2]
    offset = tmp_path / "clock"
    offset.write_text("+0\n")
    await asyncio.to_thread(cluster.stop, victim.peer_id)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in faketime_env(offset).items():
            patch.setenv(name, value)
        await asyncio.to_thread(cluster.start, victim.peer_id)
    offset.write_text("-600\n")
    await asyncio.sleep(2.0)  # past the library's cache of the offset file
    prefix = f"skewed-{rng.randrange(10**9)}"
    async with Client(cluster.ring, cluster.secret) as client:
        for index in range(10):
            key = f"{prefix}/{index}"
            acceptors = Acceptors.of(await client.ring(), key)
            assert victim.peer_id in {m.peer_id for m in acceptors.members}
            assert await client.put_record(key, b"one", expected_version=0) == 1
            assert await client.put_record(key, b"two", expected_version=1) == 2
            record = await client.get_record(key)
            assert record is not None and (record.version, record.value) == (2, b"two")
    async with HttpProbe(cluster.secret) as probe:
        answer = await probe.signed(victim.address, "GET", api.RING.pattern)
    assert (answer.status, answer.json()["error"]) == (401, "clock_skew"), answer


async def test_concurrent_writers_of_one_version_exactly_one_wins(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: four writers race to replace version 0 (their fast creates collide at the
    acceptors, then their rounds pre-empt each other). Must hold: exactly one writer is
    told it succeeded (consensus chooses one value, even when the acceptors' fast values
    split three ways), every other gets RecordConflict naming version 1 (RecordUnknown
    if its own value reached an acceptor before another was chosen); readers, fresh ones
    too, then see the winner's value, never flagged ``conflict``."""
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
        assert len(winners) == 1, results
        for result in results:
            assert result == 1 or isinstance(result, (RecordConflict, RecordUnknown)), results
            if isinstance(result, RecordConflict):
                assert (result.expected, result.current) == (0, 1), results
        winner = f"writer-{winners[0]}".encode()
        for client in clients:
            record = await client.get_record(key)
            assert record is not None and (record.version, record.value) == (1, winner)
            assert not record.conflict
        async with Client(ring.ring, ring.secret) as fresh:
            record = await fresh.get_record(key)
            assert record is not None and (record.version, record.value) == (1, winner)
    finally:
        for client in clients:
            await client.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_record_survives_restart_of_its_replicas(
    ring: LocalCluster, rng: random.Random, how: str
) -> None:
    """Breaks: every acceptor of a record at version 2 is SIGKILLed (or stopped
    cleanly), then all restart together. Must hold: each reads back its slot from disk
    with version 2 (one accepted ballot across the five); a client reads version 2
    and a write expecting version 1 is refused."""
    key = f"manifest/restart-{rng.randrange(10**9)}"
    async with Client(ring.ring, ring.secret) as client:
        await client.put_record(key, b"v1", expected_version=0)
        await client.put_record(key, b"v2", expected_version=1)
    holders = _record_holders(ring, key)
    assert len(holders) == paxos.record_group(3)
    for peer_id in holders:
        await asyncio.to_thread(ring.kill if how == "kill" else ring.stop, peer_id)
    await asyncio.to_thread(lambda: [ring.start(peer_id, wait=False) for peer_id in holders])
    await asyncio.to_thread(ring.wait_healthy, holders)
    async with HttpProbe(ring.secret) as probe:
        slots = [await _slot(probe, ring.peer(peer_id).address, key) for peer_id in holders]
    for peer_id, slot in zip(holders, slots, strict=True):
        assert (slot.value.version, slot.value.data) == (2, b"v2"), peer_id
    assert len({slot.accepted for slot in slots}) == 1, slots
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
