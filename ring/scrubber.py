"""The scrubber: re-reads every stored chunk at a bounded rate and heals corrupt ones.

Disks rot silently. The scrubber walks the chunk store once every ``interval_s``
(default a day, like other stores' background scrubs), fully verifying each chunk
(payload checksum, decompression, content address) at no more than ``rate_bytes_s``.
A pass that takes longer than the interval is followed by the next at once. Passes back
to back would cost an idle peer CPU all the time (measured: about 20 ms per second per
peer holding 12 MB) for chunks that were verified minutes before.

A chunk that fails is quarantined by the store (the file is kept in
``<data>/quarantine`` as evidence) and fetched again, verified, from a live replica:
every member is asked, the preferred replicas first. A corrupt copy found by a read or a
duplicate write is handed over too (``flag``), and fetched again at once
(``run_restores``). When no member has a good copy the chunk is *unrecoverable* here:
logged at error, counted (``sr3_peer_chunks_unrecoverable``), listed in ``/v1/info``
and by ``sr3 status`` until a good copy arrives (a writer's retry, a later restore),
and its quarantined files stay where they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ring.chunkstore import ChunkStore
from ring.errors import ChunkCorrupt, SR3Error
from ring.loops import run_periodic
from ring.membership import MemberTable
from ring.placement import Ring
from ring.ratelimit import ForegroundGate, TokenBucket
from ring.replicas import read_from_replicas
from ring.transport import Transport

__all__ = ["ScrubStats", "Scrubber"]

log = logging.getLogger(__name__)

IDLE_PAUSE_S = 1.0
INTERVAL_S_DEFAULT = 24 * 3600.0
# Corrupt chunks waiting to be fetched again; past this, the next scrub pass or repair
# round finds them.
RESTORE_QUEUE_MAX = 1024
# Unrecoverable chunks listed (the count goes on past it).
UNRECOVERABLE_LISTED_MAX = 100


@dataclass(slots=True)
class ScrubStats:
    passes: int = 0
    chunks_verified: int = 0
    bytes_verified: int = 0
    corrupt_found: int = 0
    repaired: int = 0
    unrepaired: int = 0


class Scrubber:
    def __init__(
        self,
        me: str,
        chunks: ChunkStore,
        table: MemberTable,
        ring: Callable[[], Ring],
        transport: Transport,
        *,
        replication: int,
        rate_bytes_s: float,
        interval_s: float = INTERVAL_S_DEFAULT,
        foreground: ForegroundGate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._foreground = foreground
        self._clock = clock  # monotonic: pacing and the rate limit
        self.me = me
        self.chunks = chunks
        self.table = table
        self._ring = ring
        self._transport = transport
        self._replication = replication
        self.enabled = rate_bytes_s > 0
        self.interval_s = interval_s
        self._bucket = TokenBucket(rate_bytes_s, 4 * 1024 * 1024, clock)
        self.stats = ScrubStats()
        self._flagged: OrderedDict[str, None] = OrderedDict()
        self._wake = asyncio.Event()
        # Chunks no member had a good copy of, oldest first, while this peer lacks them.
        self._unrecoverable: OrderedDict[str, None] = OrderedDict()

    def unrecoverable(self) -> list[str]:
        """Chunks found corrupt here that no member had a good copy of, and that this
        peer still lacks (at most ``UNRECOVERABLE_LISTED_MAX``)."""
        for chunk_id in [c for c in self._unrecoverable if self.chunks.has(c)]:
            del self._unrecoverable[chunk_id]
        return list(self._unrecoverable)

    def flag(self, chunk_id: str) -> None:
        """Fetch a good copy of ``chunk_id`` soon: this peer quarantined its own."""
        if chunk_id not in self._flagged and len(self._flagged) < RESTORE_QUEUE_MAX:
            self._flagged[chunk_id] = None
        self._wake.set()

    async def run_restores(self) -> None:
        """Fetch again, until cancelled, the chunks ``flag`` names (those the store
        holds again by then are skipped)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._flagged:
                chunk_id, _ = self._flagged.popitem(last=False)
                if not self.chunks.has(chunk_id):
                    await self.restore(chunk_id)

    async def run(self) -> None:
        """A pass every ``interval_s`` (the first at start) until cancelled; returns at once
        when disabled (rate 0)."""
        if not self.enabled:
            return
        await run_periodic(
            "scrub",
            self.scrub_pass,
            self.interval_s,
            pace="start",
            pause_s_min=IDLE_PAUSE_S,
            clock=self._clock,
        )

    async def scrub_pass(self) -> None:
        for chunk_id in self.chunks.ids():
            size = self.chunks.stored_size(chunk_id)
            if size is None:
                continue
            if self._foreground is not None:
                await self._foreground.quiet()
            await self._bucket.acquire(size)
            try:
                if await self.chunks.verify(chunk_id):
                    self.stats.chunks_verified += 1
                    self.stats.bytes_verified += size
            except ChunkCorrupt:
                self.stats.corrupt_found += 1
                self._flagged.pop(chunk_id, None)
                await self.restore(chunk_id)
        self.stats.passes += 1

    async def restore(self, chunk_id: str) -> bool:
        """Fetch a good copy of ``chunk_id`` from a live member (the preferred replicas
        first, then every other) and store it again."""
        live = self.table.live()
        replicas = [
            member
            for member in self._ring().candidates(chunk_id, self._replication)
            if member.peer_id != self.me and member.peer_id in live
        ]
        read = await read_from_replicas(
            self._transport,
            replicas,
            chunk_id,
            check="content",
            tolerated=(SR3Error,),
            store=lambda stored: self.chunks.put(chunk_id, stored),
        )
        for cause in read.causes:
            log.info("scrubber: a replica could not give %s: %s", chunk_id, cause)
        if read.holder is not None:
            log.warning(
                "scrubber: restored corrupt chunk %s from %s", chunk_id, read.holder.peer_id
            )
            self.stats.repaired += 1
            self._unrecoverable.pop(chunk_id, None)
            return True
        log.error(
            "scrubber: chunk %s is corrupt here and none of the %d live members asked has a "
            "good copy; its corrupt file is kept in the quarantine folder",
            chunk_id,
            len(replicas),
        )
        self.stats.unrepaired += 1
        self._unrecoverable[chunk_id] = None
        self._unrecoverable.move_to_end(chunk_id)
        while len(self._unrecoverable) > UNRECOVERABLE_LISTED_MAX:
            self._unrecoverable.popitem(last=False)
        return False
