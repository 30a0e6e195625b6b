"""Read a chunk from the next replica that gives a verified copy: the one walk that the
client, the recovery relay and the scrubber share.

Each caller decides which replicas to ask and in what order (the client puts peers it
believes down last, the relay skips peers that failed its stream, the scrubber skips
itself) and what an unreachable peer means to it (``on_unreachable``); the walk itself,
the request, the verification and which failures move on to the next replica are here.
A copy that fails verification is never returned: the next replica is asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from ring import api, codec
from ring.errors import ChunkCorrupt, PeerError, PeerUnavailable
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Check", "ReplicaRead", "fetch_chunk_from", "read_from_replicas"]

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
) -> ReplicaRead:
    """Ask ``replicas`` in order until one gives a copy that verifies.

    A replica that fails with one of ``tolerated`` (or does not answer within
    ``time_limit_s(member)``) is skipped; ``on_unreachable`` hears of those that could
    not be reached or timed out. ``store``, if given, is awaited with the copy before the
    walk ends, and a tolerated failure there moves on to the next replica too (the
    scrubber stores the copy it fetched, and a copy the store refuses is no good).
    """
    read = ReplicaRead()
    for member in replicas:
        limit_s = time_limit_s(member)
        try:
            async with asyncio.timeout(limit_s):
                data = await fetch_chunk_from(transport, member.address, chunk_id, check=check)
            if store is not None:
                await store(data)
        except TimeoutError:
            read.causes.append(f"{member.address}: no answer within {limit_s} s")
            on_unreachable(member)
            continue
        except tolerated as exc:
            read.causes.append(str(exc))
            if isinstance(exc, PeerUnavailable):
                on_unreachable(member)
            continue
        read.data, read.holder = data, member
        return read
    return read
