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

import random
from pathlib import Path

import pytest
import xxhash
from prometheus_client import REGISTRY
from support import MakeCluster, commit_next_batch, materialize

import spark_connector.restore as restore_module
from ring.blobs import BlobRef, Extent
from ring.errors import ConfigError, SR3Error
from ring.sync_client import SyncClient
from spark_connector.catalog import forget
from spark_connector.checkpoint import read_cut
from spark_connector.manifest import ManifestFile
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
        with pytest.raises(ConfigError, match="not empty"):
            restorer.restore()
        assert restorer.restore(overwrite=True) == 20
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
