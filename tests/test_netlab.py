"""The network fault lab (``tests/netlab.py``) on real namespaces, and real peers in it.

What breaks and what must hold:

- Three hosts, each running a small HTTP server on its lab address: every host reaches
  every other; a partition ``[0] | [1, 2]`` cuts exactly the links across it, both ways,
  and ``heal`` restores them; a bridge cuts its two sides apart and leaves both their
  links to the shared host; one-way loss drops one direction only (seen with datagrams:
  a TCP connection needs both); 100 % random loss cuts a host off and leaves the others.
- SIGSTOP, SIGCONT and SIGKILL reach a process started in a host.
- Teardown, also after an error, leaves no namespace of the lab's prefix and no process
  it started or that was left in its namespaces.
- Three ``sr3 peer`` processes, one per host and started as ``sr3.local.peer_command``
  starts them, serve a record written and read back by a client on a fourth host.

Every probe runs inside the namespaces, with a short connect timeout. Where the lab
cannot run (not root, no ``nft``), these tests skip, or fail under ``SR3_REQUIRE_NETLAB=1``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import netlab
import pytest
from netlab import REQUIRE_NETLAB_ENV, NetLab, lab_namespaces, pid_alive, require_netlab

from ring.auth import generate_secret
from ring.config import ClusterFile, ClusterPeer
from ring.placement import VNODES_DEFAULT
from sr3.local import peer_command

HTTP_PORT = 8000
UDP_PORT = 9000
PEER_PORT = 7401
PEER_READY_WAIT_S = 60.0
CLIENT_TIMEOUT_S = 60.0


def pairs(hosts: int) -> list[tuple[int, int]]:
    return [(src, dst) for src in range(hosts) for dst in range(hosts) if src != dst]


@pytest.fixture
def lab3(tmp_path: Path) -> Iterator[NetLab]:
    """Three hosts, each serving HTTP on its lab address."""
    require_netlab()
    with NetLab(3) as lab:
        for index in range(3):
            server = [sys.executable, "-m", "http.server", "--bind", lab.address(index)]
            lab.start_peer(index, [*server, "--directory", str(tmp_path), str(HTTP_PORT)])
        for index in range(3):
            lab.wait_listening(index, index, HTTP_PORT)
        yield lab


def test_a_partition_cuts_exactly_the_links_across_it_until_healed(lab3: NetLab) -> None:
    assert all(lab3.reachability(pairs(3), HTTP_PORT).values())
    lab3.partition([[0], [1, 2]])
    reached = lab3.reachability(pairs(3), HTTP_PORT)
    assert reached == {
        (0, 1): False,
        (0, 2): False,
        (1, 0): False,
        (2, 0): False,
        (1, 2): True,
        (2, 1): True,
    }
    lab3.heal()
    assert all(lab3.reachability(pairs(3), HTTP_PORT).values())


def test_a_bridge_cuts_two_sides_apart_and_leaves_both_links_to_the_shared_host(
    lab3: NetLab,
) -> None:
    lab3.bridge([0], [2], shared=1)
    reached = lab3.reachability(pairs(3), HTTP_PORT)
    assert reached == {
        (0, 1): True,
        (1, 0): True,
        (1, 2): True,
        (2, 1): True,
        (0, 2): False,
        (2, 0): False,
    }


def test_one_way_loss_drops_one_direction_only(lab3: NetLab) -> None:
    lab3.one_way_loss(0, 1)
    assert not lab3.datagram_arrives(0, 1, UDP_PORT)
    assert lab3.datagram_arrives(1, 0, UDP_PORT)
    assert not lab3.can_connect(0, 1, HTTP_PORT)
    assert lab3.reachability([(0, 2), (2, 0), (1, 2), (2, 1)], HTTP_PORT) == {
        (0, 2): True,
        (2, 0): True,
        (1, 2): True,
        (2, 1): True,
    }


def test_full_random_loss_cuts_a_host_off_and_leaves_the_others(lab3: NetLab) -> None:
    lab3.random_loss(2, 1.0)
    reached = lab3.reachability(pairs(3), HTTP_PORT)
    assert reached == {pair: 2 not in pair for pair in pairs(3)}
    assert lab3.run(2, [sys.executable, "-c", "pass"]).returncode == 0  # lo still works
    lab3.heal()
    assert all(lab3.reachability(pairs(3), HTTP_PORT).values())


def process_state(pid: int, wanted: set[str], wait_s: float = 5.0) -> str:
    """The process's state letter once it is one of ``wanted`` (signals land
    asynchronously), or whatever it is after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state in wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def test_kill_stop_and_cont_signal_a_process_in_its_host(lab3: NetLab) -> None:
    process = lab3.start_peer(1, ["sleep", "60"])
    lab3.stop(process)
    assert process_state(process.pid, {"T"}) == "T"
    lab3.cont(process)
    assert process_state(process.pid, {"S", "R"}) in {"S", "R"}
    assert lab3.kill(process) == -9


def test_teardown_leaves_no_namespace_or_process_behind_also_after_an_error() -> None:
    require_netlab()
    lab = NetLab(2)
    with pytest.raises(RuntimeError, match="in the lab"), lab:
        assert lab_namespaces(lab.prefix) == sorted(lab.namespaces())
        assert len(lab.namespaces()) == 3  # the bridge's and two hosts'
        started = lab.start_peer(0, ["sleep", "60"])
        # A process that left the lab's session but lives on in a host's namespace.
        detached = [sys.executable, "-c", "import subprocess; print(subprocess.Popen("]
        detached[-1] += "['sleep', '60'], start_new_session=True, stdout=-3, stderr=-3).pid)"
        escaped = int(lab.run(1, detached).stdout)
        assert pid_alive(escaped)
        raise RuntimeError("a failure in the lab")
    assert lab_namespaces(lab.prefix) == []
    assert lab.namespaces() == []
    assert started.poll() is not None
    assert not pid_alive(escaped)


def test_without_the_lab_tests_skip_unless_ci_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netlab, "netlab_unavailable", lambda: "`nft` is missing")
    monkeypatch.delenv(REQUIRE_NETLAB_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="`nft` is missing"):
        require_netlab()
    monkeypatch.setenv(REQUIRE_NETLAB_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"SR3_REQUIRE_NETLAB=1 .*`nft` is missing"):
        require_netlab()
    monkeypatch.setenv(REQUIRE_NETLAB_ENV, "yes")
    with pytest.raises(pytest.UsageError, match="expected 1"):
        require_netlab()


# -- real peers ----------------------------------------------------------------------------

# Run on the client host: wait until every peer is ready and places every member.
READY_SCRIPT = """
import json, sys, time, urllib.request
addresses, deadline = sys.argv[1].split(","), time.monotonic() + float(sys.argv[2])
waiting = list(addresses)
while waiting and time.monotonic() < deadline:
    for address in list(waiting):
        try:
            with urllib.request.urlopen(f"http://{address}/v1/health", timeout=1) as answer:
                health = json.loads(answer.read())
        except (OSError, ValueError):
            continue
        if health.get("ready") and health.get("members") == len(addresses):
            waiting.remove(address)
    time.sleep(0.2)
print("waiting for", waiting)
sys.exit(1 if waiting else 0)
"""

# Run on the client host: create a record through the ring and read it back.
CLIENT_SCRIPT = """
import asyncio
from ring.client import Client

async def main():
    async with Client() as client:
        version = await client.put_record("netlab/smoke", b"across hosts", expected_version=0)
        record = await client.get_record("netlab/smoke")
        print(version, record.version, record.value.decode())

asyncio.run(main())
"""


@pytest.mark.slow
def test_peers_on_three_hosts_serve_a_client_on_a_fourth(tmp_path: Path) -> None:
    require_netlab()
    with NetLab(4) as lab:
        members = tuple(
            ClusterPeer(
                peer_id=f"peer-{index + 1}",
                address=f"{lab.address(index)}:{PEER_PORT}",
                data_dir=str(tmp_path / f"peer-{index + 1}"),
            )
            for index in range(3)
        )
        cluster = ClusterFile(
            secret=generate_secret(),
            replication=3,
            write_quorum=2,
            vnodes=VNODES_DEFAULT,
            peers=members,
            home=str(tmp_path),
        )
        env = {**os.environ, "SR3_SECRET": cluster.secret, "SR3_RING": ",".join(cluster.addresses)}
        for index, peer in enumerate(members):
            Path(peer.data_dir).mkdir()
            lab.start_peer(
                index,
                peer_command(cluster, peer),
                env=env,
                log_path=tmp_path / f"{peer.peer_id}.log",
            )
        ready = lab.run(
            3,
            [
                sys.executable,
                "-c",
                READY_SCRIPT,
                ",".join(cluster.addresses),
                str(PEER_READY_WAIT_S),
            ],
            timeout_s=PEER_READY_WAIT_S + 10,
        )
        assert ready.returncode == 0, (ready.stdout, ready.stderr, peer_logs(tmp_path))
        done = lab.run(
            3, [sys.executable, "-c", CLIENT_SCRIPT], env=env, timeout_s=CLIENT_TIMEOUT_S
        )
        assert done.returncode == 0, (done.stderr, peer_logs(tmp_path))
        assert done.stdout.strip() == "1 1 across hosts"


def peer_logs(home: Path) -> str:
    """The tail of every peer's log, for a failure message."""
    return "\n".join(f"{log.name}: {log.read_text()[-2000:]}" for log in sorted(home.glob("*.log")))
