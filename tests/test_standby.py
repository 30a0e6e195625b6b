"""Hot standby (spark_connector.standby) with real Spark and a real ring, in one process.

What it breaks: the active application stops renewing its lease and its query stops
mid-stream (as a killed driver's would), with a standby application beside it; later
the old active comes back and tries to renew and push. What must hold: the standby
takes over with the next fence only after the lease lapsed, resumes from the batch it
pulled, and the rows and state at the end equal an uninterrupted run's; the old active
is told it lost the lease, and its renewals and pushes are refused (nothing it pushes
lands on the ring). Killed applications in their own processes, partitions and the
``sr3://`` path are in test_standby_drill.py and test_standby_partition.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from ring.auth import scoped_credential
from ring.errors import ConfigError, Fenced
from ring.sync_client import SyncClient
from spark_connector.lease import read_lease
from spark_connector.standby import CREDENTIAL_CONFS, Standby, StandbyStatus, standbys_prefix
from sr3.local import LocalCluster

pytest_plugins = ("spark_fixtures",)

LEASE_S = 1.0
RENEW_S = 0.2
WAIT_S = 120.0

Rows = dict[int, list[tuple[str, str, int]]]


def starter(spark: Any, input_dir: Path, checkpoint: Path, output: Rows) -> Callable[[], Any]:
    """Start the fixtures' aggregation on ``checkpoint``, collecting rows by batch id."""
    from spark_fixtures import aggregation

    def collect(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted(
            (row["window"]["start"].isoformat(), row["key"], row["count"])
            for row in batch.collect()
        )

    def start() -> Any:
        return (
            aggregation(spark, input_dir)
            .writeStream.outputMode("append")
            .foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    return start


def newest_batch(query: Any) -> int:
    progress = query.lastProgress
    return -1 if not progress else int(progress["batchId"])


def processed_all(query: Any, files: int) -> bool:
    """All ``files`` input files read (one per batch), and a batch without input since
    (the one that emits the windows the last file's watermark closed)."""
    progress = query.recentProgress
    read = sum(int(p["numInputRows"]) for p in progress)
    return read >= 6 * files and int(progress[-1]["numInputRows"]) == 0


def test_a_standby_takes_over_resumes_exactly_and_the_old_holder_is_fenced(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    from spark_fixtures import write_input

    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    )
    input_dir = tmp_path / "input"
    query_name = f"standby-{time.monotonic_ns() % 10**9}"
    for index in range(6):
        write_input(input_dir, index)
    out_a: Rows = {}
    out_b: Rows = {}
    active, standby = (
        Standby(
            ring.ring,
            query_name,
            tmp_path / f"ckpt-{side}",
            ring.secret,
            spark=spark,
            holder=f"app-{side}",
            start=starter(spark, input_dir, tmp_path / f"ckpt-{side}", out),
            timeout_s=LEASE_S,
            renew_every_s=RENEW_S,
            poll_s=0.05,
        )
        for side, out in (("a", out_a), ("b", out_b))
    )
    waiting: Future[Any] | None = None
    pool = ThreadPoolExecutor(1)
    try:
        query_a = active.take_over(timeout_s=60)
        assert active.lease.fence == 1 and active.takeover is not None
        wait_until(lambda: processed_all(query_a, 6), "the active side to read six files", WAIT_S)
        assert active.sync is not None
        active.sync.flush(timeout_s=60)
        waiting = pool.submit(standby.take_over, WAIT_S)
        # The standby keeps up: it holds the active side's newest pushed batch.
        pushed = active.sync.pushed_batch
        wait_until(
            lambda: standby._puller is not None and standby._puller.batch_id == pushed,
            "the standby to pull the newest batch",
            WAIT_S,
        )
        status_key = standbys_prefix(query_name) + "app-b"
        wait_until(
            lambda: _standing_by_at(standby, status_key, pushed), "the standby's status", WAIT_S
        )
        # The active application freezes: no renewal, its query gone (a killed driver).
        crashed_at = time.monotonic()
        active.lease.stop_renewing()
        assert active.sync is not None
        spark.streams.removeListener(active.sync._listener)  # B's run shares its query id
        query_a.stop()
        resumed_after = newest_batch(query_a)
        query_b = waiting.result(timeout=WAIT_S)
        took_s = time.monotonic() - crashed_at
        takeover = standby.takeover
        assert takeover is not None and takeover.fence == 2
        assert takeover.previous is not None and takeover.previous.holder == "app-a"
        assert took_s >= LEASE_S * (1 - 0.05), "taken before the lease could have lapsed"
        assert takeover.resumed_after == resumed_after, "not resumed from the newest push"
        assert _status(standby, status_key) is None, "a holder still listed as standby"
        for index in range(6, 10):
            write_input(input_dir, index)
        wait_until(lambda: processed_all(query_b, 4), "the standby to read the new files", WAIT_S)
        assert standby.sync is not None
        standby.sync.flush(timeout_s=60)
        _check_old_holder_fenced(active, standby, tmp_path / "ckpt-b")
        query_b.stop()
        _check_against_reference(spark, tmp_path, input_dir, {**out_a, **out_b})
    finally:
        if waiting is not None and not waiting.done():
            standby.close()
        pool.shutdown(wait=True)
        standby.close()
        active.close()


def _check_old_holder_fenced(active: Standby, standby: Standby, checkpoint_b: Path) -> None:
    """The old active comes back: its renewal and its pushes are refused, and the
    ring's newest batch is the new holder's."""
    assert active.sync is not None and standby.sync is not None
    with pytest.raises(Fenced, match="app-b with fence 2"):
        active.lease.renew()
    with pytest.raises(Fenced):
        active.sync.push()
    lease, _version = read_lease(standby._client, standby.query)
    assert lease is not None and (lease.holder, lease.fence) == ("app-b", 2)
    newest = standby.sync.latest_batch()
    assert newest is not None
    assert standby.sync.manifest(newest).root == str(checkpoint_b.resolve())


def latest_commit(checkpoint: Path) -> int:
    return max(int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit())


def _standing_by_at(standby: Standby, key: str, batch: int | None) -> bool:
    status = _status(standby, key)
    return status is not None and (status.holder, status.mode, status.batch) == (
        "app-b",
        "sync",
        batch,
    )


def _status(standby: Standby, key: str) -> StandbyStatus | None:
    record = standby._client.get_record(key)
    return None if record is None else StandbyStatus.decode(record.value)


def _check_against_reference(spark: Any, tmp_path: Path, input_dir: Path, rows: Rows) -> None:
    from spark_fixtures import run_query, state_rows

    reference = run_query(spark, input_dir, tmp_path / "reference", "hdfs")
    emitted = sorted(row for batch in rows.values() for row in batch)
    assert emitted == sorted(row for batch in reference.values() for row in batch)
    for operator in (0, 1):
        final_b = state_rows(
            spark, tmp_path / "ckpt-b", latest_commit(tmp_path / "ckpt-b"), operator
        )
        final_reference = state_rows(
            spark, tmp_path / "reference", latest_commit(tmp_path / "reference"), operator
        )
        assert final_b == final_reference, f"operator {operator}'s state differs"


def test_a_standby_waits_while_the_holder_renews(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """No takeover while the lease is renewed, however long the standby waits."""
    query_name = f"standby-held-{time.monotonic_ns() % 10**9}"
    started = threading.Event()

    def start() -> Any:
        started.set()
        raise AssertionError("the standby started the query")

    options = {"timeout_s": LEASE_S, "renew_every_s": RENEW_S, "poll_s": 0.05}
    holder = Standby(
        ring.ring, query_name, tmp_path / "a", ring.secret, spark=spark, holder="app-a",
        start=lambda: None, **options,
    )  # fmt: skip
    waiter = Standby(
        ring.ring, query_name, tmp_path / "b", ring.secret, spark=spark, holder="app-b",
        start=start, **options,
    )  # fmt: skip
    try:
        holder.take_over(timeout_s=30)
        with pytest.raises(Exception, match="still driven by app-a"):
            waiter.take_over(timeout_s=LEASE_S * 4)
        assert not started.is_set() and holder.lease.valid()
        # Released on close: the waiter takes it at once, without waiting for a lapse.
        holder.close()
        waiter._start = lambda: None
        began = time.monotonic()
        waiter.take_over(timeout_s=30)
        assert waiter.lease.fence == 2 and time.monotonic() - began < LEASE_S * 4
    finally:
        waiter.close()
        holder.close()


def test_an_sr3_standby_whose_credential_cannot_fence_its_logs_is_refused_at_once(
    spark: Any, ring: LocalCluster
) -> None:
    """Breaks: an sr3:// standby whose session's credential is scoped to /spark/sessions,
    which does not reach the query's lease spark/<query>/lease (the peers would refuse
    its fenced offset and commit writes with 403 after the takeover). Must hold:
    ``take_over`` refuses with a ``ConfigError`` before it takes the lease, naming the
    lease and a prefix that reaches it; the same standby with a /spark credential gets
    past the check."""
    query_name = f"standby-scope-{time.monotonic_ns() % 10**9}"
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    now = int(time.time())

    def credential(prefix: str) -> str:
        return scoped_credential(ring.secret, prefix, expires_at=now + 600, issued_at=now)

    standby = Standby(
        ring.ring, query_name, f"sr3:///spark/sessions/{query_name}", ring.secret,
        spark=spark, holder="app-a", start=lambda: None, warm=False,
    )  # fmt: skip
    try:
        # The name spark_conf() gives (Spark redacts it), then the former one.
        for name in CREDENTIAL_CONFS:
            hadoop.set(name, credential("/spark/sessions"))
            with pytest.raises(ConfigError, match=f"spark/{query_name}/lease") as refused:
                standby.take_over(timeout_s=30)
            assert f"/spark/{query_name}" in str(refused.value)
            hadoop.unset(name)
        with SyncClient(ring.ring, ring.secret) as client:
            assert read_lease(client, query_name) == (None, 0)
        hadoop.set(CREDENTIAL_CONFS[0], credential("/spark"))
        standby.prepare()
    finally:
        for name in CREDENTIAL_CONFS:
            hadoop.unset(name)
        standby.close()
