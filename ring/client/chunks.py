"""The client's chunks and blobs: cut sources into chunks, store each on W..R replicas,
read blobs back verified end to end.

A chunk goes to the first R reachable peers of its preference list (a peer that cannot
be reached is replaced by the next one, which keeps a hint for it) and is stored once W
acknowledge: the write returns then, after a short grace for the others, and lanes still
running finish in the background (``RingTracker.fan_out``). A read walks the same list,
live peers first, until a replica gives a copy that verifies (``ring.replicas``); a
replica silent past the hedge delay does not hold it, the next one is asked too. At most
``transfers_max`` chunks are in flight per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import xxhash

from ring import api, codec
from ring.auth import BodyDigest
from ring.blobs import BlobRef, ChunkPlan, Extent, plan_chunks
from ring.client.options import ClientOptions, Progress, Source, file_source
from ring.client.view import Early, LatencyWindow, RingTracker, added_members
from ring.errors import ChunkCorrupt, DataUnavailable, QuorumError
from ring.placement import Member
from ring.replicas import Hedge, read_from_replicas
from ring.transport import Body, Transport

__all__ = ["ChunkIO", "LocalChunks", "first_error"]

log = logging.getLogger(__name__)

# A chunk whose stored form every replica refuses as corrupt is encoded again from its
# raw bytes, this many times in all.
ENCODE_ATTEMPTS_MAX = 2
REFUSED_AS_CORRUPT = "HTTP 422 chunk_corrupt"
# A one-piece chunk at least this large is read into a buffer reused across the chunks
# of a call (``put_sources``); smaller ones (packed files, a blob's tail) are read fresh.
BUFFERED_READ_BYTES_MIN = 1024 * 1024


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first leaf of an exception group, so callers see one sr3 error."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


class LocalChunks(Protocol):
    """The chunk store of the peer a client runs in (the namespace a peer serves reads
    through its own client): ``has`` says whether it holds a chunk; ``read_local`` gives
    a chunk's stored form, checked, or None when it is not held there, and raises
    ``ChunkCorrupt`` for a copy that fails (which the store quarantines)."""

    def has(self, chunk_id: str) -> bool: ...

    async def read_local(self, chunk_id: str) -> bytes | None: ...


class ChunkIO:
    """Chunks and blobs on the ring, through a client's transport and ring view; with
    ``local``, a chunk read takes the copy in this process's own store when it is there
    and verifies (a chunk is immutable: any copy that matches its address is the chunk),
    before asking replicas over the network."""

    def __init__(
        self,
        transport: Transport,
        view: RingTracker,
        options: ClientOptions,
        local: LocalChunks | None = None,
    ) -> None:
        self._transport = transport
        self._view = view
        self.options = options
        self._local = local
        # How long recent chunk reads and writes took: the hedge delay of reads, the
        # grace that a write's slower replicas get once W acknowledged.
        self.read_latency = LatencyWindow()
        self.write_latency = LatencyWindow()

    # -- one chunk ----------------------------------------------------------------------

    async def _put_chunk_to(
        self, member: Member, chunk_id: str, stored: Body, digest: BodyDigest, hint: Member | None
    ) -> None:
        path = api.chunk_path(chunk_id, hint=hint.peer_id if hint is not None else None)
        await self._transport.request(
            member.address, api.CHUNK_PUT.method, path, body=stored, body_digest=digest
        )

    def _encode(self, raw: bytes | memoryview) -> tuple[str, Body, BodyDigest]:
        """The chunk's id, its stored form as header and payload (sent in turn, never
        joined), and the digest of the whole."""
        chunk_id, header, payload = codec.encode_parts(raw)
        stored = (header, payload)
        return chunk_id, stored, self._transport.digest(stored)

    async def store_raw_chunk(self, raw: bytes | memoryview) -> str:
        """Store one chunk on W..R replicas; its id. Bytes that the replicas refuse as not
        matching their address (``chunk_corrupt``: a fault in this process after its own
        check) are encoded again from ``raw`` and sent once more."""
        for attempt in range(1, ENCODE_ATTEMPTS_MAX + 1):
            # Encoded and digested once, off the event loop; every replica gets the same
            # body.
            chunk_id, stored, digest = await asyncio.to_thread(self._encode, raw)
            error = await self._store_encoded(chunk_id, stored, digest)
            if error is None:
                return chunk_id
            refused = any(REFUSED_AS_CORRUPT in cause for cause in error.causes)
            if attempt < ENCODE_ATTEMPTS_MAX and refused:
                log.warning(
                    "chunk %s: replicas refused its bytes as not matching its address; "
                    "encoding it again",
                    chunk_id,
                )
                continue
            raise error
        raise AssertionError("unreachable")

    async def _store_encoded(
        self, chunk_id: str, stored: Body, digest: BodyDigest
    ) -> QuorumError | None:
        """Send one encoding to the chunk's replicas: None once W acknowledged, else the
        error naming why."""
        view = await self._view.ring()
        quorum = view.write_quorum
        result = await self._view.fan_out(
            view.ring.candidates(chunk_id, view.replication),
            view.replication,
            lambda member, hint: self._put_chunk_to(member, chunk_id, stored, digest, hint),
            early=Early(
                lambda answers, _running: len(answers) >= quorum,
                grace_s=self.write_latency.delay_s(),
                background=True,
            ),
            attempt_s=self.options.write_attempt_s,
            latency=self.write_latency,
        )
        if len(result.answers) >= quorum:
            return None
        return QuorumError(f"chunk {chunk_id}", len(result.answers), quorum, result.causes)

    async def _read_walk(
        self, members: Sequence[Member], chunk_id: str
    ) -> tuple[bytes | None, list[str]]:
        read = await read_from_replicas(
            self._transport,
            self._view.live_first(members),
            chunk_id,
            check="raw",
            time_limit_s=self._view.probe_limit_s,
            on_unreachable=self._view.mark_down,
            hedge=Hedge(
                self.read_latency.delay_s(),
                self.options.read_hedges_max,
                self._view.clock,
                on_answer=lambda _member, seconds: self.read_latency.add(seconds),
                on_outpaced=self._view.note_slow,
            ),
        )
        return read.data, read.causes

    def held_locally(self, chunk_id: str) -> bool:
        """Whether this process's own store holds ``chunk_id`` (not yet verified)."""
        return self._local is not None and self._local.has(chunk_id)

    async def fetch_local(self, chunk_id: str) -> bytes | None:
        """The chunk from this process's own store, verified end to end as a replica's
        copy is; None when there is no such store, it does not hold the chunk, or its copy
        fails (the replicas are asked then)."""
        if self._local is None or not self._local.has(chunk_id):
            return None
        try:
            stored = await self._local.read_local(chunk_id)
            if stored is None:
                return None
            return await asyncio.to_thread(codec.decode, stored, chunk_id)
        except (ChunkCorrupt, OSError) as exc:
            # A copy that fails its check is quarantined by the store; a disk that fails
            # to read it is the store's to report. Either way a replica has the chunk.
            log.warning("chunk %s: the local copy failed (%s); reading a replica's", chunk_id, exc)
            return None

    async def fetch_chunk(self, chunk_id: str) -> bytes:
        """A chunk's raw bytes, verified; from the first replica in the walk that has it.

        When no member of the view has it, the members a wider view adds are tried too
        (``wider_ring``): the view may have come from a peer that knows part of the ring."""
        raw = await self.fetch_local(chunk_id)
        if raw is not None:
            return raw
        view = await self._view.ring()
        raw, causes = await self._read_walk(
            view.ring.candidates(chunk_id, view.replication), chunk_id
        )
        if raw is None:
            wider = await self._view.wider_ring(view)
            if wider is not None:
                raw, more = await self._read_walk(added_members(view, wider, chunk_id), chunk_id)
                causes += more
        if raw is None:
            raise DataUnavailable([chunk_id], causes)
        return raw

    # -- blobs --------------------------------------------------------------------------

    async def put_sources(
        self, sources: Sequence[Source], *, progress: Progress | None = None
    ) -> list[BlobRef]:
        """Store many sources, packing small ones; one ``BlobRef`` per source, in order."""
        plans = plan_chunks(
            [source.size for source in sources],
            chunk_bytes=self.options.chunk_bytes,
            pack_below_bytes=self.options.pack_below_bytes,
        )
        hashers = [xxhash.xxh3_128() for _ in sources]
        chunk_ids: list[str] = [""] * len(plans)
        slots = asyncio.Semaphore(self.options.transfers_max)
        # Read buffers of large pieces, reused from chunk to chunk (at most one per
        # transfer in flight): a fresh buffer per chunk costs a page fault every 4 KiB.
        free: list[bytearray] = []

        async def store(index: int, raw: bytes | memoryview, buffer: bytearray | None) -> None:
            try:
                chunk_ids[index] = await self.store_raw_chunk(raw)
                if progress is not None:
                    progress(len(raw))
            finally:
                if buffer is not None:
                    free.append(buffer)
                slots.release()

        try:
            async with asyncio.TaskGroup() as group:
                for index, plan in enumerate(plans):
                    await slots.acquire()
                    buffer = None
                    if _reads_into_buffer(plan, sources):
                        buffer = free.pop() if free else bytearray(self.options.chunk_bytes)
                    raw = await asyncio.to_thread(_build_chunk, plan, sources, hashers, buffer)
                    group.create_task(store(index, raw, buffer))
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None
        return _blob_refs(sources, plans, chunk_ids, hashers)

    async def put_blob(self, data: bytes) -> BlobRef:
        source = Source(len(data), lambda offset, length: data[offset : offset + length])
        return (await self.put_sources([source]))[0]

    async def put_file(self, path: Path, *, progress: Progress | None = None) -> BlobRef:
        return (await self.put_sources([file_source(path)], progress=progress))[0]

    async def _fetch_extent(self, extent: Extent) -> bytes | DataUnavailable:
        try:
            raw = await self.fetch_chunk(extent.chunk_id)
        except DataUnavailable as exc:
            return exc
        if extent.offset + extent.length > len(raw):
            raise ChunkCorrupt(f"chunk {extent.chunk_id} is shorter than the extent naming it")
        return raw[extent.offset : extent.offset + extent.length]

    async def read_blob(
        self,
        ref: BlobRef,
        sink: Callable[[bytes], Awaitable[object]],
        *,
        progress: Progress | None = None,
    ) -> None:
        """Feed a blob's bytes to ``sink`` in order, fetching a bounded window ahead (the
        window's fetches go on while ``sink`` awaits, as when it writes in a thread).

        Raises ``DataUnavailable`` naming every chunk no replica could serve (the sink has
        then received a prefix only), and ``ChunkCorrupt`` if the reassembled blob does not
        match its digest.
        """
        hasher = xxhash.xxh3_128()
        pending: deque[asyncio.Task[bytes | DataUnavailable]] = deque()
        missing: list[DataUnavailable] = []

        async def deliver(piece: bytes | DataUnavailable) -> None:
            if isinstance(piece, DataUnavailable):
                missing.append(piece)
            elif not missing:
                hasher.update(piece)
                await sink(piece)
                if progress is not None:
                    progress(len(piece))

        try:
            async with asyncio.TaskGroup() as group:
                for extent in ref.extents:
                    if len(pending) >= self.options.transfers_max:
                        await deliver(await pending.popleft())
                    pending.append(group.create_task(self._fetch_extent(extent)))
                while pending:
                    await deliver(await pending.popleft())
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None
        if missing:
            names = list(dict.fromkeys(chunk for error in missing for chunk in error.missing))
            raise DataUnavailable(names, [str(error) for error in missing[:1]])
        if hasher.hexdigest() != ref.digest:
            raise ChunkCorrupt(f"reassembled blob does not match its digest {ref.digest}")

    async def get_blob(self, ref: BlobRef) -> bytes:
        pieces: list[bytes] = []

        async def append(piece: bytes) -> None:
            pieces.append(piece)

        await self.read_blob(ref, append)
        return b"".join(pieces)

    async def get_file(self, ref: BlobRef, path: Path, *, progress: Progress | None = None) -> None:
        """Write a blob to ``path`` atomically: a temp file, fsync, then rename. Pieces are
        written in a worker thread while the next ones arrive."""
        tmp = path.with_name(f".{path.name}.sr3-partial")
        try:
            handle = await asyncio.to_thread(open, tmp, "wb")
            with handle:

                async def write(piece: bytes) -> None:
                    await asyncio.to_thread(handle.write, piece)

                await self.read_blob(ref, write, progress=progress)
                handle.flush()
                await asyncio.to_thread(os.fsync, handle.fileno())
            os.replace(tmp, path)
        finally:
            # Cleanup must not raise a second error over the first: a target under a
            # file (ENOTDIR) fails the open and the unlink alike.
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                tmp.unlink()


def _reads_into_buffer(plan: ChunkPlan, sources: Sequence[Source]) -> bool:
    """Whether the chunk is one piece large enough to be read into a reused buffer."""
    if len(plan.pieces) != 1:
        return False
    piece = plan.pieces[0]
    return sources[piece.source].read_into is not None and piece.length >= BUFFERED_READ_BYTES_MIN


def _build_chunk(
    plan: ChunkPlan, sources: Sequence[Source], hashers: list[Any], buffer: bytearray | None
) -> bytes | memoryview:
    """Read a chunk's pieces and feed each source's digest, in source order; a
    one-piece chunk into ``buffer`` when given (``_reads_into_buffer``)."""
    if buffer is not None:
        (piece,) = plan.pieces
        read_into = sources[piece.source].read_into
        assert read_into is not None
        view = memoryview(buffer)[: piece.length]
        read_into(piece.offset, view)
        hashers[piece.source].update(view)
        return view
    parts = []
    for piece in plan.pieces:
        data = sources[piece.source].read(piece.offset, piece.length)
        hashers[piece.source].update(data)
        parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _blob_refs(
    sources: Sequence[Source],
    plans: Sequence[ChunkPlan],
    chunk_ids: Sequence[str],
    hashers: Sequence[Any],
) -> list[BlobRef]:
    extents: list[list[Extent]] = [[] for _ in sources]
    for plan, chunk_id in zip(plans, chunk_ids, strict=True):
        position = 0
        for piece in plan.pieces:
            extents[piece.source].append(Extent(chunk_id, position, piece.length))
            position += piece.length
    return [
        BlobRef(source.size, hasher.hexdigest(), tuple(found))
        for source, hasher, found in zip(sources, hashers, extents, strict=True)
    ]
