"""Real Spark queries recovered from the ring: one end-to-end test per stateful operator
kind, and a pushing process killed at chosen points.

What the recovery tests break: a query runs a few batches on a directory source while
``StateSync`` pushes its committed batches to a real 5-peer ring (R=3, W=2); then its
checkpoint directory is deleted, R-1 = 2 peers are SIGKILLed, the newest batch is
restored into another directory and the query continues there with more input. What
must hold: Spark's state reader sees the same state at the restored batch as it saw in
the original checkpoint (every operator, every store), and all the rows the query
emitted, before and after the loss, are those of a run that was never interrupted.

What the crash test breaks: the process pushing a batch is SIGKILLed while chunks are in
flight, after every chunk is stored but before the manifest, and after the manifest but
before the ``latest`` pointer. What must hold: every manifest on the ring names only
chunks that are on a write quorum of peers and readable; ``latest`` names a manifest that
is there; the next push completes and its restore is the batch Spark committed.

What the restart test breaks: a query restarts with ``restore()`` on its intact
checkpoint, and another query reuses its name. What must hold: the first keeps its
checkpoint and resumes as if never stopped; the second is refused, both query ids named.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import MakeCluster, chunk_holders, require_spark

from ring.blobs import BlobRef
from ring.client import ClientOptions, Source
from ring.sync_client import SyncClient
from spark_connector.catalog import latest_batch
from spark_connector.checkpoint import list_checkpoint, read_cut
from spark_connector.cut import committed_batches
from spark_connector.listener import make_listener
from spark_connector.manifest import Manifest, manifests_prefix
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

# Registers the ``spark`` marker and the session's SparkSession fixture (see
# tests/test_checkpoint.py: helpers are imported inside the tests, after pytest has
# loaded the plugin, so that its assertions are rewritten).
pytest_plugins = ("spark_fixtures",)

# Real Spark and real rings end to end: out of the `-m "not slow"` inner loop.
pytestmark = pytest.mark.slow

# pandas 3 works for what these queries do; PySpark 4.3 warns about it on every plan.
PANDAS_3_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"
REPOSITORY = Path(__file__).resolve().parent.parent
FIRST_RUN_FILES = 3  # input files before the loss
ALL_FILES = 5  # input files in all
PUSH_TIMEOUT_S = 120.0
INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01, the day the rows are about
PROVIDER_CLASS = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

Output = dict[int, list[str]]


# ----------------------------------------------------------------- the stateful queries


@dataclass(frozen=True, slots=True)
class StateStore:
    """One store the state reader reads: an operator and reader options (join side,
    state variable)."""

    operator_id: int
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"operator {self.operator_id} {dict(self.options)}"


@dataclass(frozen=True, slots=True)
class StatefulQuery:
    """A deterministic query: its input files, its plan, and the stores it keeps."""

    name: str
    write_input: Callable[[Path, int], None]  # (input root, file index)
    build: Callable[[Any, Path], Any]  # (SparkSession, input root) -> streaming DataFrame
    output_mode: str
    stores: tuple[StateStore, ...]


def write_rows(directory: Path, index: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """Input file ``index`` of a directory source, with a modification time that orders
    it after file ``index - 1`` (the file source takes files oldest first)."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".input-{index}.tmp"
    temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
    modified_s = INPUT_MTIME_BASE_S + 10 * index
    os.utime(temporary, (modified_s, modified_s))
    temporary.rename(directory / f"input-{index:03d}.json")


def aggregation_input(root: Path, index: int) -> None:
    from spark_fixtures import write_input

    write_input(root, index)


def aggregation(spark: Any, root: Path) -> Any:
    """The query of spark_fixtures.run_query: dropDuplicates (operator 1) then a windowed
    count with a 30 s watermark (operator 0)."""
    from spark_fixtures import aggregation as query

    return query(spark, root)


def join_input(root: Path, index: int) -> None:
    """Impressions every 10 s of minute ``index`` over four ads, and a click 5 s after
    every other one. Clicks 0 and 2 also fall within a minute of an impression of the same
    ad in the file before: matches span batches, so they come from the join's state."""
    minute = f"2024-01-01T00:{index:02d}"
    impressions = [
        {"ad": f"a{(index * 3 + second) % 4}", "shown": f"{minute}:{second * 10:02d}"}
        for second in range(6)
    ]
    clicks = [
        {"click_ad": row["ad"], "clicked": f"{minute}:{second * 10 + 5:02d}"}
        for second, row in enumerate(impressions)
        if second % 2 == 0
    ]
    write_rows(root / "impressions", index, impressions)
    write_rows(root / "clicks", index, clicks)


def stream_stream_join(spark: Any, root: Path) -> Any:
    """Inner join of impressions and clicks on the ad, a click counting within a minute
    of its impression; 30 s watermarks on both sides bound the state."""
    from pyspark.sql import functions

    def side(name: str, schema: str, column: str) -> Any:
        frame = (
            spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(root / name))
        )
        return frame.withWatermark(column, "30 seconds")

    impressions = side("impressions", "ad STRING, shown TIMESTAMP", "shown")
    clicks = side("clicks", "click_ad STRING, clicked TIMESTAMP", "clicked")
    condition = functions.expr(
        "ad = click_ad AND clicked >= shown AND clicked <= shown + interval 1 minute"
    )
    return impressions.join(clicks, condition, "inner").select("ad", "shown", "clicked")


def counted_input(root: Path, index: int) -> None:
    rows = [
        {"key": f"k{(index * 7 + second) % 5}", "value": index * 10 + second} for second in range(6)
    ]
    write_rows(root, index, rows)


def apply_in_pandas_with_state(spark: Any, root: Path) -> Any:
    """A running count and sum per key (GroupStateTimeout.NoTimeout), update mode."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def running_total(key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        # Defined here so that cloudpickle ships it by value: Python workers cannot
        # import this test module.
        import pandas  # type: ignore[import-untyped,unused-ignore]

        count, total = state.get if state.exists else (0, 0)
        for frame in frames:
            count += len(frame)
            total += int(frame["value"].sum())
        state.update((count, total))
        yield pandas.DataFrame({"key": [key[0]], "count": [count], "total": [total]})

    return (
        spark.readStream.schema("key STRING, value LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(root))
        .groupBy("key")
        .applyInPandasWithState(
            running_total,
            outputStructType="key STRING, count LONG, total LONG",
            stateStructType="count LONG, total LONG",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    )


def transform_with_state_in_pandas(spark: Any, root: Path) -> Any:
    """A StatefulProcessor counting rows per key in a ValueState, update mode."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CountPerKey(StatefulProcessor):
        # A local class, shipped by value to the Python workers (see running_total).
        def init(self, handle: Any) -> None:
            self.seen = handle.getValueState("seen", "count LONG")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            import pandas  # type: ignore[import-untyped,unused-ignore]

            count = self.seen.get()[0] if self.seen.exists() else 0
            for frame in rows:
                count += len(frame)
            self.seen.update((count,))
            yield pandas.DataFrame({"key": [key[0]], "count": [count]})

        def close(self) -> None:
            return None

    return (
        spark.readStream.schema("key STRING, value LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(root))
        .groupBy("key")
        .transformWithStateInPandas(
            statefulProcessor=CountPerKey(),
            outputStructType="key STRING, count LONG",
            outputMode="Update",
            timeMode="None",
        )
    )


AGGREGATION = StatefulQuery(
    "aggregation", aggregation_input, aggregation, "append", (StateStore(0), StateStore(1))
)
JOIN = StatefulQuery(
    "join",
    join_input,
    stream_stream_join,
    "append",
    (StateStore(0, (("joinSide", "left"),)), StateStore(0, (("joinSide", "right"),))),
)
APPLY_IN_PANDAS = StatefulQuery(
    "apply-in-pandas", counted_input, apply_in_pandas_with_state, "update", (StateStore(0),)
)
TRANSFORM_WITH_STATE = StatefulQuery(
    "transform-with-state",
    counted_input,
    transform_with_state_in_pandas,
    "update",
    (StateStore(0, (("stateVarName", "seen"),)),),
)


# ------------------------------------------------------------------------- running them


@contextlib.contextmanager
def provider_conf(spark: Any, provider: str) -> Iterator[None]:
    """The state store provider for queries started inside; the session's settings are
    put back afterwards (an existing checkpoint keeps the provider it was started with)."""
    from spark_fixtures import PROVIDERS

    keys = (PROVIDER_CLASS, CHANGELOG)
    previous = {key: spark.conf.get(key, None) for key in keys}
    for key in keys:
        spark.conf.unset(key)
    for key, value in PROVIDERS[provider].items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def run(
    spark: Any,
    query: StatefulQuery,
    inputs: Path,
    checkpoint: Path,
    provider: str,
    sync: StateSync | None = None,
) -> Output:
    """Process every input file present (one per batch) and stop; with ``sync``, push
    the batches it commits meanwhile. Returns the rows each batch emitted, as JSON."""
    output: Output = {}

    def collect(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted(
            json.dumps(row.asDict(recursive=True), default=str, sort_keys=True)
            for row in batch.collect()
        )

    with provider_conf(spark, provider):
        stream = (
            query.build(spark, inputs)
            .writeStream.outputMode(query.output_mode)
            .foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        listener = None
        try:
            if sync is not None:
                # What StateSync.register does (see
                # test_register_pushes_the_batches_a_query_commits).
                sync.start()
                listener = make_listener(str(stream.id), sync.committed)
                spark.streams.addListener(listener)
            stream.awaitTermination()
        finally:
            stream.stop()
            if listener is not None:
                spark.streams.removeListener(listener)
    if stream.exception() is not None:
        raise AssertionError(f"query {query.name} failed: {stream.exception()}")
    return output


def read_state(spark: Any, checkpoint: Path, batch_id: int, store: StateStore) -> list[str]:
    """A store's rows as of ``batch_id``, read by Spark's ``statestore`` reader."""
    reader = spark.read.format("statestore").option("batchId", batch_id)
    reader = reader.option("operatorId", store.operator_id)
    for key, value in store.options:
        reader = reader.option(key, value)
    frame = reader.load(str(checkpoint))
    return sorted(json.dumps(row.asDict(recursive=True), default=str) for row in frame.collect())


def newest_committed(checkpoint: Path) -> int:
    batches = committed_batches(list_checkpoint(checkpoint))
    assert batches, f"{checkpoint} has no committed batch"
    return batches[-1]


def push_newest(cluster: LocalCluster, name: str, checkpoint: Path) -> int:
    """Push the newest committed batch with a StateSync of its own; its batch id."""
    pusher = StateSync(cluster.ring, name, checkpoint, cluster.secret)
    try:
        report = pusher.push()
    finally:
        pusher.close()
    assert report.batch_id == newest_committed(checkpoint)
    return report.batch_id


def kill_all_but_quorum(cluster: LocalCluster, rng: random.Random) -> list[str]:
    """SIGKILL R-1 peers chosen by ``rng``."""
    peer_ids = [peer.peer_id for peer in cluster.cluster.peers]
    victims = rng.sample(peer_ids, cluster.cluster.replication - 1)
    for peer_id in victims:
        cluster.kill(peer_id)
    return victims


WIPE_TRIES = 50


def wipe(checkpoint: Path) -> None:
    """Delete a checkpoint directory while the session's state store maintenance may
    still be writing snapshots into it (it runs on after the query stopped)."""
    for _attempt in range(WIPE_TRIES):
        shutil.rmtree(checkpoint, ignore_errors=True)
        if not checkpoint.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{checkpoint} could not be deleted: something keeps writing to it")


def check_recovery(
    spark: Any,
    cluster: LocalCluster,
    rng: random.Random,
    tmp_path: Path,
    query: StatefulQuery,
    provider: str,
) -> None:
    """Run, push, lose the checkpoint and R-1 peers, restore elsewhere, continue; compare
    the state at the restored batch and the output with an uninterrupted run."""
    inputs, original = tmp_path / "in", (tmp_path / "original").resolve()
    for index in range(FIRST_RUN_FILES):
        query.write_input(inputs, index)
    sync = StateSync(cluster.ring, query.name, original, cluster.secret)
    try:
        first = run(spark, query, inputs, original, provider, sync)
        sync.flush(timeout_s=PUSH_TIMEOUT_S)
    finally:
        sync.close()
    # The listener may not have seen the last batch yet: push the newest one for certain.
    batch = push_newest(cluster, query.name, original)
    expected_state = {store: read_state(spark, original, batch, store) for store in query.stores}
    for store, rows in expected_state.items():
        assert rows, f"{store} holds no state at batch {batch}: the comparison proves nothing"
    wipe(original)

    killed = kill_all_but_quorum(cluster, rng)
    restored = (tmp_path / "restored").resolve()
    restorer = StateSync(cluster.ring, query.name, restored, cluster.secret)
    try:
        assert restorer.restore(topology="auto") == batch, f"peers killed: {killed}"
    finally:
        restorer.close()
    for store, rows in expected_state.items():
        assert read_state(spark, restored, batch, store) == rows, f"{store} at batch {batch}"

    for index in range(FIRST_RUN_FILES, ALL_FILES):
        query.write_input(inputs, index)
    second = run(spark, query, inputs, restored, provider)
    assert second and min(second) == batch + 1, f"resumed at {sorted(second)}, not {batch + 1}"
    uninterrupted = run(spark, query, inputs, tmp_path / "uninterrupted", provider)

    resumed = [row for rows in (*first.values(), *second.values()) for row in rows]
    expected = [row for rows in uninterrupted.values() for row in rows]
    assert [row for rows in second.values() for row in rows], "nothing emitted after restore"
    assert sorted(resumed) == sorted(expected)


@pytest.fixture
def pandas_spark(spark: Any) -> Iterator[Any]:
    """The session, with Python workers started from this interpreter (which has pandas
    and pyarrow) rather than whatever ``python3`` is first on PATH."""
    require_spark("pandas", "pyarrow")
    context = spark.sparkContext
    previous = context.pythonExec
    context.pythonExec = sys.executable
    yield spark
    context.pythonExec = previous


# ----------------------------------------------------------------- one test per operator


@pytest.mark.timeout(240)
@pytest.mark.parametrize("provider", ["hdfs", "rocksdb", "rocksdb-changelog"])
def test_aggregation_and_dedup_recover_after_checkpoint_and_peers_are_lost(
    spark: Any, make_cluster: MakeCluster, rng: random.Random, tmp_path: Path, provider: str
) -> None:
    """Watermarked windowed count and dropDuplicates (two operators) on each provider:
    both operators' state at the restored batch equals the original's, and the output
    equals an uninterrupted run's."""
    check_recovery(spark, make_cluster(5), rng, tmp_path, AGGREGATION, provider)


@pytest.mark.timeout(240)
def test_stream_stream_join_recovers_after_checkpoint_and_peers_are_lost(
    spark: Any, make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Inner stream-stream join with watermarks and a time range (four stores on HDFS):
    the left and right sides' state at the restored batch equal the original's, and the
    joined rows equal an uninterrupted run's."""
    check_recovery(spark, make_cluster(5), rng, tmp_path, JOIN, "hdfs")


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings(PANDAS_3_WARNING)
def test_apply_in_pandas_with_state_recovers_after_checkpoint_and_peers_are_lost(
    pandas_spark: Any, make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """applyInPandasWithState on RocksDB: the per-key state at the restored batch equals
    the original's, and the running totals equal an uninterrupted run's."""
    check_recovery(pandas_spark, make_cluster(5), rng, tmp_path, APPLY_IN_PANDAS, "rocksdb")


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings(PANDAS_3_WARNING)
def test_transform_with_state_in_pandas_recovers_into_another_directory(
    pandas_spark: Any, make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """transformWithStateInPandas on RocksDB with changelogs, whose operator metadata
    names the checkpoint's absolute path: restored into another directory, the ValueState
    at the restored batch equals the original's and the counts equal an uninterrupted
    run's."""
    check_recovery(
        pandas_spark, make_cluster(5), rng, tmp_path, TRANSFORM_WITH_STATE, "rocksdb-changelog"
    )


# -------------------------------------------------------------- pushing on every commit


@pytest.mark.timeout(240)
def test_a_restart_on_its_intact_checkpoint_restores_nothing_and_another_run_is_refused(
    spark: Any, make_cluster: MakeCluster, tmp_path: Path
) -> None:
    """What it breaks: a query restarts the documented way (``restore()`` before
    ``start()``) on its intact checkpoint; another query started under the same name on
    its own checkpoint restarts the same way. What must hold: the first restore keeps the
    checkpoint and the query resumes after its newest batch with the output of an
    uninterrupted run; the second is refused with both Spark query ids named."""
    from ring.errors import ConfigError

    cluster = make_cluster(3)
    inputs, original = tmp_path / "in", (tmp_path / "original").resolve()
    for index in range(FIRST_RUN_FILES):
        AGGREGATION.write_input(inputs, index)
    with StateSync(cluster.ring, "restarted", original, cluster.secret) as sync:
        first = run(spark, AGGREGATION, inputs, original, "hdfs", sync)
        sync.flush(timeout_s=PUSH_TIMEOUT_S)
    batch = push_newest(cluster, "restarted", original)
    with StateSync(cluster.ring, "restarted", original, cluster.secret) as restarted:
        assert restarted.restore() == batch
        assert restarted.last_restore is not None
        assert restarted.last_restore.action == "kept-local"
    for index in range(FIRST_RUN_FILES, ALL_FILES):
        AGGREGATION.write_input(inputs, index)
    second = run(spark, AGGREGATION, inputs, original, "hdfs")
    assert second and min(second) == batch + 1, f"resumed at {sorted(second)}, not {batch + 1}"
    uninterrupted = run(spark, AGGREGATION, inputs, tmp_path / "uninterrupted", "hdfs")
    resumed = [row for rows in (*first.values(), *second.values()) for row in rows]
    assert sorted(resumed) == sorted(row for rows in uninterrupted.values() for row in rows)

    other_inputs, other = tmp_path / "other-in", (tmp_path / "other").resolve()
    AGGREGATION.write_input(other_inputs, 0)
    run(spark, AGGREGATION, other_inputs, other, "hdfs")
    with (
        StateSync(cluster.ring, "restarted", other, cluster.secret) as reused,
        pytest.raises(ConfigError) as refused,
    ):
        reused.restore()
    for checkpoint in (original, other):
        query_id = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
        assert query_id in str(refused.value), str(refused.value)
    assert "overwrite=True discards" in str(refused.value)


def termination_watch(query_id: str) -> Any:
    """A listener whose ``terminated`` event is set when the query terminates. Spark's
    listener bus hands each event to every listener before the next one, so once it is
    set, every listener added before has seen all of the query's progress events."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class TerminationWatch(StreamingQueryListener):
        def __init__(self) -> None:
            self.terminated = threading.Event()

        def onQueryStarted(self, event: Any) -> None:
            return None

        def onQueryProgress(self, event: Any) -> None:
            return None

        def onQueryIdle(self, event: Any) -> None:
            return None

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) == query_id:
                self.terminated.set()

    return TerminationWatch()


@pytest.mark.timeout(180)
def test_register_pushes_the_batches_a_query_commits(
    spark: Any, make_cluster: MakeCluster, tmp_path: Path
) -> None:
    """StateSync.register on a running query, before any input arrives: the batches it
    commits reach the ring with no explicit push, and flush returns once the newest
    committed batch is the ring's latest."""
    cluster = make_cluster(3)
    inputs, checkpoint = tmp_path / "in", (tmp_path / "checkpoint").resolve()
    inputs.mkdir()
    sync = StateSync(cluster.ring, "registered", checkpoint, cluster.secret)
    counts = (
        spark.readStream.schema("key STRING, value LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs))
        .groupBy("key")
        .count()
    )
    watch: Any = None
    try:
        with provider_conf(spark, "hdfs"):
            stream = (
                counts.writeStream.outputMode("update")
                .format("noop")
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="100 milliseconds")
                .start()
            )
            try:
                sync.register(stream)
                watch = termination_watch(str(stream.id))
                spark.streams.addListener(watch)
                for index in range(FIRST_RUN_FILES):
                    counted_input(inputs, index)
                stream.processAllAvailable()
            finally:
                stream.stop()
        assert watch.terminated.wait(PUSH_TIMEOUT_S), "the termination event never came"
        # Every progress event has reached the listener: it alone told the pusher of the
        # newest batch (flush would read commits/ and so hide a listener that is silent).
        sync.throttle(0, timeout_s=PUSH_TIMEOUT_S)
        assert sync.latest_batch() == newest_committed(checkpoint)
        sync.flush(timeout_s=PUSH_TIMEOUT_S)
        assert sync.latest_batch() == newest_committed(checkpoint)
    finally:
        if watch is not None:
            spark.streams.removeListener(watch)
        sync.close()


# --------------------------------------------------------- a pusher killed mid-push

CRASH_QUERY = "crashing"
CRASH_CHUNK_BYTES = 1024  # small chunks: many uploads in flight when the pusher dies


class CrashingSyncClient(SyncClient):
    """The pushing process's client: SIGKILLs its own process at a chosen point."""

    def __init__(self, *args: Any, point: str, reads: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.point = point
        self.reads_left = reads
        self.lock = threading.Lock()

    def put_sources(self, sources: Sequence[Source]) -> list[BlobRef]:
        if self.point == "reading-chunk":
            sources = [Source(source.size, self.counted(source.read)) for source in sources]
        return super().put_sources(sources)

    def counted(self, read: Callable[[int, int], bytes]) -> Callable[[int, int], bytes]:
        def read_or_crash(offset: int, length: int) -> bytes:
            with self.lock:
                self.reads_left -= 1
                if self.reads_left <= 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            return read(offset, length)

        return read_or_crash

    def put_record(
        self, key: str, value: bytes, *, expected_version: int, refs: Sequence[str] = ()
    ) -> int:
        manifest = key.startswith(manifests_prefix(CRASH_QUERY))
        if manifest and self.point == "writing-manifest":
            os.kill(os.getpid(), signal.SIGKILL)
        version = super().put_record(key, value, expected_version=expected_version, refs=refs)
        if manifest and self.point == "manifest-written":
            os.kill(os.getpid(), signal.SIGKILL)
        return version


def push_and_crash(argv: Sequence[str]) -> None:
    """The pushing process (``python -c``): push the newest batch of a checkpoint and
    SIGKILL itself at ``point`` (after ``reads`` source reads for reading-chunk)."""
    import spark_connector.sync as sync_module

    ring, checkpoint, point, reads = argv
    options = ClientOptions(chunk_bytes=CRASH_CHUNK_BYTES, pack_below_bytes=CRASH_CHUNK_BYTES)

    def client(*args: Any, **kwargs: Any) -> CrashingSyncClient:
        return CrashingSyncClient(*args, point=point, reads=int(reads), **kwargs)

    setattr(sync_module, "SyncClient", client)  # noqa: B010 - StateSync builds it by this name
    StateSync(ring, CRASH_QUERY, checkpoint, client_options=options).push()


def crash_pusher(cluster: LocalCluster, checkpoint: Path, point: str, reads: int = 0) -> None:
    """Run push_and_crash in a process of its own; it must die by SIGKILL."""
    code = (
        "import sys; from test_spark_recovery import push_and_crash; push_and_crash(sys.argv[1:])"
    )
    paths = [str(REPOSITORY), str(REPOSITORY / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "SR3_SECRET": cluster.secret, "PYTHONPATH": os.pathsep.join(paths)}
    arguments = [cluster.ring, str(checkpoint), point, str(reads)]
    pusher = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        check=False,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert pusher.returncode == -signal.SIGKILL, (
        f"the pusher did not reach {point}: exit {pusher.returncode}\n{pusher.stderr.decode()}"
    )


def manifests_on_ring(cluster: LocalCluster, query: str) -> tuple[dict[int, Manifest], int | None]:
    """Every manifest of ``query`` on the ring, and the newest batch a client finds;
    checks that each named chunk is on a write quorum of peers' disks and reads back."""
    quorum = cluster.cluster.write_quorum
    with SyncClient(cluster.ring, cluster.secret) as client:
        manifests: dict[int, Manifest] = {}
        for key in client.list_records(manifests_prefix(query)):
            record = client.get_record(key)
            if record is None:  # deleted since it was listed
                continue
            manifest = Manifest.from_json(json.loads(record.value))
            for chunk_id in manifest.chunk_ids():
                holders = chunk_holders(cluster, chunk_id)
                assert len(holders) >= quorum, f"{key} names {chunk_id}, held by {holders}"
                client.run(client.client.fetch_chunk(chunk_id))
            manifests[manifest.batch_id] = manifest
        newest = latest_batch(client, query)
    return manifests, newest


@pytest.mark.timeout(240)
def test_killing_the_pusher_never_leaves_a_manifest_naming_missing_chunks(
    spark: Any, make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Batch A is on the ring; the process pushing the newer batch B is SIGKILLed while
    reading chunks (a point chosen by ``rng``, up to 8 uploads in flight), then just
    before writing B's manifest: after each crash every manifest names only chunks on a
    write quorum that read back, and the newest batch a restore finds is A. Killed just
    after writing B's manifest, B is the newest, whole; pushed again, B restores to the
    state Spark reads in the original checkpoint."""
    cluster = make_cluster(5)
    inputs, checkpoint = tmp_path / "in", (tmp_path / "original").resolve()
    for index in range(FIRST_RUN_FILES):
        AGGREGATION.write_input(inputs, index)
    run(spark, AGGREGATION, inputs, checkpoint, "hdfs")
    batch_a = push_newest(cluster, CRASH_QUERY, checkpoint)
    for index in range(FIRST_RUN_FILES, ALL_FILES):
        AGGREGATION.write_input(inputs, index)
    run(spark, AGGREGATION, inputs, checkpoint, "hdfs")
    batch_b = newest_committed(checkpoint)
    assert batch_b > batch_a

    files = [entry for entry in read_cut(checkpoint, batch_b).files if entry.size > 0]
    reads = rng.randint(1, len(files))
    crash_pusher(cluster, checkpoint, "reading-chunk", reads)
    manifests, latest = manifests_on_ring(cluster, CRASH_QUERY)
    assert latest == batch_a and batch_a in manifests and batch_b not in manifests, reads

    crash_pusher(cluster, checkpoint, "writing-manifest")
    manifests, latest = manifests_on_ring(cluster, CRASH_QUERY)
    assert latest == batch_a and batch_a in manifests and batch_b not in manifests

    crash_pusher(cluster, checkpoint, "manifest-written")
    manifests, latest = manifests_on_ring(cluster, CRASH_QUERY)
    assert latest == batch_b and batch_a in manifests and batch_b in manifests

    assert push_newest(cluster, CRASH_QUERY, checkpoint) == batch_b
    manifests, latest = manifests_on_ring(cluster, CRASH_QUERY)
    assert latest == batch_b and batch_b in manifests
    restored = (tmp_path / "restored").resolve()
    restorer = StateSync(cluster.ring, CRASH_QUERY, restored, cluster.secret)
    try:
        assert restorer.restore() == batch_b
    finally:
        restorer.close()
    for store in AGGREGATION.stores:
        expected = read_state(spark, checkpoint, batch_b, store)
        assert read_state(spark, restored, batch_b, store) == expected, f"{store}"
