"""Gray failure: a frozen peer (SIGSTOP: the kernel still accepts its connections, it
never answers) must not hold a client's writes or reads for the transport's read
timeout (30 s), nor for one attempt's timeout (``ClientOptions.write_attempt_s``,
``read_attempt_s``). Writes return once W replicas acknowledged, chunk reads hedge to the
next replica, creates hedge to the fifth acceptor, record reads answer as soon as the
live acceptors' slots show the value chosen (``ring.paxos.chosen_value``) or else run a
round once the silent acceptor has had its patience, and what the client stores stays
intact.

Real peers on the shared ring; the frozen peer is always resumed (SIGCONT) afterwards.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from support import MakeCluster, chunk_holders, frozen

from ring import codec
from ring.client import Client, ClientOptions
from ring.client.options import BLOB_KEY_PREFIX
from ring.client.proposer import Acceptors
from ring.client.view import (
    HEDGE_DELAY_S_MAX,
    HEDGE_DELAY_S_MIN,
    Early,
    RingTracker,
    RingView,
    hedge_delay_s,
)
from ring.paxos import EMPTY, FAST, NOTHING, Ballot, Slot, Value, chosen_value
from ring.placement import Member
from ring.replicas import Hedge, read_from_replicas
from ring.transport import Response, Transport
from sr3.local import LocalCluster

T = TypeVar("T")

# A functional bound, not a performance figure: the stall it catches is the 30 s read
# timeout; the wide margin below it is for a loaded 2-core machine (each attempt to the
# frozen peer is bounded at 2-5 s). The latencies themselves are in bench_gray.py.
BOUND_S = 20.0


async def within_bound(what: str, op: Callable[[], Awaitable[T]]) -> T:
    started = time.monotonic()
    async with asyncio.timeout(60):  # so that a regression fails instead of hanging
        result = await op()
    elapsed_s = time.monotonic() - started
    assert elapsed_s < BOUND_S, f"{what} took {elapsed_s:.1f} s with one peer frozen"
    return result


def replicated_on(view: RingView, key: str, peer_id: str) -> bool:
    """Whether ``peer_id`` is one of the R peers that hold ``key`` (its preference list;
    ``candidates`` would name every member)."""
    preferred = view.ring.preference_list(key, view.replication)
    return peer_id in {member.peer_id for member in preferred}


def key_on(view: RingView, peer_id: str, stem: str, prefix: str = "") -> str:
    """A key named ``stem-N`` whose replicas (with ``prefix``) include ``peer_id``."""
    for index in range(1000):
        if replicated_on(view, f"{prefix}{stem}-{index}", peer_id):
            return f"{stem}-{index}"
    raise AssertionError(f"no key of {stem} on {peer_id}")


def data_on(view: RingView, peer_id: str, rng: random.Random, size: int = 50_000) -> bytes:
    """``size`` bytes (one chunk) whose chunk has ``peer_id`` among its replicas."""
    for _attempt in range(1000):
        data = rng.randbytes(size)
        if replicated_on(view, codec.chunk_id(data), peer_id):
            return data
    raise AssertionError(f"no chunk on {peer_id}")


def names_in_fast_quorum(view: RingView, peer_id: str, stem: str, count: int) -> list[str]:
    """``count`` file names whose records' fast quorum (the acceptors a create asks)
    includes ``peer_id``."""
    names = []
    for index in range(1000):
        acceptors = Acceptors.of(view, f"{BLOB_KEY_PREFIX}{stem}-{index}")
        if peer_id in [m.peer_id for m in acceptors.members[: acceptors.fast_quorum]]:
            names.append(f"{stem}-{index}")
            if len(names) == count:
                return names
    raise AssertionError(f"no {count} records of {stem} ask {peer_id} in a create")


async def test_with_one_peer_frozen_puts_and_gets_return_within_the_bound(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: SIGSTOP one of 5 peers (R=3, W=2): the first replica of a stored file's
    chunk, and a replica of every chunk and record the test then touches. Must hold,
    with a client that still believes the peer up: a named put and get, a record
    compare-and-set and read each return within BOUND_S (today: 30 s, the read timeout)
    with the right bytes and versions, the record read without a consensus round (the
    two live acceptors' slots show the value just chosen at a classic ballot); once the
    client's background writes are done, the new chunk is on R live peers (a stand-in
    holds the frozen peer's copy); after SIGCONT everything reads back intact."""
    before = rng.randbytes(50_000)
    async with Client(ring.ring, ring.secret) as client:
        view = await client.ring()
        victim = view.ring.candidates(codec.chunk_id(before), view.replication)[0].peer_id
        key_before = key_on(view, victim, "gray/before", BLOB_KEY_PREFIX)
        key_after = key_on(view, victim, "gray/after", BLOB_KEY_PREFIX)
        record_key = key_on(view, victim, "gray/record")
        after = data_on(view, victim, rng)
        await client.put_bytes(before, key_before)
        version = await client.put_record(record_key, b"one", expected_version=0)

    with frozen(ring, victim):
        async with Client(ring.ring, ring.secret) as client:
            await within_bound("put_bytes", lambda: client.put_bytes(after, key_after))
            got = await within_bound("get_bytes", lambda: client.get_bytes(key_before))
            assert got == before
            written = await within_bound(
                "put_record",
                lambda: client.put_record(record_key, b"two", expected_version=version),
            )
            assert written == version + 1
            rounds_for_reads = client.records.rounds_for_reads
            record = await within_bound("get_record", lambda: client.get_record(record_key))
            assert record is not None and (record.version, record.value) == (written, b"two")
            assert client.records.rounds_for_reads == rounds_for_reads
            assert await within_bound("get_bytes", lambda: client.get_bytes(key_after)) == after
            await client.view.aclose()
            assert client.view.background_lanes() == 0
            live = set(chunk_holders(ring, codec.chunk_id(after))) - {victim}
            assert len(live) >= view.replication, live

    async with Client(ring.ring, ring.secret) as client:
        assert await client.get_bytes(key_before) == before
        assert await client.get_bytes(key_after) == after
        record = await client.get_record(record_key)
        assert record is not None and (record.version, record.value) == (written, b"two")


FILE_BYTES = 4 * 1024 * 1024
FILES = 3
# Attempts that outlast any hedge by far (hedges and the patience of reads wait at most
# HEDGE_DELAY_S_MAX): a call that waited for one to the frozen peer to time out leaves
# the client believing the peer down. The member table is fetched once, before the
# ring's failure detector can say the peer is down.
PATIENT = ClientOptions(
    write_attempt_s=30.0, read_attempt_s=30.0, ring_refresh_s=3600.0, close_wait_s=1.0
)


async def test_with_one_peer_frozen_creates_and_record_reads_never_wait_on_its_timeout(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: SIGSTOP one of 5 peers (R=3, W=2, records on all five): an acceptor in the
    fast quorum (the four acceptors a create asks) of every file the test touches, and
    the first replica of each new file's 4 MiB chunk. The files stored before the freeze
    were created on four acceptors including it (the fifth gets a copy only from repair,
    hourly on this ring), so the live acceptors' slots alone do not show them chosen.
    Must hold, for a client whose attempts to a silent peer last 30 s and that still
    believes the peer up: puts of new 4 MiB files and gets of the files stored before
    each return the right bytes without any attempt to the frozen peer timing out (the
    client never marks it down): each create's accept went to the fifth acceptor once the
    frozen one was silent past the hedge delay, and each read ran a round once the
    frozen acceptor was silent past its patience, instead of waiting for its slot."""
    async with Client(ring.ring, ring.secret) as client:
        view = await client.ring()
        victim = rng.choice(view.ring.members)
        before = names_in_fast_quorum(view, victim.peer_id, "frozen/before", FILES)
        after = names_in_fast_quorum(view, victim.peer_id, "frozen/after", FILES)
        stored = {name: rng.randbytes(FILE_BYTES) for name in before}
        for name in after:
            stored[name] = data_on(view, victim.peer_id, rng, FILE_BYTES)
        for name in before:
            await client.put_bytes(stored[name], name)

    with frozen(ring, victim.peer_id):
        async with Client(ring.ring, ring.secret, options=PATIENT) as client:
            await client.ring()
            for put_name, get_name in zip(after, before, strict=True):
                await client.put_bytes(stored[put_name], put_name)
                assert not client.view.is_down(victim), f"put {put_name} waited for it"
                assert await client.get_bytes(get_name) == stored[get_name]
                assert not client.view.is_down(victim), f"get {get_name} waited for it"
            for name in after:
                assert await client.get_bytes(name) == stored[name]
            assert not client.view.is_down(victim)
            stats = client.records.proposer.stats
            assert (stats.fast_creates, stats.fast_hedges) == (FILES, FILES)

    async with Client(ring.ring, ring.secret) as client:
        for name, data in stored.items():
            assert await client.get_bytes(name) == data


async def test_in_a_ring_of_three_a_frozen_acceptor_costs_a_create_a_classic_round(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: SIGSTOP one peer of a ring of three (R=3, W=2: every record on all three,
    and a create's fast round needs all three, so there is no acceptor to hedge to).
    Must hold, for a client whose attempts to a silent peer last 30 s and that still
    believes the peer up: a put of a new file gives its fast round up once the frozen
    acceptor was silent past the hedge delay, and a classic round of the two live ones
    names the file; a get of a file stored before the freeze (two live slots at ballot 0
    do not show it chosen) runs a round; neither waits for an attempt to time out, and
    both files read back after the thaw."""
    cluster = make_cluster(3, peer_flags=["--scrub-rate", "0", "--repair-interval", "3600"])
    before, after = rng.randbytes(50_000), rng.randbytes(50_000)
    async with Client(cluster.ring, cluster.secret) as client:
        victim = rng.choice((await client.ring()).ring.members)
        await client.put_bytes(before, "three/before")

    with frozen(cluster, victim.peer_id):
        async with Client(cluster.ring, cluster.secret, options=PATIENT) as client:
            await client.put_bytes(after, "three/after")
            assert not client.view.is_down(victim)
            assert await client.get_bytes("three/before") == before
            assert not client.view.is_down(victim)
            stats = client.records.proposer.stats
            assert (stats.fast_creates, stats.fast_abandoned) == (0, 1)

    async with Client(cluster.ring, cluster.secret) as client:
        assert await client.get_bytes("three/before") == before
        assert await client.get_bytes("three/after") == after


def test_hedge_delay_is_the_p95_of_recent_latencies_within_its_bounds() -> None:
    assert hedge_delay_s([0.010] * 95 + [0.5] * 5) == pytest.approx(0.010)
    assert hedge_delay_s([0.010] * 94 + [0.5] * 6) == pytest.approx(0.5)
    assert hedge_delay_s([0.0001] * 100) == HEDGE_DELAY_S_MIN
    assert hedge_delay_s([30.0] * 100) == HEDGE_DELAY_S_MAX


def test_two_live_acceptors_decide_a_read_only_when_their_slots_show_the_value_chosen() -> None:
    """Breaks: one of a key's three acceptors (R=3, W=2) is frozen, so a read has the
    slots of two. Must hold: they decide it without a round only when they show the
    value chosen: both accepted it at one classic ballot, or neither accepted anything
    (absent); a fast-round value needs all three; two answers at different ballots,
    with different values, or a value beside an empty slot (a stale copy and a new owner
    after a join) decide nothing: a round must."""
    ballot, later = Ballot(4, "ab"), Ballot(5, "cd")
    one = Value(3, b"a", op="01")
    other = Value(3, b"b", op="02")
    older = Value(2, b"b", op="03")
    tombstone = Value(4, deleted=True, op="04")

    def read(*slots: Slot) -> Value | None:
        return chosen_value(slots, 3, 2)

    assert read(Slot(later, ballot, one), Slot(ballot, ballot, one)) == one
    assert read(NOTHING, Slot(ballot)) == EMPTY  # a bare promise accepted nothing
    assert read(Slot(ballot, ballot, one)) is None  # one answer is not enough
    assert read(Slot(ballot, ballot, one), Slot(later, later, one)) is None
    assert read(Slot(ballot, ballot, one), Slot(ballot, ballot, other)) is None
    assert read(Slot(ballot, ballot, one), Slot(later, later, tombstone)) is None
    assert read(Slot(ballot, ballot, one), Slot(ballot, ballot, older)) is None
    assert read(Slot(ballot, ballot, one), NOTHING) is None
    assert read(Slot(FAST, FAST, one), Slot(FAST, FAST, one)) is None
    assert read(*[Slot(FAST, FAST, one)] * 3) == one


class SilentFirst:
    """A stand-in for the transport: ``silent`` never answers (until cancelled), every
    other address serves ``stored``."""

    def __init__(self, silent: str, stored: bytes) -> None:
        self.silent = silent
        self.stored = stored
        self.cancelled: list[str] = []

    async def request(self, address: str, method: str, path_qs: str, **_: object) -> Response:
        if address == self.silent:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(address)
                raise
        return Response(200, {}, self.stored)


async def test_a_hedged_read_takes_the_next_replica_when_the_first_is_silent() -> None:
    """Breaks: the first replica of a chunk never answers. Must hold: the walk asks the
    second after the hedge delay, returns its verified copy, cancels the silent request
    and names the silent replica as outpaced."""
    raw = b"gray" * 1000
    chunk_id, stored = codec.encode(raw)
    members = [Member("p1", "a:1"), Member("p2", "b:1"), Member("p3", "c:1")]
    transport = SilentFirst("a:1", stored)
    outpaced: list[Member] = []
    read = await asyncio.wait_for(
        read_from_replicas(
            transport,  # type: ignore[arg-type]
            members,
            chunk_id,
            check="raw",
            hedge=Hedge(0.01, 1, time.monotonic, on_outpaced=outpaced.append),
        ),
        timeout=5,
    )
    assert (read.data, read.holder) == (raw, members[1])
    assert outpaced == [members[0]] and transport.cancelled == ["a:1"]


async def test_a_write_fan_out_returns_at_quorum_and_tracks_the_rest() -> None:
    """Breaks: one of three replicas holds its write open. Must hold: the fan-out returns
    once two acknowledged, the third lane goes on in the background (counted), finishes
    there when the replica answers, and ``aclose`` leaves nothing running."""
    members = [Member("p1", "a:1"), Member("p2", "b:1"), Member("p3", "c:1")]
    release = asyncio.Event()
    view = RingTracker(("a:1",), Transport("x" * 32), ClientOptions(), time.monotonic)

    async def write(member: Member, _hint: Member | None) -> str:
        if member.peer_id == "p1":
            await release.wait()
        return member.peer_id

    result = await asyncio.wait_for(
        view.fan_out(
            members,
            3,
            write,
            early=Early(lambda answers, _running: len(answers) >= 2, 0.0, background=True),
        ),
        timeout=5,
    )
    assert sorted(peer for _member, peer in result.answers) == ["p2", "p3"]
    assert result.unfinished == 1 and view.background_lanes() == 1
    release.set()
    await view.aclose()
    assert view.background_lanes() == 0
    assert sorted(peer for _member, peer in result.answers) == ["p1", "p2", "p3"]


async def test_a_fan_out_hedges_a_silent_lane_with_the_next_candidate() -> None:
    """Breaks: one of the three peers a fan-out asks first never answers (a fast round's
    acceptor). Must hold: after the hedge delay the fourth candidate is asked beside it,
    standing in for it; the fan-out returns with three answers and hands the silent
    lane to the background, and only one hedge is started."""
    members = [Member(f"p{index}", f"{index}:1") for index in range(1, 6)]
    release = asyncio.Event()
    asked: list[tuple[str, str | None]] = []
    view = RingTracker(("a:1",), Transport("x" * 32), ClientOptions(), time.monotonic)

    async def accept(member: Member, stand_in_for: Member | None) -> bool:
        asked.append((member.peer_id, stand_in_for and stand_in_for.peer_id))
        if member.peer_id == "p2":
            await release.wait()
        return True

    result = await asyncio.wait_for(
        view.fan_out(
            members,
            3,
            accept,
            early=Early(lambda answers, _running: len(answers) >= 3, 0.0, background=True),
            hedge_s=0.01,
        ),
        timeout=5,
    )
    assert sorted(member.peer_id for member, _ok in result.answers) == ["p1", "p3", "p4"]
    assert ("p4", "p2") in asked and len(asked) == 4
    assert (result.hedged, result.unfinished) == (1, 1)
    release.set()
    await view.aclose()


async def test_a_fan_out_whose_answers_will_do_waits_for_a_silent_lane_only_its_patience() -> None:
    """Breaks: one of three strictly asked peers never answers, and the two others'
    answers never make ``enough`` hold (a record read whose slots disagree). Must hold:
    once ``will_do`` holds, the silent lane gets ``patience_s`` and the fan-out returns
    with the two answers (it would otherwise wait for the attempt timeout)."""
    members = [Member("p1", "a:1"), Member("p2", "b:1"), Member("p3", "c:1")]
    view = RingTracker(("a:1",), Transport("x" * 32), ClientOptions(), time.monotonic)

    async def read(member: Member, _stand_in_for: Member | None) -> str:
        if member.peer_id == "p1":
            await asyncio.Event().wait()
        return member.peer_id

    result = await asyncio.wait_for(
        view.fan_out(
            members,
            3,
            read,
            strict=True,
            early=Early(
                lambda _answers, _running: False,
                0.0,
                background=False,
                will_do=lambda answers, _running: len(answers) >= 2,
                patience_s=0.01,
            ),
            attempt_s=60.0,
        ),
        timeout=5,
    )
    assert sorted(answer for _member, answer in result.answers) == ["p2", "p3"]
    assert result.unfinished == 1 and not view.is_down(members[0])
