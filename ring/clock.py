"""The two clocks a peer runs on, injected so that tests can step them.

``monotonic`` measures durations: failure detection, timeouts, rate limits, pacing of
background loops, grace periods of state held in memory. It never jumps, so an NTP step
cannot mark every peer down or hide a failure. ``wall`` is unix time, only for what is
stored or compared across processes and machines: tombstone ages, signed timestamps,
the times reports show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SYSTEM_CLOCKS", "Clocks"]


@dataclass(frozen=True, slots=True)
class Clocks:
    monotonic: Callable[[], float]
    wall: Callable[[], float]


SYSTEM_CLOCKS = Clocks(monotonic=time.monotonic, wall=time.time)
