"""How long a new application takes to restart a query holding a large RocksDB state
from ``sr3://``, against the same from ``file://`` on the local disk.

A 5-peer local ring (R=3, W=2) and Spark on ``local-cluster[2,1,1024]`` share the two
cores. A query keeping one row per unique id (a ~130-byte string each, RocksDB provider)
is built up to at least ``--state-mib`` of state files under ``state/`` (the SST files
and zips RocksDB uploads), once on a local checkpoint and once on ``sr3:///bench/...``,
each in its own application. Then, ``--restarts`` times in alternating order, a new
application (its own driver and executor JVMs, so RocksDB starts from nothing on the
executors) processes one small file on each checkpoint: the time from its query's
``start()`` until that batch is done, and from the application's start. The ratio of
the medians (sr3 / file) is the figure; the peers' CPU seconds say where time went.

Writes ``benchmarks/results/fs-restart.json``. Run from the repository root:

    python benchmarks/bench_fs_restart.py [--state-mib 256] [--restarts 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_fs import session
from connector_spark import start_keys_query
from proc_cpu import cpu_seconds

from ring.auth import scoped_credential
from sr3.local import LocalCluster

RESULTS = Path(__file__).parent / "results" / "fs-restart.json"
IDS_PER_FILE = 400_000
MIB = 1024 * 1024
APP_S_MAX = 1800


# -- one application (a subprocess) -----------------------------------------------------


def _session(work: Path) -> Any:
    from spark_connector.conf import spark_conf

    conf = spark_conf(os.environ["SR3_RING"], credential=os.environ["SR3_CREDENTIAL"])
    spark = session({**conf, "spark.sql.shuffle.partitions": "8"}, "rocksdb", work)
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    return spark


def app(input_dir: str, checkpoint: str) -> int:
    """Process what is new in ``input_dir``; print one JSON line of timings."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sr3-bench-app-") as work:
        return _app(_session(Path(work)), began, input_dir, checkpoint)


def _app(spark: Any, began: float, input_dir: str, checkpoint: str) -> int:
    started = time.monotonic()
    query = start_keys_query(spark, Path(input_dir), checkpoint, available_now=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    done = time.monotonic()
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    print(json.dumps({
        "query_s": done - started,
        "app_s": done - began,
        "batches": len(batches),
        "state_rows": sum(int(op.numRowsTotal) for op in batches[-1].stateOperators)
        if batches else 0,
    }), flush=True)  # fmt: skip
    spark.stop()
    return 0


# -- the parent ---------------------------------------------------------------------------


def write_ids(directory: Path, index: int) -> None:
    first = index * IDS_PER_FILE
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".ids-{index:05d}.tmp"
    temporary.write_text("\n".join(str(i) for i in range(first, first + IDS_PER_FILE)) + "\n")
    os.utime(temporary, (1_704_067_200 + 10 * index,) * 2)
    temporary.rename(directory / f"ids-{index:05d}.txt")


def run_app(env: dict[str, str], input_dir: Path, checkpoint: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "app", str(input_dir), checkpoint],
        env=env, capture_output=True, text=True, timeout=APP_S_MAX, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"application failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def state_bytes_local(checkpoint: Path) -> int:
    return sum(p.stat().st_size for p in (checkpoint / "state").rglob("*") if p.is_file())


async def state_bytes_sr3(ring: str, secret: str, path: str) -> int:
    from spark_connector.fs_client import FsClient

    total = 0
    async with FsClient(ring, secret) as fs:
        pending = [path + "/state"]
        while pending:
            for entry in await fs.list(pending.pop()):
                if entry.type == "directory":
                    pending.append(entry.path)
                else:
                    total += entry.size
    return total


def peers_cpu_s(cluster: LocalCluster) -> float:
    pids = [cluster.peer(peer.peer_id).pid for peer in cluster.cluster.peers]
    return sum(cpu_seconds(pid) or 0.0 for pid in pids if pid is not None)


def main() -> int:
    import asyncio

    if len(sys.argv) == 4 and sys.argv[1] == "app":
        return app(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", type=int, default=256)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--files-max", type=int, default=40)
    args = parser.parse_args()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="sr3-bench-fs-restart-") as home_text:
        home = Path(home_text)
        cluster = LocalCluster.create(home / "ring", 5, cluster_file=home / "c.json")
        cluster.up()
        try:
            now = int(time.time())
            credential = scoped_credential(
                cluster.secret, "/bench", expires_at=now + 86400, issued_at=now
            )
            hidden = ("SR3_SECRET", "SR3_CLUSTER_FILE")
            env = {k: v for k, v in os.environ.items() if k not in hidden}
            env.update(SR3_RING=cluster.ring, SR3_CREDENTIAL=credential)
            input_dir = home / "ids"
            sides = {"file": str(home / "checkpoint"), "sr3": "sr3:///bench/restart"}
            build: dict[str, Any] = {"file": [], "sr3": []}
            index = 0
            state = {"file": 0, "sr3": 0}
            while min(state.values()) < args.state_mib * MIB and index < args.files_max:
                for _ in range(2):
                    write_ids(input_dir, index)
                    index += 1
                for side, checkpoint in sides.items():
                    build[side].append(run_app(env, input_dir, checkpoint))
                state["file"] = state_bytes_local(Path(sides["file"]))
                state["sr3"] = asyncio.run(
                    state_bytes_sr3(cluster.ring, cluster.secret, "/bench/restart")
                )
                print(f"built {index} files: state file {state['file'] / MIB:.0f} MiB, "
                      f"sr3 {state['sr3'] / MIB:.0f} MiB", flush=True)  # fmt: skip
            restarts: dict[str, list[dict[str, Any]]] = {"file": [], "sr3": []}
            for trial in range(args.restarts):
                write_ids(input_dir, index)
                index += 1
                order = ("file", "sr3") if trial % 2 == 0 else ("sr3", "file")
                for side in order:
                    cpu = peers_cpu_s(cluster)
                    figure = run_app(env, input_dir, sides[side])
                    figure["peers_cpu_s"] = peers_cpu_s(cluster) - cpu
                    restarts[side].append(figure)
                    print(f"restart {trial} {side}: {figure}", flush=True)
            medians = {
                side: {
                    key: statistics.median(r[key] for r in runs)
                    for key in ("query_s", "app_s", "peers_cpu_s")
                }
                for side, runs in restarts.items()
            }
            results.update(
                state_bytes=state,
                build=build,
                restarts=restarts,
                medians=medians,
                ratio_query=medians["sr3"]["query_s"] / medians["file"]["query_s"],
                ratio_app=medians["sr3"]["app_s"] / medians["file"]["app_s"],
            )
        finally:
            cluster.down(purge=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"restart with {results['state_bytes']['sr3'] / MIB:.0f} MiB of RocksDB state: "
        f"query {results['medians']['sr3']['query_s']:.1f} s from sr3:// vs "
        f"{results['medians']['file']['query_s']:.1f} s from file:// "
        f"({results['ratio_query']:.2f}x); application {results['ratio_app']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
