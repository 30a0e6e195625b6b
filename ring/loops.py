"""One skeleton for the periodic background loops of a peer (gossip, repair, scrubbing,
chunk collection, handing data over on leave, overlay upkeep).

``run_periodic`` runs ``step`` round after round until cancelled (or until ``until``
says the work is done). The pause between rounds is either ``interval_s`` after a round
ends (``pace="after"``) or what is left of ``interval_s`` since it started
(``pace="start"``), and at least ``pause_s_min`` either way.

A failed round is handled in one bounded way: an exception of a ``tolerated`` type
(an expected operating error, such as a peer being down) is logged and counted, and the
next round comes after the usual pause, never sooner, so a failing loop costs no more
than a working one. Any other exception is a bug and propagates, ending the loop (and
the task group it runs in). Cancellation always propagates.

Nothing is spawned: the loop runs in the caller's task. Sleep and clock are injected, so
tests drive loops without real waiting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["LoopStats", "Pacing", "run_periodic"]

log = logging.getLogger(__name__)

Pacing = Literal["after", "start"]


@dataclass(slots=True)
class LoopStats:
    """What a loop did so far; pass one in to observe a running loop."""

    rounds: int = 0  # finished, successfully or not
    failures: int = 0  # rounds that raised a tolerated exception
    failures_in_a_row: int = 0
    last_error: str = ""


async def run_periodic(
    name: str,
    step: Callable[[], Awaitable[object]],
    interval_s: float,
    *,
    pace: Pacing = "after",
    first_at_once: bool = True,
    pause_s_min: float = 0.0,
    tolerated: tuple[type[Exception], ...] = (),
    until: Callable[[], bool] | None = None,
    stats: LoopStats | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``step`` every ``interval_s`` until cancelled or ``until()`` is true.

    ``first_at_once=False`` waits one interval before the first round. ``until`` is
    checked before every round and after it (no pause once the work is done). ``clock``
    is monotonic; only ``pace="start"`` reads it.
    """
    for value in (interval_s, pause_s_min):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}: loop pauses are finite and not negative, not {value}")
    if max(interval_s, pause_s_min) <= 0:
        raise ValueError(f"{name}: a loop with no pause between rounds would starve the rest")
    stats = stats if stats is not None else LoopStats()
    if not first_at_once:
        await sleep(interval_s)
    while until is None or not until():
        started = clock()
        await _round(name, step, tolerated, stats)
        if until is not None and until():
            return
        await sleep(pause_after(pace, interval_s, pause_s_min, clock() - started))


def pause_after(pace: Pacing, interval_s: float, pause_s_min: float, elapsed_s: float) -> float:
    """How long to wait after a round that took ``elapsed_s``."""
    if pace == "after":
        return max(pause_s_min, interval_s)
    return max(pause_s_min, interval_s - elapsed_s)


async def _round(
    name: str,
    step: Callable[[], Awaitable[object]],
    tolerated: tuple[type[Exception], ...],
    stats: LoopStats,
) -> None:
    try:
        await step()
    except tolerated as exc:
        stats.failures += 1
        stats.failures_in_a_row += 1
        stats.last_error = str(exc)
        stats.rounds += 1
        log.warning("%s round failed (%d in a row): %s", name, stats.failures_in_a_row, exc)
        return
    if stats.failures_in_a_row:
        log.info("%s round succeeded after %d failed", name, stats.failures_in_a_row)
    stats.failures_in_a_row = 0
    stats.rounds += 1
