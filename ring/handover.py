"""A leaving peer's hand-over: what it has handed over so far, and what it still holds.

A leaving peer is out of placement, so its repair rounds (``ring.repair``) treat every
chunk and record it holds as an extra copy: the peers that now own it get it (pushed by
this peer or by another holder), and this peer deletes its copy only once each of the R
owners, all alive, answered that it holds the chunk (``POST /v1/chunks/exists``) or the
record at this version or newer (``POST /v1/records/versions``). A copy gone from here
is therefore a copy on R peers without this one, and an empty store is a finished
hand-over. ``HandOver`` counts, after each round, what went (chunks, their stored bytes,
records) and what is left; the peer serves it as ``api.LeaveProgress``.

Nothing here does I/O beyond reading the stores' in-memory indexes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ring.api import LeaveProgress
from ring.chunkstore import ChunkStore
from ring.records import RecordStore

__all__ = ["HandOver"]


class HandOver:
    """The progress of one peer's leave, from ``start`` to ``finish`` or ``fail``."""

    def __init__(self, chunks: ChunkStore, records: RecordStore) -> None:
        self._chunks = chunks
        self._records = records
        # What this peer held when last counted: chunk id -> stored bytes; record keys.
        self._chunk_bytes: dict[str, int] = {}
        self._keys: set[str] = set()
        self.progress = LeaveProgress()
        # Set once a client has been told the hand-over is done: the peer may exit.
        self.reported = asyncio.Event()

    @property
    def active(self) -> bool:
        return self.progress.state == "handing_over"

    def start(self) -> LeaveProgress:
        """Begin a hand-over, counting from zero (or keep the one under way or done)."""
        if self.progress.state in ("idle", "failed"):
            self._chunk_bytes.clear()
            self._keys.clear()
            self.reported.clear()
            self.progress = LeaveProgress("handing_over")
            self.account()
        return self.progress

    def account(self) -> bool:
        """Count what went since the last call; True once this peer holds nothing."""
        held = self._chunks.ids()
        still = set(held)
        gone = [chunk_id for chunk_id in self._chunk_bytes if chunk_id not in still]
        gone_bytes = sum(self._chunk_bytes.pop(chunk_id) for chunk_id in gone)
        for chunk_id in held:
            if chunk_id not in self._chunk_bytes:
                self._chunk_bytes[chunk_id] = self._chunks.stored_size(chunk_id) or 0
        keys = set(self._records.keys())
        keys_gone = len(self._keys - keys)
        self._keys = keys
        progress = self.progress
        self.progress = replace(
            progress,
            chunks_moved=progress.chunks_moved + len(gone),
            bytes_moved=progress.bytes_moved + gone_bytes,
            records_moved=progress.records_moved + keys_gone,
            chunks_remaining=len(held),
            bytes_remaining=sum(self._chunk_bytes.values()),
            records_remaining=len(keys),
        )
        return not held and not keys

    def note(self, message: str) -> None:
        """Say why the hand-over is not moving (shown to the client that waits)."""
        self.progress = replace(self.progress, message=message)

    def finish(self) -> LeaveProgress:
        self.progress = replace(self.progress, state="done", message="")
        return self.progress

    def fail(self, message: str) -> LeaveProgress:
        self.progress = replace(self.progress, state="failed", message=message)
        return self.progress

    def read(self) -> LeaveProgress:
        """The progress, as a client is told it (a told ``done`` lets the peer exit)."""
        if self.progress.state == "done":
            self.reported.set()
        return self.progress
