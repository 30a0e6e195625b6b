"""The connector's synchronous core (spark_connector.sync) on a real ring, with a
checkpoint directory laid out exactly as Spark 4.3 wrote one (the listing in
tests/fixtures, files filled with seeded bytes).

What it breaks: a second batch commits, two peers are SIGKILLed before the restore, the
restore goes to another directory. What must hold: a push uploads only files it has not
uploaded before; the restore gives back every file of the newest batch's cut
byte-identical and nothing else; a non-empty target is refused; a query the ring does
not know restores to None.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash
from prometheus_client import REGISTRY
from support import MakeCluster, commit_next_batch, materialize

import spark_connector.restore as restore_module
from ring.blobs import BlobRef, Extent
from ring.errors import ConfigError, ProtocolError, SR3Error
from ring.sync_client import SyncClient, SyncClientClosed
from spark_connector.catalog import forget
from spark_connector.checkpoint import read_cut
from spark_connector.manifest import Manifest, ManifestFile
from spark_connector.restore import _Writer
from spark_connector.sync import StateSync
from sr3.local import LocalCluster


def test_push_uploads_only_new_files_and_restore_returns_the_cut(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    cluster: LocalCluster = make_cluster(5)
    source = tmp_path / "ckpt"
    materialize(source, rng)
    sync = StateSync(cluster.ring, "sessions", source, cluster.secret)
    try:
        first = sync.push()
        assert first.batch_id == 19 and first.bytes_read == first.bytes_total > 0
        again = sync.push()
        assert again.bytes_read == 0, "unchanged files were uploaded again"
        new_files = commit_next_batch(source, rng)
        second = sync.push()
        assert second.batch_id == 20
        # Only what batch 20 added is read: its new files (the cut also drops old ones).
        assert second.bytes_read == sum(path.stat().st_size for path in new_files)
        assert sync.latest_batch() == 20
    finally:
        sync.close()
    cut = read_cut(source, 20)
    for peer_id in rng.sample([p.peer_id for p in cluster.cluster.peers], 2):
        cluster.kill(peer_id)
    target = tmp_path / "restored"
    restorer = StateSync(cluster.ring, "sessions", target, cluster.secret)
    try:
        assert restorer.restore(topology="line") == 20
        assert restorer.lag_batches == 0, "a restored batch counts as pushed"
        restored = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        assert restored == sorted(entry.path for entry in cut.files)
        for entry in cut.files:
            assert (target / entry.path).read_bytes() == (source / entry.path).read_bytes()
        # A restart on the intact directory: nothing to do.
        assert restorer.restore() == 20
        assert restorer.last_restore is not None
        assert restorer.last_restore.action == "kept-local"
        assert restorer.restore(overwrite=True) == 20
        assert restorer.last_restore.action == "restored"
    finally:
        restorer.close()
    unknown = StateSync(cluster.ring, "never-pushed", tmp_path / "none", cluster.secret)
    try:
        assert unknown.restore() is None
    finally:
        unknown.close()


def test_a_pusher_uploads_everything_again_once_its_manifest_is_forgotten_elsewhere(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Chunks of the last manifest are reused without asking the ring within
    ``recheck_s``; past it, the pusher reads that manifest back, and when `sr3 spark
    forget` (another client) deleted it, uploads every file again: its chunks may be
    collected by now."""
    cluster: LocalCluster = make_cluster(3)
    source = tmp_path / "ckpt"
    materialize(source, rng)
    trusting = StateSync(cluster.ring, "trusting", source, cluster.secret, recheck_s=3600.0)
    checking = StateSync(cluster.ring, "checking", source, cluster.secret, recheck_s=0.0)
    try:
        for sync in (trusting, checking):
            first = sync.push()
            assert sync.push().bytes_read == 0, "unchanged files were uploaded again"
            with SyncClient(cluster.ring, cluster.secret) as other:
                assert forget(other, sync.query, 0) == [first.batch_id]
            assert sync.latest_batch() is None
        # Within recheck_s the forget goes unseen (the peers' grace covers it) ...
        assert trusting.push().bytes_read == 0
        # ... past it, the pusher finds its manifest gone and uploads the whole cut.
        again = checking.push()
        assert again.bytes_read == again.bytes_total == first.bytes_total
        assert checking.push().bytes_read == 0, "the manifest written again lives"
        assert checking.latest_batch() == first.batch_id
    finally:
        trusting.close()
        checking.close()


def test_worker_pushes_the_newest_committed_batch_and_flush_waits_for_it(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Holds: batches noted as committed reach the ring in the background; flush returns
    once the newest one is there; a flush without a worker says so instead of hanging."""
    cluster: LocalCluster = make_cluster(3)
    source = tmp_path / "ckpt"
    materialize(source, rng)
    idle = StateSync(cluster.ring, "idle", source, cluster.secret)
    try:
        idle.committed(19)
        with pytest.raises(SR3Error, match="not on the ring"):
            idle.flush(timeout_s=0.1)
        idle.throttle(20, timeout_s=0.1)  # 20 behind (nothing pushed): within the bound
        with pytest.raises(SR3Error, match="not on the ring"):
            idle.throttle(19, timeout_s=0.1)
        assert REGISTRY.get_sample_value("sr3_connector_lag_batches", {"query": "idle"}) == 20
    finally:
        idle.close()
    sync = StateSync(cluster.ring, "worker", source, cluster.secret)
    try:
        sync.start()
        sync.committed(19)
        sync.flush(timeout_s=60)
        assert sync.latest_batch() == 19 and sync.lag_batches == 0
        commit_next_batch(source, rng)
        # No committed(20): the listener's event can come late; flush reads commits/.
        sync.flush(timeout_s=60)
        assert sync.latest_batch() == 20
        assert REGISTRY.get_sample_value("sr3_connector_lag_batches", {"query": "worker"}) == 0
        assert REGISTRY.get_sample_value("sr3_connector_pushed_batch", {"query": "worker"}) == 20
    finally:
        sync.close()


# -------------------------------------------------------- the restore's file writer


def _restore_files(
    chunks: dict[str, bytes], layout: dict[str, list[tuple[str, int, int]]]
) -> list[ManifestFile]:
    """ManifestFiles whose extents are (chunk, offset, length) of ``chunks``."""
    files = []
    for path, extents in layout.items():
        data = b"".join(
            chunks[chunk][offset : offset + length] for chunk, offset, length in extents
        )
        blob = BlobRef(
            len(data),
            xxhash.xxh3_128_hexdigest(data),
            tuple(Extent(chunk, offset, length) for chunk, offset, length in extents),
        )
        files.append(ManifestFile(path, blob))
    return files


@pytest.mark.parametrize("held_max", [64 * 1024 * 1024, 1500, 0])
def test_restore_writer_checks_each_file_whatever_order_chunks_arrive_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_max: int
) -> None:
    """Pieces ahead of a gap are held in memory or, past the bound, read back."""
    monkeypatch.setattr(restore_module, "AHEAD_BYTES_MAX", held_max)
    rng = random.Random(5)
    chunks = {f"c{index}": rng.randbytes(1000 + index) for index in range(8)}
    layout = {
        "state/0/0/1.delta": [("c0", 0, 1000), ("c1", 0, 1001), ("c2", 10, 500)],
        "state/0/1/1.delta": [("c2", 0, 10), ("c3", 0, 1003), ("c4", 0, 1004)],
        "offsets/1": [("c5", 0, 1005), ("c6", 0, 1006), ("c7", 0, 1007), ("c5", 0, 5)],
        "commits/1": [],
    }
    files = _restore_files(chunks, layout)
    for order in (sorted(chunks), sorted(chunks, reverse=True), rng.sample(sorted(chunks), 8)):
        root = tmp_path / "-".join(order)
        writer = _Writer(root, files)
        for chunk_id in order:
            writer._write(chunk_id, chunks[chunk_id])
        writer._write(order[0], chunks[order[0]])  # a duplicate delivery counts once
        writer.close()
        writer.verify()
        assert writer._held == 0
        for file, extents in zip(files, layout.values(), strict=True):
            expected = b"".join(chunks[c][o : o + n] for c, o, n in extents)
            assert (root / file.path).read_bytes() == expected


def test_restore_writer_refuses_a_file_that_does_not_match_its_digest(tmp_path: Path) -> None:
    chunks = {"c0": b"a" * 100, "c1": b"b" * 100}
    files = _restore_files(chunks, {"metadata": [("c0", 0, 100), ("c1", 0, 100)]})
    writer = _Writer(tmp_path / "bad", files)
    writer._write("c1", chunks["c1"])
    writer._write("c0", b"x" * 100)  # not what the manifest's digest says
    writer.close()
    with pytest.raises(SR3Error, match="metadata does not match its digest"):
        writer.verify()
    partial = _Writer(tmp_path / "partial", files)
    partial._write("c0", chunks["c0"])
    partial.close()
    with pytest.raises(SR3Error, match="incomplete: metadata"):
        partial.verify()


# ------------------------------------------------ restore: the one call before every start


def _spark_metadata(root: Path, query_id: str) -> None:
    """The ``metadata`` file Spark writes once, when a checkpoint is created."""
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root`` (hidden ones too): its mtime and bytes."""
    return {
        str(path.relative_to(root)): (path.stat().st_mtime_ns, path.read_bytes())
        for path in root.rglob("*")
        if path.is_file()
    }


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_restore_keeps_a_current_or_newer_checkpoint_and_restores_an_earlier_one(
    ring: LocalCluster, tmp_path: Path, rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    """What it breaks: the query restarts on its intact checkpoint (equal to the ring's
    newest batch, then one batch ahead of it), on an empty directory, and on a stale copy
    of the same query (an earlier batch, plus a batch it planned but never committed).
    What must hold: restore() before start() never raises for these; an intact or newer
    checkpoint is left byte for byte as it was; an empty or earlier one gets the ring's
    newest batch, exactly its cut; the restore is logged with when, from which host and
    directory the batch was pushed."""
    caplog.set_level(logging.INFO, logger="spark_connector.restore")
    query = f"restart-{rng.randrange(10**9)}"
    source = (tmp_path / "ckpt").resolve()
    materialize(source, rng)
    _spark_metadata(source, "11111111-aaaa-4000-8000-000000000001")
    stale = tmp_path / "stale"
    shutil.copytree(source, stale)
    (stale / "offsets" / "20").write_bytes(b"v1\nplanned by a run that never committed it\n")
    with StateSync(ring.ring, query, source, ring.secret) as sync:
        assert sync.push().batch_id == 19
        before = _snapshot(source)
        assert sync.restore() == 19, "an intact checkpoint equal to the ring's newest"
        assert sync.last_restore is not None and sync.last_restore.action == "kept-local"
        assert sync.last_restore.ring_batch_id == 19 and sync.last_restore.files == 0
        assert _snapshot(source) == before, "restore() changed an intact checkpoint"
        commit_next_batch(source, rng)
        before = _snapshot(source)
        assert sync.restore() == 20, "a checkpoint newer than the ring's newest"
        assert sync.last_restore.action == "kept-local"
        assert sync.last_restore.ring_batch_id == 19
        assert _snapshot(source) == before, "restore() changed a newer checkpoint"
        assert sync.lag_batches == 1, "the local batch 20 is not on the ring yet"
        sync.start()
        sync.flush(timeout_s=60)
        assert sync.latest_batch() == 20
    cut = read_cut(source, 20)
    for target in (tmp_path / "empty", stale):
        with StateSync(ring.ring, query, target, ring.secret) as restorer:
            assert restorer.restore() == 20, target
            report = restorer.last_restore
            assert report is not None and report.action == "restored" and report.discarded == ""
        assert _files(target) == sorted(entry.path for entry in cut.files), target
        for entry in cut.files:
            assert (target / entry.path).read_bytes() == (source / entry.path).read_bytes()
    assert not list(tmp_path.glob(".*sr3-*")), "a staging or replaced directory was left"
    origin = f"from {socket.gethostname()}:{source}"
    logged = [r.getMessage() for r in caplog.records if "restored batch 20" in r.getMessage()]
    assert len(logged) == 2, logged
    assert all(f"restored batch 20 of query {query} pushed at " in line for line in logged)
    assert all(origin in line and " UTC " in line for line in logged), logged
    assert all("query id 11111111-aaaa-4000-8000-000000000001" in line for line in logged)


def test_a_background_restore_overlaps_the_caller_and_guards_the_start(
    ring: LocalCluster, tmp_path: Path, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What it breaks: a restore runs on its own thread while the caller goes on (as an
    application starting its SparkSession would), and the caller tries to register,
    start pushing or restore again before it is done; then a background restore that
    must refuse (a directory that is no checkpoint). What must hold: the future gives what
    restore() gives, the directory holds exactly the ring's cut; until the restore is
    done everything that would start the query on a half-restored directory is refused
    with ConfigError; a refusal surfaces from result(), not in a log."""
    query = f"background-{rng.randrange(10**9)}"
    source = (tmp_path / "ckpt").resolve()
    materialize(source, rng)
    _spark_metadata(source, "22222222-aaaa-4000-8000-000000000002")
    with StateSync(ring.ring, query, source, ring.secret) as sync:
        assert sync.push().batch_id == 19
    cut = read_cut(source, 19)
    target = tmp_path / "restored"
    restorer = StateSync(ring.ring, query, target, ring.secret)
    release = threading.Event()
    entered = threading.Event()
    real_restore = restorer._restore

    def held_restore(*args: object) -> int | None:  # holds the thread until released
        entered.set()
        release.wait(timeout=60)
        return real_restore(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(restorer, "_restore", held_restore)
    try:
        restoring = restorer.restore_in_background(topology="star")
        assert entered.wait(timeout=60)
        for attempt in (
            lambda: restorer.register(object()),
            restorer.start,
            restorer.restore,
            restorer.restore_in_background,
        ):
            with pytest.raises(ConfigError, match=r"background restore .* runs"):
                attempt()
        release.set()
        assert restoring.result(timeout=120) == 19
        assert restorer.last_restore is not None and restorer.last_restore.action == "restored"
    finally:
        release.set()
        restorer.close()
    assert _files(target) == sorted(entry.path for entry in cut.files)
    for entry in cut.files:
        assert (target / entry.path).read_bytes() == (source / entry.path).read_bytes()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a checkpoint")
    with StateSync(ring.ring, query, junk, ring.secret) as refusing:
        refused = refusing.restore_in_background()
        with pytest.raises(ConfigError, match="no metadata file"):
            refused.result(timeout=120)
        assert (junk / "notes.txt").read_text() == "not a checkpoint"
        assert refusing.restore_in_background(overwrite=True).result(timeout=120) == 19
    assert _files(junk) == sorted(entry.path for entry in cut.files)
    with pytest.raises(SyncClientClosed):
        refusing.restore_in_background()


def test_restore_refuses_another_run_or_a_fork_and_overwrite_says_what_it_discards(
    ring: LocalCluster, tmp_path: Path, rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    """What it breaks: the directory holds an older checkpoint of another query that
    reused the name (another query id), a fork of the same query (same id, an offset log
    the ring's history does not have), a batch newer than the one asked for by id, and
    files that are no checkpoint at all. What must hold: restore() refuses each with an
    error that names the directory, both batches, both query ids and what overwrite=True
    discards, and changes nothing; overwrite=True replaces it and says what it threw away."""
    caplog.set_level(logging.INFO, logger="spark_connector.restore")
    query = f"reused-{rng.randrange(10**9)}"
    source = tmp_path / "ckpt"
    materialize(source, rng)
    _spark_metadata(source, "22222222-bbbb-4000-8000-000000000002")
    fork = tmp_path / "fork"
    shutil.copytree(source, fork)
    commit_next_batch(source, rng)
    commit_next_batch(fork, random.Random(rng.random()))  # batch 20, planned otherwise
    for path in ("commits/20", "state/0/0/21.delta", "state/0/1/21.delta"):
        (fork / path).unlink()  # ... and never committed; offsets/19 differs too:
    (fork / "offsets" / "19").write_bytes(b"v1\n{}\n" + b" " * 1176)
    other = tmp_path / "other"
    materialize(other, random.Random(rng.random()))
    _spark_metadata(other, "33333333-cccc-4000-8000-000000000003")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a checkpoint")
    with StateSync(ring.ring, query, source, ring.secret) as sync:
        sync.push(19)
        sync.push(20)
    for target, why in [
        (other, "query id 33333333-cccc-4000-8000-000000000003) is not the ring's (query id "
         "22222222-bbbb-4000-8000-000000000002"),
        (fork, "offsets/19 differs from the ring's"),
        (junk, "no metadata file"),
    ]:  # fmt: skip
        before = _snapshot(target)
        refusal = _refusal(ring, query, target)
        message = str(refusal)
        assert why in message, message
        assert str(target.resolve()) in message and "on the ring: batch 20" in message, message
        assert "overwrite=True discards the local checkpoint" in message, message
        assert f"({len(before)} file" in message, message
        assert _snapshot(target) == before, f"a refused restore changed {target}"
    assert "Here: no committed batch" in message
    assert "batches 16..19" in str(_refusal(ring, query, other)), "the discarded batches"
    newer = "holds batch 20, newer than the requested batch 19"
    with (
        StateSync(ring.ring, query, source, ring.secret) as current,
        pytest.raises(ConfigError, match=newer),
    ):
        current.restore(batch_id=19)
    cut = read_cut(source, 20)
    files_before = len(_snapshot(other))
    with StateSync(ring.ring, query, other, ring.secret) as restorer:
        assert restorer.restore(overwrite=True) == 20
        report = restorer.last_restore
        assert report is not None and report.action == "restored"
        assert report.discarded.startswith(f"{files_before} files, batches 16..19, query id 3333")
    assert _files(other) == sorted(entry.path for entry in cut.files)
    assert any(
        "discards the local checkpoint" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    )


def _refusal(ring: LocalCluster, query: str, target: Path) -> ConfigError:
    with (
        StateSync(ring.ring, query, target, ring.secret) as restorer,
        pytest.raises(ConfigError) as refused,
    ):
        restorer.restore()
    return refused.value


def test_manifests_record_where_they_were_pushed_from_and_format_1_still_reads() -> None:
    blob = BlobRef(3, xxhash.xxh3_128_hexdigest(b"abc"), (Extent("c" * 32, 0, 3),))
    files = (ManifestFile("metadata", blob),)
    manifest = Manifest("q", 7, 8, "/data/ckpt", files, 1_795_000_000.5, "driver-1", "id-1")
    data = manifest.to_json()
    assert data["format"] == 2 and Manifest.from_json(json.loads(json.dumps(data))) == manifest
    assert manifest.origin() == "pushed at 2026-11-18 11:06:40 UTC from driver-1:/data/ckpt"
    older = {k: v for k, v in data.items() if k not in ("pushed_at", "host", "query_id")}
    read = Manifest.from_json({**older, "format": 1})
    assert (read.pushed_at, read.host, read.query_id) == (None, None, None)
    assert read.origin() == "pushed at an unknown time from an unknown host:/data/ckpt"
    for bad in ({"pushed_at": 1e400}, {"pushed_at": "now"}, {"host": "h" * 256}):
        with pytest.raises(ProtocolError):
            Manifest.from_json({**data, **bad})
    with pytest.raises(ProtocolError, match="format 3"):
        Manifest.from_json({**data, "format": 3})
    # A manifest on the ring never names a file outside the directory it restores into.
    for path in ("../../etc/cron.d/x", "/etc/passwd", "state/../../x", "a//b", "", "a/\x00"):
        outside = {**data, "files": [{"path": path, **blob.to_json()}]}
        with pytest.raises(ProtocolError, match="does not name"):
            Manifest.from_json(outside)


# ------------------------------------------------------------------ closing cleanly

_SCRIPT = """
import sys
from spark_connector import StateSync

ring, secret, query, checkpoint = sys.argv[1:5]
sync = StateSync(ring, query, checkpoint, secret)
restored = sync.restore()  # the README's restart, on the intact checkpoint
sync.push()
if sys.argv[5] == "close":
    sync.close()
print("restored", restored, flush=True)
"""


@pytest.mark.parametrize("ending", ["close", "exit-without-close"])
def test_a_script_using_state_sync_leaves_no_unclosed_session(
    ring: LocalCluster, tmp_path: Path, rng: random.Random, ending: str
) -> None:
    """What it breaks: a driver script restores as the README says, on its intact
    checkpoint, pushes, and closes the StateSync (or just ends). What must hold: it exits
    0, and aiohttp reports no unclosed session or connector."""
    query = f"closing-{rng.randrange(10**9)}"
    source = tmp_path / "ckpt"
    materialize(source, rng)
    with StateSync(ring.ring, query, source, ring.secret) as sync:
        sync.push()
    done = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", _SCRIPT,
         ring.ring, ring.secret, query, str(source), ending],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "restored 19" in done.stdout
    assert "Unclosed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
