"""Chunk garbage collection: chunks no live record references go away, safely.

Chunks are shared (content addressing dedups equal data across batches and queries), so
a chunk can be collected only when no live record anywhere references it. Every
``interval_s`` a peer

1. drops its tombstones older than the record store's TTL;
2. asks every member of the placement for the chunk ids its live records reference
   (``GET /v1/refs``) and takes the union with its own. The round is skipped unless
   every member is up and answers: a peer that is down may hold the only copies of
   some records (a record is on W..R replicas), and a partial union would look like
   garbage;
3. notes, for each chunk it holds that is not in the union, since when it has been
   unreferenced, and deletes it once that is at least ``grace_s`` ago and the chunk was
   not stored (or stored again) in the last ``grace_s`` either.

What the grace protects:

- a writer uploads a batch's chunks first and writes the manifest that references
  them last: a chunk is kept ``grace_s`` after its last store, which is the time the
  writer has to name it in a record (a chunk stored again, deduplicated, counts as
  stored again);
- a reader that fetched a manifest just before it was deleted (retention) keeps its
  chunks for ``grace_s`` after the delete reached the ring, so a restore racing a
  collection completes if it takes less than ``grace_s``.

The unreferenced-since times live in memory: a restarted peer starts counting again,
which only delays collection. Each deletion moves the chunk's file out of place at
once (no store can slip in between the decision and the removal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ring import api
from ring.chunkstore import ChunkStore
from ring.errors import SR3Error
from ring.loops import run_periodic
from ring.membership import MemberTable
from ring.records import RecordStore
from ring.transport import Transport

__all__ = [
    "GC_GRACE_S_DEFAULT",
    "GC_INTERVAL_S_DEFAULT",
    "ChunkCollector",
    "GcReport",
    "GcSettings",
]

log = logging.getLogger(__name__)

GC_INTERVAL_S_DEFAULT = 300.0
GC_GRACE_S_DEFAULT = 3600.0


@dataclass(frozen=True, slots=True)
class GcSettings:
    # 0 turns collection off (tombstones are still purged by their TTL).
    interval_s: float = GC_INTERVAL_S_DEFAULT
    grace_s: float = GC_GRACE_S_DEFAULT


@dataclass(slots=True)
class GcReport:
    finished_at: float = 0.0
    skipped: str = ""  # why the sweep did not run, if it did not
    chunks_referenced: int = 0
    chunks_unreferenced: int = 0  # held here, referenced nowhere, still within the grace
    chunks_collected: int = 0
    bytes_collected: int = 0
    tombstones_purged: int = 0

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class ChunkCollector:
    def __init__(
        self,
        me: str,
        table: MemberTable,
        chunks: ChunkStore,
        records: RecordStore,
        transport: Transport,
        settings: GcSettings,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.me = me
        self.table = table
        self.chunks = chunks
        self.records = records
        self._transport = transport
        self.settings = settings
        # Monotonic, like the chunk store's: the grace is measured within this run.
        self._clock = clock
        self._wall_clock = wall_clock
        self._unreferenced_since: dict[str, float] = {}
        self.last: GcReport | None = None
        self.totals = GcReport()

    async def run(self) -> None:
        if self.settings.interval_s <= 0:
            return
        await run_periodic(
            "chunk collection",
            self.round,
            self.settings.interval_s,
            first_at_once=False,
            tolerated=(SR3Error,),
            clock=self._clock,
        )

    async def round(self) -> GcReport:
        report = GcReport()
        report.tombstones_purged = await self.records.purge_tombstones()
        referenced = await self._referenced(report)
        if referenced is not None:
            await self._sweep(referenced, report)
        report.finished_at = self._wall_clock()
        self.last = report
        for name in ("chunks_collected", "bytes_collected", "tombstones_purged"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(report, name))
        return report

    async def _referenced(self, report: GcReport) -> set[str] | None:
        """The union of every member's referenced chunks, or None (skip the sweep)."""
        states = self.table.states()
        not_up = sorted(p for p, state in states.items() if state == "down")
        if not_up:
            report.skipped = f"peers down: {', '.join(not_up)}"
            return None
        referenced = self.records.referenced()
        others = [m for m in self.table.placement() if m.peer_id != self.me]
        answers = await asyncio.gather(
            *(self._refs_of(member.address) for member in others), return_exceptions=True
        )
        for member, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, SR3Error):
                    raise answer
                report.skipped = f"{member.peer_id} did not list its references: {answer}"
                return None
            referenced |= answer
        report.chunks_referenced = len(referenced)
        return referenced

    async def _refs_of(self, address: str) -> set[str]:
        route = api.REFS
        answer = await self._transport.request(
            address, route.method, route.pattern, body_bytes_max=api.REFS_ANSWER_MAX * api.REF_BYTES
        )
        return api.parse_refs(answer.body)

    async def _sweep(self, referenced: set[str], report: GcReport) -> None:
        now = self._clock()
        grace = self.settings.grace_s
        held = self.chunks.ids()
        for chunk_id in list(self._unreferenced_since):
            if chunk_id in referenced or not self.chunks.has(chunk_id):
                del self._unreferenced_since[chunk_id]
        for chunk_id in held:
            if chunk_id in referenced:
                continue
            since = self._unreferenced_since.setdefault(chunk_id, now)
            if now - since < grace:
                report.chunks_unreferenced += 1
                continue
            size = self.chunks.discard_if_idle(chunk_id, now - grace)
            if size is None:
                report.chunks_unreferenced += 1
                continue
            del self._unreferenced_since[chunk_id]
            report.chunks_collected += 1
            report.bytes_collected += size
        await self.chunks.empty_trash()
        if report.chunks_collected:
            log.info(
                "collected %d unreferenced chunks (%d bytes)",
                report.chunks_collected, report.bytes_collected,
            )  # fmt: skip
