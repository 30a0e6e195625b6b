"""The Spark side of the connector benchmark: the deterministic input files, the local
session, the two streaming queries (windowed events for the overhead, one row of state
per id for the restart), the figures of their micro-batches from ``recentProgress``, and
the session's environment as recorded with the results."""

from __future__ import annotations

import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_settings import EVENT_SECONDS_PER_FILE, INPUT_MTIME_BASE_S, SEED, Settings

RECORDED_CONF = (
    "spark.sql.shuffle.partitions",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
    "spark.sql.streaming.stateStore.maintenanceInterval",
    "spark.sql.streaming.minBatchesToRetain",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    "spark.sql.streaming.noDataMicroBatches.enabled",
    "spark.driver.memory",
)


# -- input files -------------------------------------------------------------------------


def place(directory: Path, name: str, text: str, index: int) -> Path:
    """Write ``name`` atomically with a modification time that orders it by ``index``: the
    file source takes the oldest files first."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.tmp"
    temporary.write_text(text)
    modified_s = INPUT_MTIME_BASE_S + 10 * index
    os.utime(temporary, (modified_s, modified_s))
    return temporary.rename(directory / name)


def write_events(directory: Path, index: int, settings: Settings) -> Path:
    """Events file ``index``: ``rows_per_batch`` events in minute ``index`` over seeded keys."""
    rng = random.Random(SEED + index)
    start_s = INPUT_MTIME_BASE_S + EVENT_SECONDS_PER_FILE * index
    step_s = EVENT_SECONDS_PER_FILE / settings.rows_per_batch
    lines = [
        json.dumps({
            "key": f"key-{rng.randrange(settings.keys):08d}",
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start_s + int(row * step_s))),
            "value": rng.randrange(1_000_000),
        })
        for row in range(settings.rows_per_batch)
    ]  # fmt: skip
    return place(directory, f"events-{index:05d}.json", "\n".join(lines) + "\n", index)


def write_ids(directory: Path, index: int, first_id: int, count: int) -> Path:
    """Ids file ``index``: ``count`` consecutive ids from ``first_id``, one per line."""
    text = "\n".join(str(key) for key in range(first_id, first_id + count)) + "\n"
    return place(directory, f"ids-{index:05d}.txt", text, index)


# -- Spark -------------------------------------------------------------------------------


def start_spark(settings: Settings, local_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    from spark_connector.plan_hook import local_conf

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback from the JVM's start
    session = (
        SparkSession.builder.master(f"local[{settings.spark_cores}]")
        .appName("sr3-bench-connector")
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.local.dir", str(local_dir))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(settings.partitions))
        # One batch per input file: no extra batch to evict after the watermark moved.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # sr3's jar and checkpoint file manager: StateSync puts each plan on the ring.
        .config(map=local_conf())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def jvm_pid(spark: Any) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def start_events_query(spark: Any, input_dir: Path, checkpoint_dir: Path, name: str) -> Any:
    """The overhead query: count and sum per five-minute window and key, append mode."""
    from pyspark.sql import functions
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    schema = StructType([
        StructField("key", StringType()),
        StructField("ts", TimestampType()),
        StructField("value", LongType()),
    ])  # fmt: skip
    windows = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .withWatermark("ts", "10 minutes")
        .groupBy(functions.window("ts", "5 minutes"), "key")
        .agg(functions.count("*").alias("events"), functions.sum("value").alias("total"))
    )
    return (
        windows.writeStream.queryName(name)
        .outputMode("append")
        .format("noop")
        .option("checkpointLocation", str(checkpoint_dir))
        .start()
    )


def start_keys_query(
    spark: Any, input_dir: Path, checkpoint_dir: Path | str, *, available_now: bool = False
) -> Any:
    """The restart query: one row of state per unique id, holding a ~130-byte string.
    ``checkpoint_dir``: a local directory, or a URI (``sr3:///...``)."""
    from pyspark.sql import functions

    ids = spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
    key = functions.col("value").cast("long").alias("key")
    text = functions.col("key").cast("string")
    payload = functions.concat_ws(
        "-",
        functions.sha2(text, 256),
        functions.sha2(functions.concat(text, functions.lit("x")), 256),
    )
    rows = ids.select(key).select("key", payload.alias("payload"))
    writer = (
        rows.groupBy("key")
        .agg(functions.max("payload").alias("payload"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint_dir))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """One micro-batch from ``recentProgress``."""

    batch_id: int
    trigger_ms: int
    add_batch_ms: int
    input_rows: int
    state_rows: int
    state_memory_bytes: int


def batches_from(query: Any, first_batch_id: int) -> list[BatchFigures]:
    """The progress of every batch from ``first_batch_id`` on, in order."""
    figures = []
    for progress in query.recentProgress:
        if progress.batchId < first_batch_id or progress.numInputRows == 0:
            continue
        operators = progress.stateOperators
        figures.append(
            BatchFigures(
                batch_id=int(progress.batchId),
                trigger_ms=int(progress.durationMs.get("triggerExecution", 0)),
                add_batch_ms=int(progress.durationMs.get("addBatch", 0)),
                input_rows=int(progress.numInputRows),
                state_rows=sum(int(op.numRowsTotal) for op in operators),
                state_memory_bytes=sum(int(op.memoryUsedBytes) for op in operators),
            )
        )
    return sorted(figures, key=lambda batch: batch.batch_id)


def check_query(query: Any) -> None:
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"query {query.name or query.id} failed: {error}")


def environment(spark: Any, settings: Settings) -> dict[str, Any]:
    import pyspark

    jvm = spark.sparkContext._jvm
    conf = {key: conf_value(spark, key) for key in RECORDED_CONF}
    return {
        "cores": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "spark": spark.version,
        "java": str(jvm.java.lang.System.getProperty("java.version")),
        "platform": platform.platform(),
        "spark_master": f"local[{settings.spark_cores}]",
        "spark_conf": conf,
    }


def conf_value(spark: Any, key: str) -> str | None:
    """A setting as the session sees it (its default when not set), or None."""
    try:
        return str(spark.conf.get(key))
    except Exception:  # py4j's error for a key Spark does not know
        return None
