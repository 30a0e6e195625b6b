"""``Standby``: a second application that takes a query over when its driver is lost.

Two or more applications run the same query's code, each with its SparkSession started
and the query built but not started; each makes a ``Standby`` and calls
``take_over()``. Exactly one holds the query's lease (``spark_connector.lease``) and
runs the query; the others wait, kept close behind it:

- for a query whose checkpoint is a local directory pushed by ``StateSync``, a standby
  pulls each batch the active side pushes into its own checkpoint directory, fetching
  only the files that batch changed (``spark_connector.pull``), so that it holds the
  newest pushed batch or the one before;
- for a query whose checkpoint is on ``sr3://``, the checkpoint is on the ring already;
  a standby reads its commit log through its own JVM's ``sr3://`` client as batches
  commit, which keeps that client's classes, connections and TLS sessions warm and
  tells how far behind it is, and reads ahead the state files the first batch after a
  takeover would load (``spark_connector.warm``: bounded, each file once).

When the lease lapses (its holder stopped renewing it: lost machine, killed process,
partition) or is released, one standby takes it, raising its fence: it pulls what is
left, starts the query, and from then on renews the lease and pushes (``StateSync``
guarded by the lease) or commits to ``sr3://`` (offset and commit files fenced: the JVM's
``Sr3Fence`` knows the fence and for how long it is valid). The application that lost
the lease, if it is still running (it was cut off, not killed), is told when its next
renewal fails, stops its query and logs why; until then its pushes and fenced commits
are refused by its own validity check and, once another holder's fence is on the
record, by the ring. Each side logs the takeover with the batch it resumes from.

Each standby reports itself in record ``spark/<query>/standbys/<holder>`` (``sr3 spark
list`` shows them) and in Prometheus gauges of the driver's default registry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client import Counter, Gauge

from ring.client import ClientOptions
from ring.codec import compact_json
from ring.config import resolve
from ring.errors import (
    ConfigError,
    DataUnavailable,
    PeerError,
    QuorumError,
    RecordConflict,
    RecordContention,
    RecordUnknown,
    SR3Error,
)
from ring.lease import DRIFT_DEFAULT, RENEW_EVERY_S_DEFAULT, TIMEOUT_S_DEFAULT, Lease
from ring.sync_client import SyncClient
from spark_connector.conf import CONF_CREDENTIAL, HADOOP_PREFIX
from spark_connector.fs_checkpoints import SCHEME, fs_path_of
from spark_connector.fs_client import FsClient
from spark_connector.lease import LeaseState, QueryLease, check_credential_fences
from spark_connector.manifest import check_query_name
from spark_connector.plan_hook import check_session
from spark_connector.plans import place_plan
from spark_connector.pull import Puller, PullReport
from spark_connector.push import KEEP_BATCHES_DEFAULT
from spark_connector.rescale import (
    check_partitions,
    partitions_of,
    pending_batches,
    repartition_checkpoint,
    unfinished_rescale,
)
from spark_connector.restore import read_manifest
from spark_connector.sync import DRAIN_S_DEFAULT, StateSync
from spark_connector.warm import WarmReport, warm_state

__all__ = ["STANDBY_STATUS_FORMAT", "Standby", "StandbyStatus", "Takeover", "standbys_prefix"]

log = logging.getLogger(__name__)

# How often a standby reads the lease record (each read is one consensus round).
POLL_S_DEFAULT = 0.25
POLL_S_MIN = 0.05
# A standby's status record is rewritten when its batch changes, at most this often,
# and at least this often otherwise (so that ``sr3 spark list`` can tell a silent one).
STATUS_EVERY_S = 2.0
STATUS_REFRESH_S = 15.0
STANDBY_STATUS_FORMAT = 1
# An sr3:// standby reads the newest state files ahead at most this often.
WARM_EVERY_S = 10.0
# The warm-up query (``Standby.prepare``) is stopped after this long.
WARM_S_MAX = 120.0
# The JVM counts a fence valid this much less than the Python side does (py4j's call).
FENCE_MARGIN_MS = 50
# The Hadoop confs the Java FileSystem takes its credential from (``spark.hadoop.`` +
# them): the name Spark redacts, then the former one it still reads.
CREDENTIAL_CONFS = (CONF_CREDENTIAL.removeprefix(HADOOP_PREFIX), "fs.sr3.credential")

BEHIND_BATCHES = Gauge(
    "sr3_standby_behind_batches", "Batches the standby is behind the active side.", ["query"]
)
BEHIND_BYTES = Gauge(
    "sr3_standby_behind_bytes", "Bytes the standby would fetch to catch up.", ["query"]
)
PULLED_BYTES = Counter("sr3_standby_pulled_bytes", "Bytes a standby pulled.", ["query"])
WARMED_BYTES = Counter(
    "sr3_standby_read_ahead_bytes", "State bytes an sr3:// standby read ahead.", ["query"]
)
LEASE_UNCHANGED = Gauge(
    "sr3_standby_lease_unchanged_seconds",
    "How long the standby has seen the lease record unchanged.",
    ["query"],
)


def standbys_prefix(query: str) -> str:
    return f"spark/{check_query_name(query)}/standbys/"


@dataclass(frozen=True, slots=True)
class StandbyStatus:
    """What a standby reports of itself (record ``spark/<query>/standbys/<holder>``)."""

    holder: str
    mode: str  # "sync" (StateSync pulls) or "fs" (sr3:// checkpoint)
    batch: int | None  # the newest batch it holds (sync) or has seen committed (fs)
    behind_batches: int
    behind_bytes: int
    pulled_bytes_last: int  # what its last pull fetched
    updated_at: float  # wall clock

    def encode(self) -> bytes:
        return compact_json({"format": STANDBY_STATUS_FORMAT, **_fields(self)})

    @classmethod
    def decode(cls, raw: bytes) -> StandbyStatus:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != STANDBY_STATUS_FORMAT:
            raise ValueError("not a standby status record")
        batch = data.get("batch")
        return cls(
            str(data["holder"]), str(data["mode"]), None if batch is None else int(batch),
            int(data["behind_batches"]), int(data["behind_bytes"]),
            int(data["pulled_bytes_last"]), float(data["updated_at"]),
        )  # fmt: skip


def _fields(status: StandbyStatus) -> dict[str, Any]:
    return {name: getattr(status, name) for name in StandbyStatus.__slots__}


@dataclass(frozen=True, slots=True)
class Takeover:
    """How this application came to hold the query: from whom (None: no one held it,
    or it was released), with which fence, resuming after which batch, how long the
    lease was seen unchanged before it was taken, and how long the catch-up and the
    query's start took. ``planned``: the batch after ``resumed_after`` that the previous
    holder planned, laid down from the ring so that it runs with the same offsets (a
    local checkpoint's; None when there was none)"""

    fence: int
    previous: Lease | None
    resumed_after: int | None
    waited_s: float
    catch_up_bytes: int
    catch_up_s: float
    start_s: float
    planned: int | None = None
    # The batch Spark's runner wrote to bring the state to ``Standby(partitions=...)``
    # before the query started (a rescale by handover); None when none was needed.
    rescaled: int | None = None
    rescale_s: float = 0.0


class Standby:
    """One application's side of a query that several can drive (see the module)."""

    def __init__(
        self,
        ring: str | None = None,
        query: str = "",
        checkpoint_dir: str | Path = "",
        secret: str | None = None,
        *,
        start: Any,
        spark: Any = None,
        holder: str | None = None,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        renew_every_s: float = RENEW_EVERY_S_DEFAULT,
        drift: float = DRIFT_DEFAULT,
        poll_s: float = POLL_S_DEFAULT,
        topology: str = "auto",
        overwrite: bool = False,
        keep_batches: int = KEEP_BATCHES_DEFAULT,
        warm: bool = True,
        partitions: int | None = None,
        client_options: ClientOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.query = check_query_name(query)
        if not str(checkpoint_dir):
            raise ConfigError("a checkpoint directory is required")
        if poll_s < POLL_S_MIN:
            raise ConfigError(f"poll_s must be at least {POLL_S_MIN}")
        self._start = _starter(start)
        self._spark = spark
        self.poll_s = poll_s
        self.topology = topology
        self.keep_batches = keep_batches
        self.warm = warm
        # The state partitions this application runs the query at once it takes it over
        # (None: as the checkpoint has them): a rescale by handover.
        self.partitions = None if partitions is None else check_partitions(partitions)
        self._clock, self._wall = clock, wall_clock
        self.mode = "fs" if str(checkpoint_dir).startswith("sr3:") else "sync"
        self.checkpoint = (
            fs_path_of(str(checkpoint_dir))
            if self.mode == "fs"
            else str(Path(checkpoint_dir).resolve())
        )
        settings = resolve(ring, secret)
        self._ring, self._secret = settings.ring, settings.secret
        self._client_options = client_options
        self._client = SyncClient(settings.ring, settings.secret, options=client_options)
        self.lease = QueryLease(
            self._client, self.query, holder, timeout_s=timeout_s,
            renew_every_s=renew_every_s, drift=drift, clock=clock, wall_clock=wall_clock,
        )  # fmt: skip
        self._puller = (
            Puller(self._client, self.query, Path(self.checkpoint), topology=topology,
                   overwrite=overwrite, clock=clock)
            if self.mode == "sync" else None
        )  # fmt: skip
        self.sync: StateSync | None = None
        self.streaming_query: Any = None
        self.takeover: Takeover | None = None
        self.last_pull: PullReport | None = None
        self._seen_batch: int | None = None  # fs: newest committed batch seen
        self._behind_bytes = 0  # sync: what the pull in progress (or that failed) fetches
        # sr3://: state files read ahead (path, size, mtime), and when the last pass ran.
        self._warmed: set[tuple[str, int, int]] = set()
        self._warmed_at = -1e9
        self._status_version = 0
        self._status_written: tuple[float, int | None] = (-1e9, None)
        self._prepared = False
        self._closing = threading.Event()
        self._lost = threading.Event()
        self.lost_why: str | None = None

    # -- waiting ------------------------------------------------------------------------

    def take_over(self, timeout_s: float | None = None) -> Any:
        """Wait until this application holds the query's lease, keeping up meanwhile;
        then catch up, start the query and return it (a ``StreamingQuery``). The first
        application to call it on a query no one holds starts at once. ``timeout_s``:
        give up waiting after that long (``SR3Error``)."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        self.prepare()
        while True:
            if self._closing.is_set():
                raise SR3Error(f"the standby of query {self.query} was closed")
            try:
                state = self.lease.try_acquire()
            except (QuorumError, DataUnavailable, RecordContention, PeerError) as exc:
                # The ring cannot decide the lease now (peers failing): ask again.
                log.warning("sr3 standby of query %s cannot read the lease: %s", self.query, exc)
                state = LeaseState(None, -1, 0.0)
            if state is None:
                break
            if state.version >= 0:
                self._keep_up(state)
            if deadline is not None and self._clock() >= deadline:
                holder = "no one" if state.lease is None else state.lease.holder
                raise SR3Error(
                    f"query {self.query} is still driven by {holder} after {timeout_s} s"
                )
            self._closing.wait(self.poll_s)
        return self._run_as_holder()

    def prepare(self) -> None:
        """Get ready to take over (``take_over`` does it first; once): the whole
        checkpoint pulled (StateSync) and, unless ``warm=False``, a tiny streaming query
        run to warm Spark up."""
        if self._prepared:
            return
        if self.mode == "fs":
            self._check_fences()
        if self._puller is not None:
            spark = self._session()
            if spark is not None:
                check_session(spark)  # before waiting: a takeover would be refused
            self._pull(None)  # a whole restore first: the rest are increments
        self._warm_spark()
        self._prepared = True

    def _check_fences(self) -> None:
        """Refuse now a session whose sr3:// credential cannot fence the query's logs
        with its lease (``check_credential_fences``), rather than after a takeover."""
        spark = self._session()
        if spark is None:
            return
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        credential = next(
            (str(value) for name in CREDENTIAL_CONFS if (value := hadoop.get(name)) is not None),
            None,
        )
        check_credential_fences(credential, self.query)

    def _warm_spark(self) -> None:
        """Run a tiny streaming query of the same kind (stateful, ``foreachBatch``, the
        session's state store provider) for two batches on a scratch directory, so that
        the real query's first batch after a takeover finds the streaming engine, the
        state store's code (RocksDB's native library), the JIT and the Python callback
        server warm rather than loading them then."""
        spark = self._session()
        if spark is None or not self.warm:
            return
        started = self._clock()
        # Spark's state store maintenance may still write the warm-up query's snapshots
        # while the directory goes: what it left behind stays in the temporary directory
        # (a few KiB) rather than failing the standby over an optimization.
        with tempfile.TemporaryDirectory(
            prefix="sr3-standby-warm-", ignore_cleanup_errors=True
        ) as scratch:
            source = Path(scratch) / "input"
            source.mkdir()
            for index in range(2):
                rows = "".join(
                    f'{{"key": "k{key}", "ts": "2024-01-01T00:0{index}:0{key}"}}\n'
                    for key in range(4)
                )
                (source / f"part-{index}.json").write_text(rows)
            counts = (
                spark.readStream.schema("key STRING, ts TIMESTAMP")
                .option("maxFilesPerTrigger", 1)
                .json(str(source))
                .withWatermark("ts", "30 seconds")
                .dropDuplicates(["key", "ts"])
                .groupBy("key")
                .count()
            )
            query = (
                counts.writeStream.outputMode("update")
                .foreachBatch(_count_rows)
                .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            finished = query.awaitTermination(WARM_S_MAX)
            if not finished:
                query.stop()
        log.info(
            "sr3 standby of query %s warmed Spark's streaming engine in %.2f s",
            self.query, self._clock() - started,
        )  # fmt: skip

    def _session(self) -> Any:
        if self._spark is None:
            try:
                from pyspark.sql import SparkSession
            except ImportError:
                return None
            self._spark = SparkSession.getActiveSession()
        return self._spark

    def _keep_up(self, state: LeaseState) -> None:
        LEASE_UNCHANGED.labels(self.query).set(state.unchanged_s)
        note = None if state.lease is None else state.lease.note
        batch = note.get("batch") if isinstance(note, dict) else None
        active_batch = batch if isinstance(batch, int) and not isinstance(batch, bool) else None
        try:
            if self._puller is not None:
                if active_batch is not None and (
                    self._puller.batch_id is None or active_batch > self._puller.batch_id
                ):
                    self._pull(active_batch)
            elif (
                active_batch is None or self._seen_batch is None or active_batch > self._seen_batch
            ):
                self._follow_commits()
            self._report(active_batch)
        except (QuorumError, DataUnavailable, SR3Error) as exc:
            # The ring is degraded: keep watching the lease; catch up on a later poll.
            log.warning("sr3 standby of query %s could not keep up: %s", self.query, exc)

    def _pull(self, batch_id: int | None) -> None:
        assert self._puller is not None
        manifest = None if batch_id is None else read_manifest(self._client, self.query, batch_id)
        if manifest is None:
            manifest = self._puller.newest()
        if manifest is None:
            return
        behind_batches, behind_bytes = self._puller.behind(manifest)
        self._behind_bytes = behind_bytes  # until the pull lands
        BEHIND_BATCHES.labels(self.query).set(behind_batches)
        BEHIND_BYTES.labels(self.query).set(behind_bytes)
        report = self._puller.pull(manifest)
        self._behind_bytes = 0
        if report is None:
            return
        self.last_pull = report
        PULLED_BYTES.labels(self.query).inc(report.bytes_fetched)
        BEHIND_BATCHES.labels(self.query).set(0)
        BEHIND_BYTES.labels(self.query).set(0)
        log.info(
            "sr3 standby of query %s holds batch %d: fetched %d files, %d of %d bytes in "
            "%.3f s%s", self.query, report.batch_id, report.files_fetched, report.bytes_fetched,
            report.bytes_total, report.seconds, " (whole)" if report.whole else "",
        )  # fmt: skip

    def _follow_commits(self) -> None:
        """sr3://: the newest committed batch, read through the JVM's own client."""
        spark = self._session()
        if spark is None:
            return
        jvm = spark._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"{SCHEME}{self.checkpoint}/commits")
        fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        if not fs.exists(path):
            return
        names = [status.getPath().getName() for status in fs.listStatus(path)]
        batches = [int(name) for name in names if name.isascii() and name.isdigit()]
        if batches:
            self._seen_batch = max(batches)

    def _warm_state(self) -> None:
        """sr3://: read the state files the first batch after a takeover would load
        (``spark_connector.warm``), at most every ``WARM_EVERY_S``."""
        batch = self._seen_batch
        if batch is None or self._clock() - self._warmed_at < WARM_EVERY_S:
            return
        self._warmed_at = self._clock()

        async def warm() -> WarmReport:
            async with FsClient(self._ring, self._secret) as client:
                return await warm_state(client, self.checkpoint, batch + 1, self._warmed)

        report = asyncio.run(warm())
        WARMED_BYTES.labels(self.query).inc(report.bytes_read)
        log.info(
            "sr3 standby of query %s read ahead %d state files, %d bytes, for batch %d%s",
            self.query, report.files, report.bytes_read, batch + 1,
            " (bounded: the rest on the next pass)" if report.truncated else "",
        )  # fmt: skip

    def _report(self, active_batch: int | None) -> None:
        """Write this standby's status record when its batch changed (at most every
        ``STATUS_EVERY_S``) or every ``STATUS_REFRESH_S``."""
        if self._puller is not None:
            batch = self._puller.batch_id
            pull = self.last_pull
            pulled = 0 if pull is None else pull.bytes_fetched
        else:
            batch, pulled = self._seen_batch, 0
        behind = 0 if active_batch is None or batch is None else max(0, active_batch - batch)
        if self._puller is None:
            BEHIND_BATCHES.labels(self.query).set(behind)
        now = self._clock()
        written_at, written_batch = self._status_written
        due = now - written_at >= (STATUS_EVERY_S if batch != written_batch else STATUS_REFRESH_S)
        if not due:
            return
        status = StandbyStatus(
            self.lease.holder, self.mode, batch, behind, self._behind_bytes, pulled, self._wall()
        )
        self._put_status(status.encode())
        self._status_written = (now, batch)

    def _put_status(self, value: bytes) -> None:
        key = standbys_prefix(self.query) + self.lease.holder
        try:
            self._status_version = self._client.put_record(
                key, value, expected_version=self._status_version
            )
        except RecordConflict as exc:  # an earlier run under the same name wrote it
            self._status_version = self._client.put_record(key, value, expected_version=exc.current)

    def _drop_status(self) -> None:
        if self._status_version == 0:
            return
        key = standbys_prefix(self.query) + self.lease.holder
        try:
            self._client.delete_record(key, expected_version=self._status_version)
        except (
            RecordConflict,
            RecordUnknown,
            RecordContention,
            QuorumError,
            DataUnavailable,
        ) as exc:
            log.warning("sr3 standby status %s not deleted: %s", key, exc)
        self._status_version = 0

    # -- holding ------------------------------------------------------------------------

    def _run_as_holder(self) -> Any:
        took_at = self._clock()
        previous, waited = self.lease.taken_from, self.lease.taken_after_s
        catch_up_bytes = 0
        planned = None
        if self._puller is not None:
            before = self.last_pull
            self._pull(None)  # the newest pushed batch: the last push may have landed
            if self.last_pull is not before and self.last_pull is not None:
                catch_up_bytes = self.last_pull.bytes_fetched
            resumed = self._puller.batch_id
            # The batch the old holder planned after it, as it planned it.
            placed = place_plan(self._client, self.query, Path(self.checkpoint), resumed)
            planned = None if placed is None else placed.plan.batch_id
        else:
            self._follow_commits()
            resumed = self._seen_batch
        caught_up = self._clock()
        self._drop_status()
        self.lease.note_source = self._note
        self.lease.start_renewing(self._on_lost)
        if self.mode == "fs":
            self.lease.add_listener(self._tell_jvm)
            self._tell_jvm(self.lease.fence, self.lease.remaining_s())
        rescale_started = self._clock()
        rescaled = self._rescale(resumed, planned)
        rescale_s = self._clock() - rescale_started if rescaled is not None else 0.0
        if self.mode == "sync":
            self.sync = StateSync(
                self._ring, self.query, self.checkpoint, self._secret,
                client_options=self._client_options, keep_batches=self.keep_batches,
                lease=self.lease,
            )  # fmt: skip
            if resumed is not None:
                self.sync.resumed(resumed)
            spark = self._session()
            if spark is not None:
                self.sync.attach(spark)
            if rescaled is not None:
                self.sync.committed(rescaled)  # the rescaled batch goes to the ring first
        self.streaming_query = self._start()
        if self.sync is not None and self.streaming_query is not None:
            self.sync.register(self.streaming_query, self._session())
        started = self._clock()
        self.takeover = Takeover(
            self.lease.fence, previous, resumed, waited, catch_up_bytes,
            caught_up - took_at, started - caught_up, planned, rescaled, rescale_s,
        )  # fmt: skip
        log.warning(
            "sr3 %s took query %s over with fence %d from %s, resuming after batch %s%s "
            "(lease seen unchanged %.2f s; caught up %d bytes in %.2f s; query started in "
            "%.2f s)", self.lease.holder, self.query, self.lease.fence,
            "no one" if previous is None else f"{previous.holder} (fence {previous.fence})",
            resumed, "" if planned is None else f" with batch {planned} as it was planned",
            waited, catch_up_bytes, caught_up - took_at, started - caught_up,
        )  # fmt: skip
        return self.streaming_query

    def _rescale(self, resumed: int | None, planned: int | None) -> int | None:
        """Bring the checkpoint to ``partitions`` before the query starts (a rescale by
        handover), as holder: the batch Spark's runner wrote, or None when there was
        nothing to do. A batch the old holder planned runs first, at the count it was
        planned with: the rescale waits for a later takeover (logged). An ``sr3://``
        checkpoint whose rescale was killed before its commit (Spark refuses to start
        the query from it) has that rescale finished first."""
        spark = self._session()
        if resumed is None or spark is None:
            return None
        if self.mode == "fs":
            checkpoint = f"{SCHEME}{self.checkpoint}"
            unfinished = unfinished_rescale(spark, checkpoint)
            if unfinished is not None:
                log.warning(
                    "sr3 %s finishes the rescale of query %s to %d partitions that did not "
                    "commit", self.lease.holder, self.query, unfinished,
                )  # fmt: skip
                repartition_checkpoint(spark, checkpoint, unfinished)
            _base, current, pending, _count = pending_batches(spark, checkpoint)
        else:
            checkpoint = self.checkpoint
            current, pending = partitions_of(spark, checkpoint, resumed), planned
        target = self.partitions
        if target is None or current == target:
            return None
        if pending is not None:
            log.warning(
                "sr3 %s does not rescale query %s to %d partitions: batch %d was planned at "
                "the old count and runs first; rescale later", self.lease.holder, self.query,
                target, pending,
            )  # fmt: skip
            return None
        started = self._clock()
        rescaled = repartition_checkpoint(spark, checkpoint, target)
        log.warning(
            "sr3 %s rescaled query %s from %s to %d partitions as batch %d in %.2f s",
            self.lease.holder, self.query, current, target, rescaled,
            self._clock() - started,
        )  # fmt: skip
        return rescaled

    def _note(self) -> dict[str, Any] | None:
        """What the lease record says of the active side: its newest batch on the ring
        (pushed, or committed to sr3://)."""
        if self.sync is not None:
            pushed = self.sync.pushed_batch
            return None if pushed is None else {"batch": pushed}
        query = self.streaming_query
        progress = None if query is None else query.lastProgress
        batch = None if not progress else progress.get("batchId")
        return None if not isinstance(batch, int) else {"batch": batch}

    def _tell_jvm(self, fence: int, valid_for_s: float) -> None:
        spark = self._session()
        if spark is None:
            return
        valid_ms = max(0, int(valid_for_s * 1000) - FENCE_MARGIN_MS) if fence else 0
        spark._jvm.sr3.hadoop.Sr3Fence.hold(
            self.checkpoint, self.lease.key, max(fence, 1), valid_ms
        )

    def _on_lost(self, why: str) -> None:
        self.lost_why = why
        self._lost.set()
        note = self._note() or {}
        log.error(
            "sr3 %s lost query %s at batch %s: %s. Stopping the query.", self.lease.holder,
            self.query, note.get("batch", "none"), why,
        )  # fmt: skip
        query = self.streaming_query
        if query is not None:
            try:
                query.stop()
            except Exception:  # py4j or Spark: the query is being torn down regardless
                log.exception("sr3: stopping query %s after losing its lease failed", self.query)

    def wait_lost(self, timeout_s: float | None = None) -> bool:
        """Wait until this application lost the lease (True) or ``timeout_s`` passed."""
        return self._lost.wait(timeout_s)

    def stop_query(self, drain_s: float = DRAIN_S_DEFAULT) -> None:
        """Stop the query this application drives, on purpose: a local checkpoint's
        query first finishes the batch in flight and plans no other (``StateSync.drain``,
        at most ``drain_s``), so that whoever takes over resumes after a committed batch
        (and a standby started at another count can rescale at once)."""
        query = self.streaming_query
        if query is None or self._lost.is_set():
            return
        if self.sync is not None:
            self.sync.drain(drain_s)
        try:
            query.stop()
        except Exception:  # py4j or Spark: the query is being torn down regardless
            log.exception("sr3: stopping query %s failed", self.query)

    def close(self) -> None:
        """Stop waiting or driving: a query this application drives is stopped (after
        the batch in flight: ``stop_query``), its pushes finished, the lease released (a
        standby takes it at once) and the status record dropped."""
        self._closing.set()
        self.stop_query()
        if self.sync is not None:
            if self.lease.valid():
                try:
                    self.sync.flush(timeout_s=30.0)
                except SR3Error as exc:
                    log.warning("sr3: the last batch of %s was not pushed: %s", self.query, exc)
            self.sync.close()
        self.lease.release()
        if self.mode == "fs" and self.streaming_query is not None:
            self._tell_jvm(0, 0.0)
        try:
            self._drop_status()
        except SR3Error as exc:
            log.warning("sr3 standby status of %s not dropped: %s", self.query, exc)
        self._client.close()

    def __enter__(self) -> Standby:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _count_rows(batch: Any, _batch_id: int) -> None:
    batch.count()


def _starter(start: Any) -> Callable[[], Any]:
    """A ``DataStreamWriter`` (its ``start``) or a callable that starts the query."""
    if callable(start):
        return start  # type: ignore[no-any-return]
    method = getattr(start, "start", None)
    if callable(method):
        return method  # type: ignore[no-any-return]
    raise ConfigError("start: a DataStreamWriter, or a function that starts the query")
