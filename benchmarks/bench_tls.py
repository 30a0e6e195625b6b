"""What TLS on every hop costs record operations: create, update and read latency on a
ring with HTTPS everywhere and client certificates required (``sr3 cluster up --tls``)
against the same ring over plain HTTP, same code, same machine.

Each repetition starts a fresh five-peer cluster of each kind in turn (plain, TLS, then
TLS, plain in the next: ABBA), lets it settle, warms one client up (connections made,
TLS sessions established: a long-lived client pays the handshake once per connection),
and times ``--ops`` single-writer creates, updates and reads. Reported per phase: the
p50 and p99 of each repetition, and the TLS / plain ratio of p50 per repetition pair
(median and range). Writes ``benchmarks/results/tls-records.json``. The store
throughput with and without TLS is ``bench_store.py --compare-tls``.

    python benchmarks/bench_tls.py [--repeat 4] [--ops 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring.client import Client, ClientOptions
from sr3.local import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "tls-records.json"
PEERS = 5
SETTLE_S = 5.0
WARMUP_OPS = 50
VALUE = b"v" * 256
TARGET_P50_RATIO = 1.2
PHASES = ("create", "update", "read")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(cluster: LocalCluster, ops: int, tag: str) -> dict[str, dict[str, float]]:
    options = replace(ClientOptions(), tls=cluster.client_tls)
    figures: dict[str, dict[str, float]] = {}
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        for index in range(WARMUP_OPS):
            await client.put_record(f"warm/{tag}/{index}", VALUE, expected_version=0)
        await asyncio.sleep(SETTLE_S)
        latencies: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for index in range(ops):
            started = time.perf_counter()
            await client.put_record(f"c/{tag}/{index}", VALUE, expected_version=0)
            latencies["create"].append(1000 * (time.perf_counter() - started))
        version = await client.put_record(f"u/{tag}", VALUE, expected_version=0)
        for _ in range(ops):
            started = time.perf_counter()
            version = await client.put_record(f"u/{tag}", VALUE, expected_version=version)
            latencies["update"].append(1000 * (time.perf_counter() - started))
        for _ in range(ops):
            started = time.perf_counter()
            await client.get_record(f"u/{tag}")
            latencies["read"].append(1000 * (time.perf_counter() - started))
    for phase, values in latencies.items():
        figures[phase] = {"p50_ms": percentile(values, 0.5), "p99_ms": percentile(values, 0.99)}
    return figures


def one(work: Path, tls: bool, repeat: int, ops: int) -> dict[str, dict[str, float]]:
    home = work / f"{'tls' if tls else 'plain'}-{repeat}"
    cluster = LocalCluster.create(
        home, PEERS, cluster_file=home / "cluster.json", tls=tls, peer_flags=["--scrub-rate", "0"]
    )
    try:
        cluster.up()
        return asyncio.run(measure(cluster, ops, f"{repeat}"))
    finally:
        cluster.down(purge=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not 1 <= args.repeat <= 20 or not 10 <= args.ops <= 10_000:
        parser.error("--repeat 1..20, --ops 10..10000")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"plain": [], "tls": []}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sr3-bench-tls-") as temporary:
        work = Path(temporary)
        for repeat in range(args.repeat):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for tls in order:
                figures = one(work, tls, repeat, args.ops)
                runs["tls" if tls else "plain"].append(figures)
                summary = ", ".join(f"{p} p50 {figures[p]['p50_ms']:.2f} ms" for p in PHASES)
                print(f"{'tls  ' if tls else 'plain'} {repeat + 1}/{args.repeat}: {summary}")
    ratios: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        each = [
            secured[phase]["p50_ms"] / plain[phase]["p50_ms"]
            for plain, secured in zip(runs["plain"], runs["tls"], strict=True)
        ]
        ratios[phase] = {"median": statistics.median(each), "min": min(each), "max": max(each)}
    report: dict[str, Any] = {
        "benchmark": "tls-records",
        "peers": PEERS,
        "ops_per_phase": args.ops,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m_before": load,
        "ratio_tls_plain_p50": ratios,
        "target_p50_ratio": TARGET_P50_RATIO,
        "runs": runs,
        "notes": [
            "TLS: HTTPS on every hop, client certificates required, ECDSA P-256 (sr3 tls)",
            "ratio: TLS p50 / plain p50 per repetition pair; median, min and max",
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for phase in PHASES:
        figure = ratios[phase]
        print(
            f"{phase}: TLS/plain p50 {figure['median']:.2f}x "
            f"[{figure['min']:.2f}-{figure['max']:.2f}]"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
