"""What an ``sr3://`` standby reads ahead: the state files the first batch after a
takeover will load.

A state store of version V loads from its newest snapshot (``N.snapshot``, a RocksDB
``N.zip`` and the ``.sst`` files it names) at or below V and the deltas or changelogs
after it. ``state_files_to_warm`` picks those files from a listing of one store's
directory (pure); ``warm_state`` walks a checkpoint's ``state/`` tree and reads them
through the namespace, so that the peers holding them have them in memory (a snapshot
written long ago is cold on their disks) and a file that cannot be read is found before
the takeover, not during it. Bounded: at most ``WARM_BYTES_MAX`` read per pass, and a
file already read (immutable: the same path, size and mtime) is not read again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ring.errors import NotFound
from ring.fs_api import Stat
from spark_connector.fs_client import FsClient

__all__ = ["WARM_BYTES_MAX", "WarmReport", "state_files_to_warm", "warm_state"]

WARM_BYTES_MAX = 512 * 1024 * 1024
WARM_DIRECTORIES_MAX = 20_000
WARM_DEPTH_MAX = 4  # state/<operator>/<partition>[/<store name>]/files
READ_PIECE_BYTES = 8 * 1024 * 1024
_VERSIONED = re.compile(r"^([0-9]{1,18})\.(delta|snapshot|zip|changelog)$")
_BASES = ("snapshot", "zip")


@dataclass(frozen=True, slots=True)
class WarmReport:
    files: int
    bytes_read: int
    truncated: bool  # the byte bound stopped the pass


def state_files_to_warm(entries: Sequence[Stat], version: int) -> list[Stat]:
    """Of one store directory's files, those that loading ``version`` reads: the newest
    base (snapshot or zip) at or below it, the steps after it up to it, and the SST
    files beside them (RocksDB's, all of them: which a zip names is inside the zip)."""
    versioned: list[tuple[int, str, Stat]] = []
    for entry in entries:
        match = _VERSIONED.match(entry.name)
        if entry.type == "file" and match is not None:
            versioned.append((int(match.group(1)), match.group(2), entry))
    bases = [v for v, kind, _ in versioned if kind in _BASES and v <= version]
    base = max(bases, default=0)
    chosen = [
        entry
        for v, kind, entry in versioned
        if (v == base and kind in _BASES) or (base < v <= version and kind not in _BASES)
    ]
    chosen += [e for e in entries if e.type == "file" and e.name.endswith(".sst")]
    return chosen


async def warm_state(
    client: FsClient, checkpoint: str, version: int, done: set[tuple[str, int, int]]
) -> WarmReport:
    """Read the state files loading ``version`` of every store of ``checkpoint`` (a
    namespace path) reads, but those in ``done`` (path, size, mtime), which it extends."""
    files = bytes_read = 0
    for directory in await _store_directories(client, checkpoint):
        try:
            entries = await client.list(directory)
        except NotFound:
            continue  # deleted since listed (retention)
        for stat in state_files_to_warm(entries, version):
            key = (stat.path, stat.size, stat.mtime_ms)
            if key in done:
                continue
            if bytes_read + stat.size > WARM_BYTES_MAX:
                return WarmReport(files, bytes_read, truncated=True)
            await _read(client, stat)
            done.add(key)
            files, bytes_read = files + 1, bytes_read + stat.size
    return WarmReport(files, bytes_read, truncated=False)


async def _read(client: FsClient, stat: Stat) -> None:
    offset = 0
    while offset < stat.size:
        piece = await client.read(stat.path, offset, READ_PIECE_BYTES)
        if not piece:
            return
        offset += len(piece)


async def _store_directories(client: FsClient, checkpoint: str) -> list[str]:
    """Directories under ``state/`` that hold files (a store's), depth-bounded."""
    found: list[str] = []
    frontier = [f"{checkpoint}/state"]
    for _depth in range(WARM_DEPTH_MAX):
        following: list[str] = []
        for directory in frontier:
            try:
                entries = await client.list(directory)
            except NotFound:
                continue
            if any(e.type == "file" for e in entries):
                found.append(directory)
            following += [e.path for e in entries if e.type == "directory"]
            if len(found) + len(following) > WARM_DIRECTORIES_MAX:
                return found
        frontier = following
    return found
