"""The peer's on-disk chunk store.

Chunks live under ``<data>/chunks/<first two hex digits>/<chunk id>`` (the 256 shard
folders are made when the store opens) in their stored form
(see ``ring.codec``). A write goes to ``<data>/tmp``, is fsynced, renamed into place and
the directory fsynced, so a crash leaves either the whole chunk or nothing. Where the
file system takes it, the write bypasses the page cache (``O_DIRECT``,
``ring.files.DirectIO``), and so do reads: a chunk is written once and read rarely, and
a peer should not fill the page cache with it.

What is checked where: before a chunk is written, everything (``codec.check_before_write``:
header, checksum, and the content against its address, decompressed). A copy checked in
full since this process started (written, served or scrubbed) is *verified*: a read
checks its header and payload checksum, which catch what can happen to it since (rot, a
torn write). A copy not verified yet (stored by an earlier run, or by a version that
checked less) is checked in full before it is served or counted as present for a
duplicate write. A file that fails any check, or cannot be read (an I/O error; a file
changed in place while read), is moved to ``<data>/quarantine`` (the evidence stays),
counted and reported, never served; a later write of the same id stores a good copy in
its place.

Blocking file I/O runs in worker threads, at most ``io_concurrency`` at a time; a new
chunk's content check runs in the same worker call as its write.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ring import codec
from ring.errors import ChunkCorrupt, StorageFull
from ring.files import DirectIO, make_folders, move_or_remove, storage_full, write_file_atomic

__all__ = ["ChunkStore", "StoreStats", "write_file_atomic"]

log = logging.getLogger(__name__)

IO_CONCURRENCY_DEFAULT = 4
# Chunk files are spread over folders named by the first two hex digits of their id.
SHARDS = 256
# Collected chunks wait in the tmp folder under this prefix until the trash is emptied.
TRASH_PREFIX = "gc-"
# Errors of reading a chunk's file that come from the process, not from the file.
PROCESS_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EINTR, errno.EAGAIN}
)


@dataclass(frozen=True, slots=True)
class StoreStats:
    chunk_count: int
    stored_bytes: int
    quarantined: int
    capacity_bytes: int | None
    # Room left on the data folder's file system for this peer (None: not known).
    disk_free_bytes: int | None = None
    # Whether chunk files bypass the page cache (O_DIRECT): False where the file system
    # refuses it.
    direct_io: bool = False


class ChunkStore:
    """Content-addressed chunks on disk with an in-memory index of what is present."""

    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int | None = None,
        io_concurrency: int = IO_CONCURRENCY_DEFAULT,
        write_file: Callable[[Path, Path, bytes], None] | None = None,
        direct_io: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._chunks_dir = root / "chunks"
        self._tmp_dir = root / "tmp"
        self._quarantine_dir = root / "quarantine"
        self._capacity_bytes = capacity_bytes
        self._io_concurrency = io_concurrency
        self._io = asyncio.Semaphore(io_concurrency)
        # None: chosen at open, direct where the file system allows it.
        self._write_file = write_file
        self._read_file: Callable[[Path], bytes] = Path.read_bytes
        self._direct_io_wanted = direct_io
        self._direct_io = False
        self._index: dict[str, int] = {}
        # chunk id -> clock() (monotonic) at its last store (new or repeated), since
        # start: chunk collection leaves recently stored chunks alone.
        self._last_stored: dict[str, float] = {}
        # Ids whose stored copy was checked in full since this process started (see the
        # module docstring); a subset of the index.
        self._verified: set[str] = set()
        self._quarantining: set[str] = set()
        self._stored_bytes = 0
        self._quarantined = 0
        self.on_corrupt: Callable[[str, str], None] | None = None

    def open(self) -> None:
        """Create the layout, drop leftovers of interrupted writes, index what is present."""
        # Every shard folder is made here, not by the first write into it: a write then
        # never pays for a new folder, and a new folder's entry in ``chunks`` is fsynced
        # before any chunk is written into it.
        make_folders(
            [self._tmp_dir, self._quarantine_dir]
            + [self._chunks_dir / f"{shard:02x}" for shard in range(SHARDS)]
        )
        for leftover in self._tmp_dir.iterdir():
            leftover.unlink(missing_ok=True)
        self._choose_io()
        for shard in self._chunks_dir.iterdir():
            for entry in shard.iterdir():
                if codec.is_chunk_id(entry.name):
                    size = entry.stat().st_size
                    self._index[entry.name] = size
                    self._stored_bytes += size
        # The folder is shared with the record store; count only quarantined chunks,
        # which are named "<chunk id>.<suffix>" (records: "<digest>.rec.<suffix>").
        self._quarantined = sum(
            1
            for entry in self._quarantine_dir.iterdir()
            if (parts := entry.name.split(".")) and len(parts) == 2 and codec.is_chunk_id(parts[0])
        )

    def _choose_io(self) -> None:
        """Direct I/O where wanted and the file system takes it, else the page cache."""
        if self._direct_io_wanted and DirectIO.usable(self._tmp_dir):
            direct = DirectIO(self._io_concurrency)
            self._direct_io = True
            self._read_file = direct.read
            if self._write_file is None:
                self._write_file = direct.write_atomic
        elif self._direct_io_wanted:
            log.info("%s does not take O_DIRECT: chunks go through the page cache", self._tmp_dir)
        if self._write_file is None:
            self._write_file = write_file_atomic

    def _path(self, chunk_id: str) -> Path:
        return self._chunks_dir / chunk_id[:2] / chunk_id

    def has(self, chunk_id: str) -> bool:
        return chunk_id in self._index

    def stored_size(self, chunk_id: str) -> int | None:
        return self._index.get(chunk_id)

    def stored_within(self, chunk_id: str, seconds: float) -> bool:
        """Whether ``chunk_id`` was stored here (anew or again) in the last ``seconds``:
        the writer's copies to the other replicas may still be on their way."""
        stored = self._last_stored.get(chunk_id)
        return stored is not None and stored > self._clock() - seconds

    def ids(self) -> list[str]:
        return list(self._index)

    def stats(self) -> StoreStats:
        return StoreStats(
            len(self._index),
            self._stored_bytes,
            self._quarantined,
            self._capacity_bytes,
            self.disk_free_bytes(),
            self._direct_io,
        )

    def disk_free_bytes(self) -> int | None:
        """Bytes this peer may still write on its data folder's file system (statvfs)."""
        try:
            usage = os.statvfs(self._chunks_dir)
        except OSError:
            return None
        return usage.f_bavail * usage.f_frsize

    async def put(self, chunk_id: str, stored: bytes) -> bool:
        """Verify and durably store a chunk. False if a good copy was already here (a
        copy here that fails its check is quarantined and replaced)."""
        if chunk_id in self._index and await self._holds_good_copy(chunk_id):
            self._last_stored[chunk_id] = self._clock()
            return False
        write_file = self._write_file
        assert write_file is not None, "the chunk store is used before open()"

        def check_and_write() -> None:
            # One hand-off to a worker thread for both: each costs the event loop a
            # wake-up, and every replica takes every chunk.
            codec.check_before_write(stored, chunk_id)
            self._ensure_room(len(stored))
            with storage_full(f"storing chunk {chunk_id}"):
                write_file(self._tmp_dir, self._path(chunk_id), stored)

        async with self._io:
            await asyncio.to_thread(check_and_write)
        if chunk_id not in self._index:
            self._index[chunk_id] = len(stored)
            self._stored_bytes += len(stored)
        self._verified.add(chunk_id)
        self._last_stored[chunk_id] = self._clock()
        return True

    def _ensure_room(self, size: int) -> None:
        """``StorageFull`` unless ``size`` more bytes fit within the capacity."""
        if self._capacity_bytes is not None and self._stored_bytes + size > self._capacity_bytes:
            raise StorageFull(
                f"storing {size} bytes would exceed the capacity of "
                f"{self._capacity_bytes} bytes ({self._stored_bytes} used)"
            )

    async def _holds_good_copy(self, chunk_id: str) -> bool:
        """Whether the copy here is good: verified, or checked in full now (one that
        fails is quarantined)."""
        if chunk_id in self._verified:
            return True
        try:
            return await self.verify(chunk_id)
        except ChunkCorrupt:
            return False

    async def get(self, chunk_id: str) -> bytes | None:
        """The checked stored form of a chunk, or None if absent: its header and payload
        checksum when it is verified, everything otherwise (see the module docstring).

        A chunk that fails is quarantined and ``ChunkCorrupt`` raised; it is never
        returned.
        """
        stored = await self._read(chunk_id)
        if stored is not None:
            verified = chunk_id in self._verified
            check = codec.verify_stored if verified else codec.check_content
            await self._check(chunk_id, stored, check)
        return stored

    async def verify(self, chunk_id: str) -> bool:
        """Re-verify one stored chunk in full (decompress and re-hash), whether or not it
        was verified before; quarantine on failure. False if it is absent."""
        stored = await self._read(chunk_id)
        if stored is None:
            return False
        await self._check(chunk_id, stored, codec.check_content)
        return True

    async def _read(self, chunk_id: str) -> bytes | None:
        """The file's bytes, None when it is gone. A file that cannot be read (an I/O
        error, or it ended before its size while read: changed in place) is a copy as bad
        as a corrupt one: quarantined, and ``ChunkCorrupt``; an error of the process
        (out of file handles, of memory) says nothing of the copy and propagates."""
        if chunk_id not in self._index:
            return None
        try:
            async with self._io:
                return await asyncio.to_thread(self._read_file, self._path(chunk_id))
        except FileNotFoundError:
            self._forget(chunk_id)
            return None
        except OSError as exc:
            if exc.errno in PROCESS_ERRNOS:
                raise
            reason = f"its file cannot be read: {exc}"
        await self.quarantine(chunk_id, reason)
        raise ChunkCorrupt(f"chunk {chunk_id}: {reason}")

    async def _check(
        self, chunk_id: str, stored: bytes, check: Callable[[bytes, str], object]
    ) -> None:
        """Run ``check`` in a worker thread; a chunk that fails is quarantined, and one
        that passes a full check (``codec.check_content``) is verified."""
        try:
            await asyncio.to_thread(check, stored, chunk_id)
        except ChunkCorrupt as exc:
            await self.quarantine(chunk_id, str(exc))
            raise
        if check is codec.check_content and chunk_id in self._index:
            self._verified.add(chunk_id)

    async def delete(self, chunk_id: str) -> bool:
        if chunk_id not in self._index:
            return False
        async with self._io:
            await asyncio.to_thread(self._path(chunk_id).unlink, True)
        self._forget(chunk_id)
        return True

    def discard_if_idle(self, chunk_id: str, idle_before: float) -> int | None:
        """Collect a chunk not stored since ``idle_before`` (on ``clock``): its
        file moves out of place at once, so no store can slip in between this decision
        and the removal (``empty_trash`` deletes it). Its stored size, or None if kept."""
        size = self._index.get(chunk_id)
        if size is None or self._last_stored.get(chunk_id, float("-inf")) > idle_before:
            return None
        with contextlib.suppress(FileNotFoundError, StorageFull):
            # On a disk too full for the move the file is removed at once instead; on a
            # read-only one it stays, forgotten until the next start indexes it again.
            move_or_remove(self._path(chunk_id), self._tmp_dir / f"{TRASH_PREFIX}{chunk_id}")
        self._forget(chunk_id)
        return size

    async def empty_trash(self) -> None:
        def empty() -> None:
            for entry in self._tmp_dir.glob(f"{TRASH_PREFIX}*"):
                with storage_full("emptying the trash"):
                    entry.unlink(missing_ok=True)

        async with self._io:
            await asyncio.to_thread(empty)

    async def quarantine(self, chunk_id: str, reason: str) -> None:
        """Move a copy that failed a check out of place, once: checks of the same copy
        that fail at the same time (two reads) count it once."""
        if chunk_id not in self._index or chunk_id in self._quarantining:
            return
        self._quarantining.add(chunk_id)
        log.error("chunk %s is corrupt and was quarantined: %s", chunk_id, reason)
        target = self._quarantine_dir / f"{chunk_id}.{secrets.token_hex(4)}"
        try:
            async with self._io:
                # Read-only, or a disk that fails: the corrupt file stays, forgotten
                # (never served: every read verifies, and the next start indexes and
                # checks it again).
                try:
                    await asyncio.to_thread(move_or_remove, self._path(chunk_id), target)
                except (FileNotFoundError, StorageFull):
                    pass
                except OSError as exc:
                    log.error("chunk %s: its file stays in place, forgotten: %s", chunk_id, exc)
        finally:
            self._quarantining.discard(chunk_id)
        self._forget(chunk_id)
        self._quarantined += 1
        if self.on_corrupt is not None:
            self.on_corrupt(chunk_id, reason)

    def _forget(self, chunk_id: str) -> None:
        self._last_stored.pop(chunk_id, None)
        self._verified.discard(chunk_id)
        size = self._index.pop(chunk_id, None)
        if size is not None:
            self._stored_bytes -= size
