"""A token bucket for bytes per second, with an injected clock and sleep.

Both limits here measure durations: their clock is monotonic (``Clocks.monotonic``).

Used to keep background work (repair, scrubbing) from starving foreground traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["ForegroundGate", "TokenBucket"]


class TokenBucket:
    """``rate`` units per second, bursts of at most ``burst``. ``rate <= 0``: unlimited."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def acquire(self, amount: float) -> None:
        """Wait until ``amount`` units may pass. Amounts above the burst are let through
        once the bucket is full, and leave it in debt."""
        if self.rate <= 0:
            return
        async with self._lock:
            self._refill()
            needed = min(amount, self.burst)
            if self._tokens < needed:
                await self._sleep((needed - self._tokens) / self.rate)
                self._refill()
            self._tokens -= amount


class ForegroundGate:
    """Foreground requests in flight on this peer; background work (repair, scrubbing)
    waits for a quiet moment before each step, for at most ``wait_s_max`` so that it
    still progresses under constant load (then at its own rate limit)."""

    QUIET_S = 0.05
    POLL_S = 0.01
    # Longest one background step waits for foreground reads to pause.
    WAIT_S_MAX = 0.5

    def __init__(
        self,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._in_flight = 0
        self._last_active = clock() - self.QUIET_S

    def enter(self) -> None:
        self._in_flight += 1

    def leave(self) -> None:
        self._in_flight -= 1
        self._last_active = self._clock()

    @property
    def busy(self) -> bool:
        return self._in_flight > 0 or self._clock() - self._last_active < self.QUIET_S

    async def quiet(self, wait_s_max: float = WAIT_S_MAX) -> None:
        deadline = self._clock() + wait_s_max
        while self.busy and self._clock() < deadline:
            await self._sleep(self.POLL_S)
