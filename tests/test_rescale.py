"""Rescaling a query's state through the ring (spark_connector.rescale), real Spark and
real peers.

What it breaks: a stateful query's state, kept on the ring by StateSync at 2 partitions,
is rescaled on the ring to another count (up and down) while the query is stopped; the
query then restarts from the ring in another directory and reads more input. What must
hold: the restarted query runs at the new count, and its output and final state equal
those of the same query never rescaled; a dry run changes nothing on the ring; a rescale
is refused while a live holder drives the query, while a batch is planned and not
committed, and to the count it has already, each in one line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from ring.blobs import BlobRef
from ring.sync_client import SyncClient
from spark_connector.catalog import query_batches
from spark_connector.checkpoint import read_offsets
from spark_connector.lease import QueryLease
from spark_connector.manifest import ManifestFile, plan_key
from spark_connector.plans import Plan
from spark_connector.rescale import RescaleRefused, rescale
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

pytest_plugins = ("spark_fixtures",)

WAIT_S = 120.0
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def _provider(spark: Any, provider: str) -> None:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")


def _run(
    spark: Any, sync: StateSync | None, input_dir: Path, checkpoint: Path, output: dict[int, Any]
) -> Any:
    """The fixtures' aggregation over every input file present, until done."""
    from spark_fixtures import aggregation

    def collect(batch: Any, batch_id: int) -> None:
        output[batch_id] = sorted(
            (row["window"]["start"].isoformat(), row["key"], row["count"])
            for row in batch.collect()
        )

    writer = (
        aggregation(spark, input_dir)
        .writeStream.outputMode("append")
        .foreachBatch(collect)
        .trigger(availableNow=True)
    )
    if sync is None:
        query = writer.option("checkpointLocation", str(checkpoint)).start()
    else:
        query = sync.start_query(writer, spark)
    query.awaitTermination(WAIT_S)
    assert query.exception() is None, query.exception()
    if sync is not None:
        sync.flush(timeout_s=WAIT_S)
    return query


def _rows(output: dict[int, Any]) -> list[Any]:
    return sorted(row for rows in output.values() for row in rows)


def _state(spark: Any, checkpoint: Path) -> list[str]:
    from sr3.standby_app import state_rows

    return state_rows(spark, str(checkpoint))


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [4, 1])
def test_a_query_rescaled_on_the_ring_restarts_at_the_new_count_with_the_same_results(
    spark: Any, ring: LocalCluster, tmp_path: Path, partitions: int
) -> None:
    from spark_fixtures import write_input

    _provider(spark, ROCKSDB)
    query_name = f"rescale-{partitions}-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    first: dict[int, Any] = {}
    reference: dict[int, Any] = {}
    with StateSync(ring.ring, query_name, tmp_path / "a", ring.secret) as sync:
        _run(spark, sync, input_dir, tmp_path / "a", first)
        before = sync.latest_batch()
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    assert before is not None
    with SyncClient(ring.ring, ring.secret) as client:
        dry = rescale(client, query_name, partitions, spark, dry_run=True)
        assert dry.batch_id is None and query_batches(client, query_name)[-1] == before
        assert (dry.from_partitions, dry.to_partitions) == (2, partitions)
        assert all(len(s.bytes) == partitions for s in dry.spread), dry.spread
        report = rescale(client, query_name, partitions, spark)
    assert report.base_batch == before and report.batch_id == before + 1
    assert report.fence is not None and report.pushed_bytes > 0
    for index in range(4, 7):
        write_input(input_dir, index)
    second: dict[int, Any] = {}
    with StateSync(ring.ring, query_name, tmp_path / "b", ring.secret) as resumer:
        assert resumer.restore() == before + 1
        assert read_offsets(tmp_path / "b", before + 1)[0] == partitions
        _run(spark, resumer, input_dir, tmp_path / "b", second)
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    newest = max(second)
    assert read_offsets(tmp_path / "b", newest)[0] == partitions
    assert _rows(first) + _rows(second) == _rows(reference)
    assert _state(spark, tmp_path / "b") == _state(spark, tmp_path / "reference")


@pytest.mark.slow
def test_a_rescale_is_refused_in_one_line_when_it_must_not_run(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    from spark_fixtures import write_input

    query_name = f"rescale-refused-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    write_input(input_dir, 0)
    _provider(spark, HDFS)
    with StateSync(ring.ring, query_name, tmp_path / "a", ring.secret) as sync:
        _run(spark, sync, input_dir, tmp_path / "a", {})
    with SyncClient(ring.ring, ring.secret) as client:
        # What Spark's runner would get wrong: tests/test_rescale_matrix.py.
        with pytest.raises(RescaleRefused, match="2 state partitions already") as refused:
            rescale(client, query_name, 2, spark)
        assert "\n" not in str(refused.value)
        # A live holder: refused, named.
        holder = QueryLease(client, query_name, "app-live:1", timeout_s=1.0, renew_every_s=0.2)
        assert holder.try_acquire() is None
        lost: list[str] = []
        holder.start_renewing(lost.append)
        try:
            with pytest.raises(RescaleRefused, match="driven by app-live:1"):
                rescale(client, query_name, 4, spark, lease_timeout_s=1.0, renew_every_s=0.2)
        finally:
            holder.release()
        assert not lost
        # A batch planned and not committed (a driver that died in it, or runs it).
        newest = query_batches(client, query_name)[-1]
        blob = BlobRef(0, "0" * 32, ())
        plan = Plan(query_name, newest + 1, "/c", (ManifestFile(f"offsets/{newest + 1}", blob),))
        client.put_record(
            plan_key(query_name, newest + 1), json.dumps(plan.to_json()).encode(),
            expected_version=0,
        )  # fmt: skip
        with pytest.raises(RescaleRefused, match=f"batch {newest + 1} .* was planned"):
            rescale(client, query_name, 4, spark)


@pytest.mark.slow
def test_sr3_spark_rescale_dry_run_then_rescale(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """The command line, as an operator runs it: --dry-run reports the spread and
    changes nothing; without it the ring's newest batch is the rescaled one."""
    import os
    import subprocess
    import sys

    from spark_fixtures import write_input

    _provider(spark, ROCKSDB)
    query_name = f"rescale-cli-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(3):
        write_input(input_dir, index)
    with StateSync(ring.ring, query_name, tmp_path / "a", ring.secret) as sync:
        _run(spark, sync, input_dir, tmp_path / "a", {})
        before = sync.latest_batch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SR3_")}
    env["SR3_CLUSTER_FILE"] = str(ring.cluster_file)

    def sr3(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "sr3", "spark", "rescale", "--query", query_name, *args],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
        return done.stdout

    dry = json.loads(sr3("--partitions", "3", "--dry-run", "--json"))
    assert dry["dry_run"] and dry["batch_id"] is None and dry["to_partitions"] == 3
    assert dry["spread"] and all(len(s["bytes"]) == 3 for s in dry["spread"]), dry
    with SyncClient(ring.ring, ring.secret) as client:
        assert query_batches(client, query_name)[-1] == before
    text = sr3("--partitions", "3")
    assert f"is batch {before + 1} at 3 on the ring" in text, text
    with SyncClient(ring.ring, ring.secret) as client:
        assert query_batches(client, query_name)[-1] == before + 1


@pytest.mark.slow
def test_a_standby_started_at_another_count_takes_a_planned_handover_and_rescales(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """Breaks: nothing; the active application closes (a deploy: its last batch pushed,
    its lease released) and a standby started with ``partitions=4`` takes over. Must
    hold: the standby repartitions its local copy before it starts, the rescaled batch
    is the first it pushes (under its fence), the query runs on at 4 partitions, and
    output and state equal a run never rescaled."""
    from concurrent.futures import ThreadPoolExecutor

    from spark_fixtures import write_input

    from spark_connector.standby import Standby

    _provider(spark, ROCKSDB)
    query_name = f"rescale-handover-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    outputs: dict[str, dict[int, Any]] = {"a": {}, "b": {}}

    def starter(side: str) -> Any:
        from spark_fixtures import aggregation

        def collect(batch: Any, batch_id: int) -> None:
            outputs[side][batch_id] = sorted(
                (row["window"]["start"].isoformat(), row["key"], row["count"])
                for row in batch.collect()
            )

        return (
            aggregation(spark, input_dir)
            .writeStream.outputMode("append")
            .foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{side}"))
            .trigger(processingTime="200 milliseconds")
        )

    options = {"timeout_s": 1.0, "renew_every_s": 0.2, "poll_s": 0.05}
    active = Standby(
        ring.ring, query_name, tmp_path / "ckpt-a", ring.secret, spark=spark, holder="app-a",
        start=starter("a"), **options,
    )  # fmt: skip
    standby = Standby(
        ring.ring, query_name, tmp_path / "ckpt-b", ring.secret, spark=spark, holder="app-b",
        start=starter("b"), partitions=4, **options,
    )  # fmt: skip
    pool = ThreadPoolExecutor(1)
    try:
        query_a = active.take_over(timeout_s=60)
        wait_until_rows(outputs["a"], query_a, 4)
        waiting = pool.submit(standby.take_over, WAIT_S)
        assert active.sync is not None
        active.sync.flush(timeout_s=WAIT_S)
        pushed = active.sync.pushed_batch
        assert pushed is not None
        wait_until(
            lambda: (standby._puller is not None and (standby._puller.batch_id or -1) >= pushed),
            "the standby to pull the newest batch", WAIT_S,
        )  # fmt: skip
        active.close()  # a planned handover: last batch pushed, lease released
        query_b = waiting.result(timeout=WAIT_S)
        takeover = standby.takeover
        assert takeover is not None and takeover.rescaled == takeover.resumed_after + 1
        for index in range(4, 7):
            write_input(input_dir, index)
        wait_until_rows(outputs["b"], query_b, 3)
        assert standby.sync is not None
        standby.sync.flush(timeout_s=WAIT_S)
        latest = standby.sync.latest_batch()
        assert latest is not None and latest > takeover.rescaled
        assert standby.sync.manifest(latest).fence == takeover.fence
        newest = max(
            int(p.name) for p in (tmp_path / "ckpt-b" / "commits").iterdir() if p.name.isdigit()
        )
        assert read_offsets(tmp_path / "ckpt-b", newest)[0] == 4
        query_b.stop()
    finally:
        pool.shutdown(wait=True)
        standby.close()
        active.close()
    reference: dict[int, Any] = {}
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    assert _rows(outputs["a"]) + _rows(outputs["b"]) == _rows(reference)
    assert _state(spark, tmp_path / "ckpt-b") == _state(spark, tmp_path / "reference")


def wait_until_rows(output: dict[int, Any], query: Any, files: int) -> None:
    """``files`` more input files read, and a batch without input since."""
    from support import wait_until

    def done() -> bool:
        progress = query.recentProgress
        read = sum(int(p["numInputRows"]) for p in progress)
        return read >= 6 * files and int(progress[-1]["numInputRows"]) == 0

    wait_until(done, f"{files} files read", WAIT_S)


@pytest.mark.slow
def test_an_sr3_checkpoint_is_rescaled_in_place_on_the_ring(
    spark: Any, ring: LocalCluster, tmp_path: Path
) -> None:
    """An ``sr3://`` checkpoint: Spark's runner reads and writes the partitions on the
    ring, under the query's lease (its offset and commit writes fenced). The query
    restarts at the new count from the same path, with the output and state of a run
    never rescaled; a second rescale to the same count is refused in one line."""

    from ring.auth import scoped_credential
    from spark_connector.jar import JAR_CLASSES

    _provider(spark, ROCKSDB)
    query_name = f"rescale-fs-{time.monotonic_ns() % 10**9}"
    checkpoint = f"sr3:///spark/{query_name}/checkpoint"
    now = int(time.time())
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("fs.sr3.impl", JAR_CLASSES[0])
    hadoop.set("fs.AbstractFileSystem.sr3.impl", JAR_CLASSES[1])
    hadoop.set("fs.sr3.ring", ring.ring)
    hadoop.set(
        "fs.sr3.token",
        scoped_credential(ring.secret, "/spark", expires_at=now + 3600, issued_at=now),
    )
    try:
        _rescale_in_place(spark, ring, tmp_path, query_name, checkpoint)
    finally:
        for name in ("fs.sr3.ring", "fs.sr3.token"):
            hadoop.unset(name)


def _rescale_in_place(
    spark: Any, ring: LocalCluster, tmp_path: Path, query_name: str, checkpoint: str
) -> None:
    from spark_fixtures import write_input

    from spark_connector.rescale import (
        dry_run_fs,
        logged_batches,
        partitions_of,
        rescale_fs,
        unfinished_rescale,
    )

    input_dir = tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    first: dict[int, Any] = {}
    reference: dict[int, Any] = {}
    _run(spark, None, input_dir, Path(checkpoint), first)  # type: ignore[arg-type]
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    before = logged_batches(spark, checkpoint)
    dry = dry_run_fs(ring.ring, ring.secret, query_name, checkpoint, 4, spark, scratch_dir=tmp_path)
    assert dry.dry_run and dry.batch_id is None and dry.restored_bytes > 0
    assert all(len(spread.bytes) == 4 for spread in dry.spread), dry.spread
    assert logged_batches(spark, checkpoint) == before, "the dry run changed the ring"
    with SyncClient(ring.ring, ring.secret) as client:
        report = rescale_fs(client, query_name, checkpoint, 4, spark)
        assert (report.from_partitions, report.to_partitions) == (2, 4)
        assert report.batch_id == report.base_batch + 1 and report.fence == 1
        with pytest.raises(RescaleRefused, match="4 state partitions already"):
            rescale_fs(client, query_name, checkpoint, 4, spark)
        # A rescale killed before Spark's runner committed its batch: Spark refuses to
        # start from it; another count is refused; the same count finishes it.
        assert report.batch_id is not None
        _delete(spark, f"{checkpoint}/commits/{report.batch_id}")
        assert unfinished_rescale(spark, checkpoint) == 4
        with pytest.raises(RescaleRefused, match="unfinished rescale to 4 partitions"):
            rescale_fs(client, query_name, checkpoint, 8, spark)
        again = rescale_fs(client, query_name, checkpoint, 4, spark)
        assert again.batch_id == report.batch_id and unfinished_rescale(spark, checkpoint) is None
    for index in range(4, 7):
        write_input(input_dir, index)
    second: dict[int, Any] = {}
    _run(spark, None, input_dir, Path(checkpoint), second)  # type: ignore[arg-type]
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    offsets, _commits = logged_batches(spark, checkpoint)
    assert partitions_of(spark, checkpoint, max(offsets)) == 4
    assert _rows(first) + _rows(second) == _rows(reference)
    assert _state(spark, Path(checkpoint)) == _state(spark, tmp_path / "reference")  # type: ignore[arg-type]


def _delete(spark: Any, uri: str) -> None:
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    assert path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(path, False)


@pytest.mark.slow
def test_a_rescale_killed_at_any_moment_leaves_a_batch_that_runs_at_one_count(
    spark: Any, ring: LocalCluster, tmp_path: Path, rng: Any
) -> None:
    """Breaks: ``sr3 spark rescale`` (its process group: Python and its JVM) is SIGKILLed
    at a random moment, ``SR3_RESCALE_KILL_ROUNDS`` times (2 here; ``make rescale-kills``
    runs 10). Must hold after each kill: the ring's newest batch restores, runs at the
    old or the new count, and the query finishes the input from it with the output and
    state of a run never rescaled; the next round's rescale takes the lease the killed
    one held once it lapses."""
    import os
    import signal
    import subprocess
    import sys

    from spark_fixtures import write_input

    _provider(spark, ROCKSDB)
    rounds = int(os.environ.get("SR3_RESCALE_KILL_ROUNDS", "2"))
    query_name = f"rescale-kill-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    first: dict[int, Any] = {}
    with StateSync(ring.ring, query_name, tmp_path / "a", ring.secret) as sync:
        _run(spark, sync, input_dir, tmp_path / "a", first)
    reference: dict[int, Any] = {}
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    rest = tmp_path / "rest"
    for index in range(4, 7):
        write_input(rest, index)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SR3_")}
    env["SR3_CLUSTER_FILE"] = str(ring.cluster_file)
    counts = {2: 4, 4: 2}
    seen: list[int] = []
    for round_number in range(rounds):
        current = _newest_partitions(ring, query_name, tmp_path / f"peek-{round_number}")
        log_path = tmp_path / f"rescale-{round_number}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "sr3", "spark", "rescale", "--query", query_name,
                 "--partitions", str(counts[current])],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        time.sleep(rng.uniform(2.0, 25.0))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        after = _newest_partitions(ring, query_name, tmp_path / f"after-{round_number}")
        assert after in (current, counts[current]), after
        seen.append(after)
    # The ring's newest batch (whichever count) finishes the input as the reference does.
    for index in range(4, 7):
        write_input(input_dir, index)
    second: dict[int, Any] = {}
    with StateSync(ring.ring, query_name, tmp_path / "b", ring.secret) as resumer:
        resumer.restore()
        _run(spark, resumer, input_dir, tmp_path / "b", second)
    _run(spark, None, input_dir, tmp_path / "reference", reference)
    assert _rows(first) + _rows(second) == _rows(reference), seen
    assert _state(spark, tmp_path / "b") == _state(spark, tmp_path / "reference"), seen


def _newest_partitions(ring: LocalCluster, query: str, target: Path) -> int:
    """The count the ring's newest batch of ``query`` runs at (restored into ``target``)."""
    with StateSync(ring.ring, query, target, ring.secret) as peek:
        batch = peek.restore()
    assert batch is not None
    partitions = read_offsets(target, batch)[0]
    assert partitions is not None
    return partitions
