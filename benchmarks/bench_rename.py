"""What an atomic file rename costs: ``sr3://`` file renames against the code before it.

Before ``--before`` (default ``2e2b9e2``) a file rename wrote the target's record, then
deleted the source's: three rounds with the reads, but a request cut between the two
left the file at both ends. Since, it is an intent, two marks, a commit and a clean-up
(``filesystem.file_rename``): six rounds, atomic wherever it is cut.

Each side (the code of ``--before``, extracted with ``git archive``, and this checkout)
runs in a worker process (this script with ``--worker``) whose ``PYTHONPATH`` is that
code: it starts a local ring of 5 peers (R=3, W=2), waits out the peers' sync window,
then times, one call at a time through one ``FsClient``:

- **create**: a PUT of a new 1 KiB file (the baseline of the same run);
- **rename**: that file renamed to a new path;
- **rename, overwrite**: a new file renamed with overwrite onto an existing one.

Sides alternate which goes first from one repetition to the next. Reported per
repetition: each call's p50 and p99, and the ratios new/old of the p50s; over the
repetitions their median and range. Run from the repository root:

    python benchmarks/bench_rename.py [--repeat 3] [--ops 100]
                                      [--out benchmarks/results/rename.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_records import extract, percentile

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parent.parent
RESULTS_PATH_DEFAULT = SCRIPT.parent / "results" / "rename.json"
BEFORE_DEFAULT = "2e2b9e2"
PEERS = 5
FILE_BYTES = 1024
CALLS = ("create", "rename", "rename_overwrite")
# Bounds: calls per kind, repetitions, how long a worker may take.
OPS_MAX = 2_000
REPEAT_MAX = 20
WARMUP_OPS = 20
# The peers' sync window after they start (failure timeout and repair rounds): a new
# acceptor catches up from the others before its first round, as bench_records waits.
SETTLE_S = 40.0
WORKER_TIMEOUT_S = 900.0
BASE_PORT = 7740


async def measure(address: list[str], secret: str, ops: int) -> dict[str, list[float]]:
    from spark_connector.fs_client import FsClient

    times: dict[str, list[float]] = {call: [] for call in CALLS}
    body = os.urandom(FILE_BYTES)
    async with FsClient(address, secret) as fs:
        for index in range(WARMUP_OPS + ops):
            root = f"/bench/rename/{index}"
            await fs.write(f"{root}/final-overwritten", body)
            started = time.perf_counter()
            await fs.write(f"{root}/a.tmp", body)
            created = time.perf_counter()
            await fs.rename(f"{root}/a.tmp", f"{root}/a")
            renamed = time.perf_counter()
            await fs.write(f"{root}/b.tmp", body)
            written = time.perf_counter()
            await fs.rename(f"{root}/b.tmp", f"{root}/final-overwritten", overwrite=True)
            overwritten = time.perf_counter()
            if index >= WARMUP_OPS:
                times["create"].append((created - started) * 1000)
                times["rename"].append((renamed - created) * 1000)
                times["rename_overwrite"].append((overwritten - written) * 1000)
    return times


def run_worker(home: Path, ops: int) -> None:
    from sr3.local import LocalCluster

    cluster = LocalCluster.create(
        home, PEERS, replication=3, write_quorum=2, base_port=BASE_PORT,
        cluster_file=home / "cluster.json",
    )  # fmt: skip
    try:
        cluster.up()
        time.sleep(SETTLE_S)
        times = asyncio.run(measure(list(cluster.cluster.addresses), cluster.secret, ops))
    finally:
        cluster.down(purge=True)
    print(json.dumps(times))


def side(code: Path, ops: int) -> dict[str, dict[str, float]]:
    """One side's run: each call's p50 and p99 in ms."""
    with tempfile.TemporaryDirectory(prefix="sr3-bench-rename-") as home:
        environment = {**os.environ, "PYTHONPATH": str(code)}
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--worker", home, "--ops", str(ops)],
            cwd=code, env=environment, capture_output=True, text=True,
            timeout=WORKER_TIMEOUT_S, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"worker of {code} failed:\n{done.stderr[-3000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        call: {"p50_ms": percentile(times[call], 0.5), "p99_ms": percentile(times[call], 0.99)}
        for call in CALLS
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE_DEFAULT)
    parser.add_argument("--repeat", type=int, default=3, choices=range(1, REPEAT_MAX + 1))
    parser.add_argument("--ops", type=int, default=100, choices=range(1, OPS_MAX + 1))
    parser.add_argument("--out", type=Path, default=RESULTS_PATH_DEFAULT)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        run_worker(args.worker, args.ops)
        return 0
    with tempfile.TemporaryDirectory(prefix="sr3-bench-rename-code-") as scratch:
        old = extract("old", args.before, Path(scratch) / "old")
        codes = {"old": old.path, "new": REPO_ROOT}
        repetitions: list[dict[str, Any]] = []
        for repetition in range(args.repeat):
            order = ["old", "new"] if repetition % 2 == 0 else ["new", "old"]
            figures = {name: side(codes[name], args.ops) for name in order}
            ratios = {
                call: round(figures["new"][call]["p50_ms"] / figures["old"][call]["p50_ms"], 3)
                for call in CALLS
            }
            repetitions.append({"order": order, "figures": figures, "p50_ratio": ratios})
            print(json.dumps(repetitions[-1]), flush=True)
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "before": old.commit,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "peers": PEERS,
        "ops": args.ops,
        "repetitions": repetitions,
        "p50_ratio": {call: spread([r["p50_ratio"][call] for r in repetitions]) for call in CALLS},
        "p50_ms": {
            f"{name} {call}": spread([r["figures"][name][call]["p50_ms"] for r in repetitions])
            for name in ("old", "new")
            for call in CALLS
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["p50_ratio"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
