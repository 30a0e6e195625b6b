"""Whether a coordinator of ``sr3://`` may still commit a write it serves: not once it
stalled while the write was in flight, nor just after a stall, nor once its client left.

A client of the namespace (``spark_connector.fs_client``, the Java FileSystem) that
waits on a coordinator probes it (``GET /v1/health``); when the probe goes unanswered
for the clients' ``PROBE_TIMEOUT_S`` (1 s), it gives the request up, sends it
through another peer, and may then write the same path again. A coordinator that was
frozen meanwhile (SIGSTOP, a paused VM, an event loop blocked) would, once it runs
again, go on with the request it was serving, or with one that waited in its kernel's
socket buffer all along, and commit it after those newer writes: older content over
newer, a file deleted after it was written again.

So a coordinator watches its own event loop (``StallWatch``): a timer every ``TICK_S``
on the monotonic clock, which keeps counting while the process is stopped. A gap
between two ticks above ``STALL_S`` is a stall. A record write made for a request
(``GuardedClient``: every commit, mark, delete and rename step goes through it) is
refused with 425 ``stalled``, writing nothing, when

- a stall was seen since the request's handler started (it was in flight across it);
- the loop has not ticked for more than ``STALL_S`` (a stall it has not counted yet);
- the handler started less than ``AFTER_STALL_S`` after a stall ended: a request that
  arrived during the stall waited in the socket buffer and is read in the first turns
  of the loop after it (each shorter than ``STALL_S``, or it is a stall again);
- the client closed its connection: it went elsewhere, nobody reads the answer.

Why a client that gave up on a coordinator finds it refusing: a probe crosses four
turns of the peer's loop (accept, read, handle, answer), so a peer whose loop never
paused more than ``STALL_S`` (0.2 s) answers within 0.8 s, under the clients' 1 s.
A probe unanswered for longer means a stall after it was sent, hence after the request
was (the request went first), so the request is in flight across it or waited through
it. A write whose commit had started before the stall holds a version read before it:
any write the client made through another peer since then moved the record on, so the
late compare-and-set fails, and its retry is refused here. What remains (a coordinator
that keeps turning but cannot answer within the bound: overloaded by many turns just
under ``STALL_S``, or cut off from its client but not from the ring) is in docs/fs.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from filesystem.namespace import FsError
from ring.client import Client, ClientOptions
from ring.client.chunks import LocalChunks

__all__ = [
    "AFTER_STALL_S",
    "STALL_S",
    "TICK_S",
    "CommitGuard",
    "GuardedClient",
    "Mark",
    "StallWatch",
]

log = logging.getLogger(__name__)

# The watch's timer period, and the gap between two of its ticks that counts as a stall
# (its period included): a loop that kept turning ticks every TICK_S plus its turn.
TICK_S = 0.05
STALL_S = 0.2
# 425 Too Early: the peer will not risk committing a request its client may have sent
# again elsewhere. A 4xx: nothing in the request is wrong, and the peer is not failing
# (a 5xx would count a pause of this peer's loop as a server error); clients go on
# through the next seed, as for a 503.
STALLED_STATUS = 425
# A request whose handler started within this after a stall may have waited through it.
AFTER_STALL_S = 1.0


@dataclass(frozen=True, slots=True)
class Mark:
    """When a request's handler started: the stalls counted so far, and the time."""

    stalls: int
    at_s: float


class StallWatch:
    """The pure core: fed the monotonic times of the loop's ticks, it counts stalls and
    says whether a request marked at some point may still commit."""

    def __init__(self, now_s: float) -> None:
        self.last_tick_s = now_s
        self.stalls = 0
        self.stall_ended_s = -math.inf
        self.last_stall_s = 0.0

    def tick(self, now_s: float) -> float:
        """A tick at ``now_s``; the gap since the last one."""
        gap = now_s - self.last_tick_s
        self.last_tick_s = now_s
        if gap > STALL_S:
            self.stalls += 1
            self.stall_ended_s = now_s
            self.last_stall_s = gap
        return gap

    def resume(self, now_s: float) -> None:
        """Tick at ``now_s`` without counting the gap (the timer starts)."""
        self.last_tick_s = now_s

    def mark(self, now_s: float) -> Mark:
        return Mark(self.stalls, now_s)

    def refusal(self, mark: Mark, now_s: float) -> str | None:
        """Why a request marked ``mark`` must not commit at ``now_s``, or None."""
        silent = now_s - self.last_tick_s
        if silent > STALL_S:
            return f"this peer's event loop did not run for {silent:.2f} s"
        if self.stalls != mark.stalls:
            return f"this peer stalled ({self.last_stall_s:.2f} s) while it served the request"
        after = mark.at_s - self.stall_ended_s
        if after < AFTER_STALL_S:
            return (
                f"the request came {after:.2f} s after this peer stalled "
                f"({self.last_stall_s:.2f} s): it may have waited through the stall"
            )
        return None


@dataclass(frozen=True, slots=True)
class _Serving:
    guard: CommitGuard
    mark: Mark
    gone: Callable[[], bool]


# The request the running task serves (tasks it starts inherit it); None outside any.
_SERVING: ContextVar[_Serving | None] = ContextVar("sr3_fs_serving", default=None)


class CommitGuard:
    """A peer's watch over its loop, and the check every record write made for a
    request passes first (``check``); ``run`` is the watch's timer."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.watch = StallWatch(clock())
        # Writes refused so far (for logs and tests).
        self.refused = 0

    @contextmanager
    def serving(self, gone: Callable[[], bool]) -> Iterator[None]:
        """Mark the request the block serves; ``gone`` says whether its client left."""
        token = _SERVING.set(_Serving(self, self.watch.mark(self._clock()), gone))
        try:
            yield
        finally:
            _SERVING.reset(token)

    def check(self) -> None:
        """Raise 425 ``stalled`` when the request being served must not commit now."""
        serving = _SERVING.get()
        if serving is None or serving.guard is not self:
            return  # not for a request (the rename sweep), or another peer's
        refusal = self.watch.refusal(serving.mark, self._clock())
        if refusal is None and serving.gone():
            refusal = "its client closed the connection"
        if refusal is None:
            return
        self.refused += 1
        log.info("a write is not committed: %s", refusal)
        raise FsError(
            STALLED_STATUS, "stalled",
            f"not committed: {refusal}; its client may have gone on through another peer",
        )  # fmt: skip

    async def run(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Tick every ``TICK_S`` until cancelled; log the stalls."""
        self.watch.resume(self._clock())
        while True:
            await sleep(TICK_S)
            gap = self.watch.tick(self._clock())
            if gap > STALL_S:
                log.info(
                    "this peer's event loop stalled for %.2f s: writes in flight across it "
                    "or arriving within %.1f s after it are not committed", gap, AFTER_STALL_S,
                )  # fmt: skip


class GuardedClient(Client):
    """The ring client a peer's namespace writes through: each record write made for a
    request passes ``guard.check`` first (a refusal writes nothing)."""

    def __init__(
        self,
        ring: str | Sequence[str],
        secret: str,
        *,
        guard: CommitGuard,
        options: ClientOptions,
        local_chunks: LocalChunks | None,
    ) -> None:
        super().__init__(ring, secret, options=options, local_chunks=local_chunks)
        self.guard = guard

    async def put_record(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int,
        refs: Sequence[str] = (),
        op: str | None = None,
    ) -> int:
        self.guard.check()
        return await super().put_record(
            key, value, expected_version=expected_version, refs=refs, op=op
        )

    async def delete_record(self, key: str, *, expected_version: int, op: str | None = None) -> int:
        self.guard.check()
        return await super().delete_record(key, expected_version=expected_version, op=op)
