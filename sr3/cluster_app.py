"""A Spark application on ``local-cluster`` that checkpoints to ``sr3://``: the driver
of ``sr3 demo --cluster`` and of the cluster tests.

    python -m sr3.cluster_app run JOB      process the input one file per trigger (the
                                           application that gets SIGKILLed)
    python -m sr3.cluster_app rescale JOB  finish what the checkpoint holds, then
                                           rescale it in place on the ring to
                                           ``JobArgs.partitions`` (executors read and
                                           write the partitions there)
    python -m sr3.cluster_app finish JOB   continue on the same checkpoint until the
                                           input is done, then the same query without
                                           failures on a local checkpoint (at
                                           ``partitions`` when set), and write RESULT:
                                           both outputs and state store rows

Executors are their own JVMs (``local-cluster[2,1,1024]``) and write their state straight
to the ring through the ``sr3://`` FileSystem, with the conf ``spark_conf`` gives: a
credential scoped to the checkpoint's prefix, taken from ``SR3_CREDENTIAL`` (the cluster
secret is never in this process's environment, so never in an executor's either), and
the seeds from ``SR3_RING``.

Queries (``JobArgs.query``), each deterministic given one input file per batch:
``window`` (count per one-minute window with a watermark, default state store),
``dedup`` (dropDuplicates on RocksDB with changelog checkpointing), ``join`` (a
stream-stream inner join with watermarks on both sides) and ``pandas``
(``applyInPandasWithState``, a running count per key).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ring.errors import ConfigError, SR3Error
from sr3.spark_demo import scratch_beside, scratch_conf, with_scratch, write_inputs

__all__ = [
    "QUERIES",
    "ClusterJob",
    "ClusterResult",
    "application_env",
    "finish_application",
    "kill_application",
    "local_cluster_conf",
    "read_outputs",
    "rescale_application",
    "spark_home",
    "start_application",
    "wait_for_batches",
    "write_job_inputs",
]

QUERIES = ("window", "dedup", "join", "pandas")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
MASTER = "local-cluster[2,1,1024]"
BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.executor.memory": "512m",
    "spark.sql.streaming.stateStore.maintenanceInterval": "500ms",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    # A task that meets a ring still healing (503 from a peer) is retried, not the job.
    "spark.task.maxFailures": "8",
}
# A local-cluster worker keeps each application's executor logs in <Spark home>/work,
# which for a pip-installed pyspark is inside the package (Spark gives workers a temporary
# work folder only in its own testing mode). Workers of sr3's applications remove folders
# of applications that are not running and wrote nothing for WORK_KEEP_S, looking every
# WORK_CLEANUP_INTERVAL_S (Spark's standalone clean-up), so a failed run's logs stay a
# day for whoever reads them and the folder does not grow with every run.
WORK_KEEP_S = 24 * 3600
WORK_CLEANUP_INTERVAL_S = 30
POLL_S = 0.5
GROUP_EXIT_S_MAX = 30.0
LOG_TAIL_LINES = 40


@dataclass(frozen=True, slots=True)
class ClusterJob:
    query: str
    input_dir: str
    checkpoint: str  # sr3:///...
    output_dir: str
    reference_checkpoint: str = ""  # a local directory
    reference_output_dir: str = ""
    result_path: str = ""
    trigger_s: float = 1.0
    run_s_max: float = 300.0
    # ``rescale``: the state partitions to rescale the checkpoint to (0: no rescale; the
    # reference run of ``finish`` starts at this count), and a file holding the cluster
    # secret, which the rescale's lease (a record, beyond a scoped credential's reach)
    # needs: read by that driver alone, never in an environment executors inherit.
    partitions: int = 0
    secret_file: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClusterJob:
        data = json.loads(text)
        names = {field.name for field in fields(cls)}
        if not isinstance(data, dict) or not set(data) <= names:
            raise ConfigError(f"not a ClusterJob: {text[:200]}")
        job = cls(**data)
        if job.query not in QUERIES:
            raise ConfigError(f"query is one of {', '.join(QUERIES)}")
        return job


@dataclass(frozen=True, slots=True)
class ClusterResult:
    output: list[list[Any]]  # every row the run on sr3:// emitted (update mode: the table)
    reference_output: list[list[Any]]
    state: list[list[Any]]  # the state store reader's rows of the final checkpoint
    reference_state: list[list[Any]]
    executor_env_has_secret: bool
    conf_has_secret: bool
    finish_s: float
    # The state partitions the checkpoint's newest offset log entry records.
    partitions: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClusterResult:
        return cls(**json.loads(text))


# -- the parent's side: start, watch and kill an application (no pyspark) ---------------


def application_env(ring: str, credential: str) -> dict[str, str]:
    """An application's environment: the seeds and a scoped credential, never the
    cluster secret (executors inherit the driver's environment)."""
    hidden = ("SR3_SECRET", "SR3_CLUSTER_FILE", "SR3_RING", "SR3_CREDENTIAL")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env.update(SR3_RING=ring, SR3_CREDENTIAL=credential)
    return env


def start_application(
    command: str, job: ClusterJob, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """``python -m sr3.cluster_app COMMAND JOB`` in a process group of its own (the
    driver, its JVM and the executor JVMs), its output appended to ``log``, its JVMs'
    scratch files in the folder beside it named after it (``driver.log``:
    ``driver.jvm``)."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "sr3.cluster_app", command, job.to_json()],
            env=with_scratch(env, scratch_beside(log)),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_application(app: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole application: driver, its JVM and the executors."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(app.pid, signal.SIGKILL)
    app.wait(timeout=GROUP_EXIT_S_MAX)


def wait_for_batches(
    app: subprocess.Popen[bytes], output: Path, count: int, log: Path, timeout_s: float
) -> None:
    """Until the application wrote ``count`` batches' output; ``SR3Error`` (with the
    log's tail) if it exits first or ``timeout_s`` passes (it is then killed)."""
    deadline = time.monotonic() + timeout_s
    while len(list(output.glob("batch-*.json"))) < count:
        if app.poll() is not None:
            raise SR3Error(f"the application exited early:\n{_tail(log)}")
        if time.monotonic() > deadline:
            kill_application(app)
            raise SR3Error(f"no {count} batches within {timeout_s:.0f} s:\n{_tail(log)}")
        time.sleep(POLL_S)


def finish_application(
    job: ClusterJob, env: dict[str, str], log: Path, timeout_s: float
) -> ClusterResult:
    """Run ``finish`` to the end; its result (``SR3Error`` with the log's tail if not)."""
    _run_to_end("finish", job, env, log, timeout_s)
    return ClusterResult.from_json(Path(job.result_path).read_text())


def rescale_application(job: ClusterJob, env: dict[str, str], log: Path, timeout_s: float) -> str:
    """Run ``rescale`` to the end; its RESCALED line (``SR3Error`` with the log's tail
    if it failed)."""
    _run_to_end("rescale", job, env, log, timeout_s)
    lines = [line for line in log.read_text(errors="replace").splitlines() if "RESCALED" in line]
    if not lines:
        raise SR3Error(f"rescale said nothing of its rescale:\n{_tail(log)}")
    return lines[-1]


def _run_to_end(
    command: str, job: ClusterJob, env: dict[str, str], log: Path, timeout_s: float
) -> None:
    app = start_application(command, job, env, log)
    try:
        code = app.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_application(app)
        raise SR3Error(f"{command} took over {timeout_s:.0f} s:\n{_tail(log)}") from None
    if code != 0:
        raise SR3Error(f"{command} failed (exit {code}):\n{_tail(log)}")


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(lines[-LOG_TAIL_LINES:])


def spark_home() -> str:
    """The Spark home of the installed pyspark package (``spark.test.home``: where a
    local-cluster worker finds the scripts and jars to start an executor JVM)."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


def local_cluster_conf() -> dict[str, str]:
    """The conf every ``local-cluster`` application of sr3 sets: where workers find
    Spark's scripts and jars, and the clean-up of their work folder (``WORK_KEEP_S``)."""
    return {
        "spark.test.home": spark_home(),
        "spark.worker.cleanup.enabled": "true",
        "spark.worker.cleanup.interval": str(WORK_CLEANUP_INTERVAL_S),
        "spark.worker.cleanup.appDataTtl": str(WORK_KEEP_S),
    }


def write_job_inputs(query: str, directory: Path, files: int, seed: int) -> None:
    """The input of ``query``: event files, and for the join a second stream too."""
    write_inputs(directory / "left", files, seed)
    if query == "join":
        write_inputs(directory / "right", files, seed + 1)


# -- the Spark side ---------------------------------------------------------------------


def _session(conf: dict[str, str], provider: str, changelog: bool) -> Any:
    from pyspark.sql import SparkSession

    # Executors start Python workers (applyInPandasWithState) with the driver's
    # interpreter, which has pandas: PySpark takes it from PYSPARK_PYTHON.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(MASTER).appName("sr3-cluster")
    settings = {
        **BASE_CONF,
        **scratch_conf(),
        **conf,
        **local_cluster_conf(),
        "spark.sql.streaming.stateStore.providerClass": provider,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(
            changelog
        ).lower(),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _events(spark: Any, directory: str, column: str) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    schema = StructType([StructField("key", StringType()), StructField("ts", TimestampType())])
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(directory)
    return stream.withColumnRenamed("ts", column).withWatermark(column, "30 seconds")


def _query_frame(spark: Any, query: str, input_dir: str) -> tuple[Any, str]:
    """The streaming frame of ``query`` and its output mode."""
    from pyspark.sql import functions

    left = _events(spark, f"{input_dir}/left", "ts")
    if query == "window":
        return left.groupBy(functions.window("ts", "1 minute"), "key").count().select(
            functions.col("window.start").cast("string").alias("start"), "key", "count"
        ), "append"
    if query == "dedup":
        return left.dropDuplicates(["key", "ts"]).select(
            "key", functions.col("ts").cast("string").alias("ts")
        ), "append"
    if query == "join":
        right = _events(spark, f"{input_dir}/right", "rts").withColumnRenamed("key", "rkey")
        joined = left.join(
            right,
            functions.expr("key = rkey AND rts BETWEEN ts AND ts + interval 20 seconds"),
        )
        return joined.select(
            "key",
            functions.col("ts").cast("string").alias("ts"),
            functions.col("rts").cast("string").alias("rts"),
        ), "append"
    return _pandas_counts(left), "update"


def _pandas_counts(frame: Any) -> Any:
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count(
        key: tuple[str], batches: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        seen = int(state.get[0]) if state.exists else 0
        seen += sum(len(batch) for batch in batches)
        state.update((seen,))
        yield pd.DataFrame({"key": [key[0]], "count": [seen]})

    return frame.groupBy("key").applyInPandasWithState(
        count,
        outputStructType="key string, count long",
        stateStructType="count long",
        outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def _writer(output_dir: Path) -> Callable[[Any, int], None]:
    output_dir.mkdir(parents=True, exist_ok=True)

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted([list(row) for row in batch.collect()], key=json.dumps)
        path = output_dir / f"batch-{batch_id:06d}.json"
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(rows, default=str))
        os.replace(temporary, path)

    return write


def _start(spark: Any, job: ClusterJob, checkpoint: str, output_dir: str, until_done: bool) -> Any:
    frame, mode = _query_frame(spark, job.query, job.input_dir)
    writer = (
        frame.writeStream.outputMode(mode)
        .queryName(f"sr3_{job.query}")
        .foreachBatch(_writer(Path(output_dir)))
        .option("checkpointLocation", checkpoint)
    )
    if until_done:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{job.trigger_s} seconds").start()


def _provider(query: str) -> tuple[str, bool]:
    return (ROCKSDB, True) if query == "dedup" else (HDFS, False)


def read_outputs(directory: Path, *, update: bool = False) -> list[list[Any]]:
    """Every row of every batch file, sorted (a replayed batch overwrote its own file).

    ``update``: the table an update-mode sink holds, the last row of each key (its
    first column) by batch. Update mode emits each key's new value per batch, so the
    rows themselves depend on where batches begin: a driver killed after the file
    source logged its next file, but before the offset log did, makes the restarted
    run take two files in one batch (on any file system); the table does not change."""
    rows: list[list[Any]] = []
    table: dict[str, list[Any]] = {}
    for path in sorted(directory.glob("batch-*.json")):
        batch = json.loads(path.read_text())
        rows += batch
        table.update((json.dumps(row[0]), row) for row in batch)
    return sorted(table.values() if update else rows, key=json.dumps)


def _state_rows(spark: Any, query: str, checkpoint: str) -> list[list[Any]]:
    sides = ("left", "right") if query == "join" else (None,)
    rows: list[list[Any]] = []
    for side in sides:
        reader = spark.read.format("statestore")
        if side is not None:
            reader = reader.option("joinSide", side)
        for row in reader.load(checkpoint).collect():
            rows.append([side or "", json.dumps(row.asDict(recursive=True), default=str)])
    return sorted(rows, key=json.dumps)


def _conf(checkpoint: str) -> dict[str, str]:
    from spark_connector.conf import spark_conf

    credential = os.environ.get("SR3_CREDENTIAL")
    if not credential:
        raise ConfigError("SR3_CREDENTIAL: the driver takes a scoped credential, not the secret")
    return spark_conf(os.environ.get("SR3_RING"), credential=credential)


def run(job: ClusterJob) -> int:
    """The application that gets killed: runs until SIGKILL (or ``run_s_max``: exit 3)."""
    provider, changelog = _provider(job.query)
    spark = _session(_conf(job.checkpoint), provider, changelog)
    query = _start(spark, job, job.checkpoint, job.output_dir, until_done=False)
    print(f"driver {os.getpid()}: query {query.id} running", flush=True)
    if query.awaitTermination(job.run_s_max):
        raise SR3Error(f"query stopped by itself: {query.exception()}")
    query.stop()
    spark.stop()
    return 3


def finish(job: ClusterJob) -> int:
    """The new application: the rest of the input on the same checkpoint, then the
    reference run on a local checkpoint, then RESULT."""
    provider, changelog = _provider(job.query)
    conf = _conf(job.checkpoint)
    spark = _session(conf, provider, changelog)
    started = time.monotonic()
    resumed = _start(spark, job, job.checkpoint, job.output_dir, until_done=True)
    resumed.awaitTermination()
    if resumed.exception() is not None:
        raise SR3Error(f"the resumed query failed: {resumed.exception()}")
    finish_s = time.monotonic() - started
    if job.partitions:
        # The reference starts at the rescaled count (a new checkpoint takes the session's).
        spark.conf.set("spark.sql.shuffle.partitions", str(job.partitions))
    reference = _start(
        spark, job, job.reference_checkpoint, job.reference_output_dir, until_done=True
    )
    reference.awaitTermination()
    if reference.exception() is not None:
        raise SR3Error(f"the reference query failed: {reference.exception()}")
    secret = os.environ.get("SR3_SECRET", "")
    executor_envs = (
        spark.sparkContext.parallelize(range(4), 4)
        .map(lambda _i: sorted(os.environ.items()))
        .collect()
    )
    update = job.query == "pandas"
    result = ClusterResult(
        output=read_outputs(Path(job.output_dir), update=update),
        reference_output=read_outputs(Path(job.reference_output_dir), update=update),
        state=_state_rows(spark, job.query, job.checkpoint),
        reference_state=_state_rows(spark, job.query, job.reference_checkpoint),
        executor_env_has_secret=any(
            name == "SR3_SECRET" or (secret and secret in value)
            for env in executor_envs
            for name, value in env
        ),
        # The cluster secret's key (fs.sr3.tls.secret.key is the client's TLS key).
        conf_has_secret=any(
            key == "spark.hadoop.fs.sr3.secret" or (secret and secret in value)
            for key, value in spark.sparkContext.getConf().getAll()
        ),
        finish_s=finish_s,
        partitions=_newest_partitions(spark, job.checkpoint),
    )
    path = Path(job.result_path)
    path.with_name(f".{path.name}.tmp").write_text(result.to_json())
    os.replace(path.with_name(f".{path.name}.tmp"), path)
    spark.stop()
    return 0


def rescale(job: ClusterJob) -> int:
    """The application that rescales the checkpoint in place: the query run until the
    input present is done (a batch the killed driver planned is finished, as Spark's
    restart does), then ``rescale_fs`` to ``job.partitions`` on this application's
    executors; prints RESCALED and its report."""
    from ring.sync_client import SyncClient
    from spark_connector.rescale import rescale_fs

    if job.partitions < 1 or not job.secret_file:
        raise ConfigError("rescale: the job names no partitions or no secret file")
    provider, changelog = _provider(job.query)
    spark = _session(_conf(job.checkpoint), provider, changelog)
    caught_up = _start(spark, job, job.checkpoint, job.output_dir, until_done=True)
    caught_up.awaitTermination()
    if caught_up.exception() is not None:
        raise SR3Error(f"the query failed before its rescale: {caught_up.exception()}")
    secret = Path(job.secret_file).read_text().strip()
    with SyncClient(os.environ.get("SR3_RING"), secret) as client:
        report = rescale_fs(client, f"cluster-{job.query}", job.checkpoint, job.partitions, spark)
    print(
        f"RESCALED {report.from_partitions} -> {report.to_partitions}: batch "
        f"{report.base_batch} -> {report.batch_id} in {report.repartition_s:.1f} s",
        flush=True,
    )
    spark.stop()
    return 0


def _newest_partitions(spark: Any, checkpoint: str) -> int:
    from spark_connector.rescale import logged_batches, partitions_of

    offsets, _commits = logged_batches(spark, checkpoint)
    return (partitions_of(spark, checkpoint, max(offsets)) or 0) if offsets else 0


def main(argv: list[str]) -> int:
    commands = {"run": run, "finish": finish, "rescale": rescale}
    if len(argv) != 2 or argv[0] not in commands:
        print("usage: python -m sr3.cluster_app run|rescale|finish JOB_JSON", file=sys.stderr)
        return 2
    return commands[argv[0]](ClusterJob.from_json(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
