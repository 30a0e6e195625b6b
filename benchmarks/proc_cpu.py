"""CPU seconds of processes from ``/proc``, for benchmarks that report what a phase cost
the client and the servers. It imports nothing of sr3: a worker that runs another
tree's ring code (``records_worker.py``) uses it too."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["cpu_delta", "cpu_seconds", "cpu_sum"]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and all its threads, from /proc (None
    where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_sum(pids: Sequence[int]) -> float | None:
    figures = [cpu_seconds(pid) for pid in pids]
    return None if any(figure is None for figure in figures) else sum(filter(None, figures))


def cpu_delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before
