"""Pure figures of the connector benchmark: medians, CPU deltas, new checkpoint bytes
between two listings, the upload and restart summaries, and the block-pair ratios with
their seeded bootstrap interval. Functions of values only: no Spark, no ring, no I/O."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from connector_settings import APP_MODES, TARGET_RESTART_RATIO

# A checkpoint listing: relative path -> (size, mtime_ns).
Listing = dict[str, tuple[int, int]]


def hidden_or_temporary(path: str) -> bool:
    """What no cut holds: hidden parts (Hadoop ``.crc`` side files) and ``*.tmp``."""
    parts = path.split("/")
    return any(part.startswith(".") for part in parts) or parts[-1].endswith(".tmp")


@dataclass(frozen=True, slots=True)
class NewFiles:
    """Checkpoint files that are new or changed between two listings."""

    files: int
    bytes_all: int
    bytes_visible: int


def new_files(before: Listing, after: Listing) -> NewFiles:
    changed = [path for path, stat in after.items() if before.get(path) != stat]
    return NewFiles(
        files=len(changed),
        bytes_all=sum(after[path][0] for path in changed),
        bytes_visible=sum(after[path][0] for path in changed if not hidden_or_temporary(path)),
    )


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def cpu_delta(
    before: dict[str, float | None], after: dict[str, float | None]
) -> dict[str, float | None]:
    delta: dict[str, float | None] = {}
    for name, start in before.items():
        end = after.get(name)
        delta[name] = None if start is None or end is None else end - start
    return delta


def upload_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    uploaded = sum(step["uploaded_bytes"] for step in steps)
    visible = sum(step["new_bytes_visible"] for step in steps)
    every = sum(step["new_bytes_all"] for step in steps)
    ratios = [
        step["uploaded_bytes"] / step["new_bytes_visible"]
        for step in steps
        if step["new_bytes_visible"]
    ]
    return {
        "batches": len(steps),
        "uploaded_bytes": uploaded,
        "new_bytes_visible": visible,
        "new_bytes_all": every,
        "ratio_visible": uploaded / visible if visible else None,
        "ratio_all": uploaded / every if every else None,
        "ratio_per_batch_max": max(ratios, default=None),
        "uploaded_bytes_per_batch_median": median([step["uploaded_bytes"] for step in steps]),
        "new_bytes_visible_per_batch_median": median([step["new_bytes_visible"] for step in steps]),
        "push_s_median": median([s for step in steps for s in step["push_s"]]),
        "steps": list(steps),
    }


def extra_cpu(with_side: dict[str, Any], without_side: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds per batch the connector side spent beyond the other, per process group:
    steadier than durations on a busy machine (the push's work shows up here even when it
    runs on an otherwise idle core)."""
    batches = with_side["batches"]
    extra: dict[str, Any] = {}
    for name, seconds in with_side["cpu_s"].items():
        other = without_side["cpu_s"].get(name)
        missing = seconds is None or other is None or not batches
        extra[name] = None if missing else round((seconds - other) / batches, 4)
    return extra


def pair_ratios(
    with_blocks: Sequence[dict[str, Any]], without_blocks: Sequence[dict[str, Any]]
) -> list[float]:
    return [
        round(ours["trigger_ms_median"] / theirs["trigger_ms_median"], 3)
        for ours, theirs in zip(with_blocks, without_blocks, strict=True)
    ]


def pair_interval(ratios: Sequence[float], resamples: int = 10_000) -> list[float]:
    """The mean of the block-pair ratios and a bootstrap 95 % interval of it (seeded):
    how far one run's figure can be trusted, given how much the pairs spread."""
    if not ratios:
        return []
    draw = random.Random(0)
    means = sorted(statistics.fmean(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return [round(statistics.fmean(ratios), 3), round(low, 3), round(high, 3)]


def bench_batches(block: dict[str, Any]) -> int:
    first, last = block["batch_ids"]
    return int(last) - int(first) + 1


def median_where(
    trials: Sequence[dict[str, Any]], field: str, value: str, name: str
) -> float | None:
    """The median of ``name`` over the trials whose ``field`` is ``value`` and have it."""
    return median([trial[name] for trial in trials if trial[field] == value and name in trial])


def ratio_to(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing (or the baseline is 0)."""
    return value / baseline if value is not None and baseline else None


def restart_summary(build: dict[str, Any], trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def of(path: str, name: str) -> float | None:
        return median_where(trials, "path", path, name)

    ring_s, local_s = of("ring", "total_s"), of("local", "total_s")
    ratio = ratio_to(ring_s, local_s)
    restore_s = of("ring", "restore_s")
    overlap_s = of("overlap", "total_s")
    return {
        "ring_total_s_median": ring_s,
        "local_total_s_median": local_s,
        "ratio": ratio,
        "target_ratio": TARGET_RESTART_RATIO,
        "target_met": ratio is not None and ratio <= TARGET_RESTART_RATIO,
        "restore_s_median": restore_s,
        "restore_mb_s": build["cut_bytes"] / 1e6 / restore_s if restore_s else None,
        "first_batch_after_ring_s_median": of("ring", "first_batch_s"),
        "first_batch_after_local_s_median": of("local", "first_batch_s"),
        # Copying the intact checkpoint (every retained version) with its sync, untimed
        # in the local restart: the cost of laying these bytes into new files here.
        "local_copy_s_median": of("local", "local_copy_s"),
        # The bound on any restore overlapped with the query's start (None: not run).
        "overlap_total_s_median": overlap_s,
        "overlap_ratio": ratio_to(overlap_s, local_s),
        "overlapped_restore_s_median": of("overlap", "overlapped_restore_s"),
        "build": build,
        "trials": list(trials),
    }


def app_restart_summary(trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Part 4: medians per path of the seconds from each application's process start to
    its first batch done, and the ratios against the restart on an intact local copy."""

    def of(mode: str, name: str) -> float | None:
        return median_where(trials, "mode", mode, name)

    local_s = of("local", "done_s")
    summary: dict[str, Any] = {"local_done_s_median": local_s}
    for mode in ("ring", "ring-first"):
        done_s = of(mode, "done_s")
        key = mode.replace("-", "_")
        summary[f"{key}_done_s_median"] = done_s
        summary[f"{key}_ratio"] = ratio_to(done_s, local_s)
        summary[f"{key}_restore_s_median"] = of(mode, "restore_s")
    summary["session_s_median"] = {mode: of(mode, "session_s") for mode in APP_MODES}
    summary["first_batch_s_median"] = {mode: of(mode, "first_batch_s") for mode in APP_MODES}
    ratio = summary["ring_ratio"]
    summary["target_ratio"] = TARGET_RESTART_RATIO
    summary["target_met"] = ratio is not None and ratio <= TARGET_RESTART_RATIO
    summary["jvm_crash_reports"] = sum(len(t.get("jvm_crash_reports", ())) for t in trials)
    summary["trials"] = list(trials)
    return summary
