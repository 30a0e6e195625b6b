"""``Client``: named files and records on the ring, replicated, verified and bounded.

    async with Client() as client:                  # SR3_RING/SR3_SECRET, else `sr3 cluster up`
        await client.put_file(path, "job1/state")   # chunks on W..R replicas, then named
        await client.get_file("job1/state", out)    # verified end to end, byte-identical
        await client.put_record("jobs/job1", value, expected_version=0)

What the public API stores is named: ``put_file``/``put_bytes`` store the chunks and then
write the record ``blob/<key>`` that names them, and the data is kept until
``delete_file``. Peers collect chunks that no live record references once they have been
unreferenced for ``--gc-grace``; an unnamed upload (``client.chunks``) is an internal step
of layers that write their own records (manifests, drills) within that grace.

The client is a facade over four parts that share one signed, pooled transport:
``RingTracker`` (the member table and which peers are suspected down, ``view.py``),
``ChunkIO`` (chunks and unnamed blobs, ``chunks.py``), ``RecordIO`` (records,
``records.py``) and ``Admin`` (membership and status, ``admin.py``). Concurrency is
bounded: at most ``transfers_max`` chunks in flight per call, at most
``CONNECTIONS_PER_PEER_MAX`` connections per peer, connect and read timeouts on each
request. ``SyncClient`` is the blocking facade for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from ring import api, codec
from ring.auth import SECRET_CHARS_MIN
from ring.blobs import BlobRef
from ring.client.admin import Admin, LeaveReport, RingStatus
from ring.client.chunks import ChunkIO, LocalChunks, first_error
from ring.client.options import (
    BLOB_KEY_PREFIX,
    ClientOptions,
    Progress,
    RecordScan,
    RecordValue,
    Source,
)
from ring.client.records import RecordIO
from ring.client.view import RingTracker, RingView, parse_seeds
from ring.config import ClusterFile, resolve, resolve_tls
from ring.errors import ConfigError, NotFound, ProtocolError, RecordConflict, SR3Error
from ring.tls import client_context
from ring.transport import Transport

__all__ = ["Client", "FileInfo"]

# Naming a file is a compare-and-set on its record; a concurrent writer of the same key
# makes it retry from the version it lost to, this many times at most.
NAME_ATTEMPTS_MAX = 4
# An upload to be named that took this long is stored again once named, in case it
# outlasted the peers' --gc-grace (3600 s by default) and some chunks were collected.
RESTORE_AFTER_S = 300.0

# The network to reach peers on when ``ClientOptions.network`` is not set (else the
# network of the address a seed was reached at).
NETWORK_ENV = "SR3_NETWORK"


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A named file: its key, size in bytes, the version of the record that names it, and
    where its bytes are. ``settled`` is False when more than R - W of the name's acceptors
    were down: the newest version the others hold, which a write that reached only the
    lost acceptors may have replaced (R - 1 losses still lose no stored file)."""

    key: str
    size: int
    version: int
    ref: BlobRef
    settled: bool = True


class Client:
    """Async client of one ring. Use it on one event loop; close it when done.

    ``ring`` (``HOST:PORT[,...]``) and ``secret`` default as for every ``sr3`` command:
    ``SR3_RING`` and ``SR3_SECRET``, else the cluster file ``sr3 cluster up`` writes
    (``$SR3_CLUSTER_FILE``, default ``$SR3_HOME/cluster.json``). ``ConfigError`` when
    none of them gives one.
    """

    def __init__(
        self,
        ring: str | Sequence[str] | None = None,
        secret: str | None = None,
        *,
        options: ClientOptions = ClientOptions(),
        clock: Callable[[], float] = time.monotonic,
        local_chunks: LocalChunks | None = None,
    ) -> None:
        ring, secret, cluster = _resolve(ring, secret)
        if options.network is None and (network := os.environ.get(NETWORK_ENV, "").strip()):
            options = replace(options, network=network)
        if options.tls is None:
            options = replace(options, tls=resolve_tls(cluster))
        self.seeds = parse_seeds(ring)
        if len(secret) < SECRET_CHARS_MIN:
            raise ConfigError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
        self.options = options
        self._clock = clock
        tls = client_context(options.tls) if options.tls is not None else None
        self._transport = Transport(secret, timeouts=options.timeouts, tls=tls)
        self.view = RingTracker(self.seeds, self._transport, options, clock)
        # Internal: unnamed chunks and blobs, for layers that name them in records of
        # their own (manifests, drills). See ``ChunkIO.put_sources``.
        # ``local_chunks``: the store of the peer this client runs in, read before the
        # network (``ChunkIO``).
        self.chunks = ChunkIO(self._transport, self.view, options, local_chunks)
        self.records = RecordIO(self._transport, self.view)
        self.admin = Admin(self._transport, self.view)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Let write lanes still running past their quorum finish (bounded by the
        options' ``close_wait_s``; the rest are cancelled and left to hints and repair),
        then close the connection pool."""
        await self.view.aclose()
        await self._transport.close()

    @property
    def transport(self) -> Transport:
        """The signed, pooled transport to peers (recovery streams use it directly)."""
        return self._transport

    # -- ring ---------------------------------------------------------------------------

    async def ring(self, *, refresh: bool = False) -> RingView:
        return await self.view.ring(refresh=refresh)

    async def wider_ring(self, seen: RingView) -> RingView | None:
        return await self.view.wider_ring(seen)

    # -- named files: kept until deleted (sr3 put / get / ls / rm) ----------------------

    async def put_file(self, path: Path, key: str, *, progress: Progress | None = None) -> FileInfo:
        """Store the file at ``path`` under ``key``, replacing what was there.

        The chunks go to W..R replicas each, then the record ``blob/<key>`` names them;
        the file is kept until ``delete_file(key)``."""
        _check_key(key)
        return await self._store_named(
            key, lambda report: self.chunks.put_file(path, progress=report), progress
        )

    async def put_bytes(self, data: bytes, key: str) -> FileInfo:
        """Store ``data`` under ``key`` (as ``put_file``), replacing what was there."""
        _check_key(key)
        return await self._store_named(key, lambda _report: self.chunks.put_blob(data), None)

    async def get_file(
        self, key: str | BlobRef, path: Path, *, progress: Progress | None = None
    ) -> None:
        """Write the file stored under ``key`` to ``path``, verified end to end and
        atomically (a ``BlobRef`` read from a record of your own reads those chunks)."""
        ref = key if isinstance(key, BlobRef) else await self.lookup_file(key)
        await self.chunks.get_file(ref, path, progress=progress)

    async def get_bytes(self, key: str) -> bytes:
        """The bytes stored under ``key``, verified end to end."""
        return await self.chunks.get_blob(await self.lookup_file(key))

    async def file_info(self, key: str) -> FileInfo:
        """What is stored under ``key``; ``NotFound`` when nothing is. Read decided
        (``DataUnavailable`` when more than R - 1 of its record's acceptors are lost)."""
        record = await self.get_record(BLOB_KEY_PREFIX + key)
        if record is None:
            raise NotFound(f"no file is stored under key {key!r}")
        ref = _parse_ref(key, record.value)
        return FileInfo(key, ref.size, record.version, ref, record.settled)

    async def list_files(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, FileInfo]:
        """The files whose keys start with ``prefix`` (at most ``limit``), by key."""
        versions = await self.list_records(BLOB_KEY_PREFIX + prefix, limit=limit)
        keys = [record_key[len(BLOB_KEY_PREFIX) :] for record_key in versions]
        found: dict[str, FileInfo] = {}
        slots = asyncio.Semaphore(self.options.transfers_max)

        async def one(key: str) -> None:
            async with slots:
                with contextlib.suppress(NotFound):  # deleted since it was listed
                    found[key] = await self.file_info(key)

        try:
            async with asyncio.TaskGroup() as group:
                for key in keys:
                    group.create_task(one(key))
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None
        return {key: found[key] for key in keys if key in found}

    async def delete_file(self, key: str) -> int:
        """Delete the file stored under ``key`` (``NotFound`` if none); the tombstone's
        version. Peers collect its chunks once no live record has referenced them for
        ``--gc-grace``."""
        record_key = BLOB_KEY_PREFIX + key
        conflict: RecordConflict | None = None
        for _attempt in range(NAME_ATTEMPTS_MAX):
            current = await self.get_record(record_key)
            if current is None:
                raise NotFound(f"no file is stored under key {key!r}")
            try:
                return await self.delete_record(record_key, expected_version=current.version)
            except RecordConflict as exc:  # written again meanwhile: delete what is there now
                conflict = exc
        assert conflict is not None
        raise conflict

    async def store_file(
        self, path: Path, key: str, *, progress: Progress | None = None
    ) -> BlobRef:
        """``put_file`` that returns where the bytes are (kept for older callers)."""
        return (await self.put_file(path, key, progress=progress)).ref

    async def lookup_file(self, key: str) -> BlobRef:
        """Where the bytes of the file stored under ``key`` are; ``NotFound`` if none."""
        return (await self.file_info(key)).ref

    async def _store_named(
        self,
        key: str,
        upload: Callable[[Progress | None], Awaitable[BlobRef]],
        progress: Progress | None,
    ) -> FileInfo:
        """Upload, then name what was uploaded. Peers keep an unnamed chunk for
        ``--gc-grace`` after it was stored: an upload that took ``RESTORE_AFTER_S`` or
        longer may have outlasted a short grace, so once named (and so kept) it is stored
        again, which puts back any chunk collected meanwhile."""
        started_at = self._clock()
        ref = await upload(progress)
        info = await self._name(key, ref)
        if self._clock() - started_at >= RESTORE_AFTER_S:
            again = await upload(None)  # progress was reported once
            if again != ref:
                raise SR3Error(f"what was stored under {key!r} changed while it was stored")
        return info

    async def _name(self, key: str, ref: BlobRef) -> FileInfo:
        """Point the record ``blob/<key>`` at ``ref``, whatever version it is at."""
        record_key = BLOB_KEY_PREFIX + key
        value = codec.compact_json(ref.to_json())
        refs = sorted({extent.chunk_id for extent in ref.extents})
        current = await self.get_record(record_key, include_deleted=True)
        expected = current.version if current else 0
        conflict: RecordConflict | None = None
        for _attempt in range(NAME_ATTEMPTS_MAX):
            try:
                version = await self.put_record(
                    record_key, value, expected_version=expected, refs=refs
                )
                return FileInfo(key, ref.size, version, ref)
            except RecordConflict as exc:  # another writer of this key won: replace it
                conflict, expected = exc, exc.current
        assert conflict is not None
        raise conflict

    # -- chunks: internal -------------------------------------------------------------

    async def fetch_chunk(self, chunk_id: str) -> bytes:
        """One chunk's raw bytes, verified (recovery reads chunks named by manifests)."""
        return await self.chunks.fetch_chunk(chunk_id)

    async def put_sources(
        self, sources: Sequence[Source], *, progress: Progress | None = None
    ) -> list[BlobRef]:
        """Internal: store unnamed blobs (see ``ChunkIO.put_sources``). The caller must
        write a record naming every returned ref's chunks within the peers' ``--gc-grace``,
        or they are collected; use ``put_file``/``put_bytes`` to keep data."""
        return await self.chunks.put_sources(sources, progress=progress)

    # -- records ------------------------------------------------------------------------

    async def get_record(
        self, key: str, *, include_deleted: bool = False, allow_stale: bool = False
    ) -> RecordValue | None:
        return await self.records.get_record(
            key, include_deleted=include_deleted, allow_stale=allow_stale
        )

    async def put_record(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int,
        refs: Sequence[str] = (),
        op: str | None = None,
    ) -> int:
        return await self.records.put_record(
            key, value, expected_version=expected_version, refs=refs, op=op
        )

    async def delete_record(self, key: str, *, expected_version: int, op: str | None = None) -> int:
        return await self.records.delete_record(key, expected_version=expected_version, op=op)

    async def list_records(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, int]:
        return await self.records.list_records(prefix, limit=limit)

    async def scan_records(
        self, prefix: str, *, limit: int = api.LIST_LIMIT_MAX, after: str = "",
        delimiter: bool = False, head_bytes: int = 0, include_deleted: bool = False,
        allow_stale: bool = False,
    ) -> RecordScan:  # fmt: skip
        return await self.records.scan_records(
            prefix, limit=limit, after=after, delimiter=delimiter, head_bytes=head_bytes,
            include_deleted=include_deleted, allow_stale=allow_stale,
        )  # fmt: skip

    # -- membership and status ----------------------------------------------------------

    async def members(self) -> list[dict[str, Any]]:
        return await self.admin.members()

    async def leave(
        self, peer_id: str, *, wait: bool = True, timeout_s: float = 600.0
    ) -> LeaveReport | None:
        """Ask ``peer_id`` to hand its data over and leave; with ``wait``, return once
        every chunk and record it held is on R peers without it, and how much moved."""
        return await self.admin.leave(peer_id, wait=wait, timeout_s=timeout_s)

    async def admin_kill(self, peer_id: str) -> None:
        await self.admin.admin_kill(peer_id)

    async def status(self) -> RingStatus:
        return await self.admin.status()


def _resolve(
    ring: str | Sequence[str] | None, secret: str | None
) -> tuple[str | Sequence[str], str, ClusterFile | None]:
    """``ring`` and ``secret`` as given, the missing ones found as the CLI finds them,
    and the cluster file they came from, if any."""
    if ring is not None and secret:
        return ring, secret, None
    given = ring if ring is None or isinstance(ring, str) else ",".join(ring)
    settings = resolve(given, secret or None, ring_hint="ring=", secret_hint="secret=")
    return (ring if ring is not None else settings.ring), settings.secret, settings.cluster


def _check_key(key: str) -> None:
    if not key:
        raise ConfigError("a file needs a key (a name such as 'job1/state')")


def _parse_ref(key: str, value: bytes) -> BlobRef:
    try:
        return BlobRef.from_json(api.load_json(value))
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"record for {key!r} is not a blob reference") from exc
