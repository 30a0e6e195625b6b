"""Small file helpers shared by the peer, the client and the drills.

Every write of a peer's data folder (chunks, records, hints, tombstones, ``peer.json``,
``members.json``, quarantine and trash moves, temp files) goes through ``storage_full``:
the one place where the OS saying "no room" becomes ``StorageFull``, which the peer
answers with 507 ``storage_full`` and its background work tolerates. No room means
ENOSPC (disk full), EDQUOT (quota exceeded) and EROFS (the file system went read-only,
as ext4 does after errors): in all three the peer cannot write but can still read, so it
stays up, serves what it holds and refuses writes. Each write tries again, so a peer
resumes by itself once space frees (or once the operator remounts read-write). Any
other OSError (EIO, EACCES) is not a full disk and passes through unchanged.

``PendingWrite`` keeps a small state file (the member table, the peer identity) in
memory until it can be saved.

``DirectIO`` writes and reads chunk files with ``O_DIRECT``: a chunk is written once and
fsynced at once, so the page cache gains nothing from holding it, and copying it there
costs the peer a copy into new page-cache pages (on a VM whose memory is backed on first
touch, 2.5 s of kernel CPU per GiB against 0.1 s direct, ``benchmarks/REPORT.md``), and
a peer that holds far more than its memory should not evict what its neighbours (Spark)
cache for chunks it may never read again. It copies each file through a few reused
page-aligned buffers; the chunk store falls back on buffered I/O where the file system
refuses ``O_DIRECT``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import queue
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import xxhash

from ring.errors import StorageFull

__all__ = [
    "NO_ROOM_ERRNOS",
    "DirectIO",
    "PendingWrite",
    "discard",
    "file_digest",
    "fsync_dir",
    "make_folders",
    "move_or_remove",
    "storage_full",
    "write_file_atomic",
]

log = logging.getLogger(__name__)

READ_BYTES = 8 * 1024 * 1024
# O_DIRECT wants buffers, offsets and lengths aligned to the device's logical block
# (512 or 4096 bytes); the page size satisfies both.
DIRECT_ALIGN_BYTES = mmap.PAGESIZE
# errno -> how the StorageFull message names it.
NO_ROOM_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk full (quota exceeded)",
    errno.EROFS: "disk read-only",
}


@contextlib.contextmanager
def storage_full(what: str) -> Iterator[None]:
    """Turn an OSError that means "no room to write" into ``StorageFull`` naming ``what``."""
    try:
        yield
    except OSError as exc:
        reason = NO_ROOM_ERRNOS.get(exc.errno or 0)
        if reason is None:
            raise
        raise StorageFull(f"{reason} while {what}") from exc


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folders(folders: Iterable[Path]) -> None:
    """Create the missing ones of ``folders`` (and their missing parents) durably: each
    folder that gained an entry is fsynced once all are made, so a crash cannot take away
    a folder that files were then durably written into."""
    grown: set[Path] = set()
    for folder in folders:
        missing: list[Path] = []
        step = folder
        while not step.is_dir():
            missing.append(step)
            step = step.parent
        for new in reversed(missing):
            new.mkdir(exist_ok=True)
            grown.add(new.parent)
    for parent in grown:
        fsync_dir(parent)


def write_file_atomic(tmp_dir: Path, final: Path, data: bytes) -> None:
    """Write ``data`` to ``final`` so that a crash leaves the whole file or none of it.

    ``StorageFull`` when there is no room; the temp file is removed whatever fails."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    _replace_atomically(tmp_dir, final, write)


def _replace_atomically(tmp_dir: Path, final: Path, write: Callable[[Path], None]) -> None:
    """``write`` (and fsync) a temp file in ``tmp_dir``, then rename it to ``final`` and
    fsync its folder; ``StorageFull`` when there is no room, the temp file removed
    whatever fails."""
    tmp = tmp_dir / f"{final.name}.{secrets.token_hex(6)}"
    try:
        with storage_full(f"writing {final.name}"):
            write(tmp)
            try:
                os.replace(tmp, final)
            except FileNotFoundError:
                # Its folder is missing (an operator removed it; the stores make theirs
                # at open): made durably, checked only then since a write is small.
                make_folders([final.parent])
                os.replace(tmp, final)
            fsync_dir(final.parent)
    except BaseException:
        discard(tmp)
        raise


class DirectIO:
    """Whole files written and read with ``O_DIRECT``, through reused aligned buffers.

    ``write_atomic`` has ``write_file_atomic``'s contract (the whole file or none of it,
    ``StorageFull`` when there is no room, the temp file removed whatever fails), without
    passing the bytes through the page cache; ``read`` returns a file's bytes the same way.
    Keeps up to ``buffers`` page-aligned buffers, each grown to the largest file it has
    carried (the caller runs about that many transfers at once; one beyond them, as when
    a cancelled caller's thread still runs, maps a buffer of its own for its time).
    ``usable(folder)`` tells whether the folder's file system takes ``O_DIRECT``."""

    def __init__(self, buffers: int) -> None:
        if buffers < 1:
            raise ValueError("direct I/O needs at least one buffer")
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self._pooled = 0
        self._buffers_max = buffers
        self._lock = threading.Lock()

    @staticmethod
    def usable(folder: Path) -> bool:
        """Whether a file in ``folder`` can be written and read back with ``O_DIRECT``."""
        if not hasattr(os, "O_DIRECT"):
            return False
        probe = folder / f".direct-probe.{secrets.token_hex(6)}"
        try:
            with mmap.mmap(-1, DIRECT_ALIGN_BYTES) as block:
                fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
                try:
                    os.pwrite(fd, block, 0)
                    os.preadv(fd, [block], 0)
                finally:
                    os.close(fd)
        except OSError:
            return False
        finally:
            discard(probe)
        return True

    def write_atomic(self, tmp_dir: Path, final: Path, data: bytes) -> None:
        def write(tmp: Path) -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
            try:
                _write_direct(fd, buffer, data)
                os.fsync(fd)
            finally:
                os.close(fd)

        buffer, pooled = self._take(len(data))
        try:
            _replace_atomically(tmp_dir, final, write)
        finally:
            self._give(buffer, pooled)

    def read(self, path: Path) -> bytes:
        """The bytes of ``path``; FileNotFoundError if it is absent."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            size = os.fstat(fd).st_size
            buffer, pooled = self._take(size)
            try:
                return _read_direct(fd, buffer, size)
            finally:
                self._give(buffer, pooled)
        finally:
            os.close(fd)

    def _take(self, size: int) -> tuple[mmap.mmap, bool]:
        """A buffer of at least ``size`` bytes, and whether it goes back to the pool."""
        wanted = max(_aligned(size), DIRECT_ALIGN_BYTES)
        try:
            buffer = self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                pooled = self._pooled < self._buffers_max
                self._pooled += pooled
            return mmap.mmap(-1, wanted), pooled
        if len(buffer) < wanted:
            buffer.close()
            buffer = mmap.mmap(-1, wanted)
        return buffer, True

    def _give(self, buffer: mmap.mmap, pooled: bool) -> None:
        if pooled:
            self._free.put(buffer)
        else:
            buffer.close()


def _aligned(size: int) -> int:
    return -(-size // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES


def _write_direct(fd: int, buffer: mmap.mmap, data: bytes) -> None:
    """Write ``data`` at the start of ``fd`` (opened ``O_DIRECT``), copied into the aligned
    ``buffer`` and padded with zeros to a whole block, then cut to its length."""
    length = len(data)
    padded = _aligned(length)
    with memoryview(buffer) as view:
        view[:length] = data
        view[length:padded] = bytes(padded - length)
        written = 0
        while written < padded:
            done = os.pwrite(fd, view[written:padded], written)
            if done <= 0:
                raise OSError(errno.EIO, f"an O_DIRECT write made no progress at {written}")
            written += done
    os.ftruncate(fd, length)


def _read_direct(fd: int, buffer: mmap.mmap, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (opened ``O_DIRECT``), read into ``buffer``."""
    padded = _aligned(size)
    with memoryview(buffer) as view:
        done = 0
        while done < size:
            got = os.preadv(fd, [view[done:padded]], done)
            if got <= 0:
                raise OSError(errno.EIO, f"file ended at {done} of {size} bytes while read")
            done += got
        return bytes(view[:size])


def move_or_remove(source: Path, target: Path) -> bool:
    """Move ``source`` aside to ``target`` (same file system); True if moved. When the
    disk has no room even for that (a new directory block), remove it instead: a file
    moved aside (corrupt, collected) must leave its place either way.
    FileNotFoundError if ``source`` is absent."""
    try:
        with storage_full(f"moving {source.name} aside"):
            os.replace(source, target)
    except StorageFull as exc:
        log.warning("%s: removing %s instead", exc, source)
        with storage_full(f"removing {source.name}"):
            source.unlink()
        return False
    return True


def discard(path: Path) -> None:
    """Remove a temp file if it is there, as cleanup after a failure: never raises (on a
    read-only file system even the unlink of a missing file fails, with EROFS, and that
    must not replace the error being handled)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


class PendingWrite:
    """A small file saved best effort: ``set`` its newest content, ``flush`` to save it.

    When the disk is full the content stays pending in memory and a later ``flush``
    (on the next change, or the owner's retry loop) saves the newest one. One warning
    per episode of failures, one line when it succeeds again. ``flush`` runs in worker
    threads, one at a time, so an older content never replaces a newer one."""

    def __init__(self, tmp_dir: Path, path: Path, what: str) -> None:
        self.path = path
        self._tmp_dir = tmp_dir
        self._what = what
        self._pending: bytes | None = None
        self._failures = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return self._pending is not None

    @property
    def failures(self) -> int:
        """Failed attempts since the last successful save."""
        return self._failures

    def set(self, data: bytes) -> None:
        self._pending = data

    def flush(self) -> bool:
        """Save the pending content; True if nothing is left pending."""
        with self._lock:
            data = self._pending
            if data is None:
                return True
            try:
                write_file_atomic(self._tmp_dir, self.path, data)
            except StorageFull as exc:
                self._failed(exc)
                return False
            if self._pending is data:
                self._pending = None
            if self._failures:
                log.info("saved %s after %d failed attempts", self._what, self._failures)
                self._failures = 0
            return self._pending is None

    def _failed(self, exc: StorageFull) -> None:
        self._failures += 1
        if self._failures == 1:
            log.warning(
                "cannot save %s (%s): kept in memory, saved once there is room", self._what, exc
            )
        else:
            log.debug("saving %s failed again (%d): %s", self._what, self._failures, exc)


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes, the digest blob references carry."""
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(READ_BYTES):
            hasher.update(block)
    return hasher.hexdigest()
