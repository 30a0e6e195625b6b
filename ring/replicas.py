"""Read a chunk from the next replica that gives a verified copy: the one walk that the
client, the recovery relay and the scrubber share.

Each caller decides which replicas to ask and in what order (the client puts peers it
believes down last, the relay skips peers that failed its stream, the scrubber skips
itself) and what an unreachable peer means to it (``on_unreachable``); the walk itself,
the request, the verification and which failures move on to the next replica are here.
A copy that fails verification is never returned: the next replica is asked.

A walk may hedge (``Hedge``, the client's reads): a replica that stays silent past a
short, measured delay does not hold it, the next one is asked as well and the first copy
that verifies wins ("The Tail at Scale"; Cassandra's speculative retry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ring import api, codec
from ring.errors import ChunkCorrupt, PeerError, PeerUnavailable
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Check", "Hedge", "ReplicaRead", "fetch_chunk_from", "read_from_replicas"]

# How a copy is verified, and what comes back:
#   "checksum"  header and payload checksum, no decompression; the stored form (a relay's
#               check: the requester decodes end to end)
#   "content"   end to end (content address); the stored form (to store it again)
#   "raw"       end to end; the raw bytes
Check = Literal["checksum", "content", "raw"]

# Failures that move the walk on to the next replica; anything else propagates.
TOLERATED_DEFAULT: tuple[type[Exception], ...] = (PeerError, ChunkCorrupt)


@dataclass(slots=True)
class ReplicaRead:
    """The verified bytes and who gave them, or None and why each replica failed."""

    data: bytes | None = None
    holder: Member | None = None
    causes: list[str] = field(default_factory=list)


def _verify(stored: bytes, chunk_id: str, check: Check) -> bytes:
    if check == "raw":
        return codec.decode(stored, chunk_id)
    if check == "content":
        codec.decode_view(stored, chunk_id)
    else:
        codec.verify_stored(stored, chunk_id)
    return stored


async def fetch_chunk_from(
    transport: Transport, address: str, chunk_id: str, *, check: Check
) -> bytes:
    """One replica's copy of ``chunk_id``, verified as ``check`` says (raises
    ``ChunkCorrupt`` for a copy that fails, ``PeerError`` for a peer that fails)."""
    answer = await transport.request(
        address, "GET", api.chunk_path(chunk_id), body_bytes_max=codec.STORED_BYTES_MAX
    )
    if check == "checksum":
        return _verify(answer.body, chunk_id, check)
    return await asyncio.to_thread(_verify, answer.body, chunk_id, check)


async def read_from_replicas(
    transport: Transport,
    replicas: Iterable[Member],
    chunk_id: str,
    *,
    check: Check,
    tolerated: tuple[type[Exception], ...] = TOLERATED_DEFAULT,
    time_limit_s: Callable[[Member], float | None] = lambda _member: None,
    on_unreachable: Callable[[Member], None] = lambda _member: None,
    store: Callable[[bytes], Awaitable[object]] | None = None,
    hedge: Hedge | None = None,
) -> ReplicaRead:
    """Ask ``replicas`` in order until one gives a copy that verifies.

    A replica that fails with one of ``tolerated`` (or does not answer within
    ``time_limit_s(member)``) is skipped; ``on_unreachable`` hears of those that could
    not be reached or timed out. ``store``, if given, is awaited with the copy before the
    walk ends, and a tolerated failure there moves on to the next replica too (the
    scrubber stores the copy it fetched, and a copy the store refuses is no good).

    With ``hedge``, a replica still silent after ``hedge.delay_s`` does not hold the walk:
    the next one is asked too (at most ``hedge.hedges_max`` extra requests in flight);
    the first copy that verifies wins and the others are cancelled.
    """

    async def attempt(member: Member) -> bytes | None:
        limit_s = time_limit_s(member)
        try:
            async with asyncio.timeout(limit_s):
                data = await fetch_chunk_from(transport, member.address, chunk_id, check=check)
            if store is not None:
                await store(data)
        except TimeoutError:
            read.causes.append(f"{member.address}: no answer within {limit_s} s")
            on_unreachable(member)
            return None
        except tolerated as exc:
            read.causes.append(str(exc))
            if isinstance(exc, PeerUnavailable):
                on_unreachable(member)
            return None
        return data

    read = ReplicaRead()
    if hedge is not None:
        await _hedged_walk(iter(replicas), attempt, hedge, read)
        return read
    for member in replicas:
        data = await attempt(member)
        if data is not None:
            read.data, read.holder = data, member
            return read
    return read


@dataclass(frozen=True, slots=True)
class Hedge:
    """How a walk hedges: after ``delay_s`` without an answer, ask the next replica too,
    with at most ``hedges_max`` extra requests in flight. ``on_answer`` hears how long
    the winning request took (by ``clock``), ``on_outpaced`` of each replica still silent
    when another answered."""

    delay_s: float
    hedges_max: int
    clock: Callable[[], float]
    on_answer: Callable[[Member, float], None] = lambda _member, _seconds: None
    on_outpaced: Callable[[Member], None] = lambda _member: None


async def _hedged_walk(
    walk: Iterator[Member],
    attempt: Callable[[Member], Coroutine[Any, Any, bytes | None]],
    hedge: Hedge,
    read: ReplicaRead,
) -> None:
    """Run ``attempt`` along ``walk``: the next replica starts when one fails, or when
    the newest request has been silent for ``hedge.delay_s`` and hedges are left."""
    running: dict[asyncio.Task[bytes | None], tuple[Member, float]] = {}

    def launch() -> bool:
        member = next(walk, None)
        if member is None:
            return False
        running[asyncio.create_task(attempt(member))] = (member, hedge.clock())
        return True

    exhausted = not launch()
    try:
        while running:
            may_hedge = not exhausted and len(running) <= hedge.hedges_max
            done, _ = await asyncio.wait(
                running, timeout=hedge.delay_s if may_hedge else None,
                return_when=asyncio.FIRST_COMPLETED,
            )  # fmt: skip
            if not done:
                exhausted = not launch()
                continue
            for task in done:
                member, started = running.pop(task)
                data = task.result()
                if data is not None and read.data is None:
                    read.data, read.holder = data, member
                    hedge.on_answer(member, hedge.clock() - started)
                elif data is None and not exhausted:
                    exhausted = not launch()
            if read.data is not None:
                for member, _started in running.values():
                    hedge.on_outpaced(member)
                return
    finally:
        tasks = list(running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
