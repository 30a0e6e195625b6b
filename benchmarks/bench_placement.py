"""Balance and churn of ring placement for a range of ring sizes and vnode counts.

For N peers and V vnodes per peer it measures, exactly (no sampling):

- ``max/mean`` of ``Ring.ownership(1)``: how much more than its fair share the most loaded
  peer holds (1.0 is perfect balance);
- ``moved_fraction`` when an (N+1)-th peer joins, against the ideal ``1/(N+1)``;
- the cost side of the tradeoff: ring size (N*V tokens), build and diff time.

Placement is deterministic for given peer ids, so one set of ids is a single sample. Each
cell is therefore measured over several id sets ("trials"); the table shows the canonical
ids ``peer-1..peer-N`` and the worst and mean over trials. Run from the repository root:

    python benchmarks/bench_placement.py [--trials 20]

Figures go to ``benchmarks/results/placement.json``; they were used to pick
``ring.placement.VNODES_DEFAULT``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring.placement import VNODES_DEFAULT, Member, Ring, moved_fraction

PEER_COUNTS = (3, 5, 8, 16, 32)
VNODE_COUNTS = (16, 64, 128, 256, 512)
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "placement.json"


def peer_ids(count: int, trial: int) -> list[str]:
    """Trial 0 uses the canonical ids; other trials use other, equally plausible ids."""
    prefix = "peer" if trial == 0 else f"node{trial}"
    return [f"{prefix}-{i}" for i in range(1, count + 1)]


def measure(peers: int, vnodes: int, trial: int) -> dict[str, float]:
    """Balance and join churn for one ring."""
    ids = peer_ids(peers + 1, trial)
    members = [Member(peer_id, f"127.0.0.{i + 1}:7000") for i, peer_id in enumerate(ids)]
    started_s = time.perf_counter()
    ring = Ring.build(members[:peers], vnodes=vnodes)
    build_ms = (time.perf_counter() - started_s) * 1000
    shares = ring.ownership(1).values()
    joined = ring.with_member(members[peers])
    started_s = time.perf_counter()
    moved = moved_fraction(ring, joined, 1)
    diff_ms = (time.perf_counter() - started_s) * 1000
    return {
        "max_over_mean": max(shares) / (sum(shares) / peers),
        "min_over_mean": min(shares) / (sum(shares) / peers),
        "join_moved_fraction": moved,
        "join_moved_over_ideal": moved * (peers + 1),
        "build_ms": build_ms,
        "join_diff_ms": diff_ms,
    }


def measure_cell(peers: int, vnodes: int, trials: int) -> dict[str, Any]:
    """One (N, V) cell: canonical ids plus worst and mean over ``trials`` id sets."""
    samples = [measure(peers, vnodes, trial) for trial in range(trials)]
    ratios = [sample["max_over_mean"] for sample in samples]
    moved_ratios = [sample["join_moved_over_ideal"] for sample in samples]
    return {
        "peers": peers,
        "vnodes": vnodes,
        "tokens": peers * vnodes,
        "canonical": samples[0],
        "max_over_mean_worst": max(ratios),
        "max_over_mean_mean": statistics.fmean(ratios),
        "join_moved_over_ideal_worst": max(moved_ratios, key=lambda ratio: abs(ratio - 1)),
        "join_moved_over_ideal_mean": statistics.fmean(moved_ratios),
        "build_ms_mean": statistics.fmean(sample["build_ms"] for sample in samples),
        "join_diff_ms_mean": statistics.fmean(sample["join_diff_ms"] for sample in samples),
    }


def print_table(cells: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>3} {'vnodes':>6} {'tokens':>6} | {'max/mean':>8} {'worst':>6} {'mean':>6} | "
        f"{'moved':>7} {'ideal':>7} {'ratio':>6} {'worst':>6} | {'build ms':>8} {'diff ms':>7}"
    )
    print(header)
    print("-" * len(header))
    for cell in cells:
        canonical = cell["canonical"]
        ideal = 1 / (cell["peers"] + 1)
        print(
            f"{cell['peers']:>3} {cell['vnodes']:>6} {cell['tokens']:>6} | "
            f"{canonical['max_over_mean']:>8.3f} {cell['max_over_mean_worst']:>6.3f} "
            f"{cell['max_over_mean_mean']:>6.3f} | "
            f"{canonical['join_moved_fraction']:>7.4f} {ideal:>7.4f} "
            f"{canonical['join_moved_over_ideal']:>6.3f} "
            f"{cell['join_moved_over_ideal_worst']:>6.3f} | "
            f"{cell['build_ms_mean']:>8.2f} {cell['join_diff_ms_mean']:>7.2f}"
        )


def write_results(cells: list[dict[str, Any]], trials: int) -> None:
    """Write atomically so a reader never sees half a file."""
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "placement",
        "vnodes_default": VNODES_DEFAULT,
        "trials": trials,
        "replication": 1,
        "cells": cells,
    }
    temporary = RESULTS_PATH.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, RESULTS_PATH)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=20, help="id sets per cell (>= 1)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    cells = [
        measure_cell(peers, vnodes, args.trials) for peers in PEER_COUNTS for vnodes in VNODE_COUNTS
    ]
    print_table(cells)
    write_results(cells, args.trials)
    print(f"\nwrote {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
