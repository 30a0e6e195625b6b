"""An application that drives a query or stands by for it: what ``sr3 spark standby``
runs, and what the standby drill, tests and benchmark start twice.

    python -m sr3.standby_app JOB      JOB is a JSON object (``StandbyJob``)

It starts its SparkSession (with the ``sr3://`` conf when the checkpoint is on the
ring), builds the query without starting it, and hands it to a ``Standby``
(``spark_connector.standby``): the first application to run takes the query's lease and
starts it; the others wait, keeping up, and take over when the lease lapses. The query
is ``sr3.spark_demo``'s (events deduplicated and counted per minute and key, a stateful
query) read one input file per batch, written by ``foreachBatch`` (one JSON file per
batch) or by Spark's file sink (parquet, its own commit log), or any query a function
``module:function(spark, job) -> DataStreamWriter`` builds (``app``).

The application stops by itself once it committed batch ``until_batch`` (releasing the
lease), when it loses the lease (exit 4, after its query is stopped), or after
``run_s_max``. It writes what happened as JSON lines to ``events_path``: ``ready`` (the
session is up and the query built), ``took_over`` (fence, from whom, the batch it
resumes after), ``committed`` (each batch, with the wall-clock time it was seen), and
``lost``. Ring and secret come from ``SR3_RING`` and ``SR3_SECRET`` (and a scoped
credential for ``sr3://`` from ``SR3_CREDENTIAL``, when set).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ring.errors import ConfigError, SR3Error
from ring.lease import RENEW_EVERY_S_DEFAULT, TIMEOUT_S_DEFAULT
from sr3.spark_demo import scratch_beside, with_scratch

__all__ = ["SINKS", "StandbyJob", "read_events", "start"]

SINKS = ("foreach", "files")
# How often the application looks at its query's progress (each look is a py4j call).
WATCH_S = 0.05


@dataclass(frozen=True, slots=True)
class StandbyJob:
    query: str
    checkpoint: str  # a local directory (StateSync) or sr3:///path
    input_dir: str
    output_dir: str
    events_path: str
    sink: str = "foreach"
    holder: str = ""  # default: host:pid
    lease_timeout_s: float = TIMEOUT_S_DEFAULT
    renew_every_s: float = RENEW_EVERY_S_DEFAULT
    trigger_s: float = 0.5
    until_batch: int = -1  # stop after committing it (-1: run until killed or run_s_max)
    # Stop once no batch ran for this long after one did (0: never); batch ids may shift
    # after a takeover (a restarted query can plan two files into one batch).
    stop_idle_s: float = 0.0
    run_s_max: float = 600.0
    app: str = ""  # module:function building the query; default: the demo query
    master: str = "local[2]"
    shuffle_partitions: int = 2
    state_store: str = ""  # "rocksdb" for RocksDB's provider
    state_path: str = ""  # at until_batch: the query's state rows written here (JSON)
    partitions: int = 0  # state partitions to run at once it takes over (0: as they are)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StandbyJob:
        data = json.loads(text)
        known = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or not set(data) <= known:
            raise ConfigError(f"not a standby job: {text[:200]}")
        job = cls(**data)
        if job.sink not in SINKS:
            raise ConfigError(f"sink: one of {', '.join(SINKS)}")
        return job


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events an application wrote (no pyspark needed)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill: the events before it stand
    return events


def start(
    job: StandbyJob, env: dict[str, str], log_path: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``job``'s application (this module) in a session of its own, so that its
    whole group (Python and JVM) can be killed at once; its output goes to ``log_path``,
    its JVMs' scratch files to the folder beside it named after it (``a.log``:
    ``a.jvm``)."""
    env = with_scratch(env, scratch_beside(log_path))
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sr3.standby_app", job.to_json()],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip


class _Events:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        line = {"event": event, "wall": time.time(), "pid": os.getpid(), **fields}
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def _session(job: StandbyJob) -> Any:
    from pyspark.sql import SparkSession

    from sr3.spark_demo import SPARK_CONF, scratch_conf

    conf = {
        **SPARK_CONF,
        **scratch_conf(),
        "spark.sql.shuffle.partitions": str(job.shuffle_partitions),
    }
    if job.state_store == "rocksdb":
        conf["spark.sql.streaming.stateStore.providerClass"] = (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        )
    if job.checkpoint.startswith("sr3:"):
        from spark_connector.conf import spark_conf

        credential = os.environ.get("SR3_CREDENTIAL") or None
        secret = None if credential else os.environ.get("SR3_SECRET")
        conf.update(spark_conf(os.environ.get("SR3_RING"), secret, credential=credential))
    else:
        from spark_connector.plan_hook import local_conf

        # StateSync puts each batch's plan on the ring through sr3's checkpoint manager.
        conf.update(local_conf())
    if job.master.startswith("local-cluster"):
        from sr3.cluster_app import local_cluster_conf

        # Executors are JVMs of their own, started from pyspark's Spark home; their
        # Python workers (if any) run this interpreter.
        conf.update(local_cluster_conf())
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(job.master).appName(f"sr3-standby-{job.query}")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def demo_query(spark: Any, job: StandbyJob) -> Any:
    """The demo's stateful query, not started: ``foreachBatch`` or a parquet sink."""
    from pyspark.sql import functions
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from sr3.spark_demo import _batch_writer

    schema = StructType([StructField("key", StringType()), StructField("ts", TimestampType())])
    counts = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(job.input_dir)
        .withWatermark("ts", "30 seconds")
        .dropDuplicates(["key", "ts"])
        .groupBy(functions.window("ts", "1 minute"), "key")
        .count()
    )
    writer = counts.writeStream.outputMode("append").option("checkpointLocation", job.checkpoint)
    if job.sink == "foreach":
        writer = writer.foreachBatch(_batch_writer(Path(job.output_dir)))
    else:
        flat = counts.select(
            functions.col("window.start").alias("start"), "key", functions.col("count")
        )
        writer = (
            flat.writeStream.outputMode("append")
            .option("checkpointLocation", job.checkpoint)
            .format("parquet")
            .option("path", job.output_dir)
        )
    return writer.trigger(processingTime=f"{job.trigger_s} seconds")


def _builder(app: str) -> Callable[[Any, StandbyJob], Any]:
    """The function ``app`` names: ``module:function`` (a module importable here: on
    ``PYTHONPATH``, or in the current folder) or ``path/to/file.py:function``."""
    if not app:
        return demo_query
    module_name, _, function_name = app.rpartition(":")
    if not module_name or not function_name:
        raise ConfigError("app: module:function or path/to/file.py:function")
    if module_name.endswith(".py"):
        module = _module_from_file(Path(module_name))
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(
                f"app: cannot import {module_name} ({exc}); put its folder on PYTHONPATH, "
                "run from it, or name the file: path/to/file.py:function"
            ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"app: {app} is not a function")
    return function  # type: ignore[no-any-return]


def _module_from_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"sr3_app_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ConfigError(f"app: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(job: StandbyJob) -> int:
    from spark_connector.standby import Standby

    events = _Events(Path(job.events_path))
    spark = _session(job)
    writer = _builder(job.app)(spark, job)
    standby = Standby(
        os.environ.get("SR3_RING"), job.query, job.checkpoint, os.environ.get("SR3_SECRET"),
        start=writer, spark=spark, holder=job.holder or None, timeout_s=job.lease_timeout_s,
        renew_every_s=job.renew_every_s, partitions=job.partitions or None,
    )  # fmt: skip
    started = time.monotonic()
    try:
        standby.prepare()
        events.write("ready", holder=standby.lease.holder)
        query = standby.take_over(timeout_s=job.run_s_max)
        takeover = standby.takeover
        assert takeover is not None
        previous = takeover.previous
        events.write(
            "took_over", holder=standby.lease.holder, fence=takeover.fence,
            previous=None if previous is None else previous.holder,
            resumed_after=takeover.resumed_after, planned=takeover.planned,
            rescaled=takeover.rescaled, rescale_s=takeover.rescale_s,
            waited_s=takeover.waited_s,
            catch_up_bytes=takeover.catch_up_bytes, catch_up_s=takeover.catch_up_s,
            start_s=takeover.start_s,
        )  # fmt: skip
        return _drive(job, standby, query, events, started)
    finally:
        standby.close()
        spark.stop()


def _drive(job: StandbyJob, standby: Any, query: Any, events: _Events, started: float) -> int:
    """Watch the query's progress until ``until_batch`` or ``stop_idle_s``, the lease's
    loss, or ``run_s_max``."""
    newest, executed_at = -1, None
    while time.monotonic() - started < job.run_s_max:
        if standby.wait_lost(WATCH_S):
            events.write("lost", why=standby.lost_why)
            return 4
        if not query.isActive:
            error = query.exception()
            events.write("stopped", error=None if error is None else str(error))
            return 1 if error is not None else 0
        progress = query.lastProgress
        batch = None if not progress else progress.get("batchId")
        # An idle trigger also reports progress (the next batch id, nothing run): only
        # a batch that ran (``addBatch``) committed.
        if isinstance(batch, int) and batch > newest and _executed(progress):
            newest, executed_at = batch, time.monotonic()
            events.write(
                "committed", batch=batch, rows=progress.get("numInputRows"),
                duration_ms=progress.get("durationMs"),
            )  # fmt: skip
        reached = 0 <= job.until_batch <= newest
        idle = (
            job.stop_idle_s > 0
            and executed_at is not None
            and time.monotonic() - executed_at >= job.stop_idle_s
            and not query.status["isTriggerActive"]
        )
        if reached or idle:
            standby.stop_query()
            if job.state_path:
                _write_state(None, job)
            events.write("done", batch=newest, idle=idle and not reached)
            return 0
    events.write("timeout", batch=newest)
    return 3


def _executed(progress: Any) -> bool:
    durations = progress.get("durationMs") or {}
    return "addBatch" in durations


def state_rows(spark: Any, checkpoint: str) -> list[str]:
    """Every stateful operator's rows in the checkpoint's newest version, as sorted JSON
    lines (Spark's state data source), without the partition each row is in: which
    partition holds a key depends on the query's number of state partitions, not on
    its state (a rescaled query's rows are the same in other partitions)."""
    rows: list[str] = []
    operators = spark.read.format("state-metadata").load(checkpoint).collect()
    for operator in sorted({int(row["operatorId"]) for row in operators}):
        frame = spark.read.format("statestore").option("operatorId", operator).load(checkpoint)
        for row in frame.collect():
            values = row.asDict(recursive=True)
            values.pop("partition_id", None)
            rows.append(json.dumps([operator, values], default=str))
    return sorted(rows)


def _write_state(spark: Any, job: StandbyJob) -> None:
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    Path(job.state_path).write_text(json.dumps(state_rows(spark, job.checkpoint)))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sr3.standby_app JOB_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return run(StandbyJob.from_json(argv[0]))
    except SR3Error as exc:
        print(f"sr3 standby: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
