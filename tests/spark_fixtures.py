"""Real Spark for tests: one local SparkSession per pytest session and a small stateful query.

Load with ``pytest_plugins = ("spark_fixtures",)`` in a test module. Every test that uses
the ``spark`` fixture is marked ``spark`` (select with ``-m spark``, skip with
``-m "not spark"``); the marker is registered here so warnings-as-errors accept it.
Without Java or PySpark the fixture skips, or fails under ``SR3_REQUIRE_SPARK=1`` (CI).

The query is deterministic: JSON files written one per batch into a directory source
(``maxFilesPerTrigger=1``), deduplicated on (key, ts) and counted per one-minute window
and key with a 30-second watermark, in append mode: two stateful operators (``state/0``
the aggregation, ``state/1`` dropDuplicates). File i holds minute i, so each new file
lets the window two minutes before it be emitted. The output is collected per batch id
with ``foreachBatch``, so a test can take exactly the batches a run committed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import require_spark

PROVIDERS = {
    "hdfs": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
        ),
    },
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false",
    },
    "rocksdb-changelog": {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
}

Output = dict[int, list[tuple[str, str, int]]]

INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01, the minute the rows are about


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts a real local SparkSession (Java 17)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker("spark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (2 cores, 2 shuffle partitions) for the whole test session.

    State store maintenance runs every 200 ms and snapshots after 2 deltas, so even short
    queries leave snapshots (``.snapshot`` / RocksDB ``.zip`` with changelogs) behind.
    """
    require_spark()
    from pyspark.sql import SparkSession

    from spark_connector.plan_hook import local_conf

    # Loopback from the JVM's first line on (spark.driver.host applies later), and
    # Python workers from this interpreter, which has pandas and pyarrow.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sr3-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "200ms")
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
        # sr3's jar and checkpoint file manager: StateSync's plans (and sr3:// paths).
        .config(map=local_conf())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def write_input(directory: Path, index: int) -> None:
    """Input file ``index``: six rows in minute ``index``, keys k0..k4, one duplicate row."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"key": f"k{(index * 7 + second) % 5}", "ts": f"2024-01-01T00:{index:02d}:{second:02d}"}
        for second in range(5)
    ]
    rows.append(rows[0])
    temporary = directory / f".input-{index}.tmp"
    temporary.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    # The file source takes files oldest first by modification time; files written within
    # one clock tick would come in any order, and a newer minute first makes older rows late.
    modified_s = INPUT_MTIME_BASE_S + 10 * index
    os.utime(temporary, (modified_s, modified_s))
    temporary.rename(directory / f"input-{index:03d}.json")


def aggregation(spark: Any, input_dir: Path) -> Any:
    """dropDuplicates (operator 1) then a windowed count with a 30 s watermark
    (operator 0), over the files of ``write_input``."""
    from pyspark.sql import functions

    return (
        spark.readStream.schema("key STRING, ts TIMESTAMP")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .withWatermark("ts", "30 seconds")
        .dropDuplicates(["key", "ts"])
        .groupBy(functions.window("ts", "1 minute"), "key")
        .count()
    )


def run_query(spark: Any, input_dir: Path, checkpoint_dir: Path, provider: str) -> Output:
    """Process every input file present (one batch each, plus no-data batches) and stop.

    Returns the rows each batch emitted, by batch id: (window start, key, count).
    """
    for key, value in PROVIDERS[provider].items():
        spark.conf.set(key, value)
    output: Output = {}

    def collect(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted(
            (row["window"]["start"].isoformat(), row["key"], row["count"])
            for row in batch.collect()
        )

    counts = aggregation(spark, input_dir)
    query = (
        counts.writeStream.outputMode("append")
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return output


def state_rows(spark: Any, checkpoint_dir: Path, batch_id: int, operator_id: int) -> list[str]:
    """Operator ``operator_id``'s state as of ``batch_id``, read by Spark's state reader."""
    frame = (
        spark.read.format("statestore")
        .option("batchId", batch_id)
        .option("operatorId", operator_id)
        .load(str(checkpoint_dir))
    )
    return sorted(json.dumps(row.asDict(recursive=True), default=str) for row in frame.collect())
