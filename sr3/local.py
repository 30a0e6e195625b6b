"""The embedded local cluster: N peers as subprocesses on 127.0.0.x addresses.

Each peer runs exactly the program an operator runs (``python -m sr3 peer ...``), with
its own data folder and log under the cluster home, the secret passed in the environment
(never on the command line), and its own session so that a terminal's Ctrl-C does not
reach it. The cluster file records addresses, pids and the secret for other commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ring import api
from ring.auth import generate_secret
from ring.config import ClusterFile, ClusterPeer, cluster_file_path
from ring.errors import ConfigError, SR3Error
from ring.placement import VNODES_DEFAULT
from ring.tls import ClientTls, client_context

__all__ = ["BASE_PORT_DEFAULT", "LocalCluster", "peer_command", "pick_port"]

BASE_PORT_DEFAULT = 7401
PORT_TRIES_MAX = 200
HEALTH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


SEEDS_COUNT = 2


def peer_command(cluster: ClusterFile, peer: ClusterPeer) -> list[str]:
    """The ``sr3 peer`` command line of one member (the same one compose services run).

    The first peer founds the ring (it has no seeds); every other peer joins through the
    first two peers of the cluster (the seeds)."""
    host, _, port = peer.address.rpartition(":")
    founder = cluster.peers[0].peer_id == peer.peer_id
    seeds = (
        []
        if founder
        else [p.address for p in cluster.peers[:SEEDS_COUNT] if p.peer_id != peer.peer_id]
    )
    command = [
        sys.executable, "-m", "sr3", "peer",
        "--id", peer.peer_id,
        "--listen", f"{host}:{port}",
        "--data", peer.data_dir,
        "--seeds", ",".join(seeds),
        "--replication", str(cluster.replication),
        "--write-quorum", str(cluster.write_quorum),
        "--vnodes", str(cluster.vnodes),
        *cluster.peer_flags,
    ]  # fmt: skip
    if peer.zone:
        command += ["--zone", peer.zone]
    if cluster.tls_dir:
        tls = Path(cluster.tls_dir)
        command += [
            "--tls-cert", str(tls / f"{peer.peer_id}.pem"),
            "--tls-key", str(tls / f"{peer.peer_id}.key"),
            "--tls-ca", str(tls / "ca.pem"), "--tls-client-certs",
        ]  # fmt: skip
    return command


def make_tls(folder: Path, peers: Sequence[ClusterPeer]) -> None:
    """The TLS files of a local cluster in ``folder``: a CA, one certificate per peer
    naming its address, and one for the local user's clients (client.pem)."""
    from sr3.certs import init_ca, issue

    init_ca(folder)
    for peer in peers:
        host = peer.address.rpartition(":")[0]
        issue(folder, folder, peer.peer_id, [host, "localhost"])
    issue(folder, folder, "client", ["localhost"])


def _health_context(tls: ClientTls | None) -> ssl.SSLContext | None:
    return client_context(tls) if tls is not None else None


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(hosts: Sequence[str], base_port: int) -> int:
    for port in range(base_port, base_port + PORT_TRIES_MAX):
        if all(_port_free(host, port) for host in hosts):
            return port
    raise ConfigError(f"no free port in {base_port}..{base_port + PORT_TRIES_MAX} on {hosts[0]}..")


def _healthy(
    address: str,
    members: int | None = None,
    *,
    settled: bool = False,
    tls: ssl.SSLContext | None = None,
) -> bool:
    """True once the peer answers and has learned the member table (it is ready), and,
    given ``members``, once its table places that many members; with ``settled``, once
    no record waits on a catch-up from the rings before (``ring.settle``)."""
    scheme = "https" if tls is not None else "http"
    url = f"{scheme}://{address}{api.HEALTH.pattern}"
    try:
        with urllib.request.urlopen(url, timeout=0.5, context=tls) as answer:
            health = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    if not isinstance(health, dict) or not health.get("ready"):
        return False
    if settled and health.get("settled") is not True:
        return False
    return members is None or health.get("members") == members


def _is_peer_process(pid: int) -> bool:
    """True if ``pid`` is alive and is an sr3 peer (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sr3" in cmdline and b"peer" in cmdline


class LocalCluster:
    """Start, stop, kill and restart the peers of an embedded cluster."""

    def __init__(self, cluster: ClusterFile, cluster_file: Path) -> None:
        self.cluster = cluster
        self.cluster_file = cluster_file
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def create(
        cls,
        home: Path,
        peers: int,
        *,
        replication: int = 3,
        write_quorum: int = 2,
        vnodes: int = VNODES_DEFAULT,
        base_port: int = BASE_PORT_DEFAULT,
        zones: int = 0,
        cluster_file: Path | None = None,
        peer_flags: Sequence[str] = (),
        tls: bool = False,
    ) -> LocalCluster:
        """Lay out (but do not start) a new cluster of ``peers`` peers under ``home``;
        with ``tls``, its CA and certificates too (``make_tls``): every peer then serves
        HTTPS only and requires a client certificate from the cluster's CA."""
        if not 1 <= peers <= 250:
            raise ConfigError("a local cluster has 1 to 250 peers")
        if not 1 <= write_quorum <= replication:
            raise ConfigError("write quorum must be between 1 and the replication factor")
        hosts = [f"127.0.0.{index}" for index in range(1, peers + 1)]
        port = pick_port(hosts, base_port)
        members = tuple(
            ClusterPeer(
                peer_id=f"peer-{index}",
                address=f"{host}:{port}",
                data_dir=str(home / f"peer-{index}"),
                zone=f"zone-{(index - 1) % zones + 1}" if zones else "",
                log_file=str(home / f"peer-{index}" / "peer.log"),
            )
            for index, host in enumerate(hosts, start=1)
        )
        tls_dir = ""
        if tls:
            tls_dir = str(home / "tls")
            make_tls(Path(tls_dir), members)
        cluster = ClusterFile(
            secret=generate_secret(), replication=replication, write_quorum=write_quorum,
            vnodes=vnodes, peers=members, home=str(home), peer_flags=tuple(peer_flags),
            tls_dir=tls_dir,
        )  # fmt: skip
        return cls(cluster, cluster_file or cluster_file_path())

    @classmethod
    def load(cls, cluster_file: Path | None = None) -> LocalCluster:
        path = cluster_file or cluster_file_path()
        return cls(ClusterFile.read(path), path)

    @property
    def ring(self) -> str:
        return ",".join(self.cluster.addresses)

    @property
    def secret(self) -> str:
        return self.cluster.secret

    @property
    def client_tls(self) -> ClientTls | None:
        """What a client of this cluster connects with (None: plain HTTP)."""
        return self.cluster.client_tls

    def peer(self, peer_id: str) -> ClusterPeer:
        for peer in self.cluster.peers:
            if peer.peer_id == peer_id:
                return peer
        raise ConfigError(f"no peer {peer_id!r} in this cluster")

    def add_peer(self, *, wait: bool = True) -> ClusterPeer:
        """Lay out one more peer (the next 127.0.0.x) and start it: it joins the ring."""
        index = len(self.cluster.peers) + 1
        if index > 250:
            raise ConfigError("a local cluster has at most 250 peers")
        host = f"127.0.0.{index}"
        port = int(self.cluster.peers[0].address.rpartition(":")[2])
        if not _port_free(host, port):
            raise ConfigError(f"{host}:{port} is busy")
        home = Path(self.cluster.home)
        zones = sorted({p.zone for p in self.cluster.peers if p.zone})
        member = ClusterPeer(
            peer_id=f"peer-{index}",
            address=f"{host}:{port}",
            data_dir=str(home / f"peer-{index}"),
            zone=zones[(index - 1) % len(zones)] if zones else "",
            log_file=str(home / f"peer-{index}" / "peer.log"),
        )
        self.cluster = replace(self.cluster, peers=(*self.cluster.peers, member))
        self._save()
        self.start(member.peer_id, wait=wait)
        return self.peer(member.peer_id)

    def _save(self) -> None:
        self.cluster.write(self.cluster_file)

    def _set_pid(self, peer_id: str, pid: int | None) -> None:
        peers = tuple(
            replace(p, pid=pid) if p.peer_id == peer_id else p for p in self.cluster.peers
        )
        self.cluster = replace(self.cluster, peers=peers)
        self._save()

    def start(self, peer_id: str | None = None, *, wait: bool = True) -> None:
        """Start one peer, or every peer that is not running; wait until healthy."""
        targets = [self.peer(peer_id)] if peer_id else list(self.cluster.peers)
        for peer in targets:
            if peer.pid is not None and _is_peer_process(peer.pid):
                continue
            self._reap(peer.peer_id, STOP_TIMEOUT_S)  # a peer that exited by itself
            Path(peer.data_dir).mkdir(parents=True, exist_ok=True)
            log_path = Path(peer.log_file or Path(peer.data_dir) / "peer.log")
            with open(log_path, "ab") as log_handle:
                process = subprocess.Popen(
                    peer_command(self.cluster, peer),
                    stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT,
                    env={**os.environ, "SR3_SECRET": self.cluster.secret},
                    start_new_session=True,
                )  # fmt: skip
            self._processes[peer.peer_id] = process
            self._set_pid(peer.peer_id, process.pid)
        if wait:
            # Starting the whole cluster: up means every peer places every member, so
            # that no client is handed the partial table of a peer still joining.
            # And settled: a ring that formed one peer at a time first catches every
            # record up from the rings of its formation (``ring.settle``).
            members = len(self.cluster.peers) if peer_id is None else None
            self.wait_healthy(
                [peer.peer_id for peer in targets], members=members, settled=peer_id is None
            )

    def wait_healthy(
        self,
        peer_ids: Sequence[str],
        timeout_s: float = HEALTH_TIMEOUT_S,
        *,
        members: int | None = None,
        settled: bool = False,
    ) -> None:
        """Wait until these peers are ready (and, given ``members``, place that many;
        with ``settled``, have no record catch-up pending)."""
        deadline = time.monotonic() + timeout_s
        waiting = [self.peer(peer_id) for peer_id in peer_ids]
        tls = _health_context(self.client_tls)
        while waiting:
            waiting = [
                peer
                for peer in waiting
                if not _healthy(peer.address, members, settled=settled, tls=tls)
            ]
            for peer in waiting:
                process = self._processes.get(peer.peer_id)
                if process is not None and process.poll() is not None:
                    raise SR3Error(
                        f"peer {peer.peer_id} exited with code {process.returncode}; "
                        f"see {peer.log_file}"
                    )
            if waiting and time.monotonic() > deadline:
                names = ", ".join(peer.peer_id for peer in waiting)
                raise SR3Error(f"peers not healthy after {timeout_s:.0f} s: {names}")
            if waiting:
                time.sleep(0.1)

    def up(self) -> None:
        self._save()
        try:
            self.start()
        except BaseException:
            self.down()
            raise

    def running(self, peer_id: str) -> bool:
        pid = self.peer(peer_id).pid
        return pid is not None and _is_peer_process(pid)

    def signal(self, peer_id: str, signum: int) -> None:
        pid = self.peer(peer_id).pid
        if pid is None or not _is_peer_process(pid):
            raise SR3Error(f"peer {peer_id} is not running")
        os.kill(pid, signum)

    def kill(self, peer_id: str) -> None:
        """SIGKILL one peer and reap it."""
        self.signal(peer_id, signal.SIGKILL)
        self._reap(peer_id, STOP_TIMEOUT_S)
        self._set_pid(peer_id, None)

    def stop(self, peer_id: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM one peer, SIGKILL it if it has not exited after ``timeout_s``."""
        peer = self.peer(peer_id)
        if peer.pid is None or not _is_peer_process(peer.pid):
            self._reap(peer_id, timeout_s)  # it exited by itself: collect its exit status
            self._set_pid(peer_id, None)
            return
        os.kill(peer.pid, signal.SIGTERM)
        if not self._reap(peer_id, timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.kill(peer.pid, signal.SIGKILL)
            self._reap(peer_id, timeout_s)
        self._set_pid(peer_id, None)

    def _reap(self, peer_id: str, timeout_s: float) -> bool:
        """Wait for a peer to exit; True if it did within ``timeout_s``."""
        process = self._processes.pop(peer_id, None)
        if process is not None:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._processes[peer_id] = process
                return False
            return True
        pid = self.peer(peer_id).pid
        deadline = time.monotonic() + timeout_s
        while pid is not None and _is_peer_process(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def down(self, *, purge: bool = False) -> None:
        """Stop every peer; remove the cluster file (and the data with ``purge``)."""
        for peer in self.cluster.peers:
            self.stop(peer.peer_id)
        self.cluster_file.unlink(missing_ok=True)
        if purge:
            for peer in self.cluster.peers:
                shutil.rmtree(peer.data_dir, ignore_errors=True)
            if self.cluster.tls_dir:
                shutil.rmtree(self.cluster.tls_dir, ignore_errors=True)
