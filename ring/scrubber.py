"""The scrubber: re-reads every stored chunk at a bounded rate and heals corrupt ones.

Disks rot silently. The scrubber walks the chunk store once every ``interval_s``
(default a day, like other stores' background scrubs), fully verifying each chunk
(payload checksum, decompression, content address) at no more than ``rate_bytes_s``.
A pass that takes longer than the interval is followed by the next at once. Passes back
to back would cost an idle peer CPU all the time (measured: about 20 ms per second per
peer holding 12 MB) for chunks that were verified minutes before.

A chunk that fails is quarantined by the store and fetched again, verified, from a live
replica; if none has a good copy, the scrubber reports it and the repair loop's audit
counts it among the lost.
"""

from __future__ import annotations

import logging
import time
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
                await self.restore(chunk_id)
        self.stats.passes += 1

    async def restore(self, chunk_id: str) -> bool:
        """Fetch a good copy of ``chunk_id`` from a live replica and store it again."""
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
            return True
        log.error("scrubber: no live replica has a good copy of %s", chunk_id)
        self.stats.unrepaired += 1
        return False
