"""Plans (spark_connector.plans): a batch's input on the ring before the batch runs.

What it breaks: a driver dies inside batch N (its sink fails after Spark wrote
``offsets/N``), more input arrives, and its machine is lost with the checkpoint; a new
driver restores from the ring elsewhere. What must hold: the new driver runs batch N with
exactly the rows the dead one had (the new input goes to batch N+1); a driver whose plan
the ring refuses (its lease was taken over) never runs that batch and leaves no
``offsets/N`` behind; a plan read from the ring writes only into a checkpoint's logs.
The same with two applications in their own processes, the active one SIGKILLed inside a
batch: tests/test_standby_replan.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from ring.blobs import BlobRef
from ring.errors import ProtocolError
from ring.sync_client import SyncClient
from spark_connector.catalog import delete_plans, forget
from spark_connector.lease import QueryLease, read_lease
from spark_connector.manifest import ManifestFile, plans_prefix
from spark_connector.plans import Plan, check_plan_path, read_plan
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

pytest_plugins = ("spark_fixtures",)

WAIT_S = 120.0
Rows = dict[int, list[tuple[str, str]]]


def write_rows(directory: Path, index: int, count: int) -> None:
    """Input file ``index``: ``count`` distinct rows of minute ``index``."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"key": f"k{index}-{n}", "ts": f"2024-01-01T00:{index:02d}:{n:02d}"} for n in range(count)
    ]
    temporary = directory / f".in-{index}.tmp"
    temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
    temporary.rename(directory / f"in-{index:03d}.json")


def deduplicated(spark: Any, input_dir: Path) -> Any:
    """Every new (key, ts), once: a stateful query whose output is its input rows. No
    ``maxFilesPerTrigger``: a batch takes every file there when it is planned."""
    return (
        spark.readStream.schema("key STRING, ts TIMESTAMP")
        .json(str(input_dir))
        .withWatermark("ts", "10 minutes")
        .dropDuplicates(["key", "ts"])
    )


def writer(spark: Any, input_dir: Path, output: Rows, fail_at: int | None = None) -> Any:
    def collect(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted((row["key"], row["ts"].isoformat()) for row in batch.collect())
        if batch_id == fail_at:
            raise RuntimeError(f"the driver dies inside batch {batch_id}")

    return (
        deduplicated(spark, input_dir)
        .writeStream.outputMode("append")
        .foreachBatch(collect)
        .trigger(processingTime="100 milliseconds")
    )


def _hdfs_provider(spark: Any) -> None:
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    )


@pytest.mark.slow
def test_a_batch_resumed_elsewhere_runs_with_the_dead_driver_s_input(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    _hdfs_provider(spark)
    query_name = f"plans-{time.monotonic_ns() % 10**9}"
    input_dir, first_dir, second_dir = tmp_path / "in", tmp_path / "a", tmp_path / "b"
    first: Rows = {}
    write_rows(input_dir, 0, 3)
    sync = StateSync(ring.ring, query_name, first_dir, ring.secret)
    try:
        query = sync.start_query(writer(spark, input_dir, first, fail_at=1), spark)
        wait_until(lambda: 0 in first, "batch 0", WAIT_S)
        write_rows(input_dir, 1, 5)
        wait_until(lambda: not query.isActive, "the query to die in batch 1", WAIT_S)
        assert query.exception() is not None and 1 in first
        # Batch 1 was planned and began (its sink ran): its offsets are on disk, its
        # commit is not; batch 0 was pushed before batch 1 was planned.
        assert (first_dir / "offsets" / "1").exists()
        assert not (first_dir / "commits" / "1").exists()
        assert sync.pushed_batch == 0
    finally:
        sync.close()
    with SyncClient(ring.ring, ring.secret) as client:
        found = read_plan(client, query_name, 1)
    assert found is not None
    plan = found[0]
    assert plan.batch_id == 1 and plan.fence is None
    assert {file.path for file in plan.files} >= {"offsets/1", "sources/0/1"}
    # More input arrives, then the machine is lost with its checkpoint.
    write_rows(input_dir, 2, 4)
    shutil.rmtree(first_dir)
    second: Rows = {}
    resumer = StateSync(ring.ring, query_name, second_dir, ring.secret)
    try:
        assert resumer.restore() == 0
        assert resumer.last_plan is not None and resumer.last_plan.plan.batch_id == 1
        assert (second_dir / "offsets" / "1").read_bytes() == _plan_file(
            ring, plan, "offsets/1", tmp_path / "plan-offsets"
        )
        query = resumer.start_query(writer(spark, input_dir, second), spark)
        wait_until(lambda: 2 in second, "batch 2 on the new driver", WAIT_S)
        query.stop()
    finally:
        resumer.close()
    assert 0 not in second, "batch 0 committed on the ring: it does not run again"
    assert second[1] == first[1], "batch 1 ran with other input than the dead driver's"
    assert [key for key, _ts in second[2]] == [f"k2-{n}" for n in range(4)]


def _plan_file(ring: LocalCluster, plan: Plan, path: str, scratch: Path) -> bytes:
    file = next(f for f in plan.files if f.path == path)
    with SyncClient(ring.ring, ring.secret) as client:
        client.get_file(file.blob, scratch)
    return scratch.read_bytes()


@pytest.mark.slow
def test_a_driver_whose_plan_is_refused_never_runs_the_batch(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """Breaks: the driver's lease is taken over between two batches (it was cut off).
    Must hold: its next plan is refused by the ring's fence, so Spark never runs that
    batch (the sink is not called) and no ``offsets/N`` appears on its disk."""
    _hdfs_provider(spark)
    query_name = f"plans-fenced-{time.monotonic_ns() % 10**9}"
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    output: Rows = {}
    write_rows(input_dir, 0, 2)
    with SyncClient(ring.ring, ring.secret) as client:
        lease = QueryLease(client, query_name, "app-a", timeout_s=30.0, renew_every_s=5.0)
        assert lease.try_acquire() is None
        sync = StateSync(ring.ring, query_name, checkpoint, ring.secret, lease=lease)
        try:
            query = sync.start_query(writer(spark, input_dir, output), spark)
            wait_until(lambda: 0 in output and sync.pushed_batch == 0, "batch 0 pushed", WAIT_S)
            # Another application takes the lease over (a partition: this one is alive).
            _steal(client, lease)
            write_rows(input_dir, 1, 3)
            wait_until(lambda: not query.isActive, "the query to stop, fenced", WAIT_S)
            error = query.exception()
            assert error is not None and "fenced" in str(error).lower(), error
        finally:
            sync.close()
    committed = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    refused = max(committed) + 1
    assert refused not in output, "a batch ran whose plan the ring refused"
    assert not (checkpoint / "offsets" / str(refused)).exists()


def _steal(client: SyncClient, holder: QueryLease) -> None:
    """Take ``holder``'s lease for another application now (as after it lapsed): the
    record's fence goes up by one."""
    current, version = read_lease(client, holder.query)
    assert current is not None and current.fence == holder.fence
    taken = current.taken_by("app-b", 30.0, time.time())
    client.put_record(holder.key, taken.encode(), expected_version=version)


def test_a_plan_names_only_a_checkpoint_s_log_files() -> None:
    for path in ("offsets/7", "metadata", "sources/0/7", "sources/0/9.compact", "sources/a b/c"):
        assert check_plan_path(path) == path
    for path in (
        "../x", "/etc/passwd", "offsets/../../x", "state/0/0/1.delta", "commits/7",
        "sources/0/.7.crc", "sources/../x", "offsets/7x", "offsets/\u0667", "", "sources",
    ):  # fmt: skip
        with pytest.raises(ProtocolError):
            check_plan_path(path)
    blob = BlobRef(0, "0" * 32, ())
    plan = Plan("q", 7, "/c", (ManifestFile("offsets/7", blob),), fence=3)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    bad = plan.to_json() | {"files": [{"path": "../x", **blob.to_json()}]}
    with pytest.raises(ProtocolError):
        Plan.from_json(bad)
    with pytest.raises(ProtocolError, match="no offsets/7"):
        Plan.from_json(plan.to_json() | {"files": []})
    for batch in (-1, True, "7", 10**18):
        with pytest.raises(ProtocolError):
            Plan.from_json(plan.to_json() | {"batch_id": batch})


def test_forget_deletes_a_query_s_plans(ring: LocalCluster) -> None:
    query_name = f"plans-forget-{time.monotonic_ns() % 10**9}"
    blob = BlobRef(0, "0" * 32, ())
    with SyncClient(ring.ring, ring.secret) as client:
        for batch in (0, 1):
            plan = Plan(query_name, batch, "/c", (ManifestFile(f"offsets/{batch}", blob),))
            client.put_record(
                f"{plans_prefix(query_name)}{batch:012d}",
                json.dumps(plan.to_json()).encode(),
                expected_version=0,
            )
        assert forget(client, query_name, keep=3) == []
        assert len(client.list_records(plans_prefix(query_name))) == 2, "no manifest: kept"
        assert forget(client, query_name, keep=0) == []
        assert client.list_records(plans_prefix(query_name)) == {}
        assert delete_plans(client, query_name) == []


def test_only_ascii_digits_name_a_batch() -> None:
    """Breaks: an sr3:// commit log holding names of digits of another kind (superscript
    two, which ``int()`` refuses; Arabic-Indic five, which it reads as 5). Must hold: the
    batches listed are those named with ASCII digits."""
    from ring.fs_api import Stat
    from spark_connector.fs_checkpoints import _batch_numbers

    names = ("\u00b2", "\u0665", "7", "12", "7.tmp")
    entries = [Stat(f"/spark/q/commits/{name}", "file", 1, 0, 1) for name in names]
    assert _batch_numbers(entries) == [7, 12]


@pytest.mark.slow
def test_a_query_stopped_while_its_plan_waits_for_a_push_stops_cleanly(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """Breaks: the push of batch 0 hangs (a ring that does not answer), so the plan of
    batch 1 waits for it, and the application stops the query meanwhile. Must hold:
    ``stop()`` returns while the push still hangs (the plan gives up its wait), and the
    query ends as stopped, not failed; batch 1 never ran."""
    import threading

    _hdfs_provider(spark)
    query_name = f"plans-stop-{time.monotonic_ns() % 10**9}"
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    output: Rows = {}
    write_rows(input_dir, 0, 2)
    release = threading.Event()
    sync = StateSync(ring.ring, query_name, checkpoint, ring.secret)
    real_push = sync._pusher.push

    def hanging_push(batch_id: int | None = None) -> Any:
        release.wait(WAIT_S)
        return real_push(batch_id)

    sync._pusher.push = hanging_push  # type: ignore[method-assign]
    try:
        query = sync.start_query(writer(spark, input_dir, output), spark)
        wait_until(lambda: 0 in output, "batch 0", WAIT_S)
        write_rows(input_dir, 1, 3)  # batch 1 is planned: its plan waits for batch 0's push
        wait_until(lambda: sync._worker.lag_batches > 0, "the push of batch 0 hanging", WAIT_S)
        stopped = threading.Event()
        stopper = threading.Thread(target=lambda: (query.stop(), stopped.set()))
        stopper.start()
        assert stopped.wait(WAIT_S), "stop() did not return while the plan waited"
        assert not release.is_set()
        assert query.exception() is None, query.exception()
        assert 1 not in output
        stopper.join()
    finally:
        release.set()
        sync.close()


@pytest.mark.slow
def test_a_drained_query_stops_after_its_batch_in_flight_and_plans_no_other(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """Breaks: the application stops its query on purpose (a planned handover) while a
    batch runs, and more input arrives meanwhile. Must hold: ``drain`` waits for the
    batch in flight to commit, the next batch is not planned (no ``offsets/N`` on disk,
    no plan on the ring), and the stop is clean: whoever resumes starts after a
    committed batch, with nothing to run again."""
    import threading

    _hdfs_provider(spark)
    query_name = f"plans-drain-{time.monotonic_ns() % 10**9}"
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    output: Rows = {}
    inside = threading.Event()
    write_rows(input_dir, 0, 2)

    def slow(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted((r["key"], r["ts"].isoformat()) for r in batch.collect())
        if batch_id == 1:
            inside.set()
            time.sleep(3.0)  # the batch in flight while the drain starts

    writer = (
        deduplicated(spark, input_dir)
        .writeStream.outputMode("append")
        .foreachBatch(slow)
        .trigger(processingTime="100 milliseconds")
    )
    with StateSync(ring.ring, query_name, checkpoint, ring.secret) as sync:
        query = sync.start_query(writer, spark)
        wait_until(lambda: 0 in output, "batch 0", WAIT_S)
        write_rows(input_dir, 1, 3)
        assert inside.wait(WAIT_S)
        write_rows(input_dir, 2, 4)  # would be batch 2 (or more) once batch 1 commits
        assert sync.drain(timeout_s=WAIT_S)
        committed = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        query.stop()
        assert query.exception() is None, query.exception()
        planned = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
        assert planned == committed, "a batch was planned after the drain"
        with SyncClient(ring.ring, ring.secret) as client:
            assert read_plan(client, query_name, committed + 1) is None
