"""The Spark side of ``sr3 demo``: a stateful query in its own driver process.

    python -m sr3.spark_demo run JOB      process the input one file per trigger and push
                                          every committed batch to the ring, until killed
    python -m sr3.spark_demo resume JOB   restore the newest batch from the ring into the
                                          empty checkpoint, finish the input, then run the
                                          reference query over all of it; write RESULT

JOB is a JSON object (``JobArgs``); the resume result is JSON too (``ResumeResult``).
Ring and secret come from ``SR3_RING`` and ``SR3_SECRET``, so the secret stays out of
the process list.

The query is deterministic: one JSON file per minute of events, read one file per batch
(``maxFilesPerTrigger=1``), deduplicated on (key, ts) and counted per one-minute window
and key with a 30-second watermark, in append mode. ``foreachBatch`` writes each batch's
rows to ``batch-NNNNNN.json`` (atomically, by batch id), so the output of a driver
survives its death and a replayed batch overwrites nothing but itself.

The helpers the parent uses (input files, reading outputs, the argument and result
types) import no pyspark.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ring.config import Settings, resolve
from ring.errors import ConfigError, SR3Error
from spark_connector.sync import StateSync

__all__ = [
    "SCRATCH_ENV",
    "JobArgs",
    "Output",
    "ResumeResult",
    "Row",
    "RunSummary",
    "read_output",
    "scratch_beside",
    "scratch_conf",
    "with_scratch",
    "write_inputs",
]

Row = tuple[str, str, int]  # (window start, key, count)
Output = dict[int, list[Row]]  # rows by batch id

KEYS = 8
ROWS_PER_FILE = 40
DUPLICATES_PER_FILE = 4
EVENTS_START = datetime(2024, 1, 1)
INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01, the day the events are about
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    # Snapshots (not only deltas) after a few batches, as a long-running query has them.
    "spark.sql.streaming.stateStore.maintenanceInterval": "500ms",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
}


# The folder an application's JVMs keep their scratch files in: Spark's local folders
# (shuffle blocks, a RocksDB state store's working copy) and the native libraries
# RocksDB, lz4 and snappy extract at start. Its launcher puts it in a work folder it
# cleans up: in the system temp folder, a SIGKILLed JVM (drills, the demo) leaves them
# there for good, hundreds of MB per killed application with RocksDB state.
SCRATCH_ENV = "SR3_JVM_SCRATCH"


def with_scratch(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` for an application whose JVMs keep their scratch files in ``folder``."""
    return {**env, SCRATCH_ENV: str(folder.resolve())}


def scratch_beside(log_path: Path) -> Path:
    """The scratch folder of the application whose output goes to ``log_path``: beside
    it, named after it (``driver.log``: ``driver.jvm``), in the launcher's work folder."""
    return log_path.with_name(f"{log_path.stem}.jvm")


def scratch_conf(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark settings that put the JVMs' scratch files (driver's and executors') in
    the folder ``SR3_JVM_SCRATCH`` names, created here; none when it is unset."""
    folder = (os.environ if environ is None else environ).get(SCRATCH_ENV)
    if not folder:
        return {}
    local, tmp = Path(folder) / "local", Path(folder) / "tmp"
    local.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    # Spark splits these options as a shell would: quoted, a path may hold spaces.
    quoted = str(tmp).replace("\\", "\\\\").replace('"', '\\"')
    option = f'"-Djava.io.tmpdir={quoted}"'
    return {
        "spark.local.dir": str(local),
        "spark.driver.extraJavaOptions": option,
        "spark.executor.extraJavaOptions": option,
    }


@dataclass(frozen=True, slots=True)
class JobArgs:
    input_dir: str
    checkpoint_dir: str
    output_dir: str
    query: str = "demo"
    trigger_s: float = 1.0
    run_s_max: float = 300.0  # a driver nobody kills stops by itself after this long
    topology: str = "auto"
    reference_checkpoint_dir: str = ""
    reference_output_dir: str = ""
    result_path: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobArgs:
        return cls(**_known_fields(cls, json.loads(text)))


@dataclass(frozen=True, slots=True)
class RunSummary:
    last_batch: int  # -1: the run committed no batch
    input_rows: dict[int, int]  # rows read from the input, by batch id
    seconds: float


@dataclass(frozen=True, slots=True)
class ResumeResult:
    spark_start_s: float
    restored_batch: int
    restored_files: int
    restored_bytes: int
    topology: str  # the one the restore ran along ("auto" chose it)
    topology_reason: str
    restore_s: float
    resumed: RunSummary  # the restored query over the rest of the input
    reference: RunSummary  # the same query over all input, without failures

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ResumeResult:
        data = _known_fields(cls, json.loads(text))
        runs = {name: _run_summary(data[name]) for name in ("resumed", "reference")}
        return cls(**{**data, **runs})


def _run_summary(data: Any) -> RunSummary:
    fields_ = _known_fields(RunSummary, data)
    rows = {int(batch): int(count) for batch, count in fields_["input_rows"].items()}
    return RunSummary(int(fields_["last_batch"]), rows, float(fields_["seconds"]))


def _known_fields(cls: type[Any], data: Any) -> dict[str, Any]:
    names = {field.name for field in fields(cls)}
    if not isinstance(data, dict) or not set(data) <= names:
        raise ConfigError(f"not a {cls.__name__}: {str(data)[:200]}")
    return data


# -- input and output (no pyspark) ------------------------------------------------------------


def input_rows(index: int, seed: int) -> list[dict[str, str]]:
    """File ``index``'s events: minute ``index``, seeded keys, a few exact duplicates."""
    rng = random.Random(f"{seed}/{index}")
    minute = EVENTS_START + timedelta(minutes=index)
    rows = [
        {
            "key": f"k{rng.randrange(KEYS)}",
            "ts": (minute + timedelta(seconds=rng.randrange(60))).isoformat(),
        }
        for _ in range(ROWS_PER_FILE)
    ]
    return rows + [rng.choice(rows) for _ in range(DUPLICATES_PER_FILE)]


def write_inputs(directory: Path, files: int, seed: int) -> int:
    """Write ``files`` input files; the number of rows written."""
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    for index in range(files):
        rows = input_rows(index, seed)
        temporary = directory / f".input-{index}.tmp"
        temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
        # The file source takes files oldest first by modification time; files written
        # within one clock tick would come in any order, and late minutes would be dropped.
        modified_s = INPUT_MTIME_BASE_S + 10 * index
        os.utime(temporary, (modified_s, modified_s))
        temporary.rename(directory / f"input-{index:04d}.json")
        total += len(rows)
    return total


def read_output(directory: Path) -> Output:
    """The rows of every batch a run wrote into ``directory``, by batch id."""
    output: Output = {}
    for path in sorted(directory.glob("batch-*.json")):
        rows = json.loads(path.read_text())
        output[int(path.stem.removeprefix("batch-"))] = [
            (str(start), str(key), int(count)) for start, key, count in rows
        ]
    return output


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# -- the Spark job ----------------------------------------------------------------------------


def _session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    from spark_connector.plan_hook import local_conf

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    # sr3's jar and checkpoint file manager: StateSync puts each batch's plan on the ring
    # before the batch runs.
    for key, value in {**SPARK_CONF, **scratch_conf(), **local_conf()}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _batch_writer(output_dir: Path) -> Callable[[Any, int], None]:
    output_dir.mkdir(parents=True, exist_ok=True)

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted(
            (row["window"]["start"].isoformat(), row["key"], int(row["count"]))
            for row in batch.collect()
        )
        _write_atomically(output_dir / f"batch-{batch_id:06d}.json", json.dumps(rows))

    return write


def _start_query(
    spark: Any, input_dir: str, checkpoint_dir: str, output_dir: str, trigger_s: float | None
) -> Any:
    """Start the query; ``trigger_s`` None: ``availableNow`` (stops when the input is done)."""
    return _writer(spark, input_dir, checkpoint_dir, output_dir, trigger_s).start()


def _writer(
    spark: Any, input_dir: str, checkpoint_dir: str, output_dir: str, trigger_s: float | None
) -> Any:
    """The query's ``DataStreamWriter``, not started."""
    from pyspark.sql import functions
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    schema = StructType([StructField("key", StringType()), StructField("ts", TimestampType())])
    counts = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(input_dir)
        .withWatermark("ts", "30 seconds")
        .dropDuplicates(["key", "ts"])
        .groupBy(functions.window("ts", "1 minute"), "key")
        .count()
    )
    writer = (
        counts.writeStream.outputMode("append")
        .queryName("sr3_demo")
        .foreachBatch(_batch_writer(Path(output_dir)))
        .option("checkpointLocation", checkpoint_dir)
    )
    if trigger_s is None:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{trigger_s} seconds")


def _finish(query: Any, started: float) -> RunSummary:
    """Wait for an ``availableNow`` query to end; what it did."""
    query.awaitTermination()
    if query.exception() is not None:
        raise SR3Error(f"query failed: {query.exception()}")
    progress = query.recentProgress  # the newest 100 batches: more than a demo runs
    input_rows = {int(p["batchId"]): int(p["numInputRows"]) for p in progress}
    return RunSummary(max(input_rows, default=-1), input_rows, time.monotonic() - started)


def run(args: JobArgs, settings: Settings) -> int:
    """The driver that gets killed: runs until SIGKILL (or ``run_s_max``, then exit 3)."""
    spark = _session("sr3-demo-driver")
    sync = StateSync(settings.ring, args.query, args.checkpoint_dir, settings.secret)
    query = sync.start_query(
        _writer(spark, args.input_dir, args.checkpoint_dir, args.output_dir, args.trigger_s),
        spark,
    )
    print(f"driver {os.getpid()}: query {query.id} running", flush=True)
    try:
        if query.awaitTermination(args.run_s_max):
            raise SR3Error(f"query stopped by itself: {query.exception()}")
    finally:
        query.stop()
        sync.close()
        spark.stop()
    print(f"driver {os.getpid()}: nobody killed me within {args.run_s_max:.0f} s", flush=True)
    return 3


def resume(args: JobArgs, settings: Settings) -> int:
    """The new driver: restore, finish the input, then the reference run."""
    started = time.monotonic()
    spark = _session("sr3-demo-restored")
    spark_start_s = time.monotonic() - started
    sync = StateSync(settings.ring, args.query, args.checkpoint_dir, settings.secret)
    try:
        begin = time.monotonic()
        restored = sync.restore(topology=args.topology)
        restore_s = time.monotonic() - begin
        report = sync.last_restore
    finally:
        sync.close()
    if restored is None or report is None:
        raise SR3Error(f"the ring holds no batch of query {args.query!r}")
    # The restored query does not push: the demo compares its output with a reference
    # run's and has nothing more to keep (with two of five peers down the ring would take
    # its pushes: every record has five acceptors, a majority of them up).
    begin = time.monotonic()
    resumed = _finish(
        _start_query(spark, args.input_dir, args.checkpoint_dir, args.output_dir, None), begin
    )
    begin = time.monotonic()
    reference = _finish(
        _start_query(
            spark, args.input_dir, args.reference_checkpoint_dir, args.reference_output_dir, None
        ),
        begin,
    )
    result = ResumeResult(
        spark_start_s=spark_start_s, restored_batch=restored, restored_files=report.files,
        restored_bytes=report.bytes_total, topology=report.recovery.topology,
        topology_reason=report.recovery.reason, restore_s=restore_s,
        resumed=resumed, reference=reference,
    )  # fmt: skip
    _write_atomically(Path(args.result_path), result.to_json())
    spark.stop()
    return 0


def main(argv: list[str]) -> int:
    commands = {"run": run, "resume": resume}
    if len(argv) != 2 or argv[0] not in commands:
        print("usage: python -m sr3.spark_demo run|resume JOB_JSON", file=sys.stderr)
        return 2
    settings = resolve(os.environ.get("SR3_RING"), os.environ.get("SR3_SECRET"))
    return commands[argv[0]](JobArgs.from_json(argv[1]), settings)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
