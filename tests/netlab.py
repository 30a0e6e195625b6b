"""A network fault lab for tests: hosts in network namespaces on one private bridge, and
the nemeses that break networks in practice (partitions, a bridge, one-way and random
loss), applied with nftables.

What it is for: a promise about many machines is tested on many hosts (DESIGN.md, "Real
parts in tests"). ``NetLab`` builds them on one machine, as root::

    with NetLab(3) as lab:
        server = lab.start_peer(0, ["python", "-m", "http.server", "--bind", lab.address(0)])
        lab.partition([[0], [1, 2]])
        assert not lab.can_connect(1, 0, 8000)
        lab.heal()

Layout (``P`` is the lab's prefix, ``sr3t<pid % 10000><2 chars>-``, unique per lab):

- namespace ``Pbr`` holds the bridge ``br0`` and one port ``pI`` per host, no address;
- namespace ``PhI`` (host ``I``, from 0) holds ``lo`` and ``eth0`` at ``10.213.0.(I+1)/24``,
  the other end of ``pI``, and no route beyond that subnet.

Every interface is created inside the lab's namespaces, never in the caller's: lab
traffic cannot reach the machine's own interfaces, and parallel labs (each with its
own prefix and bridge) share nothing, not even their addresses' meaning. ``down`` (and
leaving the ``with`` block, also on an error) kills every process the lab started and
every process left in its namespaces, then deletes the namespaces, which deletes their
veth pairs. Every command runs under a timeout.

Nemeses add drop rules to one nftables table (``inet sr3lab``) in the host namespaces,
and only there; they add up until ``heal`` removes them all. Each change is one atomic
``nft -f`` transaction per host. Hosts a nemesis does not name keep their links.

Not here: clock jumps (the wall clock belongs to the kernel; a time namespace offsets only
the monotonic and boot clocks, so a per-host clock jump needs an injected clock instead),
and delay or jitter (this kernel has no netem qdisc).

Where the lab cannot run (not root, no ``ip`` or ``nft``, namespaces not permitted),
:func:`netlab_unavailable` says why and :func:`require_netlab` skips the test, or fails
it when ``SR3_REQUIRE_NETLAB=1`` (CI), as ``support.require_spark`` does for Spark.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

__all__ = [
    "HOSTS_MAX",
    "LAB_NETWORK",
    "NAME_PREFIX",
    "REQUIRE_NETLAB_ENV",
    "Host",
    "NetLab",
    "NetLabError",
    "lab_namespaces",
    "netlab_required",
    "netlab_unavailable",
    "pid_alive",
    "require_netlab",
]

REQUIRE_NETLAB_ENV = "SR3_REQUIRE_NETLAB"
LAB_NETWORK = ipaddress.ip_network("10.213.0.0/24")
NAME_PREFIX = "sr3t"
HOSTS_MAX = 200
# Two base-36 characters after the pid: labs one process (or a leftover of an earlier
# process with the same pid % 10000) already holds are skipped.
PREFIX_SUFFIXES_MAX = 36 * 36
COMMAND_TIMEOUT_S = 10.0
PROCESS_EXIT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 1.0
NFT_TABLE = "sr3lab"
HOST_INTERFACE = "eth0"
BRIDGE_INTERFACE = "br0"
DATAGRAMS_MAX = 40

# Run inside a host namespace: connect to ADDRESS:PORT, retrying until WAIT_S has passed;
# exit 0 once connected, 1 if never.
_CONNECT_SCRIPT = """
import socket, sys, time
address, port = sys.argv[1], int(sys.argv[2])
timeout_s, wait_s = float(sys.argv[3]), float(sys.argv[4])
deadline = time.monotonic() + wait_s
while True:
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() >= deadline:
            sys.exit(1)
        time.sleep(0.05)
"""

# Receive one datagram on ADDRESS:PORT within TIMEOUT_S: exit 0 if one came, else 1.
_RECEIVE_SCRIPT = """
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    sock.bind((sys.argv[1], int(sys.argv[2])))
    sock.settimeout(float(sys.argv[3]))
    print("bound", flush=True)
    try:
        sock.recvfrom(64)
    except TimeoutError:
        sys.exit(1)
"""

# Send COUNT datagrams to ADDRESS:PORT, INTERVAL_S apart (errors from a drop rule are
# expected: the point is whether any arrives).
_SEND_SCRIPT = """
import socket, sys, time
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    for _ in range(int(sys.argv[3])):
        try:
            sock.sendto(b"sr3 netlab", (sys.argv[1], int(sys.argv[2])))
        except OSError:
            pass
        time.sleep(float(sys.argv[4]))
"""


class NetLabError(Exception):
    """A lab command failed or timed out (its command line and stderr in the message)."""


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str


def _run(args: Sequence[str], *, stdin: str | None = None) -> str:
    """Run one setup command under the timeout; its stdout, or NetLabError."""
    try:
        done = subprocess.run(
            list(args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetLabError(f"{' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NetLabError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def lab_namespaces(prefix: str = NAME_PREFIX) -> list[str]:
    """The network namespaces on this machine whose names start with ``prefix``."""
    names = [line.split(" ", 1)[0] for line in _run(["ip", "netns", "list"]).splitlines()]
    return sorted(name for name in names if name.startswith(prefix))


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    return digits[number // 36 % 36] + digits[number % 36]


def _reap(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGKILL a process's group unless it has exited, and wait for it (bounded)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout_s)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent to reap it counts as gone:
    a killed process whose parent is elsewhere may stay one for a while)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


class NetLab:
    """``hosts`` network namespaces on one bridge, their processes and their nemeses."""

    def __init__(self, hosts: int) -> None:
        if not 1 <= hosts <= HOSTS_MAX:
            raise ValueError(f"a lab has 1 to {HOSTS_MAX} hosts, not {hosts}")
        self.host_count = hosts
        self.prefix = ""
        self.hosts: tuple[Host, ...] = ()
        self._namespaces: list[str] = []  # created by this lab, in order
        self._processes: list[subprocess.Popen[bytes]] = []
        # Per host: the nft rules of its input and output chains.
        self._rules: dict[int, dict[str, list[str]]] = {}

    def __enter__(self) -> NetLab:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.down()

    # -- building and tearing down --------------------------------------------------------

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}br"

    def up(self) -> None:
        """Build the lab; on any failure, tear down what was built and raise."""
        try:
            self._claim_prefix()
            bridge_ns = self.bridge_namespace
            _run(["ip", "-n", bridge_ns, "link", "add", BRIDGE_INTERFACE, "type", "bridge"])
            _run(["ip", "-n", bridge_ns, "link", "set", BRIDGE_INTERFACE, "up"])
            _run(["ip", "-n", bridge_ns, "link", "set", "lo", "up"])
            self.hosts = tuple(self._add_host(index) for index in range(self.host_count))
        except BaseException:
            self.down()
            raise

    def _claim_prefix(self) -> None:
        """Take the first free prefix of this pid by creating its bridge namespace (an
        atomic claim: ``ip netns add`` fails on a name that exists)."""
        taken = lab_namespaces(f"{NAME_PREFIX}{os.getpid() % 10000:04d}")
        for number in range(PREFIX_SUFFIXES_MAX):
            prefix = f"{NAME_PREFIX}{os.getpid() % 10000:04d}{_base36(number)}-"
            if any(name.startswith(prefix) for name in taken):
                continue
            try:
                _run(["ip", "netns", "add", f"{prefix}br"])
            except NetLabError:
                if f"{prefix}br" in lab_namespaces(prefix):
                    continue  # another process took it since the listing
                raise
            self.prefix = prefix
            self._namespaces.append(f"{prefix}br")
            return
        raise NetLabError(f"no free lab prefix for pid {os.getpid()}: {len(taken)} namespaces")

    def _add_host(self, index: int) -> Host:
        namespace = f"{self.prefix}h{index}"
        address = str(LAB_NETWORK.network_address + index + 1)
        port = f"p{index}"
        bridge_ns = self.bridge_namespace
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        # Both ends are created in the lab's namespaces, never in the caller's.
        host_end = ["name", HOST_INTERFACE, "netns", namespace]
        bridge_end = ["name", port, "netns", bridge_ns]
        _run(["ip", "link", "add", *host_end, "type", "veth", "peer", *bridge_end])
        _run(["ip", "-n", bridge_ns, "link", "set", port, "master", BRIDGE_INTERFACE, "up"])
        cidr = f"{address}/{LAB_NETWORK.prefixlen}"
        _run(["ip", "-n", namespace, "addr", "add", cidr, "dev", HOST_INTERFACE])
        _run(["ip", "-n", namespace, "link", "set", HOST_INTERFACE, "up"])
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        return Host(index, namespace, address)

    def down(self) -> None:
        """Kill the lab's processes and everything left in its namespaces, delete the
        namespaces (and with them the veth pairs). Raises NetLabError at the end if a
        namespace could not be deleted; every step is tried regardless."""
        for process in self._processes:
            _reap(process, PROCESS_EXIT_TIMEOUT_S)
        self._processes.clear()
        errors: list[str] = []
        for namespace in reversed(self._namespaces):
            try:
                self._kill_namespace_processes(namespace)
                _run(["ip", "netns", "delete", namespace])
            except NetLabError as exc:
                errors.append(str(exc))
        self._namespaces.clear()
        self._rules.clear()
        self.hosts = ()
        if errors:
            raise NetLabError("lab teardown: " + "; ".join(errors))

    @staticmethod
    def _kill_namespace_processes(namespace: str) -> None:
        pids = [int(pid) for pid in _run(["ip", "netns", "pids", namespace]).split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if pid_alive(pid)]
            if pids:
                time.sleep(0.05)

    def namespaces(self) -> list[str]:
        """The namespaces this lab created and has not deleted yet."""
        return list(self._namespaces)

    # -- hosts and processes ----------------------------------------------------------------

    def host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise ValueError(f"no host {index} in a lab of {len(self.hosts)}")
        return self.hosts[index]

    def address(self, index: int) -> str:
        return self.host(index).address

    def command(self, index: int, args: Sequence[str]) -> list[str]:
        """``args`` as a command line that runs in host ``index``'s namespace."""
        return ["ip", "netns", "exec", self.host(index).namespace, *args]

    def run(
        self,
        index: int,
        args: Sequence[str],
        *,
        timeout_s: float = COMMAND_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command in host ``index`` and wait for it (raises
        ``subprocess.TimeoutExpired`` past ``timeout_s``); the exit code is not checked."""
        return subprocess.run(
            self.command(index, args),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=dict(env) if env is not None else None,
        )

    def start_peer(
        self,
        index: int,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running process in host ``index`` (its own session, output to
        ``log_path`` or nowhere). The lab keeps the handle and kills it on ``down``."""
        log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
        try:
            process = subprocess.Popen(
                self.command(index, args),
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        self._processes.append(process)
        return process

    def _signal(self, process: subprocess.Popen[bytes], signum: int) -> None:
        if process not in self._processes:
            raise ValueError(f"process {process.pid} was not started by this lab")
        if process.poll() is None:
            # `ip netns exec` execs the command: the pid is the process's own, and its
            # session's group holds whatever it started.
            os.killpg(process.pid, signum)

    def kill(self, process: subprocess.Popen[bytes]) -> int | None:
        """SIGKILL a lab process and reap it; its exit code (None if it outlived the
        wait)."""
        self._signal(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(PROCESS_EXIT_TIMEOUT_S)
        return process.returncode

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        """SIGSTOP a lab process: it freezes, its sockets stay open (a paused host)."""
        self._signal(process, signal.SIGSTOP)

    def cont(self, process: subprocess.Popen[bytes]) -> None:
        """SIGCONT a process ``stop`` froze."""
        self._signal(process, signal.SIGCONT)

    # -- probes, run inside the namespaces ------------------------------------------------

    def _connect_command(
        self, src: int, dst: int, port: int, timeout_s: float, wait_s: float
    ) -> list[str]:
        script = [sys.executable, "-c", _CONNECT_SCRIPT, self.address(dst), str(port)]
        return self.command(src, [*script, str(timeout_s), str(wait_s)])

    def can_connect(
        self, src: int, dst: int, port: int, *, timeout_s: float = PROBE_TIMEOUT_S
    ) -> bool:
        """Whether a TCP connection from host ``src`` to ``dst``:``port`` opens within
        ``timeout_s`` (one attempt)."""
        return self.reachability([(src, dst)], port, timeout_s=timeout_s)[(src, dst)]

    def reachability(
        self, pairs: Iterable[tuple[int, int]], port: int, *, timeout_s: float = PROBE_TIMEOUT_S
    ) -> dict[tuple[int, int], bool]:
        """``can_connect`` for many (src, dst) pairs at once, probed in parallel."""
        probes = {
            pair: subprocess.Popen(
                self._connect_command(*pair, port, timeout_s, 0.0),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pair in pairs
        }
        answers: dict[tuple[int, int], bool] = {}
        for pair, probe in probes.items():
            try:
                answers[pair] = probe.wait(timeout_s + COMMAND_TIMEOUT_S) == 0
            except subprocess.TimeoutExpired:
                answers[pair] = False
            finally:
                _reap(probe, PROCESS_EXIT_TIMEOUT_S)
        return answers

    def wait_listening(self, src: int, dst: int, port: int, *, wait_s: float = 10.0) -> None:
        """Wait until host ``src`` can connect to ``dst``:``port`` (a server starting up);
        NetLabError after ``wait_s``."""
        command = self._connect_command(src, dst, port, PROBE_TIMEOUT_S, wait_s)
        try:
            done = subprocess.run(
                command, capture_output=True, timeout=wait_s + COMMAND_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise NetLabError(f"waiting for {self.address(dst)}:{port}: {exc}") from exc
        if done.returncode != 0:
            raise NetLabError(f"host {src} cannot reach {self.address(dst)}:{port} in {wait_s} s")

    def datagram_arrives(
        self, src: int, dst: int, port: int, *, timeout_s: float = 2.0, count: int = 20
    ) -> bool:
        """Whether any of ``count`` UDP datagrams host ``src`` sends to ``dst``:``port``
        within ``timeout_s`` arrives: one direction alone, unlike a TCP connection."""
        count = max(1, min(count, DATAGRAMS_MAX))
        receive = [sys.executable, "-c", _RECEIVE_SCRIPT, self.address(dst), str(port)]
        receiver = subprocess.Popen(
            self.command(dst, [*receive, str(timeout_s)]),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert receiver.stdout is not None
            receiver.stdout.readline()  # "bound", or EOF if it failed to start
            send = [sys.executable, "-c", _SEND_SCRIPT, self.address(dst), str(port)]
            subprocess.run(
                self.command(src, [*send, str(count), str(timeout_s / count / 2)]),
                capture_output=True,
                timeout=timeout_s + COMMAND_TIMEOUT_S,
                check=False,
            )
            return receiver.wait(timeout_s + COMMAND_TIMEOUT_S) == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            _reap(receiver, PROCESS_EXIT_TIMEOUT_S)
            if receiver.stdout is not None:
                receiver.stdout.close()

    # -- nemeses ----------------------------------------------------------------------------

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Hosts in different groups exchange no packets, in either direction. Groups
        must be disjoint; hosts in no group keep every link."""
        named = [index for group in groups for index in group]
        if len(named) != len(set(named)):
            raise ValueError(f"partition groups overlap: {groups}")
        for position, group in enumerate(groups):
            for other in groups[position + 1 :]:
                self._cut(group, other)
        self._apply()

    def bridge(self, side_a: Sequence[int], side_b: Sequence[int], shared: int) -> None:
        """Two sides that cannot reach each other, both still reaching host ``shared``."""
        if shared in side_a or shared in side_b or set(side_a) & set(side_b):
            raise ValueError(f"bridge sides overlap: {side_a}, {side_b}, shared {shared}")
        self.host(shared)
        self._cut(side_a, side_b)
        self._apply()

    def one_way_loss(self, src: int, dst: int) -> None:
        """Drop every packet host ``src`` sends to ``dst``; ``dst`` to ``src`` still
        arrives (a TCP connection either way fails: its handshake needs both)."""
        self._add_rule(src, "output", f"ip daddr {self.address(dst)} drop")
        self._apply()

    def random_loss(self, index: int, probability: float) -> None:
        """Drop each packet host ``index`` sends or receives on the lab link with
        ``probability`` (0 to 1, in whole percents)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"a loss probability is between 0 and 1, not {probability}")
        percent = round(probability * 100)
        if percent == 0:
            return
        drop = "drop" if percent == 100 else f"numgen random mod 100 < {percent} drop"
        self._add_rule(index, "input", f'iifname "{HOST_INTERFACE}" {drop}')
        self._add_rule(index, "output", f'oifname "{HOST_INTERFACE}" {drop}')
        self._apply()

    def heal(self) -> None:
        """Remove every rule every nemesis added."""
        hosts = list(self._rules)
        self._rules.clear()
        for index in hosts:
            self._nft(index, f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n")

    def _cut(self, side_a: Iterable[int], side_b: Iterable[int]) -> None:
        side_b = list(side_b)
        for a in side_a:
            for b in side_b:
                for here, there in ((a, b), (b, a)):
                    self._add_rule(here, "input", f"ip saddr {self.address(there)} drop")
                    self._add_rule(here, "output", f"ip daddr {self.address(there)} drop")

    def _add_rule(self, index: int, chain: str, rule: str) -> None:
        self.host(index)
        rules = self._rules.setdefault(index, {"input": [], "output": []})[chain]
        if rule not in rules:
            rules.append(rule)

    def _apply(self) -> None:
        """Replace each host's table with its rules, one atomic transaction per host."""
        for index, chains in self._rules.items():
            lines = [f"add table inet {NFT_TABLE}", f"delete table inet {NFT_TABLE}"]
            lines.append(f"table inet {NFT_TABLE} {{")
            for chain, rules in chains.items():
                lines.append(f"  chain {chain} {{")
                lines.append(f"    type filter hook {chain} priority filter; policy accept;")
                lines += [f"    {rule}" for rule in rules]
                lines.append("  }")
            lines.append("}")
            self._nft(index, "\n".join(lines) + "\n")

    def _nft(self, index: int, script: str) -> None:
        _run(self.command(index, ["nft", "-f", "-"]), stdin=script)


def netlab_required() -> bool:
    """Whether ``SR3_REQUIRE_NETLAB`` asks for the lab; a value other than 0 or 1 is an
    error rather than a silent skip."""
    value = os.environ.get(REQUIRE_NETLAB_ENV, "").strip()
    if value not in {"", "0", "1"}:
        raise pytest.UsageError(f"{REQUIRE_NETLAB_ENV}={value!r}: expected 1 (or 0, or unset)")
    return value == "1"


@functools.cache
def netlab_unavailable() -> str | None:
    """Why the lab cannot run on this machine, or None when it can (found once, by
    building a one-host lab and applying a rule)."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veth pairs, nftables)"
    if shutil.which("ip") is None:
        return "`ip` is missing: install iproute2 (`apt-get install iproute2`)"
    if shutil.which("nft") is None:
        return "`nft` is missing: install nftables (`apt-get install nftables`)"
    try:
        with NetLab(1) as lab:
            lab.random_loss(0, 0.5)
            lab.heal()
    except (NetLabError, OSError) as exc:
        return f"cannot build a network lab here: {exc}"
    return None


def require_netlab() -> None:
    """Skip the calling test where the lab cannot run; fail it instead when
    ``SR3_REQUIRE_NETLAB=1`` (CI), saying why."""
    reason = netlab_unavailable()
    if reason is None:
        return
    if netlab_required():
        pytest.fail(
            f"{REQUIRE_NETLAB_ENV}=1 but the network lab cannot run: {reason}", pytrace=False
        )
    pytest.skip(f"the network lab cannot run: {reason}")
