"""The ring heals itself: crashed, frozen, joining, leaving and stopped peers, rotten disks
and strangers without the secret, with real peer processes on 127.0.0.x.

Each test starts its own cluster (they change membership) with short failure-detection
and repair timings passed as ``sr3 peer`` flags, breaks one thing, and then waits, with a
deadline, until what must hold does. A wait that runs out fails with the seed to replay
and the last state it saw. Where replicas sit is read from the peers' data folders and
compared with the preference lists that ``ring.placement`` gives for the peers that
should own data, so a repair bug cannot hide behind the repair code's own view of the
ring.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support import (
    SEED,
    SEED_ENV,
    HttpProbe,
    MakeCluster,
    acceptors_of,
    chunk_file,
    chunk_holders,
    metric_value,
    next_base_port,
    start_cluster,
)

from ring import api, codec, paxos, records_api
from ring.auth import generate_secret
from ring.blobs import BlobRef
from ring.client import Client, ClientOptions
from ring.errors import SR3Error
from ring.overlay import DATAGRAM_BYTES_MAX
from ring.paxos import Slot, Value
from ring.placement import Member, Ring
from ring.records import RecordStore
from sr3.local import LocalCluster, pick_port

# Real clusters healing under faults, seconds each: out of the `-m "not slow"` inner loop.
pytestmark = pytest.mark.slow

Check = Callable[[], Awaitable[tuple[bool, object]]]

KIB = 1024
MIB = 1024 * KIB
REPLICATION = 3

# Timings of the peers, short but with room for a loaded 2-core machine: a healthy
# peer's heartbeat advances every gossip interval, far inside the failure timeout.
FAILURE_TIMEOUT_S = 1.5
REMOVAL_GRACE_S = 4.0
REPAIR_INTERVAL_S = 0.5
GOSSIP_INTERVAL_S = 0.2
# Deadlines of the waits: generous, since they only bound a failing run.
HEAL_TIMEOUT_S = 60.0
CHECK_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.25

CHUNK_BYTES = 256 * KIB
# A tmpfs where there is one, for tests that write ten thousand files durably.
MEMORY_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
AUTH_FAILURES_METRIC = "sr3_peer_auth_failures_total"


# -- helpers --------------------------------------------------------------------------------


def peer_flags(
    rng: random.Random,
    *,
    failure_timeout_s: float = FAILURE_TIMEOUT_S,
    removal_grace_s: float = REMOVAL_GRACE_S,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        "--failure-timeout", str(failure_timeout_s),
        "--removal-grace", str(removal_grace_s),
        "--repair-interval", str(REPAIR_INTERVAL_S),
        "--gossip-interval", str(GOSSIP_INTERVAL_S),
        "--seed", str(rng.randrange(2**31)),
        *extra,
    ]  # fmt: skip


async def wait_for(what: str, check: Check, *, timeout_s: float = HEAL_TIMEOUT_S) -> object:
    """Poll ``check`` until it says done; fail after ``timeout_s`` with what it last saw.

    A check that raises an sr3 or connection error counts as not done (a peer may be
    restarting); each check is itself bounded in time."""
    started = time.monotonic()
    deadline = started + timeout_s
    seen: object = "nothing yet"
    while True:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                done, seen = await check()
        except (SR3Error, aiohttp.ClientError, OSError, TimeoutError) as exc:
            done, seen = False, f"{exc!r} (before that: {seen})"
        if done:
            return seen
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what}: not within {timeout_s:.0f} s (replay with {SEED_ENV}={SEED}); "
                f"last seen: {seen}"
            )
        await asyncio.sleep(POLL_INTERVAL_S)


def ids(cluster: LocalCluster) -> list[str]:
    return [peer.peer_id for peer in cluster.cluster.peers]


def address(cluster: LocalCluster, peer_id: str) -> str:
    return cluster.peer(peer_id).address


def ring_of(cluster: LocalCluster, peer_ids: Collection[str]) -> str:
    """A ``--ring`` value naming only these peers (a client never waits on others)."""
    return ",".join(address(cluster, peer_id) for peer_id in sorted(peer_ids))


class MemberStates(dict[str, tuple[str, int]]):
    """peer id -> (liveness, epoch); ``("unknown", 0)`` for a peer not in the table."""

    def __missing__(self, peer_id: str) -> tuple[str, int]:
        return ("unknown", 0)


async def member_states(probe: HttpProbe, peer_address: str) -> MemberStates:
    """The member table as the peer at ``peer_address`` sees it."""
    answer = await probe.signed(peer_address, "GET", "/v1/members")
    assert answer.status == 200, answer
    return MemberStates({m["peer_id"]: (m["state"], m["epoch"]) for m in answer.json()["members"]})


async def views(
    probe: HttpProbe, cluster: LocalCluster, observers: Collection[str]
) -> dict[str, MemberStates]:
    return {p: await member_states(probe, address(cluster, p)) for p in sorted(observers)}


async def infos(
    probe: HttpProbe, cluster: LocalCluster, peer_ids: Collection[str]
) -> dict[str, dict[str, Any]]:
    return {p: await probe.info(address(cluster, p)) for p in sorted(peer_ids)}


def misplaced(
    cluster: LocalCluster, chunk_ids: Collection[str], owners: Collection[str]
) -> dict[str, tuple[list[str], list[str]]]:
    """Chunks whose copies on the disks of ``owners`` are not exactly their preference
    list on a ring of ``owners``: chunk id -> (holders, preference list)."""
    ring = Ring.build(
        [Member(p, address(cluster, p)) for p in owners], vnodes=cluster.cluster.vnodes
    )
    wrong = {}
    for chunk_id in sorted(chunk_ids):
        holders = sorted(p for p in chunk_holders(cluster, chunk_id) if p in owners)
        wanted = sorted(m.peer_id for m in ring.preference_list(chunk_id, REPLICATION))
        if holders != wanted:
            wrong[chunk_id] = (holders, wanted)
    return wrong


def preference(cluster: LocalCluster, owners: Collection[str], key: str) -> list[str]:
    ring = Ring.build(
        [Member(p, address(cluster, p)) for p in owners], vnodes=cluster.cluster.vnodes
    )
    return [m.peer_id for m in ring.preference_list(key, REPLICATION)]


def stored_chunk_ids(cluster: LocalCluster, peer_id: str) -> set[str]:
    chunks = Path(cluster.peer(peer_id).data_dir) / "chunks"
    return {path.name for path in chunks.glob("*/*") if codec.is_chunk_id(path.name)}


def chunk_ids_of(refs: Mapping[str, BlobRef]) -> set[str]:
    return {extent.chunk_id for ref in refs.values() for extent in ref.extents}


async def store_files(
    client: Client, folder: Path, rng: random.Random, sizes: Sequence[int], prefix: str
) -> tuple[dict[str, bytes], dict[str, BlobRef]]:
    """Store random files under keys ``<prefix>-<n>`` (blob + record with refs)."""
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    contents: dict[str, bytes] = {}
    refs: dict[str, BlobRef] = {}
    for number, size in enumerate(sizes):
        key = f"{prefix}-{number}"
        data = rng.randbytes(size)
        path = folder / key
        await asyncio.to_thread(path.write_bytes, data)
        refs[key] = await client.store_file(path, key)
        contents[key] = data
    return contents, refs


async def assert_reads_back(client: Client, contents: Mapping[str, bytes], context: str) -> None:
    """Every file, looked up by key through its record, reads back byte-identical (from
    what the surviving acceptors of its record hold when R - 1 of them are dead)."""
    for key, data in contents.items():
        info = await client.file_info(key)
        restored = await client.chunks.get_blob(info.ref)
        assert len(restored) == len(data), f"{key} ({context}, {SEED_ENV}={SEED})"
        assert restored == data, f"{key} differs ({context}, {SEED_ENV}={SEED})"


async def repair_figures(
    probe: HttpProbe, cluster: LocalCluster, peer_ids: Collection[str]
) -> dict[str, dict[str, Any]]:
    """Per peer: rounds, when its last round started, and that round's figures."""
    figures = {}
    for peer_id, info in (await infos(probe, cluster, peer_ids)).items():
        last = info["repair"]["last"] or {}
        figures[peer_id] = {
            "rounds": info["repair"]["rounds"],
            "started_at": last.get("started_at", 0.0),
            "under": last.get("chunks_under_replicated"),
            "lost": last.get("chunks_lost"),
            "hints": info["hints_pending"],
        }
    return figures


def healed_check(
    probe: HttpProbe,
    client: Client,
    cluster: LocalCluster,
    chunk_ids: Collection[str],
    owners: Collection[str],
    since: float,
) -> Check:
    """Done when every owner finished a repair round started after ``since`` (unix time),
    the ring reports no under-replicated or lost chunk and no pending hint, and every
    chunk sits on exactly its preference list among ``owners``."""

    async def check() -> tuple[bool, object]:
        figures = await repair_figures(probe, cluster, owners)
        stale = {p: f for p, f in figures.items() if f["started_at"] <= since}
        if stale:
            return False, f"no repair round since the change on: {stale}"
        status = await client.status()
        if status.chunks_under_replicated or status.chunks_lost:
            return False, f"status: {status.chunks_under_replicated} under-replicated, " + (
                f"{status.chunks_lost} lost; peers: {figures}"
            )
        if any(f["hints"] for f in figures.values()):
            return False, f"hints pending: {figures}"
        wrong = misplaced(cluster, chunk_ids, owners)
        if wrong:
            sample = dict(list(wrong.items())[:4])
            return False, f"{len(wrong)} chunks not exactly on their preference list: {sample}"
        return True, figures

    return check


def start_stranger(
    home: Path, listen: str, seeds: Sequence[str], secret: str, flags: Sequence[str]
) -> subprocess.Popen[bytes]:
    """A real ``sr3 peer`` process with its own secret, pointed at the ring's seeds."""
    home.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "sr3", "peer",
        "--id", "intruder", "--listen", listen, "--data", str(home / "data"),
        "--seeds", ",".join(seeds), *flags,
    ]  # fmt: skip
    with open(home / "peer.log", "ab") as log_handle:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT,
            env={**os.environ, "SR3_SECRET": secret}, start_new_session=True,
        )  # fmt: skip


def end_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def flip_byte(path: Path, offset: int) -> None:
    """Invert one byte of a file in place, as a rotting disk would."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def dropped(info: Mapping[str, Any], reason: str) -> int:
    return int(info["overlay"]["dropped"][reason])


# -- tests ----------------------------------------------------------------------------------


async def test_sigkill_two_of_eight_peers_loses_nothing_and_returns_to_three_replicas(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: 2 of 8 peers (R=3, W=2), chosen with the seeded generator, SIGKILLed
    together while the ring holds a few MiB of files in 256 KiB chunks.
    Must hold: every file reads back byte-identical right away (invariant 2); once the
    survivors have removed the dead peers from placement (removal grace) and run repair
    rounds, ``sr3 status --json`` reports 0 under-replicated and 0 lost chunks, and on
    disk every chunk is on exactly its 3 preference peers of the survivors' ring
    (invariant 3: no operator action)."""
    cluster = make_cluster(8, peer_flags=peer_flags(rng))
    options = ClientOptions(chunk_bytes=CHUNK_BYTES)
    sizes = [2 * MIB + 12_345, MIB + 777, 700 * KIB, 1536 * KIB, 300 * KIB + 5, 90 * KIB]
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        contents, refs = await store_files(client, tmp_path / "files", rng, sizes, "kill")
    chunk_ids = chunk_ids_of(refs)
    assert len(chunk_ids) >= 20
    everyone = ids(cluster)
    assert misplaced(cluster, chunk_ids, everyone) == {}

    victims = sorted(rng.sample(everyone, 2))
    survivors = [p for p in everyone if p not in victims]
    async with HttpProbe(cluster.secret) as probe:
        rounds_before = {p: f["rounds"] for p, f in (await repair_figures(
            probe, cluster, survivors)).items()}  # fmt: skip
        for victim in victims:
            await asyncio.to_thread(cluster.kill, victim)
        killed_at = time.time()
        print(f"killed {victims} (replay with {SEED_ENV}={SEED})")

        async with Client(ring_of(cluster, survivors), cluster.secret) as client:
            await assert_reads_back(client, contents, f"right after killing {victims}")

            async def removed() -> tuple[bool, object]:
                seen = await views(probe, cluster, survivors)
                pending = {
                    p: {v: table[v][0] for v in victims}
                    for p, table in seen.items()
                    if any(table[v][0] != "removed" for v in victims)
                }
                return not pending, f"victims as survivors see them: {pending}"

            await wait_for(f"survivors remove {victims} from placement", removed)
            removed_at = time.time()
            figures = await wait_for(
                "ring back to 3 replicas per chunk",
                healed_check(probe, client, cluster, chunk_ids, survivors, removed_at),
            )
            assert isinstance(figures, dict)
            assert all(figures[p]["rounds"] > rounds_before[p] for p in survivors), figures
            print(f"healed {time.time() - killed_at:.1f} s after the kill")
            await assert_reads_back(client, contents, f"after healing from {victims}")

    # The command line reports the same, from the cluster file like an operator's shell.
    env = {k: v for k, v in os.environ.items() if k not in ("SR3_RING", "SR3_SECRET")}
    env["SR3_CLUSTER_FILE"] = str(cluster.cluster_file)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sr3", "status", "--json"],
        capture_output=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert (report["chunks_under_replicated"], report["chunks_lost"]) == (0, 0), report
    states = {peer["id"]: peer["state"] for peer in report["peers"]}
    expected = {p: "removed" if p in victims else "up" for p in everyone}
    if states != expected:
        # Seen once under load (victims "down"): say what each survivor's table holds now.
        async with HttpProbe(cluster.secret) as probe:
            seen = await views(probe, cluster, survivors)
        tables = {p: {v: table[v] for v in victims} for p, table in seen.items()}
        said = [peer for peer in report["peers"] if peer["id"] in victims]
        raise AssertionError(f"status says {said}; survivors' tables now: {tables}")


async def test_sigstopped_peer_gets_its_hinted_writes_back_and_extra_copies_go(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: one of 5 peers is SIGSTOPped (frozen, its sockets still accept) past the
    failure timeout but well inside the removal grace, and files are written meanwhile.
    Must hold: the others mark it down; the writes succeed, and every chunk it should
    hold went to a stand-in with a hint naming it (a hint file on some peer); after
    SIGCONT it is up again, holds every chunk of those files its preference list gives
    it, no hint stays pending anywhere, and the stand-ins' extra copies are collected:
    each chunk ends on exactly its R preference peers."""
    cluster = make_cluster(5, peer_flags=peer_flags(rng, removal_grace_s=30.0))
    everyone = ids(cluster)
    victim = rng.choice(everyone)
    others = [p for p in everyone if p != victim]
    options = ClientOptions(chunk_bytes=CHUNK_BYTES)
    async with HttpProbe(cluster.secret) as probe:
        cluster.signal(victim, signal.SIGSTOP)
        try:

            async def victim_down() -> tuple[bool, object]:
                seen = {p: table[victim] for p, table in (await views(
                    probe, cluster, others)).items()}  # fmt: skip
                return all(state[0] == "down" for state in seen.values()), seen

            await wait_for(f"{victim} (SIGSTOPped) seen down", victim_down)
            # It still accepts connections and never answers: that must not slow the
            # others' heartbeats so much that they take each other for down.
            watch_until = time.monotonic() + 2 * FAILURE_TIMEOUT_S
            while time.monotonic() < watch_until:
                seen = await views(probe, cluster, others)
                flapping = {
                    (observer, p): table[p]
                    for observer, table in seen.items()
                    for p in others
                    if table[p][0] != "up"
                }
                assert not flapping, f"live peers seen not up: {flapping} ({SEED_ENV}={SEED})"
                await asyncio.sleep(POLL_INTERVAL_S / 2)
            async with Client(ring_of(cluster, others), cluster.secret, options=options) as client:
                sizes = [MIB + 4321, 768 * KIB, 1280 * KIB, 200 * KIB]
                contents, refs = await store_files(client, tmp_path / "files", rng, sizes, "stop")
            chunk_ids = chunk_ids_of(refs)
            for_victim = {c for c in chunk_ids if victim in preference(cluster, everyone, c)}
            assert for_victim, "no new chunk is placed on the stopped peer"
            assert not (stored_chunk_ids(cluster, victim) & chunk_ids)
            hinted = {
                path.name.partition(".")[0]
                for p in others
                for path in (Path(cluster.peer(p).data_dir) / "hints").glob(f"*.{victim}")
            }
            assert for_victim <= hinted, f"no hint for {sorted(for_victim - hinted)}"
            pending = {p: info["hints_pending"] for p, info in (await infos(
                probe, cluster, others)).items()}  # fmt: skip
            assert sum(pending.values()) >= len(for_victim), pending
            states = await views(probe, cluster, others)
            assert all(table[victim][0] == "down" for table in states.values()), states
            assert all(table[p][0] == "up" for table in states.values() for p in others), states
        finally:
            cluster.signal(victim, signal.SIGCONT)
        resumed_at = time.time()

        async def victim_up() -> tuple[bool, object]:
            seen = {p: table[victim] for p, table in (await views(probe, cluster, others)).items()}
            return all(state[0] == "up" for state in seen.values()), seen

        await wait_for(f"{victim} (SIGCONTed) seen up", victim_up)
        async with Client(cluster.ring, cluster.secret, options=options) as client:
            await wait_for(
                "hints handed back and extra copies collected",
                healed_check(probe, client, cluster, chunk_ids, everyone, resumed_at),
            )
            assert for_victim <= stored_chunk_ids(cluster, victim)
            delivered = sum(
                info["repair"]["hints_delivered_total"]
                for info in (await infos(probe, cluster, others)).values()
            )
            assert delivered >= len(for_victim)
            await assert_reads_back(client, contents, f"after {victim} came back")


async def test_repair_copies_a_fast_create_to_the_acceptor_it_did_not_ask_once(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: records created in the fast round, which asks four of each key's five
    acceptors. Must hold: repair brings every record to all five acceptors with the
    value chosen, and sends each record's copy once (the first holder pushes, not all
    four): accepts served on all peers end at exactly five per record."""
    cluster = make_cluster(5, peer_flags=peer_flags(rng))
    keys = [f"fast/{index}" for index in range(20)]
    async with Client(cluster.ring, cluster.secret) as client:
        for key in keys:
            assert await client.put_record(key, key.encode(), expected_version=0) == 1
        assert client.records.proposer.stats.fast_creates == len(keys)
    async with HttpProbe(cluster.secret) as probe:

        async def on_every_acceptor() -> tuple[bool, object]:
            missing = []
            for key in keys:
                acceptors = await acceptors_of(probe, address(cluster, ids(cluster)[0]), key)
                for peer_id in acceptors:
                    path = records_api.record_raw_path(key)
                    answer = await probe.signed(address(cluster, peer_id), "GET", path)
                    slot = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)[0]
                    if slot.value.data != key.encode():
                        missing.append((key, peer_id))
            return not missing, missing

        await wait_for("every acceptor holds every record", on_every_acceptor)
        # Two more repair rounds: nothing is pushed again.
        await asyncio.sleep(3 * REPAIR_INTERVAL_S)
        accepts = await served_accepts(probe, cluster)
    assert accepts == 5 * len(keys), accepts


async def served_accepts(probe: HttpProbe, cluster: LocalCluster) -> float:
    """Record accepts served by all the peers of ``cluster`` so far."""
    accepts = 0.0
    for peer_id in ids(cluster):
        text = await probe.metrics(address(cluster, peer_id))
        accepts += sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith("sr3_peer_requests_total{") and 'route="/v1/paxos/accept/' in line
        )
    return accepts


async def test_repair_leaves_what_was_just_written_to_the_writer_s_own_requests(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: a create's fast-round accepts, and a chunk's PUTs, reach the first of
    their peers well before the others (a writer slow to reach them), while that peer's
    repair rounds run. Must hold: its repair pushes neither while the writer's own
    requests may still be on their way (it counts the pushes it deferred); once they have
    landed, the record goes only to the acceptor the writer did not ask (five accepts
    served in all, not one more per acceptor the writer was about to reach) and the chunk
    to nobody (no byte pushed)."""
    # Room to spare on a loaded machine between the first requests and the others.
    cluster = make_cluster(5, peer_flags=peer_flags(rng, extra=["--repair-settle", "10"]))
    key = "settle/0"
    value = Value(1, b"written", op="5e")
    body = paxos.encode_slot(Slot(paxos.FAST, paxos.FAST, value))
    chunk_id, stored = codec.encode(rng.randbytes(64 * KIB))
    holders = preference(cluster, ids(cluster), chunk_id)
    async with HttpProbe(cluster.secret) as probe:
        acceptors = await acceptors_of(probe, address(cluster, ids(cluster)[0]), key)
        assert len(acceptors) == 5, acceptors
        path = records_api.accept_path(key, paxos.FAST.wire(), paxos.view_digest(acceptors))

        async def accept(peer_id: str) -> None:
            answer = await probe.signed(address(cluster, peer_id), "POST", path, body=body)
            assert answer.status == 200, (peer_id, answer.status, answer.body[:300])

        async def put(peer_id: str) -> None:
            answer = await probe.signed(
                address(cluster, peer_id), "PUT", api.chunk_path(chunk_id), body=stored
            )
            assert answer.status == 201, (peer_id, answer.status, answer.body[:300])

        async def repair(peer_id: str) -> dict[str, Any]:
            info: dict[str, Any] = (await probe.info(address(cluster, peer_id)))["repair"]
            return info

        firsts = {acceptors[0], holders[0]}
        await asyncio.gather(accept(acceptors[0]), put(holders[0]))
        rounds_then = {p: (await repair(p))["rounds"] for p in firsts}

        async def rounds_after() -> tuple[bool, object]:
            rounds = {p: (await repair(p))["rounds"] for p in firsts}
            return all(rounds[p] >= rounds_then[p] + 2 for p in firsts), rounds

        # A whole round of each first peer's repair runs with the record or chunk there.
        await wait_for(f"two repair rounds on {sorted(firsts)}", rounds_after)
        await asyncio.gather(
            *(accept(peer_id) for peer_id in acceptors[1:4]),
            *(put(peer_id) for peer_id in holders[1:]),
        )

        async def on_every_acceptor() -> tuple[bool, object]:
            held = {}
            for peer_id in acceptors:
                raw = await probe.signed(
                    address(cluster, peer_id), "GET", records_api.record_raw_path(key)
                )
                held[peer_id] = paxos.decode_slot(raw.body, api.RECORD_BYTES_MAX)[0].value
            return all(v == value for v in held.values()), held

        await wait_for("every acceptor holds the record", on_every_acceptor)
        await asyncio.sleep(3 * REPAIR_INTERVAL_S)
        accepts = await served_accepts(probe, cluster)
        reports = {p: await repair(p) for p in ids(cluster)}
        deferred_metric = sum(
            [
                metric_value(await probe.metrics(address(cluster, p)), "sr3_repair_pushes_deferred")
                for p in ids(cluster)
            ]
        )
    assert accepts == 5, accepts
    assert sum(r["bytes_pushed_total"] for r in reports.values()) == 0, reports
    # Four record pushes and two chunk pushes a round, for at least two rounds.
    assert sum(r["pushes_deferred_total"] for r in reports.values()) >= 12, reports
    assert deferred_metric >= 12, deferred_metric


async def test_repair_asks_about_every_record_past_one_query_s_worth(
    rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: two peers each hold the same record slots, more of them than one versions
    query names (``api.LIST_LIMIT_MAX``), written while the peers were stopped (a large
    state store's records). Must hold: each peer's repair asks the other about every key,
    in as many queries as it takes, and so sends no accept: both already hold every slot
    at the same ballot."""
    keys = api.LIST_LIMIT_MAX + 50
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR or tmp_path) as home:
        cluster = start_cluster(Path(home) / "cluster", 2, peer_flags=peer_flags(rng))
        try:
            await _records_past_one_query(cluster, keys)
        finally:
            cluster.down(purge=True)


async def _records_past_one_query(cluster: LocalCluster, keys: int) -> None:
    for peer_id in ids(cluster):
        cluster.stop(peer_id)
    first, second = (Path(cluster.peer(p).data_dir) for p in ids(cluster))
    store = RecordStore(first)
    store.open()
    value = Value(1, b"state", op="5e")
    for index in range(keys):
        await store.accept(f"many/{index:06d}", paxos.FAST, value)
    shutil.copytree(first / "records", second / "records", dirs_exist_ok=True)
    cluster.start()
    async with HttpProbe(cluster.secret) as probe:

        async def three_rounds() -> tuple[bool, object]:
            rounds = {
                p: (await probe.info(address(cluster, p)))["repair"]["rounds"] for p in ids(cluster)
            }
            return all(r >= 3 for r in rounds.values()), rounds

        await wait_for("three repair rounds on each peer", three_rounds)
        assert (await probe.info(address(cluster, ids(cluster)[0])))["record_count"] == keys
        assert await served_accepts(probe, cluster) == 0


async def test_a_joining_peer_takes_about_one_nth_of_the_data_and_nothing_else_moves(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: a sixth peer joins a loaded 5-peer ring (R=3).
    Must hold: repair copies to it exactly the chunks whose preference list now names
    it, and the other peers drop the copies they no longer own: every chunk ends on
    exactly its 3 preference peers of the 6-peer ring; the fraction of stored bytes that
    moved is close to the ideal 1/N (reported); every file still reads back."""
    cluster = make_cluster(5, peer_flags=peer_flags(rng))
    options = ClientOptions(chunk_bytes=128 * KIB)
    sizes = [3 * MIB + 999, 2 * MIB, 1536 * KIB + 7, MIB, 512 * KIB]
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        contents, refs = await store_files(client, tmp_path / "files", rng, sizes, "join")
    chunk_ids = chunk_ids_of(refs)
    assert len(chunk_ids) >= 60
    assert misplaced(cluster, chunk_ids, ids(cluster)) == {}

    newcomer = (await asyncio.to_thread(cluster.add_peer)).peer_id
    joined_at = time.time()
    everyone = ids(cluster)
    async with HttpProbe(cluster.secret) as probe:

        async def known() -> tuple[bool, object]:
            seen = await views(probe, cluster, everyone)
            late = {p: table.get(newcomer) for p, table in seen.items()}
            return all(state and state[0] == "up" for state in late.values()), late

        await wait_for(f"every peer sees {newcomer} up", known)
        async with Client(cluster.ring, cluster.secret, options=options) as client:
            await wait_for(
                f"ring rebalanced onto {newcomer}",
                healed_check(probe, client, cluster, chunk_ids, everyone, joined_at),
            )
            figures = await infos(probe, cluster, everyone)
            await assert_reads_back(client, contents, f"after {newcomer} joined")

    total_bytes = sum(info["stored_bytes"] for info in figures.values())
    moved_bytes = figures[newcomer]["stored_bytes"]
    placed = {c for c in chunk_ids if newcomer in preference(cluster, everyone, c)}
    placed_bytes = sum(chunk_file(cluster, newcomer, c).stat().st_size for c in placed)
    assert stored_chunk_ids(cluster, newcomer) == placed
    assert moved_bytes == placed_bytes
    pushed = sum(info["repair"]["bytes_pushed_total"] for info in figures.values())
    fraction = moved_bytes / total_bytes
    peers = len(everyone)
    print(
        f"join of peer {peers}: moved {moved_bytes} of {total_bytes} stored bytes = "
        f"{fraction:.3f} (ideal 1/N = {1 / peers:.3f}, ratio {fraction * peers:.2f}); "
        f"repair pushed {pushed} bytes ({pushed / max(moved_bytes, 1):.2f}x what moved)"
    )
    assert 0.4 / peers <= fraction <= 1.8 / peers, (fraction, SEED)


async def test_scrubber_starts_a_pass_once_per_interval_not_back_to_back(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Must hold: a peer whose passes take a moment starts the next pass only once
    ``--scrub-interval`` has passed since the last one started (an idle peer does not
    re-verify its chunks over and over)."""
    interval_s = 3.0
    flags = ["--scrub-rate", "100MB/s", "--scrub-interval", str(interval_s)]
    cluster = make_cluster(1, peer_flags=peer_flags(rng, extra=flags))
    peer = cluster.cluster.peers[0]
    async with HttpProbe(cluster.secret) as probe:

        async def passes_at_least(count: int) -> tuple[bool, object]:
            passes = (await probe.info(peer.address))["scrub"]["passes"]
            return passes >= count, passes

        await wait_for("the first scrub pass", lambda: passes_at_least(1))
        first_done = time.monotonic()
        await wait_for("the second scrub pass", lambda: passes_at_least(2))
        # The first pass (an empty store) ended within moments of its start.
        assert time.monotonic() - first_done >= interval_s - 0.5


async def test_scrubber_quarantines_a_rotten_chunk_and_restores_it_from_a_replica(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: one byte of one chunk file on one peer is flipped on disk, behind the
    peer's back (nobody reads the chunk afterwards).
    Must hold: that peer's scrubber (fast scrub rate, a pass every 0.5 s) finds it, moves
    the file to quarantine, and fetches a good copy from a replica: the peer serves the chunk again
    and it verifies; /v1/info counts it (scrub corrupt_found, repaired, quarantined);
    the peer stays up, in the same process."""
    scrubbing = ["--scrub-rate", "100MB/s", "--scrub-interval", "0.5"]
    cluster = make_cluster(3, peer_flags=peer_flags(rng, extra=scrubbing))
    async with Client(
        cluster.ring, cluster.secret, options=ClientOptions(chunk_bytes=CHUNK_BYTES)
    ) as client:
        contents, refs = await store_files(client, tmp_path / "files", rng, [MIB + 3], "scrub")
    chunk_id = rng.choice(sorted(chunk_ids_of(refs)))
    victim = rng.choice(sorted(chunk_holders(cluster, chunk_id)))
    pid = cluster.peer(victim).pid
    path = chunk_file(cluster, victim, chunk_id)
    good = path.read_bytes()
    offset = rng.randrange(codec.HEADER_BYTES, len(good))
    async with HttpProbe(cluster.secret) as probe:
        before = await probe.info(address(cluster, victim))
        await asyncio.to_thread(flip_byte, path, offset)
        assert path.read_bytes() != good

        async def restored() -> tuple[bool, object]:
            info = await probe.info(address(cluster, victim))
            scrub, quarantined = info["scrub"], info["quarantined"]
            seen = {"scrub": scrub, "quarantined": quarantined, "on_disk": path.is_file()}
            done = (
                scrub["corrupt_found"] > before["scrub"]["corrupt_found"]
                and scrub["repaired"] > before["scrub"]["repaired"]
                and quarantined > before["quarantined"]
                and path.is_file()
            )
            return done, seen

        await wait_for(f"scrubber on {victim} restores {chunk_id}", restored)
        assert path.read_bytes() == good
        answer = await probe.signed(address(cluster, victim), "GET", f"/v1/chunks/{chunk_id}")
        assert answer.status == 200, answer
        codec.decode(answer.body, chunk_id)  # raises unless it verifies end to end
        quarantine = Path(cluster.peer(victim).data_dir) / "quarantine"
        assert [p.name for p in quarantine.glob(f"{chunk_id}.*")], "nothing quarantined"
        assert await probe.health(address(cluster, victim)) == 200
    assert cluster.running(victim) and cluster.peer(victim).pid == pid
    async with Client(cluster.ring, cluster.secret) as client:
        await assert_reads_back(client, contents, "after scrubbing")


async def test_a_peer_with_another_secret_never_joins_and_garbage_is_dropped(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: a real peer process with a different secret joins through the ring's
    seeds (overlay datagrams and HTTP gossip); then garbage and oversized datagrams are
    sent to an honest peer's overlay port.
    Must hold: the stranger never appears in any honest peer's member table or ring,
    and it learns nobody; the honest peers drop its datagrams (overlay ``bad_tag`` grows)
    and refuse its gossip (auth failures grow); garbage is dropped and counted
    (``bad_tag``, ``oversized``); every honest peer stays up and sees the others up."""
    flags = peer_flags(rng)
    cluster = make_cluster(3, peer_flags=flags)
    honest = ids(cluster)
    seeds = [address(cluster, p) for p in honest[:2]]
    stranger_host = f"127.0.0.{len(honest) + 1}"
    stranger_address = f"{stranger_host}:{pick_port([stranger_host], next_base_port())}"
    stranger_secret = generate_secret()
    async with HttpProbe(cluster.secret) as probe, HttpProbe(stranger_secret) as stranger_probe:
        before = await infos(probe, cluster, honest)
        refused_before = {
            p: metric_value(await probe.metrics(address(cluster, p)), AUTH_FAILURES_METRIC)
            for p in honest
        }
        process = start_stranger(tmp_path / "stranger", stranger_address, seeds,
                                 stranger_secret, flags)  # fmt: skip
        try:

            async def stranger_tried() -> tuple[bool, object]:
                assert process.poll() is None, f"the stranger exited: {process.returncode}"
                now = await infos(probe, cluster, honest)
                bad_tags = {p: dropped(now[p], "bad_tag") - dropped(before[p], "bad_tag")
                            for p in honest}  # fmt: skip
                refused = {
                    p: metric_value(await probe.metrics(address(cluster, p)), AUTH_FAILURES_METRIC)
                    - refused_before[p]
                    for p in honest
                }
                return sum(bad_tags.values()) > 0 and sum(refused.values()) > 0, (
                    f"bad_tag drops {bad_tags}, refused requests {refused}"
                )

            await wait_for("honest peers drop and refuse the stranger", stranger_tried)
            # Let the stranger keep trying for many gossip rounds, looking all along.
            watch_until = time.monotonic() + 15 * GOSSIP_INTERVAL_S + FAILURE_TIMEOUT_S
            while time.monotonic() < watch_until:
                for peer_id, table in (await views(probe, cluster, honest)).items():
                    assert set(table) == set(honest), (peer_id, table, SEED)
                    ring = (await probe.signed(address(cluster, peer_id), "GET", "/v1/ring")).json()
                    assert {m["peer_id"] for m in ring["members"]} == set(honest), ring
                await asyncio.sleep(POLL_INTERVAL_S)
            own = await member_states(stranger_probe, stranger_address)
            assert set(own) == {"intruder"}, own
        finally:
            await asyncio.to_thread(end_process, process)

        target = honest[0]
        host, _, port = address(cluster, target).rpartition(":")
        garbage = [rng.randbytes(rng.randrange(1, 600)) for _ in range(20)]
        oversized = [rng.randbytes(DATAGRAM_BYTES_MAX + 1 + rng.randrange(1000)) for _ in range(5)]
        mid = await probe.info(address(cluster, target))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for datagram in garbage + oversized:
                sender.sendto(datagram, (host, int(port)))

        async def garbage_dropped() -> tuple[bool, object]:
            info = await probe.info(address(cluster, target))
            grown = {
                reason: dropped(info, reason) - dropped(mid, reason)
                for reason in ("bad_tag", "oversized")
            }
            return grown["bad_tag"] >= len(garbage) and grown["oversized"] >= len(oversized), (
                f"grown: {grown}"
            )

        await wait_for(f"{target} drops the garbage datagrams", garbage_dropped)
        for peer_id, table in (await views(probe, cluster, honest)).items():
            assert all(table[p][0] == "up" for p in honest), (peer_id, table)
        for peer_id in honest:
            assert await probe.health(address(cluster, peer_id)) == 200
            assert cluster.running(peer_id), peer_id


async def test_graceful_leave_hands_everything_over_and_exits(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: one peer of a loaded 5-peer ring is asked to leave (``client.leave``,
    what ``sr3 peer leave`` does).
    Must hold: it hands its data over and exits by itself; the remaining peers record it
    as ``left``; no data is lost (every file reads back); the ring reports 0
    under-replicated and lost chunks and every chunk is on exactly its 3 preference peers
    of the remaining ring, none on the peer that left."""
    cluster = make_cluster(5, peer_flags=peer_flags(rng))
    options = ClientOptions(chunk_bytes=CHUNK_BYTES)
    sizes = [2 * MIB + 1, MIB + 1234, 600 * KIB, 256 * KIB]
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        contents, refs = await store_files(client, tmp_path / "files", rng, sizes, "leave")
    chunk_ids = chunk_ids_of(refs)
    everyone = ids(cluster)
    leaver = rng.choice(everyone)
    remaining = [p for p in everyone if p != leaver]
    assert stored_chunk_ids(cluster, leaver) & chunk_ids, "the leaver holds nothing"

    async with Client(cluster.ring, cluster.secret, options=options) as client:
        async with asyncio.timeout(HEAL_TIMEOUT_S):
            await client.leave(leaver, timeout_s=HEAL_TIMEOUT_S)
    left_at = time.time()

    async def exited() -> tuple[bool, object]:
        return not cluster.running(leaver), f"{leaver} pid {cluster.peer(leaver).pid}"

    await wait_for(f"{leaver} exits by itself after leaving", exited, timeout_s=20)
    await asyncio.to_thread(cluster.stop, leaver)  # reaps it
    log = await asyncio.to_thread(Path(cluster.peer(leaver).data_dir, "peer.log").read_text)
    assert "has left the ring" in log
    assert stored_chunk_ids(cluster, leaver) == set()

    async with HttpProbe(cluster.secret) as probe:
        seen = await views(probe, cluster, remaining)
        assert all(table[leaver][0] == "left" for table in seen.values()), seen
        async with Client(ring_of(cluster, remaining), cluster.secret) as client:
            await assert_reads_back(client, contents, f"after {leaver} left")
            await wait_for(
                f"ring back to 3 replicas after {leaver} left",
                healed_check(probe, client, cluster, chunk_ids, remaining, left_at),
            )
            status = await client.status()
    states = {peer.peer_id: peer.state for peer in status.peers}
    assert states == {p: "left" if p == leaver else "up" for p in everyone}, states


async def test_sigterm_is_announced_and_a_restart_comes_back_with_a_new_epoch(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: one of 4 peers is stopped with SIGTERM and started again, with a long
    failure timeout (20 s).
    Must hold: the stop is announced, so every other peer sees it ``down`` well before
    the failure timeout could have told them; after the restart it is ``up`` again
    everywhere with a higher epoch (its /v1/info and the others' member tables)."""
    failure_timeout_s = 20.0
    cluster = make_cluster(4, peer_flags=peer_flags(
        rng, failure_timeout_s=failure_timeout_s, removal_grace_s=60.0))  # fmt: skip
    everyone = ids(cluster)
    victim = rng.choice(everyone)
    others = [p for p in everyone if p != victim]
    async with HttpProbe(cluster.secret) as probe:
        epoch = (await probe.info(address(cluster, victim)))["epoch"]

        async def seen_as(state: str, epoch_min: int) -> tuple[bool, object]:
            seen = {p: table[victim] for p, table in (await views(probe, cluster, others)).items()}
            return all(s == state and e >= epoch_min for s, e in seen.values()), seen

        await wait_for(f"everyone sees {victim} up", lambda: seen_as("up", epoch))
        stopping = time.monotonic()
        await asyncio.to_thread(cluster.stop, victim)
        await wait_for(
            f"{victim} (SIGTERMed) seen down",
            lambda: seen_as("down", epoch),
            timeout_s=failure_timeout_s / 2,
        )
        print(f"{victim} seen down {time.monotonic() - stopping:.2f} s after SIGTERM")

        await asyncio.to_thread(cluster.start, victim)
        restarted = (await probe.info(address(cluster, victim)))["epoch"]
        assert restarted > epoch, (epoch, restarted)
        await wait_for(
            f"{victim} seen up again with epoch {restarted}",
            lambda: seen_as("up", restarted),
            timeout_s=failure_timeout_s / 2,
        )
