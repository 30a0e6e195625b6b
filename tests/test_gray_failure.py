"""Gray failure: a frozen peer (SIGSTOP: the kernel still accepts its connections, it
never answers) must not hold a client's writes or reads for the transport's read
timeout (30 s). Writes return once W replicas acknowledged, reads hedge to the next
replica, and what the client stores stays intact.

Real peers on the shared ring; the frozen peer is always resumed (SIGCONT) afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from support import chunk_holders

from ring import codec
from ring.client import Client, ClientOptions
from ring.client.options import BLOB_KEY_PREFIX, RecordValue
from ring.client.records import agreed
from ring.client.view import (
    HEDGE_DELAY_S_MAX,
    HEDGE_DELAY_S_MIN,
    Early,
    RingTracker,
    RingView,
    hedge_delay_s,
)
from ring.placement import Member
from ring.replicas import Hedge, read_from_replicas
from ring.transport import Response, Transport
from sr3.local import LocalCluster

T = TypeVar("T")

# A functional bound, not a performance figure: the stall it catches is the 30 s read
# timeout; the wide margin below it is for a loaded 2-core machine (each attempt to the
# frozen peer is bounded at 2-5 s). The latencies themselves are in bench_gray.py.
BOUND_S = 20.0


@contextlib.contextmanager
def frozen(cluster: LocalCluster, peer_id: str) -> Iterator[None]:
    cluster.signal(peer_id, signal.SIGSTOP)
    try:
        yield
    finally:
        cluster.signal(peer_id, signal.SIGCONT)


async def within_bound(what: str, op: Callable[[], Awaitable[T]]) -> T:
    started = time.monotonic()
    async with asyncio.timeout(60):  # so that a regression fails instead of hanging
        result = await op()
    elapsed_s = time.monotonic() - started
    assert elapsed_s < BOUND_S, f"{what} took {elapsed_s:.1f} s with one peer frozen"
    return result


def replicated_on(view: RingView, key: str, peer_id: str) -> bool:
    return peer_id in {member.peer_id for member in view.ring.candidates(key, view.replication)}


def key_on(view: RingView, peer_id: str, stem: str, prefix: str = "") -> str:
    """A key named ``stem-N`` whose replicas (with ``prefix``) include ``peer_id``."""
    for index in range(1000):
        if replicated_on(view, f"{prefix}{stem}-{index}", peer_id):
            return f"{stem}-{index}"
    raise AssertionError(f"no key of {stem} on {peer_id}")


def data_on(view: RingView, peer_id: str, rng: random.Random) -> bytes:
    """Bytes whose single chunk has ``peer_id`` among its replicas."""
    for _attempt in range(1000):
        data = rng.randbytes(50_000)
        if replicated_on(view, codec.chunk_id(data), peer_id):
            return data
    raise AssertionError(f"no chunk on {peer_id}")


async def test_with_one_peer_frozen_puts_and_gets_return_within_the_bound(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: SIGSTOP one of 5 peers (R=3, W=2): the first replica of a stored file's
    chunk, and a replica of every chunk and record the test then touches. Must hold,
    with a client that still believes the peer up: a named put and get, a record
    compare-and-set and read each return within BOUND_S (today: 30 s, the read timeout)
    with the right bytes and versions; once the client's background writes are done, the
    new chunk is on R live peers (a stand-in holds the frozen peer's copy); after SIGCONT
    everything reads back intact."""
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
            record = await within_bound("get_record", lambda: client.get_record(record_key))
            assert record is not None and (record.version, record.value) == (written, b"two")
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


def test_hedge_delay_is_the_p95_of_recent_latencies_within_its_bounds() -> None:
    assert hedge_delay_s([0.010] * 95 + [0.5] * 5) == pytest.approx(0.010)
    assert hedge_delay_s([0.010] * 94 + [0.5] * 6) == pytest.approx(0.5)
    assert hedge_delay_s([0.0001] * 100) == HEDGE_DELAY_S_MIN
    assert hedge_delay_s([30.0] * 100) == HEDGE_DELAY_S_MAX


def test_a_read_quorum_that_disagrees_at_the_newest_version_is_not_enough() -> None:
    """A read may return before every replica answered only when the answers it has
    agree on the newest value: concurrent writers of one version leave different values,
    and the one most replicas hold (the winner) needs every answer."""
    one = RecordValue("k", 3, b"a")
    other = RecordValue("k", 3, b"b")
    older = RecordValue("k", 2, b"b")
    assert agreed([None, None])
    assert agreed([one, RecordValue("k", 3, b"a")])
    assert not agreed([one, other])
    assert not agreed([one, RecordValue("k", 3, b"", deleted=True)])
    # A stale or missing copy waits for every replica: after a join the reader's
    # preferred peers may not be those the newest write was acknowledged on (W=2 on
    # A and B; the reader asks B, C, D; B is slow, C missed the write, D is new).
    assert not agreed([one, older])
    assert not agreed([older, None])


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
