"""What the Spark connector costs a running query and what it saves at a restart.

One process, one local SparkSession (``local[2]`` by default, ``--driver-memory`` set
before the JVM starts) and one local cluster of ``--peers`` peer processes (R=3, W=2),
all on 127.0.0.x. The input is deterministic: files generated from a seed beside a file
source directory and renamed into it, one per micro-batch (``maxFilesPerTrigger=1``),
oldest first by modification time.

By default every process shares every core, so the peers' work lands on the query's
cores too: the worst case, not how a ring is deployed. ``--ring-cpus 1`` pins the peers
to CPU 1 and Spark's JVM and this process (the driver, which pushes) to the others: the
query's machine then pays for the connector's driver side only, as it does when the
ring runs elsewhere.

1. **overhead**, per state store provider (``--providers``): two copies of the same
   stateful query (a one-minute-per-file event stream, ``withWatermark`` and a count and
   sum per five-minute window and key, append mode to the ``noop`` sink) run side by
   side in the session, one with ``StateSync.register`` (every committed batch pushed
   by the worker thread), one without. They are fed in alternating blocks of
   ``--block-batches`` files (with, without, without, with, ...): a block renames its
   staged files in, waits until the query has processed them all, and for the
   connector side waits for the push of the block's last batch, so that a push never
   shares the cores with the other query's block. Per batch, ``durationMs.triggerExecution`` from
   ``recentProgress``; the medians of both sides and their ratio (target <= 1.05x).
2. **upload**: after the blocks, ``--upload-batches`` single batches of the connector
   side, each waited for (query, then push): per batch, the bytes the connector read
   and uploaded (``PushReport.bytes_read``) against the bytes of the checkpoint files
   that are new or changed since the previous batch (a listing before and after; the
   "visible" figure leaves out Hadoop's hidden ``.crc`` side files and temporary files,
   which no cut holds). Target: uploaded / new visible bytes <= 1.0. The same is taken
   while building the large RocksDB state of part 3, and the ring's stored bytes (all
   replicas, compressed) are recorded around each phase.
3. **restart**: a query with at least ``--state-mib`` of RocksDB state (the consistent
   cut's ``state/`` bytes: one row per unique key with a ~130-byte string) is pushed to
   the ring and stopped. Then, ``--restarts`` times in alternating order and from the
   same checkpoint (batch N): **ring** = ``restore()`` into an empty directory and run the
   first batch after the restart; **local** = run the first batch on an intact copy of
   the checkpoint (copied before the clock starts). Both process the same small input
   file with ``availableNow``; the time is from ``restore()`` (ring) or ``start()``
   (local) until the query terminated after that batch. Target: ring / local <= 1.5x.

Writes ``benchmarks/results/connector.json`` (``connector-quick.json`` with ``--quick``)
and prints a table. Every figure is from one machine where Spark, the peers and this
process share the cores: re-run on a quiet machine before quoting the figures. Run from
the repository root:

    python benchmarks/bench_connector.py [--quick] [--state-mib 256] [--providers hdfs,rocksdb]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_store import cpu_seconds  # this script's folder is first on sys.path

from ring.sync_client import SyncClient
from spark_connector.checkpoint import read_cut
from spark_connector.sync import PushReport, StateSync
from sr3.local import LocalCluster

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SEED = 20_240_601
MIB = 1024 * 1024
REPLICATION = 3
WRITE_QUORUM = 2
BASE_PORT = 7760
TARGET_OVERHEAD_RATIO = 1.05
TARGET_RESTART_RATIO = 1.5
TARGET_UPLOAD_RATIO = 1.0
FLUSH_TIMEOUT_S = 600.0
RECENT_PROGRESS_MAX = 100  # spark.sql.streaming.numRecentProgressUpdates
BUILD_BATCHES_MAX = 200
INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01: the minute the first events are about
EVENT_SECONDS_PER_FILE = 60
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
RECORDED_CONF = (
    "spark.sql.shuffle.partitions",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
    "spark.sql.streaming.stateStore.maintenanceInterval",
    "spark.sql.streaming.minBatchesToRetain",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    "spark.sql.streaming.noDataMicroBatches.enabled",
    "spark.driver.memory",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Sizes of one run (see ``--help``)."""

    peers: int = 5
    spark_cores: int = 2
    driver_memory: str = "6g"
    partitions: int = 8
    providers: tuple[str, ...] = ("hdfs", "rocksdb")
    rows_per_batch: int = 20_000
    keys: int = 50_000
    warmup_batches: int = 20
    blocks: int = 8
    block_batches: int = 10
    upload_batches: int = 10
    state_mib: int = 256
    build_rows: int = 300_000
    restart_rows: int = 10_000
    restarts: int = 5
    settle_s: float = 2.0
    # Where the peers keep their data (default: beside the checkpoints, on one disk).
    peer_root: str = ""
    restart: bool = True  # --no-restart: parts 1 and 2 only
    overhead: bool = True  # --no-overhead: the restart part only
    # The recovery topology of the restarts from the ring (star, line, tree or auto).
    restore_topology: str = "auto"
    # CPUs the peers are pinned to, comma-separated ("": unpinned, sharing every core);
    # Spark's JVM and this process are then pinned to the other CPUs.
    ring_cpus: str = ""


QUICK = Settings(
    providers=("hdfs", "rocksdb"), rows_per_batch=2_000, keys=5_000, warmup_batches=1,
    blocks=2, block_batches=3, upload_batches=3, state_mib=16, build_rows=50_000,
    restart_rows=1_000, restarts=1, settle_s=0.5,
)  # fmt: skip


# -- measuring helpers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Processes:
    """The processes whose CPU time is accounted: this one, Spark's JVM and the peers."""

    python: int
    jvm: int
    peers: tuple[int, ...]

    def sample(self) -> dict[str, float | None]:
        peers = [cpu_seconds(pid) for pid in self.peers]
        return {
            "python": cpu_seconds(self.python),
            "jvm": cpu_seconds(self.jvm),
            "peers": None if None in peers else sum(p or 0.0 for p in peers),
        }


def cpu_delta(
    before: dict[str, float | None], after: dict[str, float | None]
) -> dict[str, float | None]:
    delta: dict[str, float | None] = {}
    for name, start in before.items():
        end = after.get(name)
        delta[name] = None if start is None or end is None else end - start
    return delta


Listing = dict[str, tuple[int, int]]


def listing(root: Path) -> Listing:
    """Every file under ``root``: relative path -> (size, mtime_ns); vanishing files skipped."""
    found: Listing = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def hidden_or_temporary(path: str) -> bool:
    """What no cut holds: hidden parts (Hadoop ``.crc`` side files) and ``*.tmp``."""
    parts = path.split("/")
    return any(part.startswith(".") for part in parts) or parts[-1].endswith(".tmp")


@dataclass(frozen=True, slots=True)
class NewFiles:
    """Checkpoint files that are new or changed between two listings."""

    files: int
    bytes_all: int
    bytes_visible: int


def new_files(before: Listing, after: Listing) -> NewFiles:
    changed = [path for path, stat in after.items() if before.get(path) != stat]
    return NewFiles(
        files=len(changed),
        bytes_all=sum(after[path][0] for path in changed),
        bytes_visible=sum(after[path][0] for path in changed if not hidden_or_temporary(path)),
    )


def tree_bytes(root: Path) -> int:
    return sum(size for size, _ in listing(root).values())


def cut_state_bytes(root: Path) -> tuple[int, int]:
    """Bytes and files under ``state/`` in the cut of the newest committed batch."""
    state = [entry for entry in read_cut(root).files if entry.path.startswith("state/")]
    return sum(entry.size for entry in state), len(state)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def settle(seconds: float) -> None:
    """Flush dirty pages of the previous phase and idle, so that neither lands in the next."""
    os.sync()
    time.sleep(seconds)


class RecordingSync(StateSync):
    """``StateSync`` that keeps each push's report and duration (its worker drops them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pushes: list[tuple[PushReport, float]] = []
        self._pushes_lock = threading.Lock()

    def push(self, batch_id: int | None = None) -> PushReport:
        started = time.perf_counter()
        report = super().push(batch_id)
        with self._pushes_lock:
            self._pushes.append((report, time.perf_counter() - started))
        return report

    def take_pushes(self) -> list[tuple[PushReport, float]]:
        with self._pushes_lock:
            pushes, self._pushes = self._pushes, []
        return pushes

    def wait_pushed(self, batch_id: int) -> float:
        """Note ``batch_id`` as committed (its progress event may still be on the listener
        bus) and wait until it is on the ring; the seconds waited."""
        started = time.perf_counter()
        self.committed(batch_id)
        self.flush(timeout_s=FLUSH_TIMEOUT_S)
        return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class RegisteredQuery:
    """A query as ``StateSync.register`` reads it: its id, and its session.

    PySpark's classic ``StreamingQuery`` has no ``sparkSession`` attribute (Scala's has),
    and ``register(query)`` read ``query.sparkSession`` (AttributeError on Spark 4.3).
    This works with that ``register`` and with one that takes the session separately."""

    query: Any
    sparkSession: Any  # the attribute name register() reads

    @property
    def id(self) -> str:
        return str(self.query.id)


def ring_stored_bytes(client: SyncClient) -> int:
    """Chunk bytes on all peers (every replica, stored compressed)."""
    status = client.status()
    down = [peer.peer_id for peer in status.peers if peer.stored_bytes is None]
    if down:
        raise RuntimeError(f"peers did not answer the status probe: {down}")
    return sum(peer.stored_bytes or 0 for peer in status.peers)


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


# -- Spark ---------------------------------------------------------------------------------


def start_spark(settings: Settings, local_dir: Path) -> Any:
    from pyspark.sql import SparkSession

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
    spark: Any, input_dir: Path, checkpoint_dir: Path, *, available_now: bool = False
) -> Any:
    """The restart query: one row of state per unique id, holding a ~130-byte string."""
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


# -- 1 and 2: overhead and upload -----------------------------------------------------------


@dataclass(slots=True)
class Side:
    """One copy of the overhead query: with the connector (``sync``) or without."""

    label: str
    query: Any
    input_dir: Path
    checkpoint_dir: Path
    sync: RecordingSync | None
    next_file: int = 0
    batches: list[BatchFigures] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    # The checkpoint as last listed: new files are counted from here on.
    listed: Listing = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bench:
    """What every phase shares."""

    spark: Any
    cluster: LocalCluster
    client: SyncClient
    processes: Processes
    settings: Settings
    work: Path
    log: Callable[[str], None]


def stage(side: Side, bench: Bench, count: int) -> list[Path]:
    """Generate ``side``'s next ``count`` input files beside its input directory (not
    yet seen by the query): generating one takes about a quarter of a second of this
    process's CPU, which, written straight into the directory, overlapped the block's
    first batches and took a core from them (on either side, at random)."""
    staging = side.input_dir.with_name(side.input_dir.name + "-staged")
    staged = [write_events(staging, side.next_file + n, bench.settings) for n in range(count)]
    side.next_file += count
    return staged


def feed(side: Side, staged: Sequence[Path]) -> tuple[list[BatchFigures], float, float]:
    """Rename the ``staged`` files into ``side``'s input directory together and wait until
    they are processed (and pushed): the batches, the wall seconds of processing, and
    the seconds then waited for the push."""
    first_batch_id = side.next_file - len(staged)
    started = time.perf_counter()
    for path in staged:
        path.rename(side.input_dir / path.name)
    side.query.processAllAvailable()
    wall_s = time.perf_counter() - started
    check_query(side.query)
    batches = batches_from(side.query, first_batch_id)
    ids = [batch.batch_id for batch in batches]
    if ids != list(range(first_batch_id, side.next_file)):
        raise RuntimeError(f"{side.label}: expected batches {first_batch_id}..; got {ids}")
    flush_s = 0.0 if side.sync is None else side.sync.wait_pushed(side.next_file - 1)
    return batches, wall_s, flush_s


def run_block(side: Side, bench: Bench) -> None:
    staged = stage(side, bench, bench.settings.block_batches)
    cpu_before = bench.processes.sample()
    batches, wall_s, flush_s = feed(side, staged)
    cpu = cpu_delta(cpu_before, bench.processes.sample())
    side.batches.extend(batches)
    block: dict[str, Any] = {
        "batch_ids": [batches[0].batch_id, batches[-1].batch_id],
        "trigger_ms_median": median([batch.trigger_ms for batch in batches]),
        "wall_s": round(wall_s, 3),
        "flush_wait_s": round(flush_s, 3),
        "cpu_s": cpu,
    }
    if side.sync is not None:
        pushes = side.sync.take_pushes()
        before, side.listed = side.listed, listing(side.checkpoint_dir)
        created = new_files(before, side.listed)
        block |= {
            "pushes": len(pushes),
            "uploaded_bytes": sum(report.bytes_read for report, _ in pushes),
            "new_bytes_visible": created.bytes_visible,
            "new_bytes_all": created.bytes_all,
        }
    side.blocks.append(block)


def upload_steps(side: Side, bench: Bench, count: int) -> list[dict[str, Any]]:
    """``count`` single batches, each processed and pushed before the next: per batch, the
    bytes uploaded against the checkpoint bytes the batch wrote."""
    assert side.sync is not None, "upload is measured on the connector side"
    steps = []
    for _ in range(count):
        batches, _wall_s, flush_s = feed(side, stage(side, bench, 1))
        before, side.listed = side.listed, listing(side.checkpoint_dir)
        steps.append(step_figures(side.sync, before, side.listed))
        steps[-1] |= {"batch_id": batches[0].batch_id, "trigger_ms": batches[0].trigger_ms}
        steps[-1] |= {"flush_wait_s": round(flush_s, 3)}
    return steps


def step_figures(sync: RecordingSync, before: Listing, after: Listing) -> dict[str, Any]:
    pushes = sync.take_pushes()
    created = new_files(before, after)
    uploaded = sum(report.bytes_read for report, _ in pushes)
    return {
        "pushes": len(pushes),
        "push_s": [round(seconds, 3) for _, seconds in pushes],
        "uploaded_bytes": uploaded,
        "new_files": created.files,
        "new_bytes_visible": created.bytes_visible,
        "new_bytes_all": created.bytes_all,
        "cut_files": pushes[-1][0].files if pushes else None,
        "cut_bytes": pushes[-1][0].bytes_total if pushes else None,
    }


def upload_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    uploaded = sum(step["uploaded_bytes"] for step in steps)
    visible = sum(step["new_bytes_visible"] for step in steps)
    every = sum(step["new_bytes_all"] for step in steps)
    ratios = [
        step["uploaded_bytes"] / step["new_bytes_visible"]
        for step in steps
        if step["new_bytes_visible"]
    ]
    return {
        "batches": len(steps),
        "uploaded_bytes": uploaded,
        "new_bytes_visible": visible,
        "new_bytes_all": every,
        "ratio_visible": uploaded / visible if visible else None,
        "ratio_all": uploaded / every if every else None,
        "ratio_per_batch_max": max(ratios, default=None),
        "uploaded_bytes_per_batch_median": median([step["uploaded_bytes"] for step in steps]),
        "new_bytes_visible_per_batch_median": median([step["new_bytes_visible"] for step in steps]),
        "push_s_median": median([s for step in steps for s in step["push_s"]]),
        "steps": list(steps),
    }


def side_summary(side: Side) -> dict[str, Any]:
    trigger_ms = [batch.trigger_ms for batch in side.batches]
    cpu: dict[str, float | None] = {}
    for block in side.blocks:
        for name, seconds in block["cpu_s"].items():
            present = cpu.get(name, 0.0) is not None and seconds is not None
            cpu[name] = (cpu.get(name) or 0.0) + seconds if present else None
    return {
        "batches": len(trigger_ms),
        "trigger_ms_median": median(trigger_ms),
        "trigger_ms_mean": statistics.fmean(trigger_ms),
        "trigger_ms_p90": statistics.quantiles(trigger_ms, n=10)[-1]
        if len(trigger_ms) > 1
        else None,
        "wall_s_per_batch_median": median(
            [block["wall_s"] / bench_batches(block) for block in side.blocks]
        ),
        "flush_wait_s_median": median([block["flush_wait_s"] for block in side.blocks]),
        "cpu_s": cpu,
        "state_rows_last": side.batches[-1].state_rows if side.batches else None,
        "blocks": side.blocks,
        "per_batch": [asdict(batch) for batch in side.batches],
    }


def extra_cpu(with_side: dict[str, Any], without_side: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds per batch the connector side spent beyond the other, per process group:
    steadier than durations on a busy machine (the push's work shows up here even when it
    runs on an otherwise idle core)."""
    batches = with_side["batches"]
    extra: dict[str, Any] = {}
    for name, seconds in with_side["cpu_s"].items():
        other = without_side["cpu_s"].get(name)
        missing = seconds is None or other is None or not batches
        extra[name] = None if missing else round((seconds - other) / batches, 4)
    return extra


def pair_ratios(
    with_blocks: Sequence[dict[str, Any]], without_blocks: Sequence[dict[str, Any]]
) -> list[float]:
    return [
        round(ours["trigger_ms_median"] / theirs["trigger_ms_median"], 3)
        for ours, theirs in zip(with_blocks, without_blocks, strict=True)
    ]


def pair_interval(ratios: Sequence[float], resamples: int = 10_000) -> list[float]:
    """The mean of the block-pair ratios and a bootstrap 95 % interval of it (seeded):
    how far one run's figure can be trusted, given how much the pairs spread."""
    if not ratios:
        return []
    draw = random.Random(0)
    means = sorted(statistics.fmean(draw.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return [round(statistics.fmean(ratios), 3), round(low, 3), round(high, 3)]


def bench_batches(block: dict[str, Any]) -> int:
    first, last = block["batch_ids"]
    return int(last) - int(first) + 1


def run_sides(bench: Bench, with_side: Side, without_side: Side) -> None:
    """Warm both queries up, then alternate blocks: with, without, without, with, ...

    The warm-up alternates too, in blocks of the same size: batch times keep falling for
    the first few dozen batches of a JVM (code still being compiled), and a warm-up fed
    one side after the other left the first measured block, the connector's, paying
    for it (about 750 against 600 ms per batch with 10 warm-up batches each)."""
    settings = bench.settings
    left = {with_side.label: settings.warmup_batches, without_side.label: settings.warmup_batches}
    pair = 0
    while any(left.values()):
        order = (with_side, without_side) if pair % 2 == 0 else (without_side, with_side)
        for side in order:
            count = min(left[side.label], settings.block_batches)
            if count:
                feed(side, stage(side, bench, count))
                left[side.label] -= count
        pair += 1
    assert with_side.sync is not None
    with_side.sync.take_pushes()
    with_side.listed = listing(with_side.checkpoint_dir)
    for pair in range(settings.blocks):
        order = (with_side, without_side) if pair % 2 == 0 else (without_side, with_side)
        for side in order:
            run_block(side, bench)
        bench.log(
            f"  blocks {pair + 1}/{settings.blocks}: median trigger ms "
            f"with {with_side.blocks[-1]['trigger_ms_median']}, "
            f"without {without_side.blocks[-1]['trigger_ms_median']}"
        )


def measure_overhead(bench: Bench, provider: str) -> dict[str, Any]:
    """Part 1 (and the upload figures of part 2) for one state store provider."""
    spark, cluster = bench.spark, bench.cluster
    spark.conf.set(PROVIDER_CONF, PROVIDERS[provider])
    root = bench.work / f"overhead-{provider}"
    name = f"overhead-{provider}"
    sides: list[Side] = []
    sync = RecordingSync(cluster.ring, name, root / "ckpt-with", cluster.secret)
    try:
        for label, side_sync in (("with", sync), ("without", None)):
            input_dir = root / f"in-{label}"
            input_dir.mkdir(parents=True)
            checkpoint = root / f"ckpt-{label}"
            if side_sync is not None:
                checkpoint = side_sync.checkpoint_dir
            query = start_events_query(spark, input_dir, checkpoint, f"{name}-{label}")
            sides.append(Side(label, query, input_dir, checkpoint, side_sync))
        sync.register(RegisteredQuery(sides[0].query, spark))
        stored_before = ring_stored_bytes(bench.client)
        run_sides(bench, sides[0], sides[1])
        steps = upload_steps(sides[0], bench, bench.settings.upload_batches)
        stored_after = ring_stored_bytes(bench.client)
    finally:
        sync.close()
        for side in sides:
            side.query.stop()
    with_figures, without_figures = side_summary(sides[0]), side_summary(sides[1])
    ratio = with_figures["trigger_ms_median"] / without_figures["trigger_ms_median"]
    blocks = sides[0].blocks
    pairs = pair_ratios(blocks, sides[1].blocks)
    uploaded = sum(block["uploaded_bytes"] for block in blocks)
    visible = sum(block["new_bytes_visible"] for block in blocks)
    return {
        "provider": provider,
        "trigger_ms_median": {
            "with": with_figures["trigger_ms_median"],
            "without": without_figures["trigger_ms_median"],
        },
        "ratio": ratio,
        "target_ratio": TARGET_OVERHEAD_RATIO,
        "target_met": ratio <= TARGET_OVERHEAD_RATIO,
        # Per pair of neighbouring blocks, with / without: a slow stretch of the machine
        # moves one pair, not the pooled medians' balance.
        "pair_ratios": pairs,
        # [mean, low, high]: the pair ratios' mean and its bootstrap 95 % interval.
        "pair_ratio_interval": pair_interval(pairs),
        "extra_cpu_s_per_batch": extra_cpu(with_figures, without_figures),
        "with": with_figures,
        "without": without_figures,
        "blocks_upload": {
            "uploaded_bytes": uploaded,
            "new_bytes_visible": visible,
            "new_bytes_all": sum(block["new_bytes_all"] for block in blocks),
            "ratio_visible": uploaded / visible if visible else None,
        },
        "upload": upload_summary(steps),
        "ring_stored_bytes_delta": stored_after - stored_before,
        "checkpoint_bytes": tree_bytes(sides[0].checkpoint_dir),
    }


# -- 3: restart ----------------------------------------------------------------------------

RESTART_QUERY = "restart-state"


def build_state(bench: Bench, input_dir: Path, checkpoint: Path) -> dict[str, Any]:
    """Run the keys query with the connector until the cut holds ``--state-mib`` of state;
    every batch is pushed before the next starts. Stops the query."""
    settings, cluster = bench.settings, bench.cluster
    target_bytes = settings.state_mib * MIB
    sync = RecordingSync(cluster.ring, RESTART_QUERY, checkpoint, cluster.secret)
    query = start_keys_query(bench.spark, input_dir, sync.checkpoint_dir)
    steps: list[dict[str, Any]] = []
    state_bytes = state_files = 0
    listed: Listing = {}  # the query's own first files count as the first batch's
    started = time.perf_counter()
    try:
        sync.register(RegisteredQuery(query, bench.spark))
        stored_before = ring_stored_bytes(bench.client)
        while state_bytes < target_bytes:
            index = len(steps)
            if index >= BUILD_BATCHES_MAX:
                raise RuntimeError(f"state still {state_bytes} bytes after {index} batches")
            write_ids(input_dir, index, index * settings.build_rows, settings.build_rows)
            query.processAllAvailable()
            check_query(query)
            batch = batches_from(query, index)
            if [figures.batch_id for figures in batch] != [index]:
                raise RuntimeError(f"expected batch {index}, got {batch}")
            flush_s = sync.wait_pushed(index)
            before, listed = listed, listing(checkpoint)
            steps.append(step_figures(sync, before, listed))
            state_bytes, state_files = cut_state_bytes(checkpoint)
            steps[-1] |= asdict(batch[0]) | {"flush_wait_s": round(flush_s, 3)}
            steps[-1] |= {"cut_state_bytes": state_bytes}
            bench.log(
                f"  build batch {index}: {batch[0].trigger_ms} ms, state {state_bytes / MIB:.0f} "
                f"MiB in {state_files} files, pushed in {flush_s:.1f} s"
            )
        stored_after = ring_stored_bytes(bench.client)
    finally:
        sync.close()
        query.stop()
    return {
        "build_s": round(time.perf_counter() - started, 1),
        "batch_id": len(steps) - 1,
        "state_rows": steps[-1]["state_rows"],
        "cut_state_bytes": state_bytes,
        "cut_state_files": state_files,
        "cut_bytes": steps[-1]["cut_bytes"],
        "state_dir_bytes_on_disk": tree_bytes(checkpoint / "state"),
        "checkpoint_bytes_on_disk": tree_bytes(checkpoint),
        "ring_stored_bytes_delta": stored_after - stored_before,
        "upload": upload_summary(steps),
    }


def run_first_batch(bench: Bench, input_dir: Path, checkpoint: Path, batch_id: int) -> Any:
    """Start the keys query on ``checkpoint`` with ``availableNow`` and wait until it
    terminated after its one batch; (wall seconds, the batch's figures)."""
    started = time.perf_counter()
    query = start_keys_query(bench.spark, input_dir, checkpoint, available_now=True)
    query.awaitTermination()
    wall_s = time.perf_counter() - started
    check_query(query)
    batches = batches_from(query, batch_id)
    if [batch.batch_id for batch in batches] != [batch_id]:
        raise RuntimeError(f"expected only batch {batch_id} after the restart, got {batches}")
    return wall_s, batches[0]


def restart_trial(
    bench: Bench, path: str, input_dir: Path, checkpoint: Path, target: Path, batch_id: int
) -> dict[str, Any]:
    """One restart after ``batch_id`` into ``target``: from the ring or from a local copy."""
    cluster = bench.cluster
    if path == "local":
        shutil.copytree(checkpoint, target, symlinks=True)
    restorer = StateSync(cluster.ring, RESTART_QUERY, target, cluster.secret)
    settle(bench.settings.settle_s)
    cpu_before = bench.processes.sample()
    started = time.perf_counter()
    restore_s = 0.0
    try:
        if path == "ring":
            restored = restorer.restore(topology=bench.settings.restore_topology)
            restore_s = time.perf_counter() - started
            if restored != batch_id:
                raise RuntimeError(f"the ring restored batch {restored}, not {batch_id}")
    finally:
        restorer.close()
    restored_bytes = tree_bytes(target)
    wall_s, batch = run_first_batch(bench, input_dir, target, batch_id + 1)
    total_s = time.perf_counter() - started
    recovery = restorer.last_restore.recovery if restorer.last_restore is not None else None
    return {
        "path": path,
        "topology": recovery.topology if recovery is not None else None,
        "topology_reason": recovery.reason if recovery is not None else None,
        "total_s": round(total_s, 3),
        "restore_s": round(restore_s, 3),
        "first_batch_s": round(wall_s, 3),
        "first_batch_trigger_ms": batch.trigger_ms,
        "first_batch_add_batch_ms": batch.add_batch_ms,
        "state_rows": batch.state_rows,
        "checkpoint_bytes_at_start": restored_bytes,
        "cpu_s": cpu_delta(cpu_before, bench.processes.sample()),
    }


def measure_restart(bench: Bench) -> dict[str, Any]:
    settings = bench.settings
    bench.spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
    root = bench.work / "restart"
    input_dir, checkpoint = root / "in", root / "ckpt"
    input_dir.mkdir(parents=True)
    build = build_state(bench, input_dir, checkpoint)
    bench.log(
        f"  state: {build['cut_state_bytes'] / MIB:.0f} MiB in the cut "
        f"({build['state_rows']} rows) after {build['batch_id'] + 1} batches, {build['build_s']} s"
    )
    files = build["batch_id"] + 1
    write_ids(input_dir, files, files * settings.build_rows, settings.restart_rows)
    # Untimed: the first restart in a JVM loads and compiles code the later ones reuse.
    warmup = restart_trial(
        bench, "local", input_dir, checkpoint, root / "warmup", build["batch_id"]
    )
    shutil.rmtree(root / "warmup", ignore_errors=True)
    bench.log(f"  warm-up restart (not counted): {warmup['total_s']:.2f} s")
    trials = []
    for trial in range(settings.restarts):
        for path in ("ring", "local") if trial % 2 == 0 else ("local", "ring"):
            target = root / f"{path}-{trial}"
            figures = restart_trial(bench, path, input_dir, checkpoint, target, build["batch_id"])
            shutil.rmtree(target, ignore_errors=True)
            trials.append({"trial": trial, **figures})
            bench.log(
                f"  restart {trial + 1}/{settings.restarts} {path:>5}: "
                f"{figures['total_s']:.2f} s (restore {figures['restore_s']:.2f} s, "
                f"first batch {figures['first_batch_s']:.2f} s)"
                + (f" {figures['topology']}" if figures["topology"] else "")
            )
    return restart_summary(build, trials)


def restart_summary(build: dict[str, Any], trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def of(path: str, name: str) -> float | None:
        return median([trial[name] for trial in trials if trial["path"] == path])

    ring_s, local_s = of("ring", "total_s"), of("local", "total_s")
    ratio = ring_s / local_s if ring_s is not None and local_s else None
    restore_s = of("ring", "restore_s")
    return {
        "ring_total_s_median": ring_s,
        "local_total_s_median": local_s,
        "ratio": ratio,
        "target_ratio": TARGET_RESTART_RATIO,
        "target_met": ratio is not None and ratio <= TARGET_RESTART_RATIO,
        "restore_s_median": restore_s,
        "restore_mb_s": build["cut_bytes"] / 1e6 / restore_s if restore_s else None,
        "first_batch_after_ring_s_median": of("ring", "first_batch_s"),
        "first_batch_after_local_s_median": of("local", "first_batch_s"),
        "build": build,
        "trials": list(trials),
    }


# -- report --------------------------------------------------------------------------------


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


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.0f}"


def _ratio(value: float | None, target: float) -> str:
    if value is None:
        return "  n/a"
    return f"{value:5.2f}x (<= {target:.2f}x {'ok' if value <= target else 'MISSED'})"


def print_report(report: dict[str, Any]) -> None:
    print("\noverhead: median micro-batch ms (triggerExecution), with / without the connector")
    for provider, figures in report["overhead"].items():
        medians = figures["trigger_ms_median"]
        print(
            f"  {provider:8} without {_ms(medians['without'])}  with {_ms(medians['with'])}  "
            f"ratio {_ratio(figures['ratio'], TARGET_OVERHEAD_RATIO)}  "
            f"({figures['with']['batches']} batches each)"
        )
        extra = ", ".join(
            f"{name} {'n/a' if seconds is None else f'{seconds * 1000:.0f} ms'}"
            for name, seconds in figures["extra_cpu_s_per_batch"].items()
        )
        print(f"  {'':8} extra CPU per batch with the connector: {extra}")
        print(f"  {'':8} per block pair, with / without: {figures['pair_ratios']}")
        interval = figures.get("pair_ratio_interval") or []
        if interval:
            mean, low, high = interval
            print(f"  {'':8} pairs' mean {mean:.3f}, 95 % interval {low:.3f}-{high:.3f}")
    print("\nupload: bytes the connector uploaded / new checkpoint bytes (no .crc, no .tmp)")
    for name, upload in report["upload"].items():
        print(
            f"  {name:16} {upload['batches']:3} batches  "
            f"uploaded {upload['uploaded_bytes'] / MIB:8.2f} MiB  "
            f"new {upload['new_bytes_visible'] / MIB:8.2f} MiB  "
            f"ratio {_ratio(upload['ratio_visible'], TARGET_UPLOAD_RATIO)}"
        )
    if "restart" in report:
        print_restart(report["restart"])
    print(
        f"\ncores {report['environment']['cores']}, Spark {report['environment']['spark']}, "
        f"peers {report['peers']} (R={REPLICATION} W={WRITE_QUORUM}), run {report['run_s']:.0f} s"
    )
    ring_cpus = report["settings"]["ring_cpus"]
    print(
        f"peers pinned to CPUs {ring_cpus}, Spark and the driver to the others"
        if ring_cpus
        else "peers, Spark and the driver share every core"
    )


def print_restart(restart: dict[str, Any]) -> None:
    build = restart["build"]
    print(
        f"\nrestart: {build['cut_state_bytes'] / MIB:.0f} MiB of RocksDB state in the cut "
        f"({build['state_rows']} rows, state/ on disk {build['state_dir_bytes_on_disk'] / MIB:.0f}"
        f" MiB), {len(restart['trials']) // 2} trial(s) per path, medians"
    )
    print(
        f"  ring   {restart['ring_total_s_median']:7.2f} s  (restore "
        f"{restart['restore_s_median']:.2f} s, first batch "
        f"{restart['first_batch_after_ring_s_median']:.2f} s)\n"
        f"  local  {restart['local_total_s_median']:7.2f} s  (first batch only)\n"
        f"  ratio  {_ratio(restart['ratio'], TARGET_RESTART_RATIO)}"
    )


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write atomically so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(temporary, out)


def measure(bench: Bench) -> dict[str, Any]:
    overhead: dict[str, Any] = {}
    upload: dict[str, Any] = {}
    for provider in bench.settings.providers if bench.settings.overhead else ():
        bench.log(f"overhead and upload, {provider} provider")
        overhead[provider] = measure_overhead(bench, provider)
        upload[f"overhead-{provider}"] = overhead[provider]["upload"]
    figures: dict[str, Any] = {"overhead": overhead, "upload": upload}
    if bench.settings.restart:
        bench.log("restart, rocksdb provider")
        figures["restart"] = restart = measure_restart(bench)
        upload["restart-build"] = restart["build"]["upload"]
    return figures


def cpu_set(text: str) -> set[int]:
    """``"1"`` or ``"2,3"``: a set of CPU numbers (empty for ``""``)."""
    return {int(part) for part in text.split(",") if part.strip()}


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def run(settings: Settings, out: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    ring_cpus = cpu_set(settings.ring_cpus)
    query_cpus = os.sched_getaffinity(0) - ring_cpus
    if ring_cpus:  # before the JVM starts: it inherits this process's CPUs
        pin(os.getpid(), query_cpus)
        log(f"peers on CPUs {sorted(ring_cpus)}; Spark and the driver on {sorted(query_cpus)}")
    load_average = os.getloadavg()[0]
    if load_average > 1.0:
        log(f"warning: load average {load_average:.2f} before the run; figures will be noisy")
    with (
        tempfile.TemporaryDirectory(prefix="sr3-bench-connector-") as temporary,
        tempfile.TemporaryDirectory(
            prefix="sr3-bench-peers-", dir=settings.peer_root or None
        ) as peer_home,
    ):
        work = Path(temporary)
        cluster = LocalCluster.create(
            Path(peer_home) / "cluster", settings.peers, replication=REPLICATION,
            write_quorum=WRITE_QUORUM, base_port=BASE_PORT, cluster_file=work / "cluster.json",
        )  # fmt: skip
        spark = None
        try:
            cluster.up()
            if ring_cpus:
                for peer in cluster.cluster.peers:
                    if peer.pid is not None:
                        pin(peer.pid, ring_cpus)
            log(f"ring of {settings.peers} peers up; starting Spark")
            spark = start_spark(settings, work / "spark-local")
            peer_pids = tuple(peer.pid for peer in cluster.cluster.peers if peer.pid is not None)
            processes = Processes(os.getpid(), jvm_pid(spark), peer_pids)
            with SyncClient(cluster.ring, cluster.secret) as client:
                bench = Bench(spark, cluster, client, processes, settings, work, log)
                figures = measure(bench)
            env = environment(spark, settings)
        finally:
            if spark is not None:
                spark.stop()
            cluster.down(purge=True)
    report = {
        "benchmark": "connector",
        "environment": env,
        "load_average_1m_before": load_average,
        "settings": asdict(settings),
        "peers": settings.peers,
        "replication": REPLICATION,
        "write_quorum": WRITE_QUORUM,
        "targets": {
            "overhead_ratio_max": TARGET_OVERHEAD_RATIO,
            "restart_ratio_max": TARGET_RESTART_RATIO,
            "upload_ratio_max": TARGET_UPLOAD_RATIO,
        },
        **figures,
        "run_s": round(time.perf_counter() - started, 1),
        "notes": NOTES,
    }
    print_report(report)
    write_report(report, out)
    print(f"\nwrote {out}")


NOTES = [
    "overhead: durationMs.triggerExecution of each batch from recentProgress; both queries "
    "in one SparkSession, fed in alternating blocks, the connector's push of a block's "
    "last batch waited for before the other query's block",
    "upload: uploaded = PushReport.bytes_read (raw bytes of files new to the connector); "
    "new = new or changed files between listings before and after each batch; "
    "ratio_visible leaves out hidden (.crc) and .tmp files, ratio_all counts them",
    "ring_stored_bytes_delta: compressed chunk bytes on all peers, every replica",
    "restart: ring = restore() into an empty directory + first batch (availableNow); "
    "local = first batch on an intact copy of the same checkpoint (copy not timed); "
    "both in the running JVM, after os.sync and settle_s idle seconds",
    "one machine shares its cores between Spark, the peers and the push: re-run on a "
    "quiet machine before quoting figures",
]


def parse_settings(argv: list[str] | None) -> tuple[Settings, Path]:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run (about 3 min)")
    parser.add_argument("--out", type=Path, help="JSON results (default results/connector.json)")
    parser.add_argument("--providers", help=f"comma-separated of {sorted(PROVIDERS)}")
    for name, value in asdict(defaults).items():
        if name == "providers":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, help=f"default {value}"
            )
            continue
        parser.add_argument(flag, type=type(value), help=f"default {value} (quick: see QUICK)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else defaults
    chosen: dict[str, Any] = {
        name: getattr(args, name)
        for name in asdict(defaults)
        if name != "providers" and getattr(args, name) is not None
    }
    if args.providers:
        chosen["providers"] = tuple(args.providers.split(","))
    settings = replace(base, **chosen)
    problems = check_settings(settings)
    if problems:
        parser.error("; ".join(problems))
    out = args.out or RESULTS_DIR / ("connector-quick.json" if args.quick else "connector.json")
    return settings, out


def check_settings(settings: Settings) -> list[str]:
    problems = [f"unknown provider {p!r}" for p in settings.providers if p not in PROVIDERS]
    if settings.peers < REPLICATION:
        problems.append(f"--peers must be at least {REPLICATION}")
    try:
        ring_cpus = cpu_set(settings.ring_cpus)
    except ValueError:
        problems.append("--ring-cpus must be CPU numbers separated by commas")
    else:
        available = os.sched_getaffinity(0)
        if not ring_cpus <= available or not available - ring_cpus:
            problems.append(f"--ring-cpus must leave the query some of CPUs {sorted(available)}")
    if not 1 <= settings.block_batches <= RECENT_PROGRESS_MAX // 2:
        problems.append(f"--block-batches must be 1..{RECENT_PROGRESS_MAX // 2}")
    positive = ("blocks", "upload_batches", "state_mib", "build_rows", "restart_rows", "restarts")
    problems += [
        f"--{n.replace('_', '-')} must be positive" for n in positive if getattr(settings, n) < 1
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    settings, out = parse_settings(argv)
    run(settings, out, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
