"""``Client``: blobs and records on the ring, replicated, verified and bounded.

    async with Client(ring="127.0.0.1:7401", secret=secret) as client:
        ref = await client.put_file(path)           # chunks stored on W..R replicas each
        await client.get_file(ref, out_path)        # verified end to end, byte-identical
        await client.put_record("blob/x", value, expected_version=0)

The client is a facade over four parts that share one signed, pooled transport:
``RingTracker`` (the member table and which peers are suspected down, ``view.py``),
``ChunkIO`` (chunks and blobs, ``chunks.py``), ``RecordIO`` (records, ``records.py``)
and ``Admin`` (membership and status, ``admin.py``). Concurrency is bounded: at most
``transfers_max`` chunks in flight per call, at most ``CONNECTIONS_PER_PEER_MAX``
connections per peer, connect and read timeouts on each request. ``SyncClient`` is the
blocking facade for scripts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ring import codec
from ring.auth import SECRET_CHARS_MIN
from ring.blobs import BlobRef
from ring.client.admin import Admin, RingStatus
from ring.client.chunks import ChunkIO
from ring.client.options import BLOB_KEY_PREFIX, ClientOptions, Progress, RecordValue, Source
from ring.client.records import RecordIO
from ring.client.view import RingTracker, RingView, parse_seeds
from ring.errors import ConfigError, NotFound, ProtocolError
from ring.transport import Transport

__all__ = ["Client"]


class Client:
    """Async client of one ring. Use it on one event loop; close it when done."""

    def __init__(
        self,
        ring: str | Sequence[str],
        secret: str,
        *,
        options: ClientOptions = ClientOptions(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seeds = parse_seeds(ring)
        if not secret:
            raise ConfigError("no cluster secret given")
        if len(secret) < SECRET_CHARS_MIN:
            raise ConfigError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
        self.options = options
        self._transport = Transport(secret, timeouts=options.timeouts)
        self.view = RingTracker(self.seeds, self._transport, options, clock)
        self.chunks = ChunkIO(self._transport, self.view, options)
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

    # -- chunks and blobs ---------------------------------------------------------------

    async def fetch_chunk(self, chunk_id: str) -> bytes:
        return await self.chunks.fetch_chunk(chunk_id)

    async def put_sources(
        self, sources: Sequence[Source], *, progress: Progress | None = None
    ) -> list[BlobRef]:
        return await self.chunks.put_sources(sources, progress=progress)

    async def put_blob(self, data: bytes) -> BlobRef:
        return await self.chunks.put_blob(data)

    async def put_file(self, path: Path, *, progress: Progress | None = None) -> BlobRef:
        return await self.chunks.put_file(path, progress=progress)

    async def read_blob(
        self, ref: BlobRef, sink: Callable[[bytes], object], *, progress: Progress | None = None
    ) -> None:
        await self.chunks.read_blob(ref, sink, progress=progress)

    async def get_blob(self, ref: BlobRef) -> bytes:
        return await self.chunks.get_blob(ref)

    async def get_file(self, ref: BlobRef, path: Path, *, progress: Progress | None = None) -> None:
        await self.chunks.get_file(ref, path, progress=progress)

    # -- records ------------------------------------------------------------------------

    async def get_record(self, key: str, *, include_deleted: bool = False) -> RecordValue | None:
        return await self.records.get_record(key, include_deleted=include_deleted)

    async def put_record(
        self, key: str, value: bytes, *, expected_version: int, refs: Sequence[str] = ()
    ) -> int:
        return await self.records.put_record(
            key, value, expected_version=expected_version, refs=refs
        )

    async def delete_record(self, key: str, *, expected_version: int) -> int:
        return await self.records.delete_record(key, expected_version=expected_version)

    async def list_records(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, int]:
        return await self.records.list_records(prefix, limit=limit)

    # -- named files (sr3 put / sr3 get) ------------------------------------------------

    async def store_file(
        self, path: Path, key: str, *, progress: Progress | None = None
    ) -> BlobRef:
        """Store a file and point record ``blob/<key>`` at it (replacing what was there)."""
        ref = await self.put_file(path, progress=progress)
        record_key = BLOB_KEY_PREFIX + key
        current = await self.get_record(record_key, include_deleted=True)
        await self.put_record(
            record_key,
            codec.compact_json(ref.to_json()),
            expected_version=current.version if current else 0,
            refs=sorted({extent.chunk_id for extent in ref.extents}),
        )
        return ref

    async def lookup_file(self, key: str) -> BlobRef:
        record = await self.get_record(BLOB_KEY_PREFIX + key)
        if record is None:
            raise NotFound(f"no file is stored under key {key!r}")
        try:
            return BlobRef.from_json(json.loads(record.value))
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"record for {key!r} is not a blob reference") from exc

    # -- membership and status ----------------------------------------------------------

    async def members(self) -> list[dict[str, Any]]:
        return await self.admin.members()

    async def leave(self, peer_id: str, *, wait: bool = True, timeout_s: float = 600.0) -> None:
        await self.admin.leave(peer_id, wait=wait, timeout_s=timeout_s)

    async def admin_kill(self, peer_id: str) -> None:
        await self.admin.admin_kill(peer_id)

    async def status(self) -> RingStatus:
        return await self.admin.status()
