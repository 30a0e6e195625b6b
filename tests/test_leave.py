"""A peer leaving for good (``sr3 peer leave``): the leave returns only once everything
the peer held is on R peers without it, and says how much it handed over.

The test runs a real 6-peer ring (R=3, W=2) whose repair is slowed down
(``--repair-rate``), so that the hand-over takes seconds; then it makes one peer leave,
SIGKILLs that peer the moment the leave returns, and looks at the other peers' data
folders and record versions at once, before their own repair could catch up.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import HttpProbe, MakeCluster, chunk_holders

from ring import api, codec, paxos, records_api
from ring.client import Client, ClientOptions, Source
from ring.client.admin import LeaveReport, leave_summary
from ring.errors import ProtocolError, SR3Error
from ring.paxos import FAST, Ballot, Slot, Value
from sr3.local import LocalCluster

REPLICATION = 3
PEERS = 6
FILES = 40
FILE_BYTES = 8 * 16 * 1024
CHUNK_BYTES = 16 * 1024
LEAVE_TIMEOUT_S = 60.0
PEER_FLAGS = [
    "--failure-timeout", "1.5",
    "--removal-grace", "30",
    "--gossip-interval", "0.2",
    "--repair-interval", "1",
    # Slow enough that copying what the leaver held takes seconds, not milliseconds.
    "--repair-rate", "200KB/s",
    "--scrub-rate", "0",
]  # fmt: skip


def _stored_chunk_ids(cluster: LocalCluster, peer_id: str) -> set[str]:
    chunks = Path(cluster.peer(peer_id).data_dir) / "chunks"
    return {path.name for path in chunks.glob("*/*") if codec.is_chunk_id(path.name)}


async def _store(client: Client, rng: random.Random) -> tuple[dict[str, bytes], set[str]]:
    """``FILES`` random blobs, each named by a record ``leave/<n>`` that references its
    chunks: the record keys with their values, and every chunk id."""
    values: dict[str, bytes] = {}
    chunk_ids: set[str] = set()
    for number in range(FILES):
        data = rng.randbytes(FILE_BYTES)
        [ref] = await client.put_sources([Source(len(data), lambda o, n, d=data: d[o : o + n])])
        refs = sorted({extent.chunk_id for extent in ref.extents})
        key, value = f"leave/{number}", codec.compact_json(ref.to_json())
        await client.put_record(key, value, expected_version=0, refs=refs)
        values[key] = value
        chunk_ids.update(refs)
    return values, chunk_ids


async def _record_copies(
    probe: HttpProbe, cluster: LocalCluster, peers: Collection[str], keys: list[str]
) -> dict[str, int]:
    """How many of ``peers`` hold each record key (any version)."""
    copies = dict.fromkeys(keys, 0)
    for peer_id in peers:
        answer = await probe.signed(
            cluster.peer(peer_id).address,
            "POST",
            "/v1/records/versions",
            body=codec.compact_json({"keys": keys}),
        )
        assert answer.status == 200, answer
        for key, version in answer.json()["versions"].items():
            copies[key] += int(version) > 0
    return copies


# Real clusters handing over a few hundred chunks: seconds each, out of the inner loop.
@pytest.mark.slow
async def test_leave_returns_once_everything_is_on_r_peers_without_the_leaver(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: one peer of a loaded 6-peer ring leaves; the moment ``leave`` returns, its
    process is SIGKILLed (if it has not exited yet).
    Must hold: at that moment every chunk is in at least R=3 data folders other than the
    leaver's and every record has R copies on the other peers and reads back; the leave
    report counts what the leaver held (chunks, their bytes, records), all > 0."""
    cluster = make_cluster(PEERS, peer_flags=PEER_FLAGS)
    options = ClientOptions(chunk_bytes=CHUNK_BYTES, pack_below_bytes=0)
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        values, chunk_ids = await _store(client, rng)
    everyone = [peer.peer_id for peer in cluster.cluster.peers]
    leaver = rng.choice(everyone)
    remaining = [p for p in everyone if p != leaver]
    held = _stored_chunk_ids(cluster, leaver) & chunk_ids
    assert len(held) > 50, f"{leaver} holds only {len(held)} chunks"

    async with Client(cluster.ring, cluster.secret, options=options) as client:
        async with asyncio.timeout(LEAVE_TIMEOUT_S):
            report = await client.admin.leave(leaver, timeout_s=LEAVE_TIMEOUT_S)
    if cluster.running(leaver):
        await asyncio.to_thread(cluster.kill, leaver)

    short = {
        chunk_id: holders
        for chunk_id in sorted(chunk_ids)
        if len(holders := [p for p in chunk_holders(cluster, chunk_id) if p != leaver])
        < REPLICATION
    }
    examples = dict(list(short.items())[:5])
    assert not short, f"{len(short)} chunks on fewer than 3 peers without {leaver}: {examples}"
    ring = ",".join(cluster.peer(p).address for p in remaining)
    async with HttpProbe(cluster.secret) as probe:
        copies = await _record_copies(probe, cluster, remaining, sorted(values))
    assert all(n >= REPLICATION for n in copies.values()), copies
    async with Client(ring, cluster.secret) as client:
        for key, value in values.items():
            record = await client.get_record(key)
            assert record is not None and record.value == value, key

    assert isinstance(report, LeaveReport)
    assert report.peer_id == leaver and report.replication == REPLICATION
    # Everything the leaver held, at least the blobs' chunks it held, was handed over.
    assert report.chunks >= len(held), (report, len(held))
    assert report.bytes >= report.chunks * CHUNK_BYTES // 2, report
    assert report.records > 0, report
    assert _stored_chunk_ids(cluster, leaver) == set()
    summary = leave_summary(report)
    assert summary.startswith(f"{leaver} has left the ring: handed over {report.chunks} chunks")
    assert f"{report.records} records" in summary and "on 3 peers without it" in summary

    # No catch-up left behind the leave: every remaining peer caught up on its records at
    # the epoch without the leaver, so two more lost at once cost no record.
    async with HttpProbe(cluster.secret) as probe:
        for peer_id in remaining:
            health = await probe.signed(cluster.peer(peer_id).address, "GET", api.HEALTH.pattern)
            assert health.json()["settled"] is True, (peer_id, health.json())
    lost = rng.sample(remaining, 2)
    for peer_id in lost:
        await asyncio.to_thread(cluster.kill, peer_id)
    ring = ",".join(cluster.peer(p).address for p in remaining if p not in lost)
    async with Client(ring, cluster.secret) as client:
        for key, value in values.items():
            record = await client.get_record(key)
            assert record is not None and record.value == value, key


@pytest.mark.slow
async def test_a_leaver_that_dies_mid_hand_over_is_no_success(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: a peer of a loaded 5-peer ring is SIGKILLed while it hands its data over.
    Must hold: ``leave`` does not report success: it fails with a clear error soon after
    (not at its timeout)."""
    cluster = make_cluster(5, peer_flags=PEER_FLAGS)
    options = ClientOptions(chunk_bytes=CHUNK_BYTES, pack_below_bytes=0)
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        await _store(client, rng)
        leaver = rng.choice([peer.peer_id for peer in cluster.cluster.peers])
        leaving = asyncio.create_task(client.admin.leave(leaver, timeout_s=LEAVE_TIMEOUT_S))
        try:
            async with HttpProbe(cluster.secret) as probe:
                while True:
                    await asyncio.sleep(0.05)
                    progress = (await probe.info(cluster.peer(leaver).address))["leave"]
                    if progress["state"] == "handing_over":
                        break
            assert progress["chunks_remaining"] > 0, progress
            await asyncio.to_thread(cluster.kill, leaver)
            with pytest.raises(SR3Error, match="stopped answering while handing its data over"):
                async with asyncio.timeout(LEAVE_TIMEOUT_S / 2):
                    await leaving
        finally:
            leaving.cancel()


async def test_leave_is_refused_when_fewer_than_r_peers_would_remain(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: one peer of a 3-peer ring with R=3 is asked to leave.
    Must hold: it refuses (409 too_few_peers), stays up and in placement."""
    cluster = make_cluster(3, peer_flags=PEER_FLAGS)
    async with Client(cluster.ring, cluster.secret) as client:
        with pytest.raises(SR3Error, match="fewer than the replication factor"):
            await client.admin.leave("peer-2", timeout_s=LEAVE_TIMEOUT_S)
        states = {m["peer_id"]: m["state"] for m in await client.members()}
    assert states == {"peer-1": "up", "peer-2": "up", "peer-3": "up"}, states
    assert cluster.running("peer-2")


@given(
    st.sampled_from(api.LEAVE_STATES),
    st.lists(st.integers(0, 2**53), min_size=6, max_size=6),
    st.text(max_size=100),
)
def test_leave_progress_round_trips(state: str, counts: list[int], message: str) -> None:
    progress = api.LeaveProgress(state, *counts, message=message)
    assert api.parse_leave_progress({"leave": progress.to_json()}) == progress


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"leave": None},
        {"leave": {"state": "gone"}},
        {"leave": {"state": "done", "chunks_moved": -1}},
        {"leave": {"state": "done", "bytes_moved": 1.5}},
        {"leave": {"state": "done", "records_moved": True}},
        {"leave": {"state": "done", "message": 3}},
        {"leave": {"state": ["done"]}},
    ],
)
def test_malformed_leave_progress_is_a_protocol_error(answer: object) -> None:
    with pytest.raises(ProtocolError):
        api.parse_leave_progress(answer)


def test_leave_summary_says_what_moved() -> None:
    report = LeaveReport("peer-3", 154, 3 * 1024 * 1024 + 1, 12, 3)
    assert leave_summary(report) == (
        "peer-3 has left the ring: handed over 154 chunks (3.0 MiB) and 12 records; "
        "every one is on 3 peers without it"
    )


@pytest.mark.slow
async def test_a_leaving_peer_takes_no_writes_and_confirms_no_copy(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: a client with a stale view writes to a peer that is handing its data over,
    and another peer asks it which copies it holds.
    Must hold: writes are refused (503 "leaving": nothing lands after its last count) and
    it confirms no chunk or record (no other peer drops a copy on the strength of one
    about to go); reads of what it holds still work."""
    cluster = make_cluster(5, peer_flags=PEER_FLAGS)
    options = ClientOptions(chunk_bytes=CHUNK_BYTES, pack_below_bytes=0)
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        values, chunk_ids = await _store(client, rng)
        leaver = rng.choice([peer.peer_id for peer in cluster.cluster.peers])
        address = cluster.peer(leaver).address
        held = sorted(_stored_chunk_ids(cluster, leaver) & chunk_ids)
        await client.admin.leave(leaver, wait=False)
    chunk_id, stored = codec.encode(rng.randbytes(1000))
    async with HttpProbe(cluster.secret) as probe:
        put = await probe.signed(address, "PUT", api.chunk_path(chunk_id), body=stored)
        assert put.status == 503 and put.json()["error"] == "leaving", put
        proposal = paxos.encode_slot(Slot(FAST, FAST, Value(1, b"value", op="01")))
        record = await probe.signed(
            address,
            "POST",
            records_api.accept_path("leave/new", FAST.wire(), "0" * 16),
            body=proposal,
        )
        assert record.status == 503 and record.json()["error"] == "leaving", record
        prepare = await probe.signed(
            address, "POST", records_api.prepare_path("leave/new", Ballot(1, "ab").wire(), "0" * 16)
        )
        assert prepare.status == 503, prepare
        exists = await probe.signed(
            address, "POST", api.CHUNKS_EXIST.pattern, body=api.exists_request(held)
        )
        assert exists.status == 200 and exists.json()["present"] == [], exists
        versions = await probe.signed(
            address,
            "POST",
            api.RECORD_VERSIONS.pattern,
            body=records_api.versions_request(sorted(values)),
        )
        assert set(versions.json()["versions"].values()) == {0}, versions
        assert versions.json()["ballots"] == {}, versions
        got = await probe.signed(address, "GET", api.chunk_path(held[0]))
        assert got.status in (200, 404), got  # served while held; gone once handed over
