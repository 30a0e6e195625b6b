"""The ``sr3`` command line end to end: real subprocesses, a real local cluster.

Every command runs as ``python -m sr3 ...`` with ``SR3_HOME`` in a temporary folder, so
the cluster file, peer data and logs live there and nothing else on the machine is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import next_base_port

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
    assert lines[0].startswith("error: "), lines
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
