"""Writing a file of the ``sr3://`` namespace: a small body becomes the record's inline
bytes; a large one is cut into chunks, each stored on its replicas (durable on W of
them) before the record that names them is written, at most ``transfers_max`` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import xxhash

from filesystem.entries import INLINE_BYTES_MAX, Entry
from ring.blobs import BlobRef, Extent
from ring.client import Client
from ring.client.chunks import first_error

__all__ = ["upload"]


async def upload(client: Client, body: AsyncIterator[bytes], wall_ms: Callable[[], int]) -> Entry:
    """The file entry of ``body``'s bytes (already bounded by the caller): inline when
    they are at most ``INLINE_BYTES_MAX``, else chunks stored on their replicas."""
    try:
        return await _cut_and_store(client, body, wall_ms)
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None


async def _cut_and_store(
    client: Client, body: AsyncIterator[bytes], wall_ms: Callable[[], int]
) -> Entry:
    chunk_bytes = client.options.chunk_bytes
    buffer = bytearray()
    hasher = xxhash.xxh3_128()
    size = 0
    slots = asyncio.Semaphore(client.options.transfers_max)
    ids: dict[int, str] = {}

    async def store(index: int, raw: bytes) -> None:
        try:
            ids[index] = await client.chunks.store_raw_chunk(raw)
        finally:
            slots.release()

    async with asyncio.TaskGroup() as group:
        pieces: list[int] = []

        async def cut(final: bool) -> None:
            while len(buffer) >= chunk_bytes or (final and buffer):
                raw = bytes(buffer[:chunk_bytes])
                del buffer[:chunk_bytes]
                await slots.acquire()
                pieces.append(len(raw))
                group.create_task(store(len(pieces) - 1, raw))

        async for piece in body:
            size += len(piece)
            hasher.update(piece)
            buffer += piece
            if size > INLINE_BYTES_MAX:
                await cut(final=False)
        if size <= INLINE_BYTES_MAX:
            return Entry("file", size, wall_ms(), bytes(buffer))
        await cut(final=True)
    extents = [Extent(ids[i], 0, length) for i, length in enumerate(pieces)]
    blob = BlobRef(size, hasher.hexdigest(), tuple(extents))
    return Entry("file", size, wall_ms(), b"", blob)
