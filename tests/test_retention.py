"""Deletes, retention and chunk collection on real peers.

What it breaks: a replica misses a delete (SIGKILLed) and comes back holding the old
value; chunks are left without any record (a writer that died before its manifest);
a manifest is deleted while a restore that already read it is still fetching; a peer is
down while chunks look unreferenced.

What must hold: a deleted record stays deleted (its tombstone wins over the stale copy
and repair spreads it); chunks no live record references are collected after the grace
and never before it, nor while a peer is down; referenced chunks are never collected;
a restore that read its manifest before the delete completes within the grace; the
connector keeps the newest ``keep_batches`` batches and ``sr3 spark`` lists, restores
and forgets them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import (
    HttpProbe,
    MakeCluster,
    chunk_holders,
    commit_next_batch,
    materialize,
    peer_address,
    wait_until,
)

from recovery.executor import recover
from ring import api, codec, paxos, records_api
from ring.chunkstore import ChunkStore
from ring.client import Client
from ring.gc import ChunkCollector, GcSettings
from ring.membership import Entry, MemberTable, Timeouts
from ring.paxos import FAST, Ballot, Value
from ring.records import RecordStore
from ring.sync_client import SyncClient
from ring.transport import Transport
from spark_connector.catalog import ring_queries
from spark_connector.checkpoint import read_cut
from spark_connector.sync import StateSync
from sr3.local import LocalCluster

# Real clusters waiting out grace periods: out of the `-m "not slow"` inner loop.
pytestmark = pytest.mark.slow

QUIET = ["--scrub-rate", "0", "--repair-interval", "3600"]
POLL_S = 0.2
WAIT_S_MAX = 60.0


def held_anywhere(cluster: LocalCluster, chunk_ids: list[str]) -> set[str]:
    return {chunk_id for chunk_id in chunk_ids if chunk_holders(cluster, chunk_id)}


# -- unit: the collector's rules on real stores -------------------------------------------


async def test_collector_waits_for_the_grace_and_spares_what_is_referenced_or_restored(
    tmp_path: Path,
) -> None:
    """One peer alone (nobody else to ask): the rules without the network."""
    offset = [0.0]

    def clock() -> float:
        return offset[0]

    chunks = ChunkStore(tmp_path, clock=clock)
    records = RecordStore(tmp_path)
    chunks.open()
    records.open()
    table = MemberTable(Entry("solo", "127.0.0.1:1", "", "up", 1, 0), time.time, Timeouts(5, 60))
    collector = ChunkCollector(
        "solo", table, chunks, records, Transport("s" * 32), GcSettings(1.0, 100.0), clock
    )
    rng = random.Random(5)
    stored = [codec.encode(rng.randbytes(2048)) for _ in range(3)]
    for chunk_id, data in stored:
        await chunks.put(chunk_id, data)
    pinned, orphan, restored = (chunk_id for chunk_id, _ in stored)
    await records.accept("m", FAST, Value(1, b"manifest", (pinned,), False, "01"))

    first = await collector.round()
    assert first.chunks_unreferenced == 2 and first.chunks_collected == 0
    offset[0] = 99.0
    assert (await collector.round()).chunks_collected == 0, "collected within the grace"
    # Stored again (a writer deduplicated onto it): its grace starts over.
    offset[0] = 150.0
    await chunks.put(restored, stored[2][1])
    third = await collector.round()
    assert third.chunks_collected == 1 and not chunks.has(orphan)
    assert chunks.has(pinned) and chunks.has(restored)
    # The record is deleted: its chunk is unreferenced from now on, collected after grace.
    await records.accept("m", Ballot(1, "ab"), Value(2, b"", (), True, "02"))
    offset[0] = 200.0
    assert (await collector.round()).chunks_collected == 0
    offset[0] = 400.0
    last = await collector.round()
    assert last.chunks_collected == 2 and chunks.ids() == []
    assert not list((tmp_path / "tmp").iterdir()), "collected files left in the trash"
    await collector._transport.close()


# -- tombstones on a ring ------------------------------------------------------------------


async def test_delete_survives_a_replica_that_missed_it(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    cluster: LocalCluster = make_cluster(
        3, peer_flags=["--scrub-rate", "0", "--repair-interval", "0.3", "--gc-interval", "0"]
    )
    missed = rng.choice([p.peer_id for p in cluster.cluster.peers])
    async with Client(cluster.ring, cluster.secret) as client:
        await client.put_record("spark/q/batches/000000000001", b"old", expected_version=0)
        cluster.kill(missed)
        assert await client.delete_record("spark/q/batches/000000000001", expected_version=1) == 2
        cluster.start(missed)
        async with HttpProbe(cluster.secret) as probe:
            address = peer_address(cluster, missed)
            # Repair rounds run on every peer: the stale copy must lose to the tombstone.
            deadline = time.monotonic() + WAIT_S_MAX
            while True:
                answer = await probe.signed(
                    address, "GET", records_api.record_raw_path("spark/q/batches/000000000001")
                )
                assert answer.status == 200, answer
                slot, _meta = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)
                if slot.value.deleted and slot.value.version == 2:
                    break
                assert time.monotonic() < deadline, f"{missed} still holds {slot}"
                await asyncio.sleep(POLL_S)
        await asyncio.sleep(1.0)  # a few more rounds, in which the stale copy could spread
        assert await client.get_record("spark/q/batches/000000000001") is None
        assert await client.list_records("spark/") == {}
        tombstone = await client.get_record("spark/q/batches/000000000001", include_deleted=True)
        assert tombstone is not None and tombstone.deleted and tombstone.version == 2
        # Written again over the tombstone: live once more.
        assert (
            await client.put_record("spark/q/batches/000000000001", b"new", expected_version=2) == 3
        )
        again = await client.get_record("spark/q/batches/000000000001")
        assert again is not None and again.value == b"new"


# -- collection on a ring ------------------------------------------------------------------


def test_unreferenced_chunks_are_collected_after_the_grace_and_never_while_a_peer_is_down(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    grace_s = 4.0
    cluster: LocalCluster = make_cluster(
        4,
        peer_flags=[*QUIET, "--gc-interval", "0.3", "--gc-grace", str(grace_s),
                    "--failure-timeout", "1", "--removal-grace", "600"],
    )  # fmt: skip
    named = tmp_path / "named.bin"
    named.write_bytes(rng.randbytes(3 * 1024 * 1024))
    loose = rng.randbytes(3 * 1024 * 1024)

    async def store() -> tuple[list[str], list[str]]:
        async with Client(cluster.ring, cluster.secret) as client:
            kept = await client.store_file(named, "named")
            orphan = await client.chunks.put_blob(loose)
        return [e.chunk_id for e in kept.extents], [e.chunk_id for e in orphan.extents]

    kept_ids, orphan_ids = asyncio.run(store())
    stored_at = time.monotonic()
    time.sleep(1.5)
    if time.monotonic() - stored_at < grace_s - 1.0:
        assert held_anywhere(cluster, orphan_ids) == set(orphan_ids), "collected within grace"
    wait_until(
        lambda: not held_anywhere(cluster, orphan_ids),
        "orphan chunks collected",
        WAIT_S_MAX,
        POLL_S,
    )
    assert all(len(chunk_holders(cluster, c)) >= 2 for c in kept_ids), "a referenced chunk went"

    # A peer is down: nothing is collected, however long the chunks stay unreferenced.
    down = rng.choice([p.peer_id for p in cluster.cluster.peers])
    cluster.kill(down)

    async def store_more() -> list[str]:
        async with Client(cluster.ring, cluster.secret) as client:
            blob = await client.chunks.put_blob(rng.randbytes(1024 * 1024))
            return [e.chunk_id for e in blob.extents]

    more_ids = asyncio.run(store_more())
    time.sleep(grace_s + 2.0)
    assert held_anywhere(cluster, more_ids) == set(more_ids)

    async def skipped_reasons() -> list[str]:
        async with HttpProbe(cluster.secret) as probe:
            reasons = []
            for peer in cluster.cluster.peers:
                if peer.peer_id != down:
                    info = await probe.info(peer.address)
                    reasons.append(str((info["gc"]["last"] or {}).get("skipped", "")))
            return reasons

    assert all(reason for reason in asyncio.run(skipped_reasons()))
    cluster.start(down)
    wait_until(
        lambda: not held_anywhere(cluster, more_ids),
        "collected once all are up",
        WAIT_S_MAX,
        POLL_S,
    )
    assert all(chunk_holders(cluster, c) for c in kept_ids)


def test_restore_that_read_its_manifest_before_the_delete_completes(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """The manifest is deleted (forget --keep 0) between reading it and fetching its
    chunks, and collection rounds run meanwhile: the fetch still gets every chunk; after
    the grace the chunks are gone."""
    cluster: LocalCluster = make_cluster(
        4, peer_flags=[*QUIET, "--gc-interval", "0.3", "--gc-grace", "6"]
    )
    source = tmp_path / "ckpt"
    materialize(source, rng)
    sync = StateSync(cluster.ring, "racing", source, cluster.secret)
    try:
        sync.push()
        manifest = sync.manifest(19)
        assert sync.forget(0) == [19] and sync.latest_batch() is None
        time.sleep(2.0)  # several collection rounds see the chunks unreferenced
        got: dict[str, bytes] = {}

        async def sink(chunk_id: str, raw: bytes) -> None:
            got[chunk_id] = raw

        async def fetch() -> None:
            async with Client(cluster.ring, cluster.secret) as client:
                await recover(client, manifest.chunk_ids(), "star", sink)

        asyncio.run(fetch())
        assert sorted(got) == manifest.chunk_ids()
        wait_until(
            lambda: not held_anywhere(cluster, manifest.chunk_ids()),
            "forgotten chunks collected",
            WAIT_S_MAX,
            POLL_S,
        )
    finally:
        sync.close()


# -- the connector's retention and `sr3 spark` ------------------------------------------


def sr3(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SR3_")}
    env.update(SR3_RING=cluster.ring, SR3_SECRET=cluster.secret)
    return subprocess.run(
        [sys.executable, "-m", "sr3", *args], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _not_a_checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("not a checkpoint")
    return path


def test_retention_keeps_the_newest_batches_and_the_spark_commands_work(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    cluster: LocalCluster = make_cluster(5, peer_flags=QUIET)
    source = tmp_path / "ckpt"
    materialize(source, rng)
    sync = StateSync(cluster.ring, "kept", source, cluster.secret, keep_batches=2)
    try:
        sync.push(18)
        sync.push(19)
        commit_next_batch(source, rng)
        sync.push(20)
        assert sync.batches() == [19, 20]
    finally:
        sync.close()
    with SyncClient(cluster.ring, cluster.secret) as client:
        assert ring_queries(client) == {"kept": [19, 20]}

    listed = sr3(cluster, "spark", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {
        "queries": [
            {"query": "kept", "batches": [19, 20], "latest": 20, "lease": None, "standbys": []}
        ],
        "checkpoints": [],
    }
    target = tmp_path / "restored"
    done = sr3(cluster, "spark", "restore", "--query", "kept", "--to", str(target),
               "--batch", "19", "--topology", "line")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "restored batch 19" in done.stdout
    cut = read_cut(source, 19)
    restored = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert restored == sorted(entry.path for entry in cut.files)
    # Into `target` again it does nothing: it holds batch 19 of the same query.
    again = sr3(cluster, "spark", "restore", "--query", "kept", "--to", str(target),
                "--batch", "19")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"kept {target}: it holds batch 19 of kept"), again.stdout
    foreign = _not_a_checkpoint(tmp_path / "foreign")
    refused = sr3(cluster, "spark", "restore", "--query", "kept", "--to", str(foreign))
    assert refused.returncode != 0 and "not empty" in refused.stderr
    missing = sr3(cluster, "spark", "restore", "--query", "nothing", "--to", str(tmp_path / "n"))
    assert missing.returncode == 3 and "no state" in missing.stderr

    forgot = sr3(cluster, "spark", "forget", "--query", "kept", "--keep", "1")
    assert forgot.returncode == 0 and "deleted 1 batches (19)" in forgot.stdout
    assert "batches 20" in sr3(cluster, "spark", "list").stdout
    assert sr3(cluster, "spark", "forget", "--query", "kept", "--keep", "0").returncode == 0
    assert "no query" in sr3(cluster, "spark", "list").stdout
    bad = sr3(cluster, "spark", "forget", "--query", "../x", "--keep", "1")
    assert bad.returncode != 0 and "query name" in bad.stderr

    # Pushed again after being forgotten (over the tombstones), by a new pusher keeping
    # one batch: it finds what an earlier pusher left and keeps only its newest.
    earlier = StateSync(cluster.ring, "kept", source, cluster.secret, keep_batches=5)
    later = StateSync(cluster.ring, "kept", source, cluster.secret, keep_batches=1)
    try:
        earlier.push(19)
        assert later.push(20).manifest_version == 3  # over the tombstone of version 2
        assert later.batches() == [20] and later.latest_batch() == 20
    finally:
        earlier.close()
        later.close()
