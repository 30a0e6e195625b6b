"""The periodic-loop helper (ring.loops) on a fake clock and sleep: pacing, failed
rounds, the end condition and cancellation, with no real waiting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from ring.errors import PeerUnavailable, SR3Error
from ring.loops import LoopStats, pause_after, run_periodic


class Stop(Exception):
    """Raised by the fake sleep to end a loop after a number of pauses."""


class FakeTime:
    """A monotonic clock that only moves when a step works or the loop sleeps."""

    def __init__(self, pauses_max: int = 100) -> None:
        self.now = 0.0
        self.pauses: list[float] = []
        self.events: list[str] = []
        self._pauses_max = pauses_max

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.events.append(f"sleep {seconds:g}")
        self.pauses.append(seconds)
        if len(self.pauses) > self._pauses_max:
            raise Stop
        self.now += seconds
        await asyncio.sleep(0)

    def step(
        self, duration_s: float, *, fail: BaseException | None = None
    ) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            self.events.append(f"round at {self.now:g}")
            self.now += duration_s
            if fail is not None:
                raise fail

        return step


async def test_pace_after_waits_the_interval_after_each_round() -> None:
    time = FakeTime(pauses_max=3)
    with pytest.raises(Stop):
        await run_periodic("test", time.step(3.0), 10.0, sleep=time.sleep, clock=time.clock)
    assert time.events[:4] == ["round at 0", "sleep 10", "round at 13", "sleep 10"]
    assert time.pauses == [10.0] * 4


async def test_pace_start_keeps_start_to_start_and_pauses_after_an_overrun() -> None:
    time = FakeTime(pauses_max=1)
    durations = iter([3.0, 15.0])

    async def step() -> None:
        time.now += next(durations)

    with pytest.raises(Stop):
        await run_periodic(
            "scrub", step, 10.0, pace="start", pause_s_min=1.0, sleep=time.sleep, clock=time.clock
        )
    # 10 - 3 after the short round; the 15 s round overran: only the minimum pause.
    assert time.pauses == [7.0, 1.0]


def test_pause_after() -> None:
    assert pause_after("after", 10.0, 1.0, 25.0) == 10.0
    assert pause_after("start", 10.0, 1.0, 4.0) == 6.0
    assert pause_after("start", 10.0, 1.0, 9.5) == 1.0
    assert pause_after("start", 0.0, 1.0, 0.0) == 1.0


async def test_first_round_after_one_interval_when_asked() -> None:
    time = FakeTime(pauses_max=1)
    with pytest.raises(Stop):
        await run_periodic(
            "repair", time.step(0.0), 5.0, first_at_once=False,
            sleep=time.sleep, clock=time.clock,
        )  # fmt: skip
    assert time.events == ["sleep 5", "round at 5", "sleep 5"]


async def test_a_tolerated_failure_is_logged_counted_and_paced_like_a_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime(pauses_max=2)
    stats = LoopStats()
    outcomes: list[BaseException | None] = [PeerUnavailable("p2", "down"), None, None]

    async def step() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    with caplog.at_level(logging.INFO, logger="ring.loops"), pytest.raises(Stop):
        await run_periodic(
            "gc", step, 30.0, tolerated=(SR3Error,), stats=stats,
            sleep=time.sleep, clock=time.clock,
        )  # fmt: skip
    assert time.pauses == [30.0, 30.0, 30.0]
    assert (stats.rounds, stats.failures, stats.failures_in_a_row) == (3, 1, 0)
    assert stats.last_error == "p2: down"
    assert "gc round failed (1 in a row): p2: down" in caplog.text
    assert "gc round succeeded after 1 failed" in caplog.text


async def test_an_untolerated_exception_ends_the_loop() -> None:
    time = FakeTime()
    stats = LoopStats()
    with pytest.raises(ValueError, match="bug"):
        await run_periodic(
            "gossip", time.step(0.0, fail=ValueError("bug")), 1.0,
            tolerated=(SR3Error,), stats=stats, sleep=time.sleep, clock=time.clock,
        )  # fmt: skip
    assert time.pauses == []
    assert stats.failures == 0


async def test_until_ends_the_loop_without_a_last_pause() -> None:
    time = FakeTime()
    left = [3]

    async def step() -> None:
        left[0] -= 1

    await run_periodic(
        "leave", step, 1.0, until=lambda: left[0] == 0, sleep=time.sleep, clock=time.clock
    )
    assert time.pauses == [1.0, 1.0]
    # Nothing to do: no round and no pause.
    await run_periodic("leave", step, 1.0, until=lambda: True, sleep=time.sleep)
    assert left == [0]
    assert time.pauses == [1.0, 1.0]


async def test_cancellation_propagates_even_when_every_exception_is_tolerated() -> None:
    started = asyncio.Event()
    stats = LoopStats()

    async def step() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(run_periodic("test", step, 1.0, tolerated=(Exception,), stats=stats))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (stats.rounds, stats.failures) == (0, 0)


@pytest.mark.parametrize(
    ("interval_s", "pause_s_min"),
    [(0.0, 0.0), (-1.0, 0.0), (float("nan"), 0.0), (1.0, float("inf")), (1.0, -0.5)],
)
async def test_a_loop_that_would_not_pause_is_refused(
    interval_s: float, pause_s_min: float
) -> None:
    time = FakeTime()
    with pytest.raises(ValueError, match="test"):
        await run_periodic(
            "test", time.step(0.0), interval_s, pause_s_min=pause_s_min,
            sleep=time.sleep,
        )  # fmt: skip
    assert time.events == []
