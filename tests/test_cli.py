"""The ``sr3`` command line end to end: real subprocesses, a real local cluster.

Every command runs as ``python -m sr3 ...`` with ``SR3_HOME`` in a temporary folder, so
the cluster file, peer data and logs live there and nothing else on the machine is read.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from support import next_base_port

from ring.client import Client, PeerStatus, RingStatus
from ring.config import ClusterFile
from ring.errors import ConfigError
from spark_connector.manifest import manifest_key
from sr3.cli import cli
from sr3.cli._shared import fail_cleanly
from sr3.cli.data import ring_health
from sr3.local import LocalCluster
from sr3.statedata import write_state_file

COMMAND_TIMEOUT_S = 60


class Sr3:
    """Runs ``sr3`` commands against one SR3_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE")
        }
        self.env["SR3_HOME"] = str(home)

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sr3", *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    def ok(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = self.run(*args, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = json.loads(self.ok("status", "--json"))
        return status


def _peer_alive(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) sr3 peer process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    zombie = any(line.startswith("State:") and "Z" in line for line in status.splitlines())
    return not zombie and b"sr3" in cmdline and b"peer" in cmdline


def _assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sr3: "), lines
    for internal in ("aiohttp", "ClientConnector", "ConnectionKey", "overwrite=True"):
        assert internal not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines


@pytest.fixture
def sr3(tmp_path: Path) -> Iterator[Sr3]:
    runner = Sr3(tmp_path / "home")
    yield runner
    cluster_file = runner.home / "cluster.json"
    if cluster_file.exists():  # the test failed before `cluster down`: stop its peers
        LocalCluster.load(cluster_file).down(purge=True)


def test_cli_end_to_end(sr3: Sr3, tmp_path: Path) -> None:
    """Breaks: peer-1 is SIGKILLed through ``sr3 cluster kill``; a wrong secret is set in
    SR3_SECRET. Must hold: up/status/put/get work and agree with each other; status shows
    the killed peer down; get still returns identical bytes; a wrong secret is exit code 1
    with one error line and no traceback; ``cluster down --purge`` stops every peer
    process and deletes the data."""
    out = sr3.ok("cluster", "up", "--peers", "3", "--base-port", str(next_base_port()))
    assert "3 peers up" in out
    cluster_file = sr3.home / "cluster.json"
    assert cluster_file.exists()

    status = sr3.status()
    assert (status["replication"], status["write_quorum"]) == (3, 2)
    peers = {peer["id"]: peer for peer in status["peers"]}
    assert sorted(peers) == ["peer-1", "peer-2", "peer-3"]
    for index, (peer_id, peer) in enumerate(sorted(peers.items()), start=1):
        assert peer["state"] == "up", peer
        assert peer["address"].startswith(f"127.0.0.{index}:"), peer
        assert isinstance(peer["pid"], int) and _peer_alive(peer["pid"]), peer
        assert peer["chunk_count"] == 0, peer_id
    pids = [peer["pid"] for peer in peers.values()]
    assert "peer-1" in sr3.ok("status")  # the table renders too

    source = tmp_path / "state.bin"
    write_state_file(source, 3 * 1024 * 1024 + 17, seed=5)
    assert sr3.ok("put", str(source), "--key", "job/state").strip() == "job/state"
    restored = tmp_path / "restored.bin"
    assert "verified" in sr3.ok("get", "job/state", "-o", str(restored))
    assert restored.read_bytes() == source.read_bytes()
    assert sum(peer["chunk_count"] for peer in sr3.status()["peers"]) >= 3

    assert "killed peer-1" in sr3.ok("cluster", "kill", "peer-1")
    assert not _peer_alive(peers["peer-1"]["pid"])
    after_kill = {peer["id"]: peer for peer in sr3.status()["peers"]}
    assert after_kill["peer-1"]["state"] == "down"
    assert after_kill["peer-1"]["pid"] is None
    killed_row = next(line for line in sr3.ok("status").splitlines() if "peer-1" in line)
    assert "?" not in killed_row and killed_row.count(" - ") >= 4, killed_row
    assert [after_kill[p]["state"] for p in ("peer-2", "peer-3")] == ["up", "up"]
    restored.unlink()
    sr3.ok("get", "job/state", "-o", str(restored))
    assert restored.read_bytes() == source.read_bytes()

    wrong = {"SR3_SECRET": "a-wrong-secret-of-enough-length"}
    _assert_one_line_error(sr3.run("status", "--json", env=wrong), "credentials")
    _assert_one_line_error(sr3.run("get", "job/state", "-o", str(tmp_path / "x"), env=wrong))
    _assert_one_line_error(sr3.run("put", str(source), env=wrong))
    assert not (tmp_path / "x").exists()
    _assert_one_line_error(sr3.run("get", "no/such/key", "-o", str(tmp_path / "x")), "no/such")

    out = sr3.ok("cluster", "down", "--purge")
    assert "stopped 3 peers" in out
    assert not cluster_file.exists()
    assert not any(_peer_alive(pid) for pid in pids)
    assert not (sr3.home / "cluster" / "peer-2").exists()
    _assert_one_line_error(sr3.run("status"), "sr3 cluster up")


def test_cli_errors_are_one_line(sr3: Sr3, tmp_path: Path) -> None:
    """Breaks: configuration that cannot work (a secret too short to sign with, a ring
    nobody listens on). Must hold: exit code 1 and a single ``error:`` line, never a
    traceback or a message wrapped over several lines."""
    dead_ring = {"SR3_RING": "127.0.0.1:9", "SR3_SECRET": "a-wrong-secret-of-enough-length"}
    _assert_one_line_error(sr3.run("status", env=dead_ring), "127.0.0.1:9")
    short_secret = {"SR3_RING": "127.0.0.1:9", "SR3_SECRET": "short"}
    _assert_one_line_error(sr3.run("status", env=short_secret), "secret")
    source = tmp_path / "f.bin"
    source.write_bytes(b"x")
    _assert_one_line_error(sr3.run("put", str(source), env=short_secret), "secret")


def test_a_ring_nobody_answers_on_is_named_with_its_source(sr3: Sr3) -> None:
    """Breaks: the ring address points where no peer listens, given by --ring and by
    SR3_RING. Must hold: one line ``sr3: cannot reach HOST:PORT (from --ring): connection
    refused`` (or ``SR3_RING``), exit code 1, no traceback and none of aiohttp's
    internals."""
    address = f"127.0.0.9:{next_base_port()}"
    secret = {"SR3_SECRET": "a-secret-of-enough-length-for-signing"}
    for command in (["status"], ["ls"], ["get", "k", "-o", "x"], ["spark", "list"]):
        done = sr3.run(*command, "--ring", address, env=secret)
        _assert_one_line_error(done, f"cannot reach {address} (from --ring): connection refused")
    done = sr3.run("status", env={**secret, "SR3_RING": address})
    _assert_one_line_error(done, f"cannot reach {address} (from SR3_RING): connection refused")


def _mount_tmpfs(path: Path, options: str) -> bool:
    """A tmpfs at ``path`` (root only; False where mounting is not allowed)."""
    path.mkdir()
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def test_get_into_a_folder_it_cannot_write_is_one_line_and_leaves_nothing(
    sr3: Sr3, tmp_path: Path
) -> None:
    """Breaks: the target of ``sr3 get`` lies under a file (ENOTDIR, for root too), on a
    read-only file system, and on one too small for the file (tmpfs mounts, when the test
    runs as root). Must hold: one ``sr3: cannot write <path>: <why>`` line, exit code 1,
    no traceback, no partial file left; the same get into a good folder still works."""
    sr3.ok("cluster", "up", "--peers", "3", "--base-port", str(next_base_port()))
    source = tmp_path / "state.bin"
    write_state_file(source, 256 * 1024, seed=3)
    sr3.ok("put", str(source), "--key", "big")

    under_a_file = source / "out.bin"
    _assert_one_line_error(sr3.run("get", "big", "-o", str(under_a_file)), "cannot write")

    mounts: list[Path] = []
    try:
        read_only = tmp_path / "ro"
        if _mount_tmpfs(read_only, "ro,size=1m"):
            mounts.append(read_only)
            done = sr3.run("get", "big", "-o", str(read_only / "out.bin"))
            _assert_one_line_error(done, "cannot write", "read-only")
            assert list(read_only.iterdir()) == []
        small = tmp_path / "small"
        if _mount_tmpfs(small, "size=64k"):
            mounts.append(small)
            done = sr3.run("get", "big", "-o", str(small / "out.bin"))
            _assert_one_line_error(done, "cannot write", "no space")
            assert list(small.iterdir()) == [], list(small.iterdir())
    finally:
        for mount in mounts:
            subprocess.run(["umount", str(mount)], check=False)
    if not mounts:
        print("not root or mount not allowed: read-only and full targets not exercised")
    good = tmp_path / "good.bin"
    sr3.ok("get", "big", "-o", str(good))
    assert good.read_bytes() == source.read_bytes()


def _peer(peer_id: str, address: str, state: str = "up", **figures: Any) -> PeerStatus:
    known = figures.pop("known", state == "up")
    values = {"stored_bytes": 1024, "chunk_count": 4, "record_count": 1} if known else {}
    return PeerStatus(
        peer_id, address, "", state, 0.6,
        values.get("stored_bytes"), values.get("chunk_count"), values.get("record_count"),
        ring_state=figures.pop("ring_state", state), **figures,
    )  # fmt: skip


def _status_output(monkeypatch: pytest.MonkeyPatch, status: RingStatus) -> str:
    """``sr3 status`` on a terminal 80 columns wide, against ``status``."""

    async def fake_status(_settings: object) -> RingStatus:
        return status

    monkeypatch.setattr("sr3.cli.data._status", fake_status)
    env = {
        "SR3_RING": "127.0.0.1:9", "SR3_SECRET": "a-secret-of-enough-length-for-signing",
        "COLUMNS": "80", "LINES": "40", "TTY_COMPATIBLE": "1", "NO_COLOR": "1",
    }  # fmt: skip
    result = CliRunner().invoke(cli, ["status"], env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)


def test_status_shows_dashes_for_unknown_figures_and_whole_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaks: a peer is down (no figures), another has not finished a repair round, and
    the addresses are long host names, on an 80-column terminal. Must hold: every unknown
    figure reads ``-`` (never ``?`` or ``0 B``), the ring's under-replicated count too,
    and every address appears whole on one line."""
    addresses = [f"storage-peer-{n:02d}.eu-west-1.compute.example.internal:7401" for n in (1, 2, 3)]
    status = RingStatus(3, 2, (
        _peer("peer-1", addresses[0], chunks_under_replicated=0, chunks_lost=0),
        _peer("peer-2", addresses[1]),
        _peer("peer-3", addresses[2], state="down", ring_state="up"),
    ))  # fmt: skip
    out = _status_output(monkeypatch, status)
    for address in addresses:
        assert address in out, out
    table = [line for line in out.splitlines() if ":7401" in line]
    rows = {m.group(): line for line in table if (m := re.search(r"peer-\d", line))}
    assert "?" not in out, out
    assert "0 B" not in rows["peer-3"], out
    assert rows["peer-3"].split()[-5:] == ["-"] * 5, out
    assert rows["peer-2"].split()[-3:] == ["-"] * 3, out
    assert "- chunks on fewer than R live owners" in out, out


def test_status_tells_placement_moving_from_under_replication_after_a_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaks: chunks are on fewer than R owners once with every peer up (a join: they
    move to the new owner) and once with a peer down or removed (a loss). Must hold:
    status says which, in the table's output and in ``--json``'s ``health``, and its
    title calls no chunk under-replicated (the count is of chunks off their owners)."""
    joined = RingStatus(3, 2, tuple(
        _peer(f"peer-{n}", f"127.0.0.{n}:7401", chunks_under_replicated=5 * (n < 3),
              chunks_lost=0) for n in (1, 2, 3, 4)
    ), chunks_under_replicated=10)  # fmt: skip
    out = _status_output(monkeypatch, joined)
    assert "placement moving after a join: 10 chunks not yet on all R=3" in out, out
    assert "10 chunks on fewer than R live owners" in out, out
    assert "under-replicated" not in out and "after a loss" not in out, out

    lost_one = RingStatus(3, 2, (
        *joined.peers[:3], _peer("peer-4", "127.0.0.4:7401", state="removed", known=False),
    ), chunks_under_replicated=10)  # fmt: skip
    out = _status_output(monkeypatch, lost_one)
    assert "under-replicated after a loss: 10 chunks" in out, out
    assert "peer-4 removed" in out, out

    result = CliRunner().invoke(
        cli, ["status", "--json"],
        env={"SR3_RING": "127.0.0.1:9", "SR3_SECRET": "a-secret-of-enough-length-for-signing"},
    )  # fmt: skip
    assert json.loads(result.stdout)["health"] == "under_replicated", result.stdout


def test_ring_health_tells_a_leave_from_a_join_and_moving_from_under_replicated() -> None:
    """Breaks: after a peer left (its hand-over done, so every chunk has R copies, some
    not yet on their new owners), while one is leaving, after a join, and with a peer
    down. Must hold: the first three are placement moving, after a leave or a join as
    the member states show; only copies gone with a member are under-replicated."""
    up = tuple(
        _peer(f"peer-{n}", f"127.0.0.{n}:7401", chunks_under_replicated=n - 1, chunks_lost=0)
        for n in (1, 2, 3)
    )
    left = ring_health(RingStatus(3, 2, (
        *up, _peer("peer-4", "127.0.0.4:7401", state="left", known=False),
    )))  # fmt: skip
    assert left.state == "moving", left
    assert left.summary == (
        "placement moving after a leave: 3 chunks not yet on all R=3 of their new owners "
        "(peer-4 left)"
    ), left
    leaving = ring_health(RingStatus(3, 2, (
        *up, _peer("peer-4", "127.0.0.4:7401", ring_state="leaving", chunks_under_replicated=0,
                   chunks_lost=0),
    )))  # fmt: skip
    assert leaving.state == "moving", leaving
    assert "after a leave" in leaving.summary and "peer-4 handing over" in leaving.summary
    joined = ring_health(RingStatus(3, 2, up))
    assert joined.state == "moving" and "after a join: 3 chunks" in joined.summary, joined
    down = ring_health(RingStatus(3, 2, (
        *up, _peer("peer-4", "127.0.0.4:7401", state="down", ring_state="up"),
    )))  # fmt: skip
    assert down.state == "under_replicated", down
    assert down.summary.startswith(
        "under-replicated after a loss: 3 chunks have fewer than R=3 live copies on their owners"
    ), down
    healthy = ring_health(RingStatus(3, 2, (
        _peer("peer-1", "127.0.0.1:7401", chunks_under_replicated=0, chunks_lost=0),
        _peer("peer-4", "127.0.0.4:7401", state="left", known=False),
    )))  # fmt: skip
    assert healthy.state == "healthy", healthy


def test_hints_from_lower_layers_name_the_cli_flag() -> None:
    """Breaks: a lower layer's message names a Python argument (``overwrite=True``), as
    spark_connector's restore does. Must hold: the CLI prints the flag (``--overwrite``)
    in its one line, exit code 1."""

    @click.command()
    @click.option("--overwrite", is_flag=True)
    @click.option("--batch", "batch_id", type=int)
    @fail_cleanly
    def restore(overwrite: bool, batch_id: int | None) -> None:
        raise ConfigError("/ckpt is not empty (pass overwrite=True to replace it, batch_id=3)")

    result = CliRunner().invoke(restore, [])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "sr3: /ckpt is not empty (pass --overwrite to replace it, --batch 3)"
    ), result.stderr


def _write_batches(cluster_file: Path, query: str, count: int) -> None:
    """``count`` manifests of ``query`` (forget lists and deletes them; it never reads
    what they say)."""
    cluster = ClusterFile.read(cluster_file)

    async def write() -> None:
        async with Client(",".join(cluster.addresses), cluster.secret) as client:
            for batch_id in range(count):
                key = manifest_key(query, batch_id)
                await client.put_record(key, b"{}", expected_version=0)

    asyncio.run(write())


def test_spark_forget_reports_what_it_deleted_and_what_is_left(sr3: Sr3) -> None:
    """Breaks: ``sr3 spark forget`` of a query the ring never held, then of a query with 12
    batches while 3 of 5 peers are killed (deletes cannot reach W on most keys). Must
    hold: an unknown query is one line ``no query named ...``, exit code 1; with peers
    down forget prints what it deleted and kept, then one line naming what is left,
    exit code 1; once the peers are back the same command finishes, exit code 0, and
    only the newest batches remain."""
    sr3.ok(
        "cluster", "up", "--peers", "5", "--base-port", str(next_base_port()),
        "--removal-grace", "300",
    )  # fmt: skip
    _assert_one_line_error(
        sr3.run("spark", "forget", "--query", "nope", "--keep", "1"), "no query named 'nope'"
    )
    _write_batches(sr3.home / "cluster.json", "clicks", 12)
    sr3.ok("cluster", "kill", "peer-1", "peer-2", "peer-3")
    done = sr3.run("spark", "forget", "--query", "clicks", "--keep", "2")
    _assert_one_line_error(done, "clicks:", "run the same command once the peers are back")
    assert done.stdout.startswith("clicks: deleted "), done.stdout
    assert "could not delete" in done.stderr or "did not answer" in done.stderr

    sr3.ok("cluster", "start")
    for _attempt in range(20):
        done = sr3.run("spark", "forget", "--query", "clicks", "--keep", "2")
        if done.returncode == 0:
            break
        time.sleep(0.5)  # the restarted peers are not yet up in every table
    assert done.returncode == 0, (done.stdout, done.stderr)
    listed = json.loads(sr3.ok("spark", "list", "--query", "clicks", "--json"))
    assert listed["queries"][0]["batches"] == [10, 11], listed


def test_ls_and_rm_round_trip(sr3: Sr3, tmp_path: Path) -> None:
    """Breaks: nothing; named files are listed, deleted, and an unknown key is named.
    Must hold: ``sr3 ls`` lists what ``sr3 put`` stored with its size (and a prefix
    narrows it); ``sr3 rm`` deletes, and names the keys that hold no file with exit code
    1; a deleted file is gone from ``ls`` and ``get``."""
    sr3.ok("cluster", "up", "--peers", "3", "--base-port", str(next_base_port()))
    for name, size in (("logs/a", 1000), ("logs/b", 2048), ("state", 10)):
        source = tmp_path / name.replace("/", "_")
        source.write_bytes(b"x" * size)
        sr3.ok("put", str(source), "--key", name)
    listed = {f["key"]: f["size"] for f in json.loads(sr3.ok("ls", "--json"))["files"]}
    assert listed == {"logs/a": 1000, "logs/b": 2048, "state": 10}, listed
    lines = sr3.ok("ls", "logs/").splitlines()
    assert [line.split()[0] for line in lines] == ["logs/a", "logs/b"], lines
    assert "2.0 KiB" in lines[1], lines

    done = sr3.run("rm", "logs/a", "no/such")
    _assert_one_line_error(done, "no file named 'no/such'")
    assert done.stdout.strip() == "deleted logs/a", done.stdout
    assert [line.split()[0] for line in sr3.ok("ls").splitlines()] == ["logs/b", "state"]
    _assert_one_line_error(sr3.run("get", "logs/a", "-o", str(tmp_path / "x")), "logs/a")
    assert sr3.ok("rm", "logs/b", "state").split() == ["deleted", "logs/b", "deleted", "state"]
    assert sr3.ok("ls").strip() == "no file on the ring"
