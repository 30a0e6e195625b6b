"""A peer whose disk fills up stays up, serves what it holds and resumes by itself.

Breaks: the data folder of peer-1 is a 16 MiB tmpfs, filled to the last byte by a filler
file while the peer runs. Must hold, on a real peer process:

- a membership change (a third peer joins) does not kill it: the new member is in its
  table in memory while ``members.json`` cannot be saved;
- chunk writes and record rounds that would change a slot (a prepare, an accept, on a
  new key or one it holds) answer 507 ``storage_full`` (JSON), not 500, and the slot on
  disk is unchanged;
- what it stored before is still served, and health and info answer;
- it restarts on the full disk, with a larger epoch than its previous life;
- once the filler is deleted, writes succeed again and ``members.json`` and
  ``peer.json`` are saved, without a restart.

Mounting needs root: the test skips with a message otherwise (or when mount fails).
The tests after it check the pieces without a mount: which OS errors mean "no room",
the best-effort saving of small state files, and the epoch of a start on a full disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from support import Answer, HttpProbe, acceptors_of, next_base_port, small_disk

from ring import api, codec, paxos, records_api
from ring.client import Client
from ring.errors import StorageFull
from ring.files import PendingWrite, move_or_remove, write_file_atomic
from ring.node import SAVE_RETRY_INTERVAL_S, _next_epoch
from ring.paxos import FAST, Ballot, Slot, Value
from sr3.local import LocalCluster

DISK_BYTES = 16 * 1024 * 1024
FILL_BLOCK_BYTES = 1024 * 1024
WAIT_S = 20.0
KEY = "full-disk/kept"
# Records written before the disk fills: after peer-3 joins, some are still peer-1's.
KEPT_KEYS = [f"full-disk/kept-{index}" for index in range(8)]


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left."""
    block = b"\0" * FILL_BLOCK_BYTES
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    small = b"\0" * 512
    with open(path, "ab", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(small)


async def wait_for(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        await asyncio.sleep(0.2)


def saved_members(data_dir: Path) -> set[str]:
    if not (data_dir / "members.json").exists():
        return set()
    saved = json.loads((data_dir / "members.json").read_text())
    return {entry["peer_id"] for entry in saved["members"]}


def lines_with(log: Path, text: str) -> int:
    return sum(text in line for line in log.read_text().splitlines())


async def on_disk(found: bool) -> bool:
    return found


def saved_epoch(data_dir: Path) -> int:
    return int(json.loads((data_dir / "peer.json").read_text())["epoch"])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Two peers (R=2, W=1); peer-1's data folder is the small disk, its log outside it."""
    cluster = LocalCluster.create(
        tmp_path / "home", 2, replication=2, write_quorum=1,
        base_port=next_base_port(), cluster_file=tmp_path / "cluster.json",
        peer_flags=["--repair-interval", "3600", "--scrub-rate", "0", "--gc-interval", "0"],
    )  # fmt: skip
    first = cluster.cluster.peers[0]
    logs = tmp_path / "logs"
    logs.mkdir()
    peers = (replace(first, log_file=str(logs / "peer-1.log")), *cluster.cluster.peers[1:])
    cluster.cluster = replace(cluster.cluster, peers=peers)
    with small_disk(Path(first.data_dir), DISK_BYTES):
        try:
            cluster.up()
            yield cluster
        finally:
            cluster.down()


async def put_chunk(probe: HttpProbe, address: str, raw: bytes) -> tuple[str, Answer]:
    chunk_id, stored = codec.encode(raw)
    return chunk_id, await probe.signed(address, "PUT", f"/v1/chunks/{chunk_id}", body=stored)


async def owned_key(probe: HttpProbe, address: str, keys: list[str]) -> tuple[str, str]:
    """The first of ``keys`` that peer-1 answers for, and its view digest."""
    for key in keys:
        acceptors = await acceptors_of(probe, address, key)
        if "peer-1" in acceptors:
            return key, paxos.view_digest(acceptors)
    raise AssertionError(f"peer-1 is an acceptor of none of {keys}")


async def read_slot(probe: HttpProbe, address: str, key: str) -> Slot:
    answer = await probe.signed(address, "GET", records_api.record_raw_path(key))
    assert answer.status == 200, answer
    return paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)[0]


def proposal(ballot: Ballot, value: Value) -> bytes:
    return paxos.encode_slot(Slot(ballot, ballot, value))


def assert_storage_full(answer: Answer) -> None:
    assert answer.status == 507, (answer.status, answer.body[:300])
    assert answer.json()["error"] == "storage_full"


async def test_a_full_peer_stays_up_serves_and_resumes(cluster: LocalCluster) -> None:
    """Breaks: peer-1's disk fills up, then a peer joins and peer-1 restarts. Must hold:
    what the module docstring lists (507 for writes and record rounds, slots unchanged,
    reads served, a larger epoch, writes and saves resume once there is room)."""
    peer = cluster.peer("peer-1")
    address, data_dir, log = peer.address, Path(peer.data_dir), Path(peer.log_file)
    async with HttpProbe(cluster.secret) as probe:
        kept_id, answer = await put_chunk(probe, address, b"kept " * 2000)
        assert answer.status == 201
        async with Client(cluster.ring, cluster.secret) as client:
            for key in (KEY, *KEPT_KEYS):
                assert await client.put_record(key, b"kept value", expected_version=0) == 1
        epoch = (await probe.info(address))["epoch"]

        await wait_for(
            lambda: on_disk(saved_members(data_dir) == {"peer-1", "peer-2"}), "members.json"
        )
        fill(data_dir / "filler")
        # A membership change: the full peer learns peer-3 but cannot save its table.
        cluster.add_peer()

        async def learned_or_exited() -> bool:
            if not cluster.running("peer-1"):
                return True
            return (await probe.send(address, "GET", "/v1/health")).json()["members"] == 3

        await wait_for(learned_or_exited, "peer-1 learns peer-3")
        # Voting for peer-3's join took a few kilobytes of peer-1's configuration
        # reserve (ring.metadata): take them back, so the disk is full again.
        fill(data_dir / "filler-2")
        await asyncio.sleep(SAVE_RETRY_INTERVAL_S + 0.5)  # gossip rounds and a save retry
        assert cluster.running("peer-1"), "peer-1 exited after a membership change"
        # One warning per episode, not one per attempt.
        assert lines_with(log, "cannot save the member table") == 1

        await _refuses_writes_serves_reads(probe, address, kept_id)

        cluster.kill("peer-1")
        cluster.start("peer-1")  # waits until it is healthy
        info = await probe.info(address)
        assert info["epoch"] > epoch
        assert saved_epoch(data_dir) == epoch  # the new one waits for room
        await _refuses_writes_serves_reads(probe, address, kept_id)

        (data_dir / "filler").unlink()
        (data_dir / "filler-2").unlink()
        _, answer = await put_chunk(probe, address, b"after " * 2000)
        assert answer.status == 201, answer.body[:300]
        key, view = await owned_key(probe, address, [f"full-disk/after-{i}" for i in range(50)])
        room = Value(1, b"room", op="02")
        answer = await probe.signed(
            address,
            "POST",
            records_api.accept_path(key, FAST.wire(), view),
            body=proposal(FAST, room),
        )
        assert answer.status == 200, answer.body[:300]
        assert (await read_slot(probe, address, key)).value == room
        await wait_for(lambda: on_disk(saved_epoch(data_dir) == info["epoch"]), "peer.json saved")
        await wait_for(lambda: on_disk("peer-3" in saved_members(data_dir)), "members.json saved")
        assert cluster.running("peer-1")


async def _refuses_round(
    probe: HttpProbe, address: str, key: str, view: str, ballot: Ballot
) -> None:
    """A prepare and accepts (classic and fast) that would change ``key``'s slot: 507,
    and the slot as it was."""
    before = await read_slot(probe, address, key)
    body = proposal(ballot, Value(before.value.version + 1, b"no room", op="01"))
    for path, sent in [
        (records_api.prepare_path(key, ballot.wire(), view), None),
        (records_api.accept_path(key, ballot.wire(), view), body),
        (records_api.accept_path(key, ballot.following().wire(), view), body),
    ]:
        assert_storage_full(await probe.signed(address, "POST", path, body=sent))
    if before == paxos.NOTHING:
        path = records_api.accept_path(key, FAST.wire(), view)
        assert_storage_full(
            await probe.signed(address, "POST", path, body=proposal(FAST, Value(1)))
        )
    assert await read_slot(probe, address, key) == before


async def _refuses_writes_serves_reads(probe: HttpProbe, address: str, kept_id: str) -> None:
    _, answer = await put_chunk(probe, address, os.urandom(64 * 1024))
    assert_storage_full(answer)
    key, view = await owned_key(probe, address, [f"full-disk/new-{i}" for i in range(50)])
    await _refuses_round(probe, address, key, view, Ballot(1, "ab"))
    assert await read_slot(probe, address, key) == paxos.NOTHING
    key, view = await owned_key(probe, address, KEPT_KEYS)
    await _refuses_round(probe, address, key, view, Ballot(10**6, "ab"))
    kept = await probe.signed(address, "GET", f"/v1/chunks/{kept_id}")
    assert kept.status == 200
    assert codec.decode(kept.body, kept_id) == b"kept " * 2000
    for key in (KEY, *KEPT_KEYS):
        slot = await read_slot(probe, address, key)
        assert (slot.value.version, slot.value.data) == (1, b"kept value"), key
    assert await probe.health(address) == 200
    await probe.info(address)


def test_fill_leaves_no_room(tmp_path: Path) -> None:
    """The filler really fills the disk (else the test above proves nothing)."""
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        fill(disk / "filler")
        with pytest.raises(OSError) as caught, open(disk / "more", "wb", buffering=0) as more:
            more.write(b"x" * 4096)
        assert caught.value.errno == errno.ENOSPC


@pytest.mark.parametrize(
    ("code", "reason"),
    [(errno.ENOSPC, "disk full"), (errno.EDQUOT, "disk full"), (errno.EROFS, "read-only")],
)
def test_no_room_is_storage_full_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    def no_room(_fd: int) -> None:
        raise OSError(code, os.strerror(code))

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("ring.files.os.fsync", no_room)
    with pytest.raises(StorageFull, match=reason):
        write_file_atomic(tmp_path / "tmp", tmp_path / "state.json", b"{}")
    assert list(tmp_path.rglob("*")) == [tmp_path / "tmp"]


def test_other_os_errors_pass_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr("ring.files.os.fsync", broken)
    with pytest.raises(OSError) as caught:
        write_file_atomic(tmp_path, tmp_path / "state.json", b"{}")
    assert not isinstance(caught.value, StorageFull)
    assert list(tmp_path.iterdir()) == []


class Disk:
    """``write_file_atomic`` with a switch: no room while ``full``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.attempts = 0
        monkeypatch.setattr("ring.files.write_file_atomic", self.write)

    def write(self, tmp_dir: Path, final: Path, data: bytes) -> None:
        self.attempts += 1
        if self.full:
            raise StorageFull(f"disk full while writing {final.name}")
        write_file_atomic(tmp_dir, final, data)


def test_pending_write_keeps_the_newest_and_warns_once_per_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch)
    saved = PendingWrite(tmp_path, tmp_path / "members.json", "the member table")
    disk.full = True
    with caplog.at_level(logging.DEBUG, logger="ring.files"):
        for data in (b"1", b"2", b"3"):
            saved.set(data)
            assert not saved.flush()
        assert saved.pending and saved.failures == 3
        assert not (tmp_path / "members.json").exists()
        disk.full = False
        assert saved.flush()
        assert saved.flush()  # nothing pending: no write
    assert (tmp_path / "members.json").read_bytes() == b"3"
    assert disk.attempts == 4
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "saved the member table after 3 failed attempts" in caplog.text


@pytest.mark.parametrize(("wall_s", "epoch"), [(1.0, 1_000), (0.003, 8)])
def test_a_start_on_a_full_disk_still_grows_the_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wall_s: float, epoch: int
) -> None:
    """Breaks: peer.json cannot be written at start. Must hold: the peer starts with an
    epoch above the saved one (the wall clock's milliseconds when larger, so that several
    restarts on a full disk still grow it) and saves it once there is room."""
    (tmp_path / "tmp").mkdir()
    identity = PendingWrite(tmp_path / "tmp", tmp_path / "peer.json", "the peer identity")
    (tmp_path / "peer.json").write_text(json.dumps({"peer_id": "p1", "epoch": 7}))
    disk = Disk(monkeypatch)
    disk.full = True
    assert _next_epoch(identity, "p1", lambda: wall_s) == epoch
    assert saved_epoch(tmp_path) == 7
    disk.full = False
    assert identity.flush()
    assert saved_epoch(tmp_path) == epoch
    assert _next_epoch(identity, "p1", lambda: wall_s) == epoch + 1


def test_an_unsaved_epoch_is_never_followed_by_a_lower_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: a start on a full disk runs with an epoch it cannot save, and the peer is
    stopped before the retry saves it. Must hold: the next start, with room, still takes
    a larger epoch (other peers hold the unsaved one and ignore anything below it)."""
    (tmp_path / "tmp").mkdir()
    identity = PendingWrite(tmp_path / "tmp", tmp_path / "peer.json", "the peer identity")
    (tmp_path / "peer.json").write_text(json.dumps({"peer_id": "p1", "epoch": 7}))
    disk = Disk(monkeypatch)
    disk.full = True
    unsaved = _next_epoch(identity, "p1", lambda: 2.0)
    assert saved_epoch(tmp_path) == 7
    disk.full = False  # space freed while the peer was stopped; a new life starts
    fresh = PendingWrite(tmp_path / "tmp", tmp_path / "peer.json", "the peer identity")
    assert _next_epoch(fresh, "p1", lambda: 2.5) > unsaved


def test_a_read_only_disk_is_storage_full_and_cleanup_raises_nothing_else(tmp_path: Path) -> None:
    """Breaks: the data folder is remounted read-only (ext4 errors=remount-ro). Must
    hold: every write says StorageFull (a peer answers 507 and its loops go on), not the
    EROFS that even the cleanup's unlink of a missing temp file raises there."""
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        (disk / "tmp").mkdir()
        (disk / "kept").write_bytes(b"kept")
        remounted = subprocess.run(
            ["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True, check=False
        )
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remounted.stderr.strip()}")
        with pytest.raises(StorageFull):
            write_file_atomic(disk / "tmp", disk / "new", b"data")
        with pytest.raises(StorageFull):
            move_or_remove(disk / "kept", disk / "tmp" / "aside")
        saved = PendingWrite(disk / "tmp", disk / "members.json", "the member table")
        saved.set(b"{}")
        assert not saved.flush()
        assert (disk / "kept").read_bytes() == b"kept"
