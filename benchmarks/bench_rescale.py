"""What a rescale through the ring costs against Spark's own offline repartition.

One process, one local ring of ``--peers`` peers (R=3, W=2) on 127.0.0.x, one local
SparkSession (RocksDB's provider, ``--from`` shuffle partitions), and the connector
benchmark's keys query (one row of state per unique id, ~130-byte strings). For each
``--sizes`` state size (MiB of the consistent cut's ``state/``):

1. the state is built with ``StateSync`` pushing every batch, then the query stops; an
   intact local copy of its checkpoint is kept;
2. ``--runs`` times, in alternating order:
   - **spark**: Spark's runner (``StreamingCheckpointManager.repartition``) on a fresh
     copy of the intact local checkpoint (the copy is made before the clock starts):
     what a user with the checkpoint on a local disk does;
   - **sr3**: ``spark_connector.rescale.rescale`` through the ring: the lease, a restore
     of the newest batch into a scratch folder, the same runner, the push of the new
     batch under the lease (timed whole, and each step); afterwards the rescaled batch's
     manifest is deleted, so that the next run starts from the same batch again.

Reported per size: the medians (and ranges) of both, their ratio (target at 295 MiB,
8 to 16: sr3 <= 1.3x spark), and the bytes restored and pushed. Writes
``benchmarks/results/rescale.json`` (``rescale-quick.json`` with ``--quick``). Every
process shares the machine's cores. From the repository root:

    .venv/bin/python benchmarks/bench_rescale.py [--quick] [--sizes 64,128,256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from connector_probes import cut_state_bytes
from connector_spark import check_query, start_keys_query, write_ids

from ring.sync_client import SyncClient
from spark_connector.catalog import delete_manifest
from spark_connector.plan_hook import local_conf
from spark_connector.rescale import rescale
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

RESULTS = Path(__file__).parent / "results"
MIB = 1024 * 1024
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
BUILD_ROWS = 300_000
BUILD_BATCHES_MAX = 400
BASE_PORT = 7820


def session(from_partitions: int, local_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("sr3-bench-rescale")
        .config("spark.driver.memory", "6g")
        .config("spark.local.dir", str(local_dir))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(from_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config(map=local_conf())
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def build(spark: Any, cluster: LocalCluster, query: str, work: Path, size_mib: int) -> int:
    """The keys query with StateSync until its cut holds ``size_mib`` of state; the
    newest batch (pushed). Its checkpoint is ``work / "checkpoint"``."""
    input_dir, checkpoint = work / "input", work / "checkpoint"
    input_dir.mkdir(parents=True)
    with StateSync(cluster.ring, query, checkpoint, cluster.secret) as sync:
        sync.attach(spark)
        stream = start_keys_query(spark, input_dir, sync.checkpoint_dir)
        sync.register(stream, spark)
        batch = -1
        try:
            state_bytes = 0
            while state_bytes < size_mib * MIB:
                batch += 1
                if batch >= BUILD_BATCHES_MAX:
                    raise RuntimeError(f"state {state_bytes} bytes after {batch} batches")
                write_ids(input_dir, batch, batch * BUILD_ROWS, BUILD_ROWS)
                stream.processAllAvailable()
                check_query(stream)
                state_bytes, _files = cut_state_bytes(checkpoint)
            sync.flush(timeout_s=600)
        finally:
            stream.stop()
    print(f"  built {state_bytes / MIB:.0f} MiB of state in {batch + 1} batches", flush=True)
    return batch


def spark_run(spark: Any, intact: Path, scratch: Path, to_partitions: int) -> float:
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(intact, scratch)
    started = time.perf_counter()
    spark._streamingCheckpointManager.repartition(str(scratch), to_partitions)
    return time.perf_counter() - started


def sr3_run(
    spark: Any, cluster: LocalCluster, query: str, to_partitions: int, scratch: Path
) -> dict[str, Any]:
    with SyncClient(cluster.ring, cluster.secret) as client:
        started = time.perf_counter()
        report = rescale(client, query, to_partitions, spark, scratch_dir=scratch)
        seconds = time.perf_counter() - started
        assert report.batch_id is not None
        delete_manifest(client, query, report.batch_id)
    return {
        "seconds": seconds,
        "restore_s": report.restore_s,
        "repartition_s": report.repartition_s,
        "push_s": report.push_s,
        "restored_bytes": report.restored_bytes,
        "pushed_bytes": report.pushed_bytes,
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def measure(args: argparse.Namespace, cluster: LocalCluster, work: Path) -> list[dict[str, Any]]:
    spark = session(args.from_partitions, work / "spark-local")
    results = []
    try:
        for size in args.sizes:
            query = f"bench-rescale-{size}"
            here = work / f"size-{size}"
            batch = build(spark, cluster, query, here, size)
            intact = here / "intact"
            shutil.copytree(here / "checkpoint", intact)
            spark_s: list[float] = []
            sr3_runs: list[dict[str, Any]] = []
            for run in range(args.runs):
                order = ("spark", "sr3") if run % 2 == 0 else ("sr3", "spark")
                for side in order:
                    if side == "spark":
                        spark_s.append(
                            spark_run(spark, intact, here / "spark-copy", args.to_partitions)
                        )
                    else:
                        sr3_runs.append(sr3_run(spark, cluster, query, args.to_partitions, here))
                print(
                    f"  {size} MiB run {run + 1}: spark {spark_s[-1]:.2f} s, sr3 "
                    f"{sr3_runs[-1]['seconds']:.2f} s", flush=True,
                )  # fmt: skip
            sr3_s = [run["seconds"] for run in sr3_runs]
            results.append({
                "state_mib": size,
                "base_batch": batch,
                "spark_s": summary(spark_s),
                "sr3_s": summary(sr3_s),
                "ratio_median": round(statistics.median(sr3_s) / statistics.median(spark_s), 3),
                "ratio_mean": round(statistics.fmean(sr3_s) / statistics.fmean(spark_s), 3),
                "sr3_steps": {
                    step: summary([run[step] for run in sr3_runs])
                    for step in ("restore_s", "repartition_s", "push_s")
                },
                "restored_bytes": sr3_runs[-1]["restored_bytes"],
                "pushed_bytes": sr3_runs[-1]["pushed_bytes"],
                "spark_runs_s": [round(s, 3) for s in spark_s],
                "sr3_runs_s": [round(s, 3) for s in sr3_s],
            })  # fmt: skip
            shutil.rmtree(here, ignore_errors=True)
    finally:
        spark.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB, 2 runs")
    parser.add_argument("--sizes", default="64,128,256", help="state sizes in MiB")
    parser.add_argument("--from", dest="from_partitions", type=int, default=8)
    parser.add_argument("--to", dest="to_partitions", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peers", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.sizes = [16] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        args.runs = 2
    out = args.out or RESULTS / ("rescale-quick.json" if args.quick else "rescale.json")
    with tempfile.TemporaryDirectory(prefix="sr3-bench-rescale-") as temporary:
        work = Path(temporary)
        cluster = LocalCluster.create(
            work / "ring", args.peers, replication=3, write_quorum=2, base_port=BASE_PORT,
            cluster_file=work / "cluster.json",
        )  # fmt: skip
        cluster.up()
        try:
            results = measure(args, cluster, work)
        finally:
            cluster.down(purge=True)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "from_partitions": args.from_partitions,
        "to_partitions": args.to_partitions,
        "peers": args.peers,
        "runs": args.runs,
        "sizes": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for row in results:
        print(
            f"{row['state_mib']} MiB {args.from_partitions}->{args.to_partitions}: spark "
            f"{row['spark_s']['median']} s, sr3 {row['sr3_s']['median']} s, ratio "
            f"{row['ratio_median']} (mean {row['ratio_mean']})"
        )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
