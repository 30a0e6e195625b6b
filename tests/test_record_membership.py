"""Records across membership changes: a new acceptor catches up before it answers.

What must hold: when a join changes a key's acceptors, a value chosen on the old ones
(and missed by one of the acceptors that stays) is what a read returns even after the
last old acceptor that kept it is gone from the key's acceptors and another holder dies:
the joiner takes the chosen value from the peers it replaces before it answers, instead
of answering with an empty slot that would let the read (or a write) take "absent" as
the register's state.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest
from support import HttpProbe, start_cluster

from ring import api, paxos, records_api
from ring.client import Client, ClientOptions
from ring.client.records import RecordIO
from ring.errors import DataUnavailable, PeerUnavailable, RecordUnknown
from ring.paxos import Slot
from ring.placement import Member, Ring
from ring.transport import Response, Transport
from sr3.local import LocalCluster

# Repair off (an hour apart) so that only catching up can bring the value to the joiner;
# failure detection quick so that a dead peer is skipped within seconds.
PEER_FLAGS = [
    "--scrub-rate", "0", "--repair-interval", "3600", "--failure-timeout", "2",
    "--gossip-interval", "0.2",
]  # fmt: skip
FAST_CLOSE = ClientOptions(close_wait_s=0.2, write_attempt_s=2.0)


def _members(cluster: LocalCluster, count: int) -> list[Member]:
    peers = [*cluster.cluster.peers]
    port = peers[0].address.rpartition(":")[2]
    addresses = {p.peer_id: p.address for p in peers}
    return [
        Member(f"peer-{i}", addresses.get(f"peer-{i}", f"127.0.0.{i}:{port}"), "")
        for i in range(1, count + 1)
    ]


GROUP = paxos.record_group(3)


def _key_moved_by_the_join(cluster: LocalCluster, rng: random.Random) -> tuple[str, str]:
    """A key of the 5-peer ring (every peer is one of its 5 acceptors) whose group, once
    peer-6 joins, has peer-6 in place of one of them; returns it with the replaced one."""
    vnodes = cluster.cluster.vnodes
    after = Ring.build(_members(cluster, 6), vnodes=vnodes)
    for _ in range(10_000):
        key = f"membership/{rng.randrange(10**12)}"
        new = [m.peer_id for m in after.preference_list(key, GROUP)]
        if "peer-6" in new:
            (replaced,) = {m.peer_id for m in _members(cluster, 5)} - set(new)
            return key, replaced
    raise AssertionError("no key among 10 000 moves to peer-6 (placement is broken)")


async def _wait_for_members(cluster: LocalCluster, count: int) -> None:
    """Until every running peer's table places ``count`` members (bounded)."""
    for _ in range(300):
        sizes = []
        for address in cluster.cluster.addresses:
            async with Client(address, cluster.secret) as client:
                sizes.append(len((await client.ring()).ring.members))
        if sizes == [count] * len(sizes):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the peers did not all see {count} members within 30 s")


async def test_a_joiner_catches_up_on_a_value_one_staying_acceptor_missed(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: a record's value is chosen while two of its five acceptors (b, c) are
    dead, so only a, d and e hold it; b and c come back empty; peer-6 joins and replaces
    e among the key's acceptors; then a and d freeze. The key's live acceptors are b and
    c (missed the write) and peer-6 (new): a majority. Must hold: the read returns the
    chosen value (peer-6 caught up on it from a majority of the old group, e among them,
    before answering)."""
    cluster = start_cluster(tmp_path, 5, peer_flags=PEER_FLAGS)
    try:
        key, replaced = _key_moved_by_the_join(cluster, rng)
        others = sorted({m.peer_id for m in _members(cluster, 5)} - {replaced})
        missed = rng.sample(others, 2)
        frozen = [p for p in others if p not in missed]
        for peer_id in missed:
            cluster.kill(peer_id)
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            assert await client.put_record(key, b"chosen", expected_version=0) == 1
        for peer_id in missed:
            cluster.start(peer_id)
        cluster.add_peer()
        await _wait_for_members(cluster, 6)
        for peer_id in frozen:
            cluster.signal(peer_id, signal.SIGSTOP)
        try:
            async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
                record = await client.get_record(key)
                assert record is not None, (
                    f"{key}: read as absent from {missed} (missed it) and peer-6 (new); "
                    f"{replaced} holds it"
                )
                assert (record.version, record.value) == (1, b"chosen")
        finally:
            for peer_id in frozen:
                cluster.signal(peer_id, signal.SIGCONT)
    finally:
        cluster.down(purge=True)


async def _slot(address: str, secret: str, key: str) -> Slot:
    async with HttpProbe(secret) as probe:
        answer = await probe.signed(address, "GET", records_api.record_raw_path(key))
    assert answer.status == 200, answer
    slot, _meta = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)
    return slot


async def test_repair_brings_a_lagging_acceptor_the_chosen_slot(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: one of a key's three acceptors is dead while the value is chosen (so only
    two hold it), then comes back with nothing. Must hold: within a few repair rounds it
    holds the chosen value at the ballot it was chosen at (repair sends it as a late
    accept), so the key again survives the loss of either other acceptor."""
    flags = ["--scrub-rate", "0", "--repair-interval", "0.5", "--failure-timeout", "2"]
    cluster = start_cluster(tmp_path, 5, peer_flags=flags)
    try:
        key = f"repair/{rng.randrange(10**12)}"
        ring = Ring.build(_members(cluster, 5), vnodes=cluster.cluster.vnodes)
        acceptors = [m.peer_id for m in ring.preference_list(key, 3)]
        lagging = rng.choice(acceptors)
        cluster.kill(lagging)
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            assert await client.put_record(key, b"chosen", expected_version=0) == 1
        holders = [p for p in acceptors if p != lagging]
        chosen = await _slot(cluster.peer(holders[0]).address, cluster.secret, key)
        assert chosen.accepted is not None and chosen.value.data == b"chosen"
        cluster.start(lagging)
        address = cluster.peer(lagging).address
        for _ in range(200):  # bounded: 20 s
            slot = await _slot(address, cluster.secret, key)
            if slot.accepted is not None:
                break
            await asyncio.sleep(0.1)
        assert (slot.accepted, slot.value) == (chosen.accepted, chosen.value), slot
        cluster.kill(holders[0])
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            record = await client.get_record(key)
        assert record is not None and (record.version, record.value) == (1, b"chosen")
    finally:
        cluster.down(purge=True)


async def test_r_minus_one_dead_acceptors_leave_a_record_linearizable_and_more_do_not(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: a record is written on its five acceptors (2R - 1 for R = 3), then two of
    them die at once (R - 1), then a third. Must hold: with two dead, a plain read
    answers the value as decided (``settled``) and a compare-and-set write succeeds, at
    once, with no membership change; with three dead (no majority), a plain read refuses
    (DataUnavailable: no quorum can say the value is the last one), and a read with
    ``allow_stale`` answers from the survivors, flagged ``settled=False``."""
    cluster = start_cluster(tmp_path, 5, peer_flags=PEER_FLAGS)
    try:
        key = f"stale/{rng.randrange(10**12)}"
        ring = Ring.build(_members(cluster, 5), vnodes=cluster.cluster.vnodes)
        acceptors = [m.peer_id for m in ring.preference_list(key, paxos.record_group(3))]
        assert len(acceptors) == 5
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            assert await client.put_record(key, b"written once", expected_version=0) == 1
        victims = rng.sample(acceptors, 3)
        for victim in victims[:2]:
            cluster.kill(victim)
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            record = await client.get_record(key)
            assert record is not None and record.settled
            assert (record.version, record.value) == (1, b"written once")
            assert await client.put_record(key, b"after two", expected_version=1) == 2
        cluster.kill(victims[2])
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            with pytest.raises(DataUnavailable):
                await client.get_record(key)
            record = await client.get_record(key, allow_stale=True)
        assert record is not None and record.value in (b"written once", b"after two")
        assert record.settled is False
    finally:
        cluster.down(purge=True)


async def test_with_two_acceptors_of_its_name_dead_a_file_still_reads_back_settled(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: two of the acceptors of a named file's record die at once (R - 1 losses;
    each of its chunks keeps a replica). Must hold: the file reads back byte-identical
    (invariant 2), its name read as decided (``settled``), not from what is left."""
    cluster = start_cluster(tmp_path, 5, peer_flags=PEER_FLAGS)
    try:
        key = f"named-{rng.randrange(10**12)}"
        ring = Ring.build(_members(cluster, 5), vnodes=cluster.cluster.vnodes)
        acceptors = [m.peer_id for m in ring.preference_list(f"blob/{key}", 5)]
        data = rng.randbytes(300_000)
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            await client.put_bytes(data, key)
        for victim in rng.sample(acceptors, 2):
            cluster.kill(victim)
        async with Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as client:
            info = await client.file_info(key)
            assert await client.get_bytes(key) == data
        assert info.settled is True
    finally:
        cluster.down(purge=True)


class _AcceptCutShort(Transport):
    """The real transport, except for the one write it is armed for: its accept reaches
    the acceptor ``late`` only when the writer moves on to its next round (as a slow
    network would deliver it), and ``refusing`` answers it 409 ``view`` (as a peer whose
    member table names other acceptors does). Before that next round goes out,
    ``between`` runs: the test's other writer."""

    def __init__(self, secret: str, late: str, refusing: str) -> None:
        super().__init__(secret)
        self.late, self.refusing = late, refusing
        self.armed = False
        self.accepted: set[str] = set()
        self.held_back: tuple[str, bytes] | None = None
        self.between: Any = None
        self._next_round = asyncio.Lock()

    async def request(self, address: str, method: str, path_qs: str, **options: Any) -> Response:
        accept = path_qs.startswith("/v1/paxos/accept/")
        if self.armed and accept and address == self.late:
            self.held_back = (path_qs, options["body"])
            raise PeerUnavailable(address, "accept held back by the test")
        if self.armed and accept and address == self.refusing:
            await asyncio.sleep(0.3)  # the refusal comes last, after the other two answers
            refusal = api.error_body("view", "this peer's member table names other acceptors")
            return Response(409, {}, json.dumps(refusal).encode())
        if self.armed and not accept:
            async with self._next_round:  # the round's other requests wait for this
                if self.held_back is not None:
                    for _ in range(100):  # the accept that got through landed (<= 5 s)
                        if self.accepted:
                            break
                        await asyncio.sleep(0.05)
                    path, body = self.held_back
                    self.held_back = None
                    await super().request(self.late, "POST", path, body=body)
                    await self.between()
                self.armed = False
        answer = await super().request(address, method, path_qs, **options)
        if self.armed and accept and answer.status == 200:
            self.accepted.add(address)
        return answer


async def test_a_write_accepted_while_another_acceptor_names_other_peers_is_not_a_conflict(
    tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: a write's accept reaches one acceptor, is late to the second and refused
    by the third with 409 ``view`` (its member table names other acceptors, as during a
    join); the late accept then lands, so the write is chosen, and another writer
    changes the record after it before the first writer's next round.
    Must hold: the first writer does not report ``RecordConflict`` (its write took
    effect): it cannot tell, so ``RecordUnknown``."""
    cluster = start_cluster(tmp_path, 3, peer_flags=PEER_FLAGS)
    try:
        key = f"view/{rng.randrange(10**12)}"
        _first, late, refusing = (m.address for m in _members(cluster, 3))
        transport = _AcceptCutShort(cluster.secret, late, refusing)
        async with (
            Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as writer,
            Client(cluster.ring, cluster.secret, options=FAST_CLOSE) as other,
        ):
            records = RecordIO(transport, writer.view)
            assert await records.put_record(key, b"one", expected_version=0) == 1
            seen: list[object] = []

            async def other_writes() -> None:
                record = await other.get_record(key)
                seen.append(None if record is None else (record.version, record.value))
                seen.append(await other.put_record(key, b"three", expected_version=2))

            transport.between = other_writes
            transport.armed = True
            try:
                with pytest.raises(RecordUnknown):
                    await records.put_record(key, b"two", expected_version=1)
            finally:
                await transport.close()
            # The premise: the write cut short was chosen, then overwritten.
            assert seen == [(2, b"two"), 3]
    finally:
        cluster.down(purge=True)
