"""Reading a file of the ``sr3://`` namespace: its inline bytes, or the ranges of its
chunks, fetched directly when they are few and along a recovery plan (star, line or
tree, as the cost model picks) when they are many. Chunks the serving peer holds are
read from its own store either way (``ChunkIO.fetch_local``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from filesystem.entries import Entry
from recovery.executor import recover
from ring.blobs import Extent
from ring.client import Client
from ring.client.chunks import first_error
from ring.errors import DataUnavailable

__all__ = ["read_entry"]

# A read of at least this many chunks goes through recovery's executor (a plan along
# star, line or tree), a window of RECOVERY_WINDOW_CHUNKS at a time; fewer are fetched
# directly.
RECOVERY_CHUNKS_MIN = 4
RECOVERY_WINDOW_CHUNKS = 16


async def read_entry(
    client: Client, entry: Entry, offset: int, length: int
) -> AsyncIterator[bytes]:
    """The bytes ``[offset, offset + length)`` of a file, piece by piece."""
    if entry.blob is None:
        yield entry.inline[offset : offset + length]
        return
    end = offset + length
    wanted: list[tuple[Extent, int, int]] = []
    position = 0
    for extent in entry.blob.extents:
        start, stop = position, position + extent.length
        position = stop
        if stop <= offset or start >= end:
            continue
        wanted.append((extent, max(offset, start) - start, min(end, stop) - start))
    if len(wanted) < RECOVERY_CHUNKS_MIN:
        fetched = await _fetch_directly(client, [extent.chunk_id for extent, _lo, _hi in wanted])
        for extent, lo, hi in wanted:
            yield _slice(fetched, extent)[lo:hi]
        return
    for first in range(0, len(wanted), RECOVERY_WINDOW_CHUNKS):
        window = wanted[first : first + RECOVERY_WINDOW_CHUNKS]
        fetched = await _recover(client, [extent.chunk_id for extent, _lo, _hi in window])
        for extent, lo, hi in window:
            yield _slice(fetched, extent)[lo:hi]


async def _fetch_directly(client: Client, chunk_ids: list[str]) -> dict[str, bytes]:
    """A few chunks, each from the first of its replicas that serves it."""
    fetched: dict[str, bytes] = {}
    slots = asyncio.Semaphore(client.options.transfers_max)

    async def one(chunk_id: str) -> None:
        async with slots:
            fetched[chunk_id] = await client.chunks.fetch_chunk(chunk_id)

    try:
        async with asyncio.TaskGroup() as group:
            for chunk_id in dict.fromkeys(chunk_ids):
                group.create_task(one(chunk_id))
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None
    return fetched


async def _recover(client: Client, chunk_ids: list[str]) -> dict[str, bytes]:
    """Many chunks: those this peer holds from its own store while the others come
    along the topology the cost model picks for the holders found and the network
    measured (what a restart's big reads are); a local copy that fails comes that way
    after."""
    fetched: dict[str, bytes] = {}
    wanted = list(dict.fromkeys(chunk_ids))
    here = [chunk_id for chunk_id in wanted if client.chunks.held_locally(chunk_id)]
    held = set(here)
    elsewhere = [chunk_id for chunk_id in wanted if chunk_id not in held]

    async def sink(chunk_id: str, raw: bytes | memoryview) -> None:
        fetched[chunk_id] = bytes(raw)

    async def read_here() -> None:
        for chunk_id in here:
            raw = await client.chunks.fetch_local(chunk_id)
            if raw is not None:
                fetched[chunk_id] = raw

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(read_here())
            if elsewhere:
                group.create_task(recover(client, elsewhere, "auto", sink))
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None
    failed_here = [chunk_id for chunk_id in here if chunk_id not in fetched]
    if failed_here:
        await recover(client, failed_here, "auto", sink)
    return fetched


def _slice(fetched: dict[str, bytes], extent: Extent) -> bytes:
    raw = fetched[extent.chunk_id]
    if extent.offset + extent.length > len(raw):
        raise DataUnavailable([extent.chunk_id], ["the chunk is shorter than its extent"])
    return raw[extent.offset : extent.offset + extent.length]
