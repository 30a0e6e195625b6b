"""Spark batch parquet on ``sr3://`` against ``file://``: the time of writing a large
partitioned table and of reading it back (a full scan), same job, same application
(``sr3.batch_app`` on ``local-cluster[2,1,1024]``), a five-peer local ring (R=3, W=2).

Each repetition is one application: for each scheme, a first write and then the timed
overwrite (``FileOutputCommitter`` algorithm 1), then the timed read. Reported: each
repetition's seconds and the sr3 / file ratios, median and range. Writes
``benchmarks/results/fs-batch.json``.

    python benchmarks/bench_fs_batch.py [--repeat 3] [--rows 1000000] [--value-bytes 1024]
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring.auth import scoped_credential
from sr3.batch_app import BatchJob, BatchResult
from sr3.cluster_app import application_env
from sr3.local import LocalCluster
from sr3.spark_demo import with_scratch

RESULTS = Path(__file__).resolve().parent / "results" / "fs-batch.json"
PEERS = 5
JOB_TIMEOUT_S = 3600.0
TARGET_WRITE = 1.5
TARGET_READ = 1.2


def one_run(rows: int, value_bytes: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sr3-bench-batch-") as home:
        cluster = LocalCluster.create(
            Path(home) / "ring", PEERS, cluster_file=Path(home) / "cluster.json"
        )
        cluster.up()
        try:
            now = int(time.time())
            credential = scoped_credential(
                cluster.secret, "/spark", expires_at=now + 7200, issued_at=now
            )
            job = BatchJob(
                sr3_path="sr3:///spark/bench-batch",
                local_path=f"file://{home}/tables",
                modes=("v1",),
                rows=rows,
                seed=seed,
                value_bytes=value_bytes,
                tasks=8,
            )
            done = subprocess.run(
                [sys.executable, "-m", "sr3.batch_app", job.to_json()],
                env=with_scratch(application_env(cluster.ring, credential), Path(home) / "jvm"),
                capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(done.stdout[-2000:] + done.stderr[-4000:])
            result = BatchResult.from_json(done.stdout.splitlines()[-1].removeprefix("RESULT "))
            table_bytes = sum(
                path.stat().st_size for path in (Path(home) / "tables").rglob("*.parquet")
            )
        finally:
            for peer in cluster.cluster.peers:
                if cluster.running(peer.peer_id):
                    cluster.stop(peer.peer_id)
    outcome = result.modes["v1"]
    if outcome.digests["sr3"] != outcome.digests["file"]:
        raise SystemExit("the sr3:// table differs from the file:// one")
    return {
        "write_s": outcome.write_s,
        "read_s": outcome.read_s,
        "rows": outcome.rows["sr3"],
        "table_bytes": table_bytes,
        "write_ratio": outcome.write_s["sr3"] / outcome.write_s["file"],
        "read_ratio": outcome.read_s["sr3"] / outcome.read_s["file"],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "mean": statistics.mean(values),
        "min": min(values),
        "max": max(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, choices=range(1, 11))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        runs.append(one_run(args.rows, args.value_bytes, seed=index + 1))
        print(json.dumps({k: runs[-1][k] for k in ("write_s", "read_s", "table_bytes")}))
    report = {
        "benchmark": "bench_fs_batch",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": args.rows,
        "value_bytes": args.value_bytes,
        "peers": PEERS,
        "runs": runs,
        "write_ratio": spread([run["write_ratio"] for run in runs]),
        "read_ratio": spread([run["read_ratio"] for run in runs]),
        "target": {"write_ratio": TARGET_WRITE, "read_ratio": TARGET_READ},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("write_ratio", "read_ratio")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
