"""Pushing a query's committed batches to the ring: one push, and the worker that pushes
off the query's path.

``Pusher.push(batch)`` cuts the checkpoint directory at a committed batch
(``spark_connector.checkpoint``), uploads the files the ring does not hold yet (files of
a checkpoint are written once, so a file seen before with the same size and mtime is not
read again), and writes the manifest after every chunk it names is on its write quorum;
the manifest also records when (wall clock) and from which host it was pushed, and the
Spark query id of the checkpoint. Then it keeps the newest ``keep_batches`` manifests of
the query and deletes older ones (``spark_connector.catalog.forget``); their chunks are
collected by the peers once no remaining manifest references them (``ring.gc``, after
its grace period).

Reusing chunks across pushes is safe while the manifest that last referenced them
lives: once it is deleted (``sr3 spark forget`` from elsewhere), the peers collect its
chunks ``grace_s`` (``--gc-grace``, default 3600 s) after they notice. So a pusher
reuses what it pushed without asking the ring for ``recheck_s`` (default 60 s) after
its last manifest write; past that, it first reads that manifest back, and uploads
everything again if it is gone. ``recheck_s`` must stay well below the peers' grace.

``PushWorker`` is one thread that pushes the newest committed batch it has not pushed
yet (batches that committed while it was busy are covered by the next cut), with a
bounded retry budget. ``lag_batches`` says how far pushing is behind; past
``lag_batches_warn`` it is logged as a warning on every batch, and exported as the
Prometheus gauge ``sr3_connector_lag_batches{query}`` (in the driver's default registry,
with ``sr3_connector_pushed_batch`` and ``sr3_connector_push_failures_total``).
``flush(timeout_s)`` waits until the newest committed batch is on the ring;
``throttle(max_lag_batches)`` holds the caller back while pushing is more than that many
batches behind (back-pressure).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge

from ring.blobs import BlobRef
from ring.client import file_source
from ring.codec import compact_json
from ring.errors import ConfigError, Fenced, RecordConflict, SR3Error
from ring.sync_client import SyncClient, SyncClientClosed
from spark_connector.catalog import delete_manifest, forget, query_batches
from spark_connector.checkpoint import list_checkpoint, read_cut, read_query_id
from spark_connector.cut import CheckpointError, Cut, FileEntry, committed_batches, version_floors
from spark_connector.manifest import Manifest, ManifestFile, manifest_key

__all__ = [
    "KEEP_BATCHES_DEFAULT",
    "LAG_BATCHES_WARN_DEFAULT",
    "RECHECK_S_DEFAULT",
    "PushReport",
    "PushWorker",
    "Pusher",
]

log = logging.getLogger(__name__)

PUSH_ATTEMPTS_MAX = 3
LAG_BATCHES_WARN_DEFAULT = 3
PUSH_RETRY_S_MAX = 30.0
PUSH_FAILURES_MAX = 8
KEEP_BATCHES_DEFAULT = 3
# A pusher reuses the chunks of its last manifest without reading it back for this long
# (well below the peers' GC grace, default 3600 s).
RECHECK_S_DEFAULT = 60.0
# How often a wait for a push asks whether it is still wanted (a plan whose query stops).
CANCEL_CHECK_S = 0.5

LAG_GAUGE = Gauge(
    "sr3_connector_lag_batches", "Committed batches not yet pushed to the ring.", ["query"]
)
PUSHED_GAUGE = Gauge("sr3_connector_pushed_batch", "Newest batch on the ring.", ["query"])
FAILURES = Counter("sr3_connector_push_failures", "Pushes that failed (retried).", ["query"])


@dataclass(frozen=True, slots=True)
class PushReport:
    batch_id: int
    files: int
    bytes_total: int
    bytes_read: int  # bytes of files new since the last push (read and uploaded)
    manifest_version: int


class Pusher:
    """Puts cuts of one checkpoint directory on the ring as manifests of one query,
    uploading only what the ring does not hold yet, and keeps the newest
    ``keep_batches`` of them."""

    def __init__(
        self,
        client: SyncClient,
        query: str,
        checkpoint_dir: Path,
        *,
        keep_batches: int = KEEP_BATCHES_DEFAULT,
        recheck_s: float = RECHECK_S_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        host: str | None = None,
        guard: Callable[[], None] | None = None,
        fence: Callable[[], int] | None = None,
        root: str | None = None,
    ) -> None:
        assert keep_batches >= 1, "the newest batch is always kept"
        assert recheck_s >= 0, "recheck_s is a duration"
        self.query = query
        self.checkpoint_dir = checkpoint_dir
        # The checkpoint path manifests record (restores rewrite metadata naming it):
        # the directory's own, or the query's when this one is a copy (a rescale's).
        self.root = str(checkpoint_dir) if root is None else root
        self.keep_batches = keep_batches
        self.recheck_s = recheck_s
        self._client = client
        self._clock = clock
        # Called right before each manifest write; raises ``Fenced`` when this pusher's
        # application no longer holds the query's lease (``spark_connector.lease``).
        self.guard = guard
        # The lease's fence, stored in each manifest (a reader skips a manifest fenced
        # below an earlier batch's: ``spark_connector.restore.newest_manifest``).
        self.fence = fence
        # Stored in each manifest: when and where it was pushed from.
        self._wall_clock = wall_clock
        self.host = host if host is not None else socket.gethostname()
        # The query id of `metadata` as last read, with that file's (size, mtime_ns).
        self._query_id: tuple[int, int, str | None] | None = None
        # path -> (size, mtime_ns, blob) of files already on the ring
        self._known: dict[str, tuple[int, int, BlobRef]] = {}
        # The manifest that references the chunks of _known, as (batch id, version), and
        # when (monotonic) it was last known to live: written or read back.
        self._referencing: tuple[int, int] | None = None
        self._referenced_at = 0.0
        # RocksDB zips of the last cut and the SST lists read from them (read_cut)
        self._zips: dict[str, tuple[FileEntry, tuple[FileEntry, ...]]] = {}
        # Each store directory's lowest version in the last cut: the next cut reads only
        # the versioned files from there on (``read_cut``), so what a push lists does
        # not grow with the versions Spark retains.
        self._floors: dict[str, int] = {}
        # batch id -> manifest version of the query's batches on the ring (0: unknown);
        # None until the first push lists them.
        self._ring_batches: dict[int, int] | None = None

    def push(self, batch_id: int | None = None) -> PushReport:
        """Put the cut of ``batch_id`` (default: the newest committed) on the ring."""
        for attempt in range(1, PUSH_ATTEMPTS_MAX + 1):
            try:
                return self._push_once(batch_id)
            except FileNotFoundError as exc:
                # Maintenance deleted a file between listing and reading: list again.
                log.info("push attempt %d: %s vanished; listing again", attempt, exc.filename)
        raise SR3Error(f"files kept vanishing while pushing {self.checkpoint_dir}")

    def _cut(self, batch_id: int | None) -> Cut:
        if self._floors:
            try:
                return read_cut(self.checkpoint_dir, batch_id, self._zips, self._floors)
            except CheckpointError as exc:
                # Not expected (a later cut builds on the same base or a newer one):
                # the whole listing decides.
                log.warning("sr3: a cut from the last one's bases failed (%s); listing all", exc)
        return read_cut(self.checkpoint_dir, batch_id, self._zips)

    def _push_once(self, batch_id: int | None) -> PushReport:
        cut = self._cut(batch_id)
        if self._known and not self._still_referenced():
            # The manifest that referenced the files pushed before was deleted (`sr3
            # spark forget`): their chunks may be collected, so they are uploaded again.
            self._known.clear()
        files: dict[str, BlobRef] = {}
        fresh: list[tuple[str, int, int]] = []
        known: dict[str, tuple[int, int, BlobRef]] = {}
        for entry in cut.files:  # as listed: size and modification time
            seen = self._known.get(entry.path)
            if seen is not None and seen[:2] == (entry.size, entry.mtime_ns):
                files[entry.path] = seen[2]
                known[entry.path] = seen
            else:
                fresh.append((entry.path, entry.size, entry.mtime_ns))
        sources = [file_source(self.checkpoint_dir / path) for path, _, _ in fresh]
        for (path, size, mtime_ns), blob in zip(
            fresh, self._client.put_sources(sources), strict=True
        ):
            files[path] = blob
            known[path] = (size, mtime_ns, blob)
        manifest = Manifest(
            self.query, cut.batch_id, cut.state_version, self.root,
            tuple(ManifestFile(path, files[path]) for path in sorted(files)),
            pushed_at=self._wall_clock(), host=self.host, query_id=self._read_query_id(cut.files),
            fence=None if self.fence is None else self.fence(),
        )  # fmt: skip
        if self.guard is not None:
            self.guard()
        writing_at = self._clock()
        version = self._write_manifest(manifest)
        # Remembered only once a manifest references them (chunks no record references
        # are collected after the peers' grace), and only this cut's files: checkpoint
        # files are written once, so no older file can be in the next cut.
        self._known = known
        self._floors = version_floors(cut)
        self._referencing, self._referenced_at = (cut.batch_id, version), writing_at
        try:
            self._retain(cut.batch_id, version)
        except SR3Error as exc:  # the batch is safe; older ones go on the next push
            log.warning("sr3 retention of query %s failed: %s", self.query, exc)
        return PushReport(
            cut.batch_id, len(files), manifest.size, sum(size for _, size, _ in fresh), version
        )

    def pushed_files(self) -> dict[str, tuple[int, int]]:
        """The files of the newest cut this pusher put on the ring, by path, as (size,
        mtime_ns) when it listed them: what the ring holds of the directory now."""
        return {path: (size, mtime_ns) for path, (size, mtime_ns, _blob) in self._known.items()}

    def _read_query_id(self, entries: tuple[FileEntry, ...]) -> str | None:
        """The query id in the cut's ``metadata`` (read again only when it changed)."""
        metadata = next((entry for entry in entries if entry.path == "metadata"), None)
        if metadata is None:
            return None
        if self._query_id is None or self._query_id[:2] != (metadata.size, metadata.mtime_ns):
            query_id = read_query_id(self.checkpoint_dir)
            self._query_id = (metadata.size, metadata.mtime_ns, query_id)
        return self._query_id[2]

    def _still_referenced(self) -> bool:
        """Whether the manifest that references the chunks of ``_known`` still lives
        (read back once ``recheck_s`` has passed since it was last known to)."""
        if self._referencing is None:
            return False
        checked_at = self._clock()
        if checked_at - self._referenced_at < self.recheck_s:
            return True
        batch_id, version = self._referencing
        record = self._client.get_record(manifest_key(self.query, batch_id), include_deleted=True)
        if record is None or record.deleted or record.version != version:
            log.info(
                "sr3 manifest %d of query %s was deleted or replaced: uploading every file "
                "of the next cut again", batch_id, self.query,
            )  # fmt: skip
            self._referencing = None
            return False
        self._referenced_at = checked_at
        return True

    def _retain(self, batch_id: int, version: int) -> None:
        """Delete manifests older than the newest ``keep_batches``. The ring is listed
        once (batches earlier runs pushed); after that this pusher knows what it wrote,
        so a push costs no listing of every peer."""
        if self._ring_batches is None:
            self._ring_batches = dict.fromkeys(query_batches(self._client, self.query), 0)
        self._ring_batches[batch_id] = version
        while len(self._ring_batches) > self.keep_batches:
            oldest = min(self._ring_batches)
            delete_manifest(self._client, self.query, oldest, self._ring_batches[oldest])
            del self._ring_batches[oldest]

    def _write_manifest(self, manifest: Manifest) -> int:
        """Write ``manifest`` (a new batch, or over the same batch pushed before: a retry,
        or after a restore), but never over one pushed with a higher fence: that batch
        was written by a newer holder of the query's lease, or by a rescale, which a
        driver without a lease (fence None, counted as 0) does not replace."""
        key = manifest_key(self.query, manifest.batch_id)
        value = compact_json(manifest.to_json())
        refs = manifest.chunk_ids()
        try:  # a new batch: nothing to read first
            return self._client.put_record(key, value, expected_version=0, refs=refs)
        except RecordConflict:
            pass
        record = self._client.get_record(key, include_deleted=True)
        current = 0 if record is None else record.version
        if record is not None and not record.deleted:
            earlier = Manifest.from_json(json.loads(record.value))
            if (earlier.fence or 0) > (manifest.fence or 0):
                raise Fenced(
                    f"batch {manifest.batch_id} of query {self.query} is on the ring with "
                    f"fence {earlier.fence}, above this pusher's {manifest.fence or 'none'} "
                    f"(written by {earlier.host or 'another driver'}: a newer holder or a "
                    "rescale); this driver must stop"
                )
        return self._client.put_record(key, value, expected_version=current, refs=refs)

    def forget(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` batches of this query (0: all of them, and
        nothing pushed before is reused); the batch ids deleted."""
        self._ring_batches = None
        if keep == 0:
            self._known.clear()
            self._referencing = None
        return forget(self._client, self.query, keep)


class PushWorker:
    """One thread that pushes (with ``push``) the newest batch noted as committed and not
    pushed yet; ``flush`` and ``throttle`` wait for it."""

    def __init__(
        self,
        query: str,
        checkpoint_dir: Path,
        push: Callable[[int], PushReport],
        *,
        lag_batches_warn: int = LAG_BATCHES_WARN_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.query = query
        self.checkpoint_dir = checkpoint_dir
        self.lag_batches_warn = lag_batches_warn
        self.last_error: str | None = None
        self._push = push
        self._clock = clock
        self._changed = threading.Condition()
        self._newest_committed = -1
        self._newest_pushed = -1
        # The newest batch whose pushes failed PUSH_FAILURES_MAX times in a row: not
        # tried again until a newer batch commits or a flush asks for it.
        self._given_up = -1
        # Why the loop ended for good (fenced, the client closed), for waiters.
        self._stopped: SR3Error | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the thread: from now on every ``committed(batch)`` is pushed."""
        if self._thread is not None:
            raise ConfigError("this StateSync is already pushing")
        self._thread = threading.Thread(target=self._loop, name="sr3-push", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop pushing; the batch being pushed is finished first."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def committed(self, batch_id: int) -> None:
        """Note that ``batch_id`` committed."""
        with self._changed:
            self._newest_committed = max(self._newest_committed, batch_id)
            self._changed.notify_all()
        LAG_GAUGE.labels(self.query).set(self.lag_batches)
        if self.lag_batches > self.lag_batches_warn:
            log.warning(
                "sr3 push of query %s is %d batches behind (newest committed %d, pushed %d)",
                self.query, self.lag_batches, self._newest_committed, self._newest_pushed,
            )  # fmt: skip

    def restored(self, batch_id: int, on_ring: int | None = None) -> None:
        """Note that the checkpoint directory holds ``batch_id`` after a restore and the
        ring holds ``on_ring`` (default: the same batch), so that pushing starts from
        there: no false lag, and a newer local batch kept counts as not pushed yet."""
        with self._changed:
            pushed = batch_id if on_ring is None else min(batch_id, on_ring)
            self._newest_pushed = max(self._newest_pushed, pushed)
            self._newest_committed = max(self._newest_committed, batch_id)
            self._changed.notify_all()

    @property
    def lag_batches(self) -> int:
        return max(0, self._newest_committed - self._newest_pushed)

    @property
    def pushed_batch(self) -> int | None:
        """The newest batch pushed (or found on the ring at a restore), or None."""
        return None if self._newest_pushed < 0 else self._newest_pushed

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._changed:
                while not self._closing and self._newest_committed <= max(
                    self._newest_pushed, self._given_up
                ):
                    self._changed.wait()
                if self._closing:
                    return
                wanted = self._newest_committed
            try:
                report = self._push(wanted)
            except Fenced as exc:
                # Another application holds the query now: nothing this one pushes may land.
                self.last_error = str(exc)
                log.error("sr3 push of batch %d refused, pushing stops: %s", wanted, exc)
                self._stop(exc)
                return
            except SR3Error as exc:
                failures += 1
                FAILURES.labels(self.query).inc()
                self.last_error = str(exc)
                log.error("sr3 push of batch %d failed (%d in a row): %s", wanted, failures, exc)
                if failures >= PUSH_FAILURES_MAX:
                    # Bounded retries: wait for the next commit (or a flush), whose cut
                    # may succeed.
                    log.error("sr3 gives up pushing batch %d; waiting for a newer one", wanted)
                    with self._changed:
                        self._given_up = wanted
                        self._changed.notify_all()
                    failures = 0
                    continue
                with self._changed:
                    self._changed.wait(min(PUSH_RETRY_S_MAX, 0.5 * 2**failures))
                continue
            except (CancelledError, SyncClientClosed) as exc:
                # The client was closed under the push: the process exits without close().
                log.warning("sr3 push of batch %d abandoned: %r", wanted, exc)
                self._stop(SR3Error(f"pushing stopped: the client was closed ({exc!r})"))
                return
            failures = 0
            with self._changed:
                self._newest_pushed = max(self._newest_pushed, report.batch_id)
                self._changed.notify_all()
            LAG_GAUGE.labels(self.query).set(self.lag_batches)
            PUSHED_GAUGE.labels(self.query).set(self._newest_pushed)

    def _stop(self, why: SR3Error) -> None:
        """The loop ends for good: waiters are told why instead of timing out."""
        with self._changed:
            self._stopped = why
            self._changed.notify_all()

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until the newest batch committed in the checkpoint directory is on the
        ring (read from ``commits/``: the listener's event may not have arrived yet)."""
        try:
            batches = committed_batches(list_checkpoint(self.checkpoint_dir))
        except CheckpointError:
            batches = []
        if batches:
            self.committed(batches[-1])
        self.throttle(0, timeout_s)

    def throttle(self, max_lag_batches: int, timeout_s: float = 600.0) -> None:
        """Wait until pushing is at most ``max_lag_batches`` behind the newest committed
        batch."""
        self.wait_pushed(self._newest_committed - max_lag_batches, timeout_s)

    def wait_pushed(
        self, batch_id: int, timeout_s: float, cancelled: Callable[[], None] | None = None
    ) -> None:
        """Wait until batch ``batch_id`` (or a newer one) is on the ring, pushing it if
        it committed and is not (a batch given up on is tried again). ``SR3Error`` when
        ``timeout_s`` passed first or when the worker closes; ``Fenced`` at once when
        pushing stopped so. ``cancelled()``, asked every ``CANCEL_CHECK_S``, raises to end
        the wait early (the wait's owner no longer wants it)."""
        deadline = self._clock() + timeout_s
        with self._changed:
            if batch_id > self._newest_pushed:
                self._newest_committed = max(self._newest_committed, batch_id)
                if self._given_up >= batch_id:
                    self._given_up = -1
                self._changed.notify_all()
            while self._newest_pushed < batch_id:
                if self._stopped is not None:
                    raise self._stopped
                if self._closing:
                    raise SR3Error(f"pushing of query {self.query} stopped: closed")
                left = deadline - self._clock()
                if left <= 0 or self._thread is None:
                    raise SR3Error(
                        f"batch {batch_id} of query {self.query} is not on the ring after "
                        f"{timeout_s:.0f} s (pushed: {self._newest_pushed}; last error: "
                        f"{self.last_error})"
                    )
                if cancelled is not None:
                    self._changed.release()  # a py4j call, maybe: not under the lock
                    try:
                        cancelled()
                    finally:
                        self._changed.acquire()
                    left = min(left, CANCEL_CHECK_S)
                self._changed.wait(left)
