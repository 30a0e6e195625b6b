"""A Spark batch job on ``local-cluster`` that writes and reads parquet on ``sr3://``, and
the same on ``file://`` to compare: the batch side of ``sr3://`` (the tests, and
``benchmarks/bench_fs_batch.py``).

    python -m sr3.batch_app JOB_JSON      prints RESULT <json> on its last line

The rows are deterministic (``BatchJob.rows``, ``seed``): an id, a value, and a partition
column whose values need escaping in a path (spaces, "/", "=", "%", ":", non-ASCII), so
``partitionBy`` makes directory names Spark escapes as ``%XX``. Each table gets a first
write of other rows (unless ``first_write`` is off), then the final rows with
``mode("overwrite")``, in each of
``MODES``: FileOutputCommitter's algorithm 1 or 2, and a static overwrite (none of the
first write may be left) or a dynamic one (``partitionOverwriteMode=dynamic``: Spark's
commit protocol moves staged partition directories into place, and the first write's
partitions the final rows do not touch stay).

Executors write their task output straight to the ring; task and job commits rename
directories (``FileOutputCommitter``). The ring and a scoped credential come from
``SR3_RING`` and ``SR3_CREDENTIAL``, as for ``sr3.cluster_app``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from ring.errors import ConfigError
from sr3.cluster_app import BASE_CONF, MASTER, local_cluster_conf
from sr3.spark_demo import scratch_conf

__all__ = ["MODES", "PARTITIONS", "BatchJob", "BatchResult", "ModeResult"]

# Values of the partition column: each needs escaping somewhere (Hadoop or Spark).
PARTITIONS = ("plain", "New York", "x=y", "São Paulo", "a/b", "100%", "k:v", "東京")
# The first write's rows fall in these, the final write's in those: a static overwrite
# leaves only the final ones; a dynamic one keeps the first write's other partitions.
FIRST_PARTITIONS = PARTITIONS[:5]
FINAL_PARTITIONS = PARTITIONS[3:]
# How each run commits: FileOutputCommitter's algorithm, and the overwrite mode.
MODES = {
    "v1": ("1", "static"),
    "v2": ("2", "static"),
    "v1-dynamic": ("1", "dynamic"),
}


@dataclass(frozen=True, slots=True)
class BatchJob:
    sr3_path: str  # sr3:///...: one table per mode under it
    local_path: str  # file:///...
    modes: tuple[str, ...] = ("v1",)
    rows: int = 200_000
    seed: int = 0
    value_bytes: int = 16  # a bigger value makes a bigger dataset (benchmarks)
    tasks: int = 4
    # Write other rows first and overwrite them (False: the final rows only, once).
    first_write: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BatchJob:
        data = json.loads(text)
        names = {field.name for field in fields(cls)}
        if not isinstance(data, dict) or not set(data) <= names:
            raise ConfigError(f"not a BatchJob: {text[:200]}")
        job = cls(**{**data, "modes": tuple(data.get("modes", ("v1",)))})
        if not job.modes or not set(job.modes) <= set(MODES):
            raise ConfigError(f"modes: some of {', '.join(MODES)}")
        return job


@dataclass(frozen=True, slots=True)
class ModeResult:
    rows: dict[str, int]  # rows read back, by scheme ("sr3", "file")
    digests: dict[str, str]  # of every row read back, by scheme
    partitions: dict[str, list[str]]  # directory names under the table, by scheme
    write_s: dict[str, float]  # the final write, by scheme
    read_s: dict[str, float]  # reading it back (a full scan), by scheme


@dataclass(frozen=True, slots=True)
class BatchResult:
    modes: dict[str, ModeResult]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BatchResult:
        data = json.loads(text)
        return cls({mode: ModeResult(**result) for mode, result in data["modes"].items()})


def _frame(spark: Any, job: BatchJob, first: bool) -> Any:
    """The rows: the final ones, or (``first``) other rows written before."""
    from pyspark.sql import functions

    count = max(1, job.rows // 3) if first else job.rows
    frame = spark.range(count, numPartitions=job.tasks)
    salt = job.seed * 7919 + (1 if first else 0)
    pick = functions.abs(functions.hash(functions.col("id"), functions.lit(salt)))
    choices = FIRST_PARTITIONS if first else FINAL_PARTITIONS
    city = functions.element_at(
        functions.array(*[functions.lit(value) for value in choices]),
        (pick % len(choices) + 1).cast("int"),
    )
    width = max(1, job.value_bytes)
    # Distinct digests side by side: bytes that do not compress (parquet's snappy finds
    # no repeats), so a table's size is about rows x value_bytes.
    digests = [
        functions.sha2(functions.concat_ws(":", "id", functions.lit(salt), functions.lit(k)), 256)
        for k in range((width + 63) // 64)
    ]
    padded = functions.concat_ws("", *digests)
    return frame.select(
        "id", city.alias("city"), functions.substring(padded, 1, width).alias("value")
    )


def _digest(spark: Any, path: str) -> tuple[int, str]:
    from pyspark.sql import functions

    frame = spark.read.parquet(path)
    row = frame.select(
        functions.count("*").alias("n"),
        functions.sum(
            functions.conv(
                functions.substring(
                    functions.sha2(functions.concat_ws("|", "id", "city", "value"), 256), 1, 12
                ),
                16,
                10,
            ).cast("decimal(38,0)")
        ).alias("sum"),
    ).collect()[0]
    return int(row["n"]), str(row["sum"])


def _partitions(spark: Any, path: str) -> list[str]:
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return sorted(
        status.getPath().getName() for status in fs.listStatus(hadoop_path) if status.isDirectory()
    )


def run(job: BatchJob) -> BatchResult:
    from pyspark.sql import SparkSession

    from spark_connector.conf import spark_conf

    credential = os.environ.get("SR3_CREDENTIAL")
    if not credential:
        raise ConfigError("SR3_CREDENTIAL: the driver takes a scoped credential, not the secret")
    settings = {
        **BASE_CONF,
        **scratch_conf(),
        **spark_conf(os.environ.get("SR3_RING"), credential=credential),
        **local_cluster_conf(),
    }
    builder = SparkSession.builder.master(MASTER).appName("sr3-batch")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = {mode: _run_mode(spark, job, mode) for mode in job.modes}
    spark.stop()
    return BatchResult(results)


def _run_mode(spark: Any, job: BatchJob, mode: str) -> ModeResult:
    algorithm, overwrite = MODES[mode]
    options = {
        "mapreduce.fileoutputcommitter.algorithm.version": algorithm,
        "partitionOverwriteMode": overwrite,
    }
    result = ModeResult({}, {}, {}, {}, {})
    for scheme, base in (("sr3", job.sr3_path), ("file", job.local_path)):
        path = f"{base}/{mode}"
        for first in (True, False) if job.first_write else (False,):
            writer = _frame(spark, job, first).write.partitionBy("city").mode("overwrite")
            started = time.monotonic()
            writer.options(**options).parquet(path)
            result.write_s[scheme] = time.monotonic() - started
        started = time.monotonic()
        result.rows[scheme], result.digests[scheme] = _digest(spark, path)
        result.read_s[scheme] = time.monotonic() - started
        result.partitions[scheme] = _partitions(spark, path)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sr3.batch_app JOB_JSON", file=sys.stderr)
        return 2
    result = run(BatchJob.from_json(argv[0]))
    print("RESULT " + result.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
