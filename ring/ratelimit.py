"""A token bucket for bytes per second, with an injected clock and sleep.

Used to keep background work (repair, scrubbing) from starving foreground traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["TokenBucket"]


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
