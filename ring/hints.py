"""Hints: chunks a peer took in for another peer that could not be reached.

A hint is an empty marker file ``<data>/hints/<chunk id>.<peer id>``, created (and its
directory fsynced) before the hinted write is acknowledged. The repair loop hands hinted
chunks to their peer first once it is alive again, then drops the hint; the extra copy
is collected like any other once every preference member holds the chunk.

A hint that cannot be written (the store holds ``HINTS_MAX``, or the disk is full) is
skipped with a log line: the hinted write still stands, and repair finds the chunk
without the hint, only later.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ring import codec
from ring.errors import StorageFull
from ring.files import discard, fsync_dir, make_folders, storage_full

__all__ = ["HINTS_MAX", "HintStore"]

log = logging.getLogger(__name__)

HINTS_MAX = 100_000
_PEER_ID_CHARS_MAX = 128


class HintStore:
    def __init__(self, root: Path, capacity: int = HINTS_MAX) -> None:
        self._dir = root / "hints"
        self._capacity = capacity
        self._hints: set[tuple[str, str]] = set()

    def open(self) -> None:
        make_folders([self._dir])
        for entry in self._dir.iterdir():
            chunk_id, _, peer_id = entry.name.partition(".")
            if codec.is_chunk_id(chunk_id) and peer_id:
                self._hints.add((chunk_id, peer_id))

    def __len__(self) -> int:
        return len(self._hints)

    def pending(self) -> list[tuple[str, str]]:
        return sorted(self._hints)

    async def add(self, chunk_id: str, peer_id: str) -> bool:
        """Record a hint durably; False (and a log line) when the store or disk is full."""
        if not codec.is_chunk_id(chunk_id) or not 0 < len(peer_id) <= _PEER_ID_CHARS_MAX:
            raise ValueError("a hint names a chunk id and a peer id")
        if "/" in peer_id or peer_id.startswith("."):
            raise ValueError("a peer id in a hint cannot contain '/' or start with '.'")
        if (chunk_id, peer_id) in self._hints:
            return True
        if len(self._hints) >= self._capacity:
            log.warning("hint store full (%d); repair will still find %s", self._capacity, chunk_id)
            return False
        try:
            await asyncio.to_thread(self._create, self._dir / f"{chunk_id}.{peer_id}")
        except StorageFull as exc:
            log.warning("hint not kept (%s); repair will still find %s", exc, chunk_id)
            return False
        self._hints.add((chunk_id, peer_id))
        return True

    @staticmethod
    def _create(path: Path) -> None:
        try:
            with storage_full(f"writing hint {path.name}"):
                path.touch()
                fsync_dir(path.parent)
        except StorageFull:
            discard(path)
            raise

    async def remove(self, chunk_id: str, peer_id: str) -> None:
        self._hints.discard((chunk_id, peer_id))
        await asyncio.to_thread((self._dir / f"{chunk_id}.{peer_id}").unlink, True)
