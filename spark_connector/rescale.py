"""Rescaling a query's state through the ring: its newest batch again, at another number
of state partitions.

A Spark stateful query keeps the number of state partitions of its first batch for the
life of its checkpoint (``spark.sql.shuffle.partitions`` is pinned in the offset log).
Spark 4.2+ can repartition a stopped query's checkpoint offline
(``StreamingCheckpointManager.repartition``): it writes batch N+1, which reads no input
and holds the state of batch N spread over the new partitions. It needs the checkpoint
where that driver can write, and refuses a checkpoint whose last batch was planned and
never committed.

``rescale`` does it for a query whose state ``StateSync`` keeps on the ring:

1. it takes the query's lease, so that no driver or standby runs the query meanwhile
   (a live holder is refused, naming it; a lapsed one is waited out as a standby would);
2. it restores the newest batch N into a scratch checkpoint and refuses when the ring
   holds the plan of batch N+1 (a driver planned it and did not commit it: starting the
   query runs it; a rescale would give its batch id to other input);
3. Spark's runner writes batch N+1 at the new count in the scratch checkpoint;
4. the batch is pushed as the query's (its manifest records the query's checkpoint
   path, not the scratch one), fenced by the lease: its manifest is the commit point.
   Until it is written the ring's newest batch is N at the old count; after, N+1 at the
   new one. A rescale killed at any moment leaves one of the two; its scratch folder and
   the chunks no manifest names are left for collection;
5. it releases the lease, noting the rescale in it.

The next start of the query anywhere (``StateSync.restore()``) runs at the new count.
``dry_run`` stops after step 3 and reports how the state spreads over the new partitions
(rows per partition from Spark's ``statestore`` reader, bytes per partition from the
files), touching nothing on the ring.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ring.errors import ConfigError, SR3Error
from ring.lease import DRIFT_DEFAULT, RENEW_EVERY_S_DEFAULT, TIMEOUT_S_DEFAULT, lapse_after_s
from ring.sync_client import SyncClient
from spark_connector.checkpoint import read_cut, read_offsets
from spark_connector.cut import parse_offsets
from spark_connector.fs_checkpoints import SCHEME, fs_path_of
from spark_connector.lease import QueryLease
from spark_connector.manifest import Manifest, check_query_name
from spark_connector.plans import read_plan
from spark_connector.push import KEEP_BATCHES_DEFAULT, Pusher
from spark_connector.rescalable import rescale_refusal, run_repartition
from spark_connector.restore import newest_manifest, restore_manifest, rewrite_root

__all__ = [
    "PARTITIONS_MAX",
    "dry_run_fs",
    "OperatorSpread",
    "RescaleRefused",
    "RescaleReport",
    "logged_batches",
    "partitions_of",
    "pending_batches",
    "rescale",
    "rescale_fs",
    "repartition_checkpoint",
    "unfinished_rescale",
]

log = logging.getLogger(__name__)

# Spark takes any positive count; beyond this a state store per partition is absurd.
PARTITIONS_MAX = 100_000
# How often a rescale reads the lease while it waits to see whether its holder lives,
# and how long past the lease's lapse it waits at most (the ring being slow to answer).
LEASE_POLL_S = 0.25
LEASE_WAIT_MARGIN_S = 30.0


class RescaleRefused(ConfigError):
    """A rescale that must not run now, and why (a live holder, a planned batch, the
    count it has already)."""


@dataclass(frozen=True, slots=True)
class OperatorSpread:
    """How one stateful operator's state spreads over the new partitions: rows (Spark's
    ``statestore`` reader; () when it cannot count them) and bytes (the state files of
    the new batch's cut) of each."""

    operator: int
    rows: tuple[int, ...]
    bytes: tuple[int, ...]

    @property
    def skew(self) -> float | None:
        """The fullest partition's rows over the mean (1.0: even), or bytes when the
        rows are not known; None when there is nothing."""
        counts = self.rows or self.bytes
        total = sum(counts)
        return None if total == 0 else max(counts) * len(counts) / total


@dataclass(frozen=True, slots=True)
class RescaleReport:
    """What ``rescale`` did: batch ``base_batch`` at ``from_partitions`` became batch
    ``batch_id`` at ``to_partitions`` (None for a dry run, which pushed nothing), with
    the fence it was written under, the seconds of each step and the bytes moved."""

    query: str
    from_partitions: int
    to_partitions: int
    base_batch: int
    batch_id: int | None
    fence: int | None
    restore_s: float
    repartition_s: float
    push_s: float
    restored_bytes: int
    pushed_bytes: int
    spread: tuple[OperatorSpread, ...] = field(default=())
    dry_run: bool = False

    @property
    def seconds(self) -> float:
        return self.restore_s + self.repartition_s + self.push_s


def check_partitions(partitions: int) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ConfigError("partitions: a whole number")
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise ConfigError(f"partitions: 1 to {PARTITIONS_MAX}, not {partitions}")
    return partitions


def rescale(
    client: SyncClient,
    query: str,
    partitions: int,
    spark: Any,
    *,
    scratch_dir: Path | None = None,
    holder: str | None = None,
    topology: str = "auto",
    keep_batches: int = KEEP_BATCHES_DEFAULT,
    dry_run: bool = False,
    lease_timeout_s: float = TIMEOUT_S_DEFAULT,
    renew_every_s: float = RENEW_EVERY_S_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
) -> RescaleReport:
    """Rescale ``query``'s state on the ring to ``partitions`` (see the module); the
    report. ``spark``: a session to run Spark's runner in (local mode is enough).
    ``scratch_dir``: where the scratch checkpoint goes (default: the system's temporary
    folder), removed afterwards."""
    check_query_name(query)
    check_partitions(partitions)
    lease = QueryLease(
        client, query, holder, timeout_s=lease_timeout_s, renew_every_s=renew_every_s,
        drift=DRIFT_DEFAULT, clock=clock,
    )  # fmt: skip
    if not dry_run:
        _take(lease, clock)
    lost: list[str] = []
    try:
        if not dry_run:
            lease.start_renewing(lost.append)
        with tempfile.TemporaryDirectory(
            prefix=f"sr3-rescale-{query}-", dir=scratch_dir, ignore_cleanup_errors=True
        ) as scratch:
            report = _rescale_in(
                client, query, partitions, spark, Path(scratch) / "checkpoint", lease,
                topology=topology, keep_batches=keep_batches, dry_run=dry_run, clock=clock,
            )  # fmt: skip
        if lost:
            raise SR3Error(f"the rescale of {query} lost the query's lease: {lost[0]}")
    finally:
        if not dry_run:
            lease.release()
    log.info(
        "sr3 %s query %s from %d to %d partitions: batch %d%s in %.2f s (restore %.2f, "
        "repartition %.2f, push %.2f)", "tried rescaling" if dry_run else "rescaled", query,
        report.from_partitions, report.to_partitions, report.base_batch,
        "" if report.batch_id is None else f" -> {report.batch_id}", report.seconds,
        report.restore_s, report.repartition_s, report.push_s,
    )  # fmt: skip
    return report


def _take(lease: QueryLease, clock: Callable[[], float]) -> None:
    """Take the query's lease: at once when no one holds it or it was released; after
    seeing it unchanged for a lapse when its holder is gone; never from a live holder
    (its renewal shows while we wait), who is named."""
    first = lease.observe()
    wait_s = 0.0 if first.lease is None else lapse_after_s(first.lease.timeout_s, lease.drift)
    deadline = clock() + wait_s + LEASE_WAIT_MARGIN_S
    while True:
        state = lease.try_acquire()
        if state is None:
            return
        holder = state.lease
        if holder is not None and state.version != first.version:
            raise RescaleRefused(
                f"query {lease.query} is driven by {holder.holder} (fence {holder.fence}, "
                "renewing its lease): stop it (close() releases the lease) or rescale "
                "through a standby started with partitions=N"
            )
        if clock() > deadline:
            raise SR3Error(f"the lease of query {lease.query} could not be taken: {state}")
        time.sleep(LEASE_POLL_S)


def _rescale_in(
    client: SyncClient,
    query: str,
    partitions: int,
    spark: Any,
    checkpoint: Path,
    lease: QueryLease,
    *,
    topology: str,
    keep_batches: int,
    dry_run: bool,
    clock: Callable[[], float],
) -> RescaleReport:
    manifest = newest_manifest(client, query)
    if manifest is None:
        raise RescaleRefused(f"the ring holds no batch of query {query}: nothing to rescale")
    _refuse_pending_plan(client, manifest)
    started = clock()
    restored = restore_manifest(client, manifest, checkpoint, topology)
    restore_s = clock() - started
    current, _ends = read_offsets(checkpoint, manifest.batch_id)
    if current is None:
        raise RescaleRefused(
            f"batch {manifest.batch_id} of query {query} records no number of partitions "
            "(a stateless query, or offsets Spark did not write): nothing to rescale"
        )
    if current == partitions:
        raise RescaleRefused(f"query {query} has {partitions} state partitions already")
    started = clock()
    batch_id = repartition_checkpoint(spark, checkpoint, partitions)
    repartition_s = clock() - started
    spread = state_spread(spark, checkpoint, batch_id)
    pushed_bytes, push_s, fence = 0, 0.0, None
    if not dry_run:
        # Spark's files name the scratch path (transformWithState's schema files): the
        # batch is the query's, so they name its checkpoint again, as the ring holds it.
        rewrite_root(checkpoint, str(checkpoint), manifest.root)
        pusher = Pusher(
            client, query, checkpoint, keep_batches=keep_batches, guard=lease.check_fence,
            fence=lambda: lease.fence, root=manifest.root,
        )  # fmt: skip
        started = clock()
        pushed = pusher.push(batch_id)
        push_s, pushed_bytes, fence = clock() - started, pushed.bytes_read, lease.fence
    return RescaleReport(
        query, current, partitions, manifest.batch_id, None if dry_run else batch_id, fence,
        restore_s, repartition_s, push_s, restored.bytes_total, pushed_bytes, spread,
        dry_run=dry_run,
    )  # fmt: skip


def _refuse_pending_plan(client: SyncClient, manifest: Manifest) -> None:
    """A plan of the batch after the newest manifest: a driver planned it and did not
    commit it (or still runs it). Spark's runner would give that batch id to the rescale
    and the planned input to the next one: refused."""
    found = read_plan(client, manifest.query, manifest.batch_id + 1)
    if found is None:
        return
    plan, _version = found
    raise RescaleRefused(
        f"batch {plan.batch_id} of query {manifest.query} was planned (on "
        f"{plan.host or 'an unknown host'}, fence {plan.fence}) and is not on the ring as "
        "committed: start the query to finish it (or stop the driver still running it), "
        "then rescale"
    )


def repartition_checkpoint(spark: Any, checkpoint: Path | str, partitions: int) -> int:
    """Run Spark's offline repartition on the stopped query's ``checkpoint`` (a local
    directory, or an ``sr3://`` path the session reaches); the batch it wrote. Spark's
    refusals (an unsupported provider or operator, a last batch that did not commit)
    come back as ``RescaleRefused`` in one line."""
    before = _newest_committed(spark, checkpoint)
    # What Spark's runner is not known to rescale right is refused before it writes
    # anything (it writes the batch's offsets before some of its own refusals).
    why = None if before is None else rescale_refusal(spark, checkpoint, before)
    if why is not None:
        raise RescaleRefused(why)
    try:  # Spark's runner, or sr3's for the HDFS-backed provider
        run_repartition(spark, checkpoint, partitions, before)
    except Exception as exc:  # py4j and PySpark's translations of Spark's errors
        raise RescaleRefused(f"Spark's repartition refused: {_first_line(exc)}") from exc
    after = _newest_committed(spark, checkpoint)
    if after is None or (before is not None and after != before + 1):
        raise SR3Error(f"{checkpoint}: Spark's repartition committed batch {after}, not next")
    return after


def _newest_committed(spark: Any, checkpoint: Path | str) -> int | None:
    """The newest batch with both its offsets and its commit."""
    offsets, commits = logged_batches(spark, checkpoint)
    both = offsets & commits
    return max(both) if both else None


def logged_batches(spark: Any, checkpoint: Path | str) -> tuple[set[int], set[int]]:
    """The batch ids of the checkpoint's offset and commit logs, read through the
    session's Hadoop file system (so an ``sr3://`` checkpoint too)."""
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(str(checkpoint))
    fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
    found: list[set[int]] = []
    for log_name in ("offsets", "commits"):
        path = jvm.org.apache.hadoop.fs.Path(root, log_name)
        names = [s.getPath().getName() for s in fs.listStatus(path)] if fs.exists(path) else []
        found.append({int(n) for n in map(str, names) if n.isascii() and n.isdigit()})
    return found[0], found[1]


def partitions_of(spark: Any, checkpoint: Path | str, batch_id: int) -> int | None:
    """The state partitions ``offsets/<batch_id>`` records, read through Hadoop."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/offsets/{batch_id}")
    stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)
    try:
        head = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    partitions, _ends = parse_offsets(batch_id, bytes(head).decode("utf-8"))
    return partitions


def rescale_fs(
    client: SyncClient,
    query: str,
    checkpoint: str,
    partitions: int,
    spark: Any,
    *,
    holder: str | None = None,
    lease_timeout_s: float = TIMEOUT_S_DEFAULT,
    renew_every_s: float = RENEW_EVERY_S_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
) -> RescaleReport:
    """Rescale an ``sr3://`` checkpoint in place (``spark`` reaches it: ``spark_conf``):
    the query's lease taken as ``rescale`` does, its offset and commit writes fenced
    (the JVM's ``Sr3Fence``), and Spark's runner run on the ring, whose executors read
    and write the partitions there. Spark's commit of the rescaled batch is the commit
    point; a rescale killed before it leaves a batch Spark refuses to start from until
    a rescale to the same count finishes it, which the next ``rescale_fs`` (or a
    standby taking over, ``Standby(partitions=...)``) does."""
    check_query_name(query)
    check_partitions(partitions)
    path = fs_path_of(checkpoint)
    uri = f"{SCHEME}{path}"
    lease = QueryLease(
        client, query, holder, timeout_s=lease_timeout_s, renew_every_s=renew_every_s,
        drift=DRIFT_DEFAULT, clock=clock,
    )  # fmt: skip
    _take(lease, clock)
    fence = spark._jvm.sr3.hadoop.Sr3Fence

    def hold(current: int, valid_for_s: float) -> None:
        fence.hold(path, lease.key, max(current, 1), max(0, int(valid_for_s * 1000) - 50))

    lost: list[str] = []
    lease.add_listener(hold)
    hold(lease.fence, lease.remaining_s())
    lease.start_renewing(lost.append)
    try:
        base, current, unfinished = _fs_state(spark, uri)
        if unfinished is not None and unfinished != partitions:
            raise RescaleRefused(
                f"{uri} holds an unfinished rescale to {unfinished} partitions: finish it "
                f"first (sr3 spark rescale --partitions {unfinished}), then rescale again"
            )
        if current == partitions and unfinished is None:
            raise RescaleRefused(f"query {query} has {partitions} state partitions already")
        started = clock()
        batch_id = repartition_checkpoint(spark, uri, partitions)
        repartition_s = clock() - started
        if lost:
            raise SR3Error(f"the rescale of {query} lost the query's lease: {lost[0]}")
        spread = tuple(
            OperatorSpread(
                operator, _rows_by_partition(spark, uri, batch_id, operator, partitions), ()
            )
            for operator in _operators(spark, uri)
        )
    finally:
        lease.release()
        fence.drop(path)
    report = RescaleReport(
        query, current or 0, partitions, base, batch_id, lease.fence, 0.0, repartition_s, 0.0,
        0, 0, spread,
    )  # fmt: skip
    log.info(
        "sr3 rescaled %s (query %s) from %s to %d partitions: batch %d -> %d in %.2f s",
        uri, query, current, partitions, base, batch_id, repartition_s,
    )  # fmt: skip
    return report


def dry_run_fs(
    ring: str,
    secret: str,
    query: str,
    checkpoint: str,
    partitions: int,
    spark: Any,
    *,
    scratch_dir: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RescaleReport:
    """``rescale_fs``'s dry run: the ``sr3://`` checkpoint copied into a scratch folder
    (every file Spark keeps there), repartitioned there, the spread reported; nothing on
    the ring changes."""
    import asyncio

    from spark_connector.fs_checkpoints import copy_to_local
    from spark_connector.fs_client import FsClient

    check_query_name(query)
    check_partitions(partitions)

    async def copy(target: Path) -> int:
        async with FsClient(ring, secret) as fs:
            _files, size = await copy_to_local(fs, checkpoint, target)
        return size

    with tempfile.TemporaryDirectory(
        prefix=f"sr3-rescale-{query}-", dir=scratch_dir, ignore_cleanup_errors=True
    ) as scratch:
        local = Path(scratch) / "checkpoint"
        started = clock()
        copied = asyncio.run(copy(local))
        restore_s = clock() - started
        base, current, unfinished = _fs_state(spark, str(local))
        if unfinished is None and current == partitions:
            raise RescaleRefused(f"query {query} has {partitions} state partitions already")
        started = clock()
        batch_id = repartition_checkpoint(spark, local, partitions)
        repartition_s = clock() - started
        spread = state_spread(spark, local, batch_id)
    return RescaleReport(
        query, current or 0, partitions, base, None, None, restore_s, repartition_s, 0.0,
        copied, 0, spread, dry_run=True,
    )  # fmt: skip


def _fs_state(spark: Any, checkpoint: str) -> tuple[int, int | None, int | None]:
    """The newest committed batch, its partitions, and the count of an unfinished
    rescale after it (Spark's runner wrote its offsets, not its commit), or None. A batch
    planned at the same count and not committed is refused."""
    base, current, planned, count = pending_batches(spark, checkpoint)
    if planned is not None and count == current:
        raise RescaleRefused(
            f"batch {planned} of {checkpoint} was planned and is not committed: start the "
            "query to finish it (or stop the driver still running it), then rescale"
        )
    return base, current, count


def unfinished_rescale(spark: Any, checkpoint: Path | str) -> int | None:
    """The count an unfinished rescale of ``checkpoint`` was taking it to (Spark's runner
    wrote the batch's offsets at another count than the batch before, and no commit):
    Spark refuses to start the query from it until a rescale to that count finishes."""
    _base, current, planned, count = pending_batches(spark, checkpoint)
    return count if planned is not None and count != current else None


def pending_batches(
    spark: Any, checkpoint: Path | str
) -> tuple[int, int | None, int | None, int | None]:
    """The newest committed batch and its partitions; the first batch planned after it
    (None: none) and its partitions."""
    offsets, commits = logged_batches(spark, checkpoint)
    committed = offsets & commits
    if not committed:
        raise RescaleRefused(f"{checkpoint} holds no committed batch: nothing to rescale")
    base = max(committed)
    current = partitions_of(spark, checkpoint, base)
    pending = sorted(batch for batch in offsets if batch > base)
    if not pending:
        return base, current, None, None
    return base, current, pending[0], partitions_of(spark, checkpoint, pending[0])


def _operators(spark: Any, checkpoint: str) -> list[int]:
    """The stateful operators of the checkpoint (Spark's ``state-metadata`` source)."""
    try:
        rows = spark.read.format("state-metadata").load(checkpoint).collect()
    except Exception as exc:  # PySpark's translations of the reader's refusals
        log.info("sr3: the operators of %s are not listed: %s", checkpoint, _first_line(exc))
        return []
    return sorted({int(row["operatorId"]) for row in rows})


def _first_line(exc: BaseException) -> str:
    # py4j's own first line names only the JVM call; Spark's reason is the Java error's.
    java = getattr(exc, "java_exception", None)
    text = str(exc if java is None else java).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def state_spread(spark: Any, checkpoint: Path, batch_id: int) -> tuple[OperatorSpread, ...]:
    """Rows and bytes per state partition of each stateful operator at ``batch_id``."""
    cut = read_cut(checkpoint, batch_id)
    partitions, _ends = read_offsets(checkpoint, batch_id)
    count = partitions or 1
    bytes_by: dict[int, list[int]] = {}
    for entry in cut.files:
        parts = entry.path.split("/")
        if len(parts) >= 4 and parts[0] == "state" and parts[2].isascii() and parts[2].isdigit():
            operator, partition = int(parts[1]), int(parts[2])
            if partition < count:
                bytes_by.setdefault(operator, [0] * count)[partition] += entry.size
    return tuple(
        OperatorSpread(
            operator,
            _rows_by_partition(spark, checkpoint, batch_id, operator, count),
            tuple(bytes_by[operator]),
        )
        for operator in sorted(bytes_by)
    )


def _rows_by_partition(
    spark: Any, checkpoint: Path | str, batch_id: int, operator: int, count: int
) -> tuple[int, ...]:
    """Rows per partition from Spark's ``statestore`` reader; () when the reader needs
    more than an operator to read its state (a join's side, a named state variable)."""
    rows = [0] * count
    try:
        frame = (
            spark.read.format("statestore")
            .option("batchId", batch_id)
            .option("operatorId", operator)
            .load(str(checkpoint))
        )
        counted = frame.groupBy("partition_id").count().collect()
    except Exception as exc:  # PySpark's translations of the reader's refusals
        log.info("sr3: the rows of operator %d are not counted: %s", operator, _first_line(exc))
        return ()
    for row in counted:
        partition = int(row["partition_id"])
        if 0 <= partition < count:
            rows[partition] = int(row["count"])
    return tuple(rows)
