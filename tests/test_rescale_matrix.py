"""Every stateful operator Spark runs, rescaled through the ring (spark_connector.rescale
and spark_connector.rescalable), real Spark and real peers.

What it breaks: a query of one stateful operator (tests/rescale_queries.py), its state
kept on the ring by StateSync at one count of state partitions, is rescaled on the ring
to another count, up and down, with each state store provider; the query restarts from
the ring in another directory and reads more input, its new batches pushed; the newest
of them is restored in a third directory. What must hold: where the operator, provider
and layout are in the table of what can be rescaled, the restarted query runs at the new
count, its output equals a run never rescaled (a multiset of rows) and the restored
state equals that run's row for row, partition by partition (it ran at the new count
from its first batch, so each key must sit where the rescale put it) — every column
family of a RocksDB store included; everywhere else the rescale is refused in one line
naming what and why, before anything is written, and the ring's newest batch is the one
it was.

The whole matrix takes the better part of an hour on two cores: it is marked
``rescale_matrix`` (``make test-rescale``); a representative few run with ``make test``.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rescale_queries import QUERIES, StatefulQuery, placement, run, state, write_input

from ring.sync_client import SyncClient
from spark_connector.catalog import query_batches
from spark_connector.checkpoint import read_offsets
from spark_connector.rescale import RescaleRefused, logged_batches, repartition_checkpoint, rescale
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

pytest_plugins = ("spark_fixtures",)

WAIT_S = 120.0
UP, DOWN = (2, 4), (4, 2)
PROVIDER_NAMES = ("hdfs", "rocksdb", "rocksdb-changelog")
# The operators every provider runs, and those Spark runs on RocksDB only.
SUPPORTED_QUERIES = (
    "aggregation",
    "aggregation-watermark",
    "dedup",
    "dedup-watermark",
    "dedup-within-watermark",
    "session-window",
    "apply-in-pandas-with-state",
    "transform-with-state-in-pandas",
    "transform-with-state",
    "transform-with-state-ttl",
    "join-inner",
    "join-left-outer",
    "join-full-outer",
    "join-inner-state-v3",
    "transform-with-state-avro",
    "aggregation-row-checksum",
)
# (query, provider, through the ring): what the refusal must name. StateSync cannot keep
# a streaming limit (its state sits in partition 0 only, and a cut wants every
# partition's), so its refusal is checked where it matters, on a checkpoint rescaled in
# place.
REFUSED = (
    ("limit", "rocksdb-changelog", False, "(globalLimit) cannot be rescaled: a streaming limit"),
    ("limit", "hdfs", False, "(globalLimit) cannot be rescaled: a streaming limit"),
    (
        "aggregation-streamline",
        "rocksdb-changelog",
        True,
        "(StatefulStreamlineAggregate) cannot be rescaled",
    ),
    ("join-inner-state-v4", "rocksdb-changelog", True, "join state format 4 cannot be rescaled"),
    ("join-inner-state-v4", "rocksdb", True, "join state format 4 cannot be rescaled"),
)
# What `make test` runs of the matrix: each family of operator once, both providers,
# both directions, and a refusal of each kind.
REPRESENTATIVE = {
    ("aggregation-watermark", "rocksdb-changelog", DOWN),
    ("join-left-outer", "rocksdb", UP),
    ("transform-with-state-in-pandas", "rocksdb-changelog", UP),
    ("session-window", "hdfs", DOWN),
    ("join-full-outer", "hdfs", UP),
}
REPRESENTATIVE_REFUSED = {("limit", "hdfs"), ("join-inner-state-v4", "rocksdb")}


def _supported() -> Iterator[Any]:
    for name in SUPPORTED_QUERIES:
        for provider in PROVIDER_NAMES:
            if provider == "hdfs" and QUERIES[name].rocksdb_only:
                continue
            for direction in (UP, DOWN):
                marks = (
                    ()
                    if (name, provider, direction) in REPRESENTATIVE
                    else pytest.mark.rescale_matrix
                )
                yield pytest.param(
                    name, provider, direction, marks=marks,
                    id=f"{name}-{provider}-{direction[0]}to{direction[1]}",
                )  # fmt: skip
    # Larger counts, once each way with each runner.
    for provider in ("rocksdb-changelog", "hdfs"):
        for direction in ((4, 16), (16, 4)):
            yield pytest.param(
                "aggregation-watermark", provider, direction,
                marks=pytest.mark.rescale_matrix,
                id=f"aggregation-watermark-{provider}-{direction[0]}to{direction[1]}",
            )  # fmt: skip


def _refused() -> Iterator[Any]:
    for name, provider, on_ring, reason in REFUSED:
        marks = () if (name, provider) in REPRESENTATIVE_REFUSED else pytest.mark.rescale_matrix
        yield pytest.param(name, provider, on_ring, reason, marks=marks, id=f"{name}-{provider}")


@pytest.fixture
def session(spark: Any) -> Iterator[Any]:
    """The shared session, its provider and partition settings put back afterwards."""
    from spark_fixtures import PROVIDERS

    keys = {key for conf in PROVIDERS.values() for key in conf} | {"spark.sql.shuffle.partitions"}
    saved = {key: spark.conf.get(key, None) for key in keys}
    yield spark
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@contextlib.contextmanager
def _settings(spark: Any, provider: str, partitions: int) -> Iterator[None]:
    """A new query's provider and state partitions (Spark pins both in its checkpoint)."""
    from spark_fixtures import PROVIDERS

    for key, value in PROVIDERS[provider].items():
        spark.conf.set(key, value)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


def _synced_run(
    spark: Any, ring: LocalCluster, query_name: str, query: StatefulQuery, input_dir: Path,
    checkpoint: Path, *, restore: int | None = None,
) -> tuple[list[str], int]:  # fmt: skip
    """``query`` run by StateSync (after restoring batch ``restore`` when given): its
    output, and the newest batch on the ring once its batches are pushed."""
    with StateSync(ring.ring, query_name, checkpoint, ring.secret) as sync:
        if restore is not None:
            assert sync.restore() == restore
        rows = run(spark, query, input_dir, checkpoint, start=lambda w: sync.start_query(w, spark))
        sync.flush(timeout_s=WAIT_S)
        newest = sync.latest_batch()
    assert newest is not None
    return rows, newest


@pytest.mark.slow
@pytest.mark.parametrize(("name", "provider", "direction"), list(_supported()))
def test_a_rescaled_query_gives_the_answers_and_state_of_one_never_rescaled(
    session: Any, ring: LocalCluster, tmp_path: Path, name: str, provider: str,
    direction: tuple[int, int],
) -> None:  # fmt: skip
    query = QUERIES[name]
    old, new = direction
    query_name = f"matrix-{name}-{provider}-{old}-{new}-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    with _settings(session, provider, old):
        first, before = _synced_run(session, ring, query_name, query, input_dir, tmp_path / "a")
    with _settings(session, provider, new):
        reference = run(session, query, input_dir, tmp_path / "reference")
    with SyncClient(ring.ring, ring.secret) as client:
        report = rescale(client, query_name, new, session, scratch_dir=tmp_path)
    assert (report.from_partitions, report.to_partitions) == (old, new)
    assert (report.base_batch, report.batch_id) == (before, before + 1)
    for index in range(4, 7):
        write_input(input_dir, index)
    second, newest = _synced_run(
        session, ring, query_name, query, input_dir, tmp_path / "b", restore=before + 1
    )
    assert newest > before + 1, "the restarted query pushed no batch"
    assert read_offsets(tmp_path / "b", newest)[0] == new
    reference += run(session, query, input_dir, tmp_path / "reference")
    # The batches pushed after the rescale restore elsewhere, holding new partitions only.
    with StateSync(ring.ring, query_name, tmp_path / "c", ring.secret) as reader:
        assert reader.restore() == newest
    folders = [p for p in (tmp_path / "c" / "state").glob("*/*") if p.name.isdigit()]
    assert folders and all(int(p.name) < new for p in folders), folders
    assert sorted(first + second) == sorted(reference)
    assert state(session, tmp_path / "c") == state(session, tmp_path / "reference")
    if provider != "hdfs":  # every column family, internal ones too
        assert placement(session, tmp_path / "c") == placement(session, tmp_path / "reference")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "provider", "on_ring", "reason"), list(_refused()))
def test_a_rescale_that_spark_would_get_wrong_is_refused_in_one_line_before_any_write(
    session: Any, ring: LocalCluster, tmp_path: Path, name: str, provider: str,
    on_ring: bool, reason: str,
) -> None:  # fmt: skip
    query = QUERIES[name]
    query_name = f"matrix-refused-{name}-{provider}-{time.monotonic_ns() % 10**9}"
    input_dir = tmp_path / "in"
    for index in range(3):
        write_input(input_dir, index)
    with _settings(session, provider, 2):
        if not on_ring:
            run(session, query, input_dir, tmp_path / "a")
        else:
            _rows, newest = _synced_run(session, ring, query_name, query, input_dir, tmp_path / "a")
    if on_ring:
        _refused_through_the_ring(session, ring, query_name, newest, reason, tmp_path)
    # A checkpoint where the query runs (a standby's, an sr3:// one): Spark's runner is
    # never started, so the checkpoint keeps no half-written batch and the query goes on.
    before = logged_batches(session, tmp_path / "a")
    with pytest.raises(RescaleRefused, match=re.escape(reason)):
        repartition_checkpoint(session, tmp_path / "a", 4)
    assert logged_batches(session, tmp_path / "a") == before
    write_input(input_dir, 3)
    run(session, query, input_dir, tmp_path / "a")
    assert read_offsets(tmp_path / "a", max(logged_batches(session, tmp_path / "a")[0]))[0] == 2


def _refused_through_the_ring(
    session: Any, ring: LocalCluster, query_name: str, newest: int, reason: str, tmp_path: Path
) -> None:
    """``rescale`` and its dry run are refused in one line; the ring's newest batch is
    the one it was."""
    with SyncClient(ring.ring, ring.secret) as client:
        for dry_run in (True, False):
            with pytest.raises(RescaleRefused) as refused:
                rescale(client, query_name, 4, session, scratch_dir=tmp_path, dry_run=dry_run)
            message = str(refused.value)
            assert reason in message and "\n" not in message, message
        assert query_batches(client, query_name)[-1] == newest


@pytest.mark.slow
def test_an_hdfs_checkpoint_that_spark_left_half_rescaled_is_finished_by_sr3s_runner(
    session: Any, tmp_path: Path
) -> None:
    """Breaks: Spark's runner, asked to rescale the HDFS-backed provider's state, writes
    the rescaled batch's offsets and then refuses (what a rescale of such a checkpoint
    did before sr3 ran its own): Spark will not start the query from it. Must hold: a
    rescale to another count is refused without writing, sr3's runner finishes the one to
    that count, and the query runs on at it with the output and state of a run never
    rescaled."""
    from spark_connector.rescale import unfinished_rescale

    query = QUERIES["aggregation-watermark"]
    checkpoint, input_dir = tmp_path / "a", tmp_path / "in"
    for index in range(4):
        write_input(input_dir, index)
    with _settings(session, "hdfs", 2):
        first = run(session, query, input_dir, checkpoint)
    with _settings(session, "hdfs", 4):
        reference = run(session, query, input_dir, tmp_path / "reference")
    committed = max(logged_batches(session, checkpoint)[1])
    with pytest.raises(Exception, match="UNSUPPORTED_PROVIDER"):
        session._streamingCheckpointManager.repartition(str(checkpoint), 4)
    assert unfinished_rescale(session, checkpoint) == 4
    before = logged_batches(session, checkpoint)
    with pytest.raises(RescaleRefused, match=f"batch {committed + 1} .* not committed"):
        repartition_checkpoint(session, checkpoint, 3)
    assert logged_batches(session, checkpoint) == before
    assert repartition_checkpoint(session, checkpoint, 4) == committed + 1
    assert unfinished_rescale(session, checkpoint) is None
    assert not (checkpoint / ".sr3-rescale").exists()
    for index in range(4, 7):
        write_input(input_dir, index)
    second = run(session, query, input_dir, checkpoint)
    reference += run(session, query, input_dir, tmp_path / "reference")
    assert read_offsets(checkpoint, max(logged_batches(session, checkpoint)[0]))[0] == 4
    assert sorted(first + second) == sorted(reference)
    assert state(session, checkpoint) == state(session, tmp_path / "reference")
