"""``StateSync``: one query's checkpoint directory kept on the ring, and given back.

The facade a Spark driver uses; it holds the ring client and composes the parts:

- ``push(batch)`` puts a committed batch's cut on the ring and keeps the newest
  ``keep_batches`` (``spark_connector.push.Pusher``);
- ``register(query)`` pushes off the query's path: a ``StreamingQueryListener`` (its
  progress event comes after ``commits/N`` is written) notes the newest committed batch,
  and one worker thread pushes it (``spark_connector.push.PushWorker``, which also
  measures the lag, and waits in ``flush`` and ``throttle``). Back-pressure is opt-in:
  ``throttle(max_lag_batches)`` called at the start of ``foreachBatch`` holds the query
  back while pushing is more than that many batches behind (a query that must not
  outrun its recovery point);
- ``start_query(writer)`` starts the query with the checkpoint directory and pushes every
  batch it commits; before each batch runs, its plan (the offset log entry and the
  source log files that fix its input) is put on the ring, after the previous batch's
  manifest (``spark_connector.plans``: Spark's checkpoint file manager hands the entry
  over through ``spark_connector.plan_hook``), so that whoever resumes the query runs
  that batch with the same input. ``register(query)`` for a query started by hand;
- ``restore()``, the call to make before every start, brings the checkpoint directory to
  the newest (or a given) batch: it fetches the manifest along a recovery topology into
  an empty directory or over an earlier state of the same query, keeps a directory that
  holds that batch or a newer one, and refuses another run's (``spark_connector.restore``).
  A restore needs no Spark: ``restore_in_background()`` runs it on a thread of its own
  while the application starts its SparkSession, and gives a future to wait on before
  the query starts;
- ``lease``: a query driven by one of several applications (``spark_connector.standby``)
  pushes only while its application holds the query's lease: each manifest is written
  after the lease record is read and still carries this application's fence;
- ``forget``, ``batches`` and ``latest_batch`` read and trim what the ring holds of the
  query (``spark_connector.catalog``).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from recovery.plan import Topology
from ring.client import ClientOptions
from ring.config import resolve
from ring.errors import ConfigError, SR3Error
from ring.sync_client import SyncClient, SyncClientClosed
from spark_connector.catalog import forget, latest_batch, query_batches, ring_queries
from spark_connector.checkpoint import list_checkpoint
from spark_connector.cut import CheckpointError
from spark_connector.lease import QueryLease
from spark_connector.manifest import Manifest, check_query_name
from spark_connector.plan_hook import PlanCancelled, PlanHook, hook_plans, unhook_plans
from spark_connector.plans import PlacedPlan, PlanWriter, place_plan
from spark_connector.push import (
    KEEP_BATCHES_DEFAULT,
    LAG_BATCHES_WARN_DEFAULT,
    RECHECK_S_DEFAULT,
    Pusher,
    PushReport,
    PushWorker,
)
from spark_connector.rescale import RescaleReport, rescale
from spark_connector.restore import (
    RestoreReport,
    newest_manifest,
    read_manifest,
    restore_manifest,
)

# forget, latest_batch and ring_queries live in spark_connector.catalog, PushReport in
# spark_connector.push and RestoreReport in spark_connector.restore; they are re-exported
# here for callers that import them from this module.
__all__ = [
    "KEEP_BATCHES_DEFAULT",
    "PushReport",
    "RestoreReport",
    "StateSync",
    "forget",
    "latest_batch",
    "ring_queries",
]

log = logging.getLogger(__name__)

# How long a batch's plan waits for the previous batch's manifest to reach the ring
# before the batch fails (the query stops rather than run ahead of its recovery point).
PLAN_WAIT_S_DEFAULT = 600.0
PLAN_WAIT_S_MAX = 86_400.0
# How long drain() waits for the batch in flight to commit, and how often it looks.
DRAIN_S_DEFAULT = 120.0
DRAIN_POLL_S = 0.1


def _log_batches(entries: Any, log_name: str) -> list[int]:
    """The batch ids of a checkpoint listing's ``offsets`` or ``commits`` log."""
    ids = []
    for entry in entries:
        folder, _, name = entry.path.partition("/")
        if folder == log_name and name.isascii() and name.isdigit():
            ids.append(int(name))
    return ids


class StateSync:
    def __init__(
        self,
        ring: str | None = None,
        query: str = "",
        checkpoint_dir: str | Path = "",
        secret: str | None = None,
        *,
        client_options: ClientOptions | None = None,
        lag_batches_warn: int = LAG_BATCHES_WARN_DEFAULT,
        keep_batches: int = KEEP_BATCHES_DEFAULT,
        recheck_s: float = RECHECK_S_DEFAULT,
        lease: QueryLease | None = None,
        plan_wait_s: float = PLAN_WAIT_S_DEFAULT,
    ) -> None:
        self.query = check_query_name(query)
        if not 0 < plan_wait_s <= PLAN_WAIT_S_MAX:
            raise ConfigError(f"plan_wait_s is in (0, {PLAN_WAIT_S_MAX:.0f}] seconds")
        self.plan_wait_s = plan_wait_s
        if keep_batches < 1:
            raise ConfigError("keep_batches must be at least 1 (the newest batch is kept)")
        if recheck_s < 0:
            raise ConfigError("recheck_s must be 0 or more")
        if not str(checkpoint_dir):
            raise ConfigError("a checkpoint directory is required")
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        settings = resolve(ring, secret)
        self._client = SyncClient(settings.ring, settings.secret, options=client_options)
        # A query driven under a lease (a standby pair): every manifest is written only
        # after the lease record is read and still carries this application's fence.
        self.lease = lease
        if lease is not None and lease.query != self.query:
            raise ConfigError(f"the lease is of query {lease.query}, not {self.query}")
        self._pusher = Pusher(
            self._client,
            self.query,
            self.checkpoint_dir,
            keep_batches=keep_batches,
            recheck_s=recheck_s,
            guard=None if lease is None else lease.check_fence,
            fence=None if lease is None else (lambda: lease.fence),
        )
        self._planner = PlanWriter(
            self._client,
            self.query,
            self.checkpoint_dir,
            pushed=self._pusher.pushed_files,
            guard=None if lease is None else lease.check_fence,
            fence=None if lease is None else (lambda: lease.fence),
        )
        # The session whose offset log entries of this checkpoint are hooked (attach).
        self._hooked: Any = None
        self._hook: PlanHook | None = None
        # The query whose batches are planned here (start_query, register): a plan
        # waiting for a push gives up once it stops.
        self._query: Any = None
        # Set by drain(): no new batch is planned; a plan asked for waits for the stop.
        self._draining = threading.Event()
        # What the last restore() laid down of the next batch's plan, if anything.
        self.last_plan: PlacedPlan | None = None
        # The worker calls self.push: what a subclass adds to a push holds for its pushes.
        self._worker = PushWorker(
            self.query, self.checkpoint_dir, self.push, lag_batches_warn=lag_batches_warn
        )
        self._listener: Any = None
        self._spark_streams: Any = None
        # What the last restore() did (restored or kept), and the recovery's figures.
        self.last_restore: RestoreReport | None = None
        # restore_in_background(): one thread, made on first use; its restore in flight.
        self._restorer: ThreadPoolExecutor | None = None
        self._restoring: Future[int | None] | None = None
        self._restore_lock = threading.Lock()
        self._closed = False

    @property
    def keep_batches(self) -> int:
        return self._pusher.keep_batches

    @property
    def recheck_s(self) -> float:
        return self._pusher.recheck_s

    @property
    def lag_batches_warn(self) -> int:
        return self._worker.lag_batches_warn

    @property
    def last_error(self) -> str | None:
        """Why the worker's last failed push failed."""
        return self._worker.last_error

    def close(self) -> None:
        """Stop pushing (the batch being pushed is finished first) and close the client
        (once; later calls do nothing). A script that never calls it has its client
        closed at exit all the same (``SyncClient``), the push in flight abandoned. A
        background restore in flight is waited for first (its error stays in its future)."""
        with self._restore_lock:
            restorer, self._restorer = self._restorer, None
            self._closed = True
        if restorer is not None:
            restorer.shutdown(wait=True)
        if self._hooked is not None:
            unhook_plans(self._hooked, str(self.checkpoint_dir))
            self._hooked = None
        self._worker.close()
        if self._listener is not None and self._spark_streams is not None:
            self._spark_streams.removeListener(self._listener)
            self._listener = None
        self._client.close()

    def __enter__(self) -> StateSync:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- pushing on every commit ----------------------------------------------------------

    def start_query(self, writer: Any, spark: Any = None) -> Any:
        """Start ``writer`` (a ``DataStreamWriter``) with this checkpoint directory, every
        batch's plan put on the ring before the batch runs (``attach``) and every batch
        it commits pushed (``register``); the started ``StreamingQuery``."""
        spark = self._spark(spark)
        self.attach(spark)
        query = writer.option("checkpointLocation", str(self.checkpoint_dir)).start()
        self.register(query, spark)
        return query

    def attach(self, spark: Any = None) -> None:
        """Before the query starts: every offset log entry Spark writes in the checkpoint
        directory (the plan of a batch) reaches the ring before the batch runs, after the
        previous batch's manifest. The session needs sr3's jar and checkpoint file manager
        (``spark_connector.local_conf()``; ``ConfigError`` otherwise). Pushing starts."""
        self._check_not_restoring("attach to a session")
        spark = self._spark(spark)
        if self._hooked is spark:
            return
        if self._hook is None:
            self._hook = PlanHook(self._planned)
        hook_plans(spark, str(self.checkpoint_dir), self._hook)
        self._hooked = spark
        if not self._worker.started:
            self.start()

    def register(self, query: Any, spark: Any = None) -> None:
        """Push every batch ``query`` commits from now on (the newest first). ``spark``
        is the query's SparkSession (default: the active one). A query started without
        ``attach`` is attached now: the batches it planned before are not on the ring
        (a restart elsewhere may plan them again), which is logged."""
        from spark_connector.listener import make_listener

        self._check_not_restoring("register a query")
        spark = self._spark(spark)
        if self._hooked is None:
            self.attach(spark)
            log.warning(
                "sr3 query %s started before StateSync.attach(): the batch it runs now may "
                "be planned anew by a restart elsewhere; start it with "
                "StateSync.start_query(writer)", self.query,
            )  # fmt: skip
        elif not self._worker.started:
            self.start()
        self._query = query
        self._spark_streams = spark.streams
        self._listener = make_listener(str(query.id), self.committed)
        self._spark_streams.addListener(self._listener)

    def _refuse_while_draining(self, batch_id: int) -> None:
        """Hold a plan asked for while draining until the query stops, then give it up
        (a stop's interruption, not a failure); bounded by ``plan_wait_s``."""
        deadline = time.monotonic() + self.plan_wait_s
        while time.monotonic() < deadline:
            self._query_stopped()
            time.sleep(DRAIN_POLL_S)
        raise SR3Error(
            f"batch {batch_id} of query {self.query} was not planned: the query is being "
            f"drained and did not stop within {self.plan_wait_s:.0f} s"
        )

    def _query_stopped(self) -> None:
        """``PlanCancelled`` once the query whose plan waits is stopping."""
        query = self._query
        if query is not None and not query.isActive:
            raise PlanCancelled(f"query {self.query} is stopping: its next batch does not run")

    @staticmethod
    def _spark(spark: Any) -> Any:
        if spark is not None:
            return spark
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is None:
            raise ConfigError("no active SparkSession: pass spark=...")
        return active

    def drain(self, timeout_s: float = DRAIN_S_DEFAULT) -> bool:
        """Before stopping the query on purpose (a planned handover, the end of a run):
        plan no new batch, and wait up to ``timeout_s`` until the batch in flight, if
        any, committed; True when none is in flight. A plan Spark asks for from now on
        waits until the query is stopped and is given up, so that the stop leaves no
        batch planned and not committed for whoever resumes the query."""
        self._draining.set()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                entries = list_checkpoint(self.checkpoint_dir)
            except CheckpointError:
                return True
            planned = max(_log_batches(entries, "offsets"), default=-1)
            if planned <= max(_log_batches(entries, "commits"), default=-1):
                return True
            query = self._query
            if query is not None and not query.isActive:
                return False  # stopped already: the batch in flight will not commit now
            if time.monotonic() > deadline:
                log.warning(
                    "sr3: batch %d of query %s did not commit within %.0f s of the drain; "
                    "it stays planned for whoever resumes the query", planned, self.query,
                    timeout_s,
                )  # fmt: skip
                return False
            time.sleep(DRAIN_POLL_S)

    def _planned(self, batch_id: int, offsets: bytes) -> None:
        """Spark is about to run ``batch_id`` with ``offsets`` (on the query's thread):
        the previous batch's manifest on the ring first, then this batch's plan."""
        if self._draining.is_set():
            self._refuse_while_draining(batch_id)
        try:
            if batch_id > 0:
                if not (self.checkpoint_dir / "commits" / str(batch_id - 1)).exists():
                    raise SR3Error(
                        f"batch {batch_id} of query {self.query} is planned before batch "
                        f"{batch_id - 1} committed (asynchronous progress tracking): StateSync "
                        "cannot keep such a query's plans on the ring"
                    )
                self._worker.wait_pushed(batch_id - 1, self.plan_wait_s, self._query_stopped)
            self._planner.write(batch_id, offsets)
        except PlanCancelled:
            raise
        except SR3Error as exc:
            log.error(
                "sr3: batch %d of query %s does not run: its plan is not on the ring: %s",
                batch_id, self.query, exc,
            )  # fmt: skip
            raise

    def start(self) -> None:
        """Start the push worker: from now on every ``committed(batch)`` is pushed."""
        self._check_not_restoring("start pushing")
        self._worker.start()

    def committed(self, batch_id: int) -> None:
        """Note that ``batch_id`` committed (called by the listener, or by hand)."""
        self._worker.committed(batch_id)

    @property
    def lag_batches(self) -> int:
        return self._worker.lag_batches

    @property
    def pushed_batch(self) -> int | None:
        """The newest batch of this query known to be on the ring, or None."""
        return self._worker.pushed_batch

    def resumed(self, batch_id: int) -> None:
        """Note that the checkpoint directory holds ``batch_id`` as the ring does (it
        was brought there by other means than ``restore()``: a standby's pulls)."""
        self._worker.restored(batch_id)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until the newest batch committed in the checkpoint directory is on the
        ring (read from ``commits/``: the listener's event may not have arrived yet)."""
        self._worker.flush(timeout_s)

    def throttle(self, max_lag_batches: int, timeout_s: float = 600.0) -> None:
        """Wait until pushing is at most ``max_lag_batches`` behind the newest committed
        batch (back-pressure: call it at the start of ``foreachBatch``)."""
        self._worker.throttle(max_lag_batches, timeout_s)

    # -- push ---------------------------------------------------------------------------

    def push(self, batch_id: int | None = None) -> PushReport:
        """Put the cut of ``batch_id`` (default: the newest committed) on the ring."""
        return self._pusher.push(batch_id)

    def rescale(self, partitions: int, spark: Any = None, **options: Any) -> RescaleReport:
        """Rescale this query's state on the ring to ``partitions`` state partitions while
        the query is stopped (``spark_connector.rescale.rescale``; ``options`` as there);
        the next ``restore()`` anywhere brings the rescaled batch."""
        return rescale(
            self._client, self.query, partitions, self._spark(spark),
            keep_batches=self.keep_batches, **options,
        )  # fmt: skip

    def forget(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` batches of this query (0: all of them);
        the batch ids deleted."""
        return self._pusher.forget(keep)

    def batches(self) -> list[int]:
        """Batch ids of this query on the ring, oldest first."""
        return query_batches(self._client, self.query)

    # -- restore ------------------------------------------------------------------------

    def latest_batch(self) -> int | None:
        """The newest batch of this query on the ring, or None."""
        return latest_batch(self._client, self.query)

    def manifest(self, batch_id: int) -> Manifest:
        manifest = read_manifest(self._client, self.query, batch_id)
        if manifest is None:
            raise SR3Error(f"query {self.query!r} has no manifest for batch {batch_id}")
        return manifest

    def restore(
        self,
        topology: Topology | str = "auto",
        *,
        batch_id: int | None = None,
        overwrite: bool = False,
    ) -> int | None:
        """Bring the checkpoint directory to the newest (or the given) batch on the ring:
        the one call to make before every start. Restores into an empty or absent
        directory, or over an earlier state of the same query; keeps a directory that
        holds that batch or a newer one; refuses anything else (``ConfigError`` saying
        what ``overwrite=True`` would discard). The batch the directory holds afterwards,
        or None when the ring has no batch of this query (the directory is left as it
        is). ``last_restore`` says what was done."""
        self._check_not_restoring("restore again")
        return self._restore(topology, batch_id, overwrite)

    def restore_in_background(
        self,
        topology: Topology | str = "auto",
        *,
        batch_id: int | None = None,
        overwrite: bool = False,
    ) -> Future[int | None]:
        """``restore()`` on a thread of its own, so that it overlaps what the application
        does meanwhile (starting its SparkSession: a restore needs no Spark). The future's
        ``result()`` is what ``restore()`` returns, or raises what it raises; wait for it
        before the query starts: until it is done, ``register``, ``start`` and another
        restore are refused (``ConfigError``), and ``close`` waits for it."""
        with self._restore_lock:
            if self._closed:
                raise SyncClientClosed(f"StateSync of query {self.query!r} is closed")
            self._check_not_restoring("restore again")
            if self._restorer is None:
                self._restorer = ThreadPoolExecutor(1, thread_name_prefix="sr3-restore")
            future = self._restorer.submit(self._restore, topology, batch_id, overwrite)
            self._restoring = future
        return future

    def _check_not_restoring(self, what: str) -> None:
        restoring = self._restoring
        if restoring is not None and not restoring.done():
            raise ConfigError(
                f"cannot {what} while the background restore of query {self.query!r} runs: "
                "wait for its result() first (the query must start on the restored directory)"
            )

    def _restore(
        self, topology: Topology | str, batch_id: int | None, overwrite: bool
    ) -> int | None:
        if batch_id is None:
            manifest = newest_manifest(self._client, self.query)
        else:
            manifest = self.manifest(batch_id)
        if manifest is None:
            log.info("sr3 ring holds no batch of query %s: nothing restored", self.query)
            self.last_plan = place_plan(self._client, self.query, self.checkpoint_dir, None)
            return None
        report = restore_manifest(
            self._client,
            manifest,
            self.checkpoint_dir,
            topology,
            overwrite=overwrite,
            requested=batch_id is not None,
        )
        self.last_restore = report
        self._worker.restored(report.batch_id, on_ring=manifest.batch_id)
        self.last_plan = place_plan(self._client, self.query, self.checkpoint_dir, report.batch_id)
        return report.batch_id
