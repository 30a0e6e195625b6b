"""What checkpointing to ``sr3://`` costs a running query, against ``file://`` on the
local disk: same query, same Spark application, ``local-cluster[2,1,1024]`` (two
executor JVMs writing their state themselves), a 5-peer local ring (R=3, W=2) on the
same two cores.

For each state store provider (HDFS-backed, RocksDB) and each number of shuffle
partitions (8, and 200: Spark's default), two copies of a windowed count (one file of
events per micro-batch, ``maxFilesPerTrigger=1``, watermark, append mode to the ``noop``
sink) run one after the other in alternating blocks, one checkpointing to a local
directory, the other to ``sr3:///bench/...``. Per batch, ``durationMs.triggerExecution``
from ``recentProgress``, the first ``--warmup`` batches of each copy left out; the
medians and their ratio (target at 200 partitions: <= 1.3x). The peers' CPU seconds
are recorded around each block, so the ratio comes with where the time goes.

Writes ``benchmarks/results/fs.json`` and prints a table. Run from the repository root:

    python benchmarks/bench_fs.py [--batches 12] [--partitions 8,200] [--providers hdfs,rocksdb]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proc_cpu import cpu_seconds

from ring.auth import scoped_credential
from spark_connector.conf import spark_conf
from sr3.cluster_app import MASTER, local_cluster_conf
from sr3.local import LocalCluster

RESULTS = Path(__file__).parent / "results" / "fs.json"
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
TARGET_AT_200 = 1.3
ROWS_PER_FILE = 2000
KEYS = 5000
MTIME_BASE_S = 1_704_067_200


def write_events(directory: Path, index: int) -> None:
    rng = random.Random(index)
    lines = [
        json.dumps({
            "key": f"k{rng.randrange(KEYS):05d}",
            "ts": time.strftime(
                "%Y-%m-%dT%H:%M:%S", time.gmtime(MTIME_BASE_S + 60 * index + rng.randrange(60))
            ),
        })
        for _ in range(ROWS_PER_FILE)
    ]  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".events-{index:05d}.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    os.utime(temporary, (MTIME_BASE_S + 10 * index, MTIME_BASE_S + 10 * index))
    temporary.rename(directory / f"events-{index:05d}.json")


def session(conf: dict[str, str], provider: str, work: Path) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(MASTER).appName("sr3-bench-fs")
    settings = {
        **conf,
        **local_cluster_conf(),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "768m",
        "spark.local.dir": str(work / "spark-local"),
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass": PROVIDERS[provider],
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(spark: Any, input_dir: Path, checkpoint: str, name: str) -> Any:
    from pyspark.sql import functions
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    schema = StructType([StructField("key", StringType()), StructField("ts", TimestampType())])
    counts = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .withWatermark("ts", "10 minutes")
        .groupBy(functions.window("ts", "5 minutes"), "key")
        .count()
    )
    return (
        counts.writeStream.queryName(name)
        .outputMode("append")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def peers_cpu_s(cluster: LocalCluster) -> float:
    """User and system CPU seconds the peers used so far (from /proc)."""
    pids = [cluster.peer(peer.peer_id).pid for peer in cluster.cluster.peers]
    return sum(cpu_seconds(pid) or 0.0 for pid in pids if pid is not None)


def run_block(
    spark: Any, cluster: LocalCluster, input_dir: Path, checkpoint: str, name: str
) -> dict[str, Any]:
    """Process every file in ``input_dir`` not processed yet (availableNow)."""
    cpu_before = peers_cpu_s(cluster)
    started = time.monotonic()
    query = start_query(spark, input_dir, checkpoint, name)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")
    durations = [
        int(p.durationMs.get("triggerExecution", 0))
        for p in query.recentProgress
        if p.numInputRows > 0
    ]
    return {
        "durations_ms": durations,
        "seconds": time.monotonic() - started,
        "peers_cpu_s": peers_cpu_s(cluster) - cpu_before,
    }


def measure(
    spark: Any, cluster: LocalCluster, work: Path, partitions: int, batches: int, warmup: int,
    blocks: int,
) -> dict[str, Any]:  # fmt: skip
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    tag = f"p{partitions}-{random.randrange(10**9)}"
    sides = {
        "file": str(work / f"checkpoint-{tag}"),
        "sr3": f"sr3:///bench/{tag}",
    }
    inputs = {side: work / f"input-{tag}-{side}" for side in sides}
    figures: dict[str, dict[str, list[float]]] = {
        side: {"durations_ms": [], "peers_cpu_s": [], "seconds": []} for side in sides
    }
    per_block = max(1, batches // blocks)
    index = 0
    for block in range(blocks):
        order = ("file", "sr3") if block % 2 == 0 else ("sr3", "file")
        for _ in range(per_block):
            for side in sides:
                write_events(inputs[side], index)
            index += 1
        for side in order:
            result = run_block(spark, cluster, inputs[side], sides[side], f"{side}_{tag}")
            durations = result["durations_ms"]
            if block == 0:
                durations = durations[warmup:]
            figures[side]["durations_ms"] += durations
            figures[side]["peers_cpu_s"].append(result["peers_cpu_s"])
            figures[side]["seconds"].append(result["seconds"])
    medians = {side: statistics.median(f["durations_ms"]) for side, f in figures.items()}
    return {
        "partitions": partitions,
        "batches": index,
        "median_ms": medians,
        "ratio": medians["sr3"] / medians["file"],
        "spread_ms": {
            side: [min(f["durations_ms"]), max(f["durations_ms"])] for side, f in figures.items()
        },
        "peers_cpu_s": {side: sum(f["peers_cpu_s"]) for side, f in figures.items()},
        "durations_ms": {side: f["durations_ms"] for side, f in figures.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--partitions", default="8,200")
    parser.add_argument("--providers", default="hdfs,rocksdb")
    parser.add_argument("--peers", type=int, default=5)
    args = parser.parse_args()
    partitions = [int(p) for p in args.partitions.split(",")]
    providers = args.providers.split(",")
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="sr3-bench-fs-") as home_text:
        home = Path(home_text)
        cluster = LocalCluster.create(home / "ring", args.peers, cluster_file=home / "c.json")
        cluster.up()
        try:
            now = int(time.time())
            credential = scoped_credential(
                cluster.secret, "/bench", expires_at=now + 86400, issued_at=now
            )
            conf = spark_conf(cluster.ring, credential=credential)
            for provider in providers:
                spark = session(conf, provider, home)
                try:
                    for count in partitions:
                        figure = measure(
                            spark, cluster, home / provider, count, args.batches,
                            args.warmup, args.blocks,
                        )  # fmt: skip
                        results[f"{provider}-{count}"] = figure
                        print(
                            f"{provider:8} {count:4} partitions: file "
                            f"{figure['median_ms']['file']:.0f} ms, sr3 "
                            f"{figure['median_ms']['sr3']:.0f} ms, ratio {figure['ratio']:.2f}x, "
                            f"peers' CPU {figure['peers_cpu_s']['sr3']:.1f} s "
                            f"(file run {figure['peers_cpu_s']['file']:.1f} s)",
                            flush=True,
                        )
                finally:
                    spark.stop()
        finally:
            cluster.down(purge=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    met = all(
        results[f"{p}-200"]["ratio"] <= TARGET_AT_200 for p in providers if f"{p}-200" in results
    )
    print(f"target at 200 partitions (<= {TARGET_AT_200}x): {'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
