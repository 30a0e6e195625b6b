"""Addresses by network: peers advertise an internal name for each other and an address
for clients elsewhere, and a client uses the addresses of the network it reached a seed
on (or the one it is told).

Real separation of names: each peer runs in a mount namespace of its own (``unshare
-m``) whose ``/etc/hosts`` names the peers ``peerN.sr3.test``, as a container network's
DNS does; the test process, like a host outside that network, cannot resolve those
names. Peers gossip, vote and replicate by name; the client reaches them at the
addresses they advertise on the ``external`` network. Needs root (mount namespaces):
skips without it, fails under ``SR3_REQUIRE_NETLAB=1`` (CI).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import HttpProbe, in_own_hosts, next_base_port, require_names_apart, stop_processes

from ring.auth import generate_secret
from ring.client import Client, ClientOptions
from ring.errors import DataUnavailable, PeerUnavailable, QuorumError
from sr3.statedata import state_bytes

PEERS = 3
WAIT_S = 40.0
DOMAIN = "sr3.test"


@pytest.fixture(scope="module")
def names_apart() -> None:
    require_names_apart()


@dataclass(frozen=True)
class NamedRing:
    secret: str
    # the address a client outside reaches each peer at (its 'external' network)
    external: tuple[str, ...]
    internal: tuple[str, ...]
    logs: tuple[Path, ...]


@pytest.fixture
def named_ring(names_apart: None, tmp_path: Path) -> Iterator[NamedRing]:
    """Three peers that know each other only by ``peerN.sr3.test`` names."""
    port = next_base_port()
    hosts = [f"127.0.0.{index}" for index in range(1, PEERS + 1)]
    names = [f"peer{index}.{DOMAIN}" for index in range(1, PEERS + 1)]
    hosts_file = tmp_path / "hosts"
    lines = [f"{host} {name}" for host, name in zip(hosts, names, strict=True)]
    hosts_file.write_text(Path("/etc/hosts").read_text() + "\n".join(lines) + "\n")
    secret = generate_secret()
    processes: list[subprocess.Popen[bytes]] = []
    logs = []
    for index, (host, name) in enumerate(zip(hosts, names, strict=True), start=1):
        data = tmp_path / f"peer-{index}"
        data.mkdir()
        command = [
            sys.executable, "-m", "sr3", "peer", "--id", f"peer-{index}",
            "--listen", f"{host}:{port}", "--advertise", f"{name}:{port}",
            "--advertise-networks", f"external={host}:{port}",
            "--data", str(data), "--seeds", "" if index == 1 else f"{names[0]}:{port}",
            "--replication", "3", "--write-quorum", "2", "--scrub-rate", "0",
        ]  # fmt: skip
        log = data / "peer.log"
        logs.append(log)
        with open(log, "ab") as handle:
            process = subprocess.Popen(
                in_own_hosts(hosts_file, command),
                stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                env={**os.environ, "SR3_SECRET": secret}, start_new_session=True,
            )  # fmt: skip
            processes.append(process)
    ring = NamedRing(
        secret,
        tuple(f"{host}:{port}" for host in hosts),
        tuple(f"{name}:{port}" for name in names),
        tuple(logs),
    )
    try:
        asyncio.run(_wait_formed(ring))
        yield ring
    finally:
        stop_processes(processes)


async def _wait_formed(ring: NamedRing) -> None:
    deadline = time.monotonic() + WAIT_S
    async with HttpProbe(ring.secret) as probe:
        for address in ring.external:
            while True:
                try:
                    answer = await probe.send(address, "GET", "/v1/health")
                    health = answer.json() if answer.status == 200 else {}
                except OSError:
                    health = {}
                if health.get("members") == PEERS and health.get("settled"):
                    break
                logs = "\n".join(log.read_text()[-2000:] for log in ring.logs)
                assert time.monotonic() < deadline, f"the ring did not form:\n{logs}"
                await asyncio.sleep(0.2)


async def test_a_client_outside_the_peers_network_uses_their_external_addresses(
    named_ring: NamedRing,
) -> None:
    """Breaks: the peers' own addresses (``peerN.sr3.test``) do not resolve where the
    client runs. Must hold: a client given one external address as its seed picks the
    'external' network, stores and reads a 3 MiB file and a record on every peer, and
    ``status`` lists every member at its external address."""
    data = state_bytes(3 * 1024 * 1024, seed=5)
    async with Client(named_ring.external[0], named_ring.secret) as client:
        view = await client.view.ring()
        assert view.network == "external"
        assert sorted(m.address for m in view.ring.members) == sorted(named_ring.external)
        ref = await client.chunks.put_blob(data)
        assert await client.chunks.get_blob(ref) == data
        assert await client.put_record("net/kept", b"v", expected_version=0) == 1
        status = await client.admin.status()
        assert {peer.address for peer in status.peers} == set(named_ring.external)
        assert all(peer.state == "up" for peer in status.peers)
    async with Client(named_ring.external[2], named_ring.secret) as client:
        record = await client.get_record("net/kept")
        assert record is not None and record.value == b"v"


async def test_a_client_told_the_internal_network_says_which_name_it_cannot_resolve(
    named_ring: NamedRing,
) -> None:
    """Breaks: a client outside the peers' network asks for their internal addresses.
    Must hold: its calls fail with an error that names the host it cannot resolve,
    whose address it is and which seed described it (was: "unknown error -2")."""
    options = ClientOptions(network="internal", write_attempt_s=1.0, read_attempt_s=1.0)
    async with Client(named_ring.external[0], named_ring.secret, options=options) as client:
        with pytest.raises((QuorumError, DataUnavailable, PeerUnavailable)) as caught:
            await client.put_record("net/internal", b"v", expected_version=0)
    message = str(caught.value)
    assert f"cannot resolve peer1.{DOMAIN}" in message or "cannot resolve peer" in message
    assert f"as {named_ring.external[0]} described the ring" in message, message
