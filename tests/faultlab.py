"""The fault lab's scenarios: five sr3 peers, each on its own host of the network lab
(``tests/netlab.py``), clients on two more hosts, one nemesis per run, and the checks of
what must still hold, judged from the histories the clients record.

What it is for: records promise linearizable compare-and-set, and a peer cut off from
the majority must never remove others, never acknowledge a record write and never answer
a record read it cannot prove current (docs/records.md, docs/architecture.md "Cluster
metadata"). Those are promises about many machines, so they are tested on many hosts.
``tests/test_faults.py`` runs each nemesis once (one seed, short);
``benchmarks/fault_runs.py`` runs them over many seeds, longer, into a JSON report.

Hosts: 0-4 are the peers (``peer-1`` .. ``peer-5``; host 0 founds the ring, the others
join through hosts 0 and 1 once it listens, as ``sr3.local.peer_command`` starts them),
5 and 6 the clients (``tests/fault_client.py``, two clients each), one on each side of
a partition: side ``a`` (host 5) is with the majority, side ``b`` (host 6) with the
minority or the other side. A run: start the peers, wait until each counts all five,
start the clients, let them run ``WARMUP_S``, apply the nemesis (it heals what it broke
before it returns), let the clients run ``RECOVERY_S`` more, then stop them: each client
then reads every key.

Nemeses (durations at ``scale`` 1; a longer run multiplies them):

- ``minority-partition``: one peer and client host ``b`` cut off from the other four
  peers and host ``a`` for ``MINORITY_CUT_S`` (longer than the removal grace), healed;
- ``bridge``: two sides of two peers each (``a`` with one, ``b`` with the other) that
  share the fifth peer, for ``BRIDGE_S``;
- ``flapping``: a partition of two peers (and ``b``) from three (and ``a``) that turns
  on and off about every second for ``FLAP_S``;
- ``one-way-loss``: every packet dropped in one direction on ``ONE_WAY_PAIRS`` pairs of
  hosts (peers, or a client host and a peer), for ``ONE_WAY_S``;
- ``random-loss``: each peer drops ``LOSS_PERCENT`` % of what it sends and receives, for
  ``LOSS_S``;
- ``kill-and-pause``: two peers SIGKILLed at once and restarted after ``KILL_S`` (past
  the removal grace: the others remove them, they join again), then one SIGSTOPped for
  ``PAUSE_S`` and SIGCONTed;
- ``late-founder``: no fault once running, but the founder (host 0, no seeds) starts
  ``FOUNDER_LATE_S`` after the others, whose first contact with it was refused; the
  clients then run for ``LATE_FOUNDER_S``. A restart order, not a network fault: every
  peer must come to hear from the founder, and the ring must settle.

- ``clock-jump``: one peer's wall clock jumps ``CLOCK_AHEAD_S`` ahead (inside the skew
  signatures allow) and, half-way through ``CLOCK_S``, another's ``CLOCK_BEHIND_S``
  behind (past it: the others refuse what it signs, and it refuses what they sign); then
  both jump back. As an NTP step does, only the wall clock moves, not the monotonic one.
  The wall clock belongs to the kernel, not to a namespace (a time namespace offsets only
  the monotonic and boot clocks), so each peer of this run has libfaketime preloaded
  (Debian's ``faketime``), reading its offset from a file of its own.

What must hold, for every nemesis (``judge``):

- the ring is ready within ``READY_WAIT_S`` of its start (every peer counting all five
  members), else that is the run's one finding;
- every key's history (both sides, final reads included) is linearizable
  (``linearizability.check_key``); no write is acknowledged at a version other than
  its expected one plus one, no conflict names the expected version;
- after the heal every client reads every key, and what it reads is the last
  acknowledged write of the key or a later write (acknowledged or of unknown outcome);
- the ``sr3://`` namespace, worked by the same clients (``fault_client.fs_loop``): at
  most one winner per create-if-absent, a winner's bytes kept, a refused create never
  taking effect, every rename atomic, every path readable after the heal and read alike
  from both sides (``fs_violations``);
- no two peers ever serve different configurations under one epoch;
- with ``late-founder`` (no fault once running), no configuration past the founding and
  the four joins: nobody is removed;
- with ``clock-jump``, the figures say how many of each side's calls were decided while
  the clocks were off (``clock_figures`` says why that is not a bound here).

And for ``minority-partition``, while the cut lasts: no write acknowledged to and no
read answered for the minority side's client; the minority peer serves a ring with every
member of the configuration the cut began with; and at least ``MAJORITY_DECIDED_MIN`` of
the majority side's calls invoked from ``FAILURE_TIMEOUT_S`` after the cut began until
the heal are decided by a quorum: answered (an acknowledged write, a conflict, a read)
or pre-empted by other writers (``RecordUnknown``, ``RecordContention``: contention
between the clients, about 2 % of calls with no fault at all, not unavailability; the
share answered outright is reported beside it).

A harness failure (peers never ready, a client process that crashed) raises
``FaultLabError``; what the checks found is a list of violations in the report.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from histories import Call, call_from_json, verdicts
from linearizability import Operation
from netlab import REQUIRE_NETLAB_ENV, NetLab, NetLabError, netlab_required

from ring.auth import generate_secret
from ring.config import ClusterFile, ClusterPeer
from ring.placement import VNODES_DEFAULT
from sr3.local import peer_command

__all__ = [
    "FAILURE_TIMEOUT_S",
    "NEMESES",
    "FaultLabError",
    "Report",
    "run_scenario",
]

PEERS = 5
SIDE_HOSTS = {"a": 5, "b": 6}
HOSTS = PEERS + len(SIDE_HOSTS)
PEER_PORT = 7401
FAILURE_TIMEOUT_S = 1.5
REMOVAL_GRACE_S = 4.0
# Short timings, as tests/test_consensus_ring.py runs its peers: suspected within 1.5 s,
# removed by the voters 4 s later.
PEER_FLAGS = (
    "--failure-timeout", str(FAILURE_TIMEOUT_S),
    "--removal-grace", str(REMOVAL_GRACE_S),
    "--gossip-interval", "0.2",
    "--repair-interval", "0.5",
    "--scrub-rate", "0",
)  # fmt: skip
KEYS = ("fault/a", "fault/b", "fault/c", "fault/d")
CLIENTS_PER_HOST = 2
CLIENT_SCRIPT = Path(__file__).with_name("fault_client.py")

# Bounds of one run.
READY_WAIT_S = 60.0
CALL_TIMEOUT_S = 10.0
FINAL_WAIT_S = 30.0
CLIENT_EXIT_WAIT_S = FINAL_WAIT_S + CALL_TIMEOUT_S + 30.0
CLIENT_MAX_S = 900.0
WARMUP_S = 2.0
RECOVERY_S = 4.0

# The nemeses' durations at scale 1.
MINORITY_CUT_S = 8.0
BRIDGE_S = 10.0
FLAP_S = 12.0
FLAP_HALF_PERIOD_S = (0.7, 1.3)
ONE_WAY_S = 10.0
ONE_WAY_PAIRS = 4
LOSS_S = 10.0
LOSS_PERCENT = 20
KILLED = 2
KILL_S = 7.0
BETWEEN_S = 2.0
PAUSE_S = 3.0
FOUNDER_LATE_S = 3.0
LATE_FOUNDER_S = 10.0
CLOCK_S = 12.0
CLOCK_AHEAD_S = 90
CLOCK_BEHIND_S = 600
# libfaketime: the offset file is read again at most once a second (not on every call).
FAKETIME_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1")  # fmt: skip
FAKETIME_CACHE_S = 1

PHASES = ("before", "during", "after", "final")
MAJORITY_DECIDED_MIN = 0.99
# Outcomes a quorum decided but the writer cannot tell: its write was pre-empted by
# other writers (who then wrote on), not refused for want of acceptors. Four clients on
# four keys see them at about 2 % of their calls with no fault at all.
CONTENDED_ERRORS = frozenset({"RecordUnknown", "RecordContention"})
LOG_TAIL_CHARS = 3000
VIOLATION_CHARS_MAX = 6000


class FaultLabError(Exception):
    """The lab could not run the scenario (not a finding about sr3)."""


# -- one run: the lab, its peers, its clients -----------------------------------------------


class Run:
    """One scenario's lab, peers and clients, and a log of what the nemesis did (times on
    the monotonic clock, as the clients record theirs)."""

    def __init__(self, lab: NetLab, home: Path, rng: random.Random) -> None:
        self.lab = lab
        self.home = home
        self.rng = rng
        members = tuple(
            ClusterPeer(
                peer_id=peer_id(index),
                address=f"{lab.address(index)}:{PEER_PORT}",
                data_dir=str(home / peer_id(index)),
            )
            for index in range(PEERS)
        )
        self.cluster = ClusterFile(
            secret=generate_secret(),
            replication=3,
            write_quorum=2,
            vnodes=VNODES_DEFAULT,
            peers=members,
            home=str(home),
            peer_flags=PEER_FLAGS,
        )
        self.env = {**os.environ, "SR3_SECRET": self.cluster.secret}
        self.peers: dict[int, subprocess.Popen[bytes]] = {}
        self.paused: set[int] = set()
        self.events: list[tuple[float, str]] = []
        # Named windows of the nemesis (the minority partition's "cut"), and who was cut.
        self.windows: dict[str, tuple[float, float]] = {}
        self.minority: tuple[int, ...] = ()
        self.nemesis_s: tuple[float, float] = (math.inf, math.inf)
        # With ``clock-jump``: each peer's wall clock offset file (libfaketime's).
        self.clock_files: dict[int, Path] = {}

    def note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    # -- peers

    def start_peer(self, index: int) -> None:
        peer = self.cluster.peers[index]
        Path(peer.data_dir).mkdir(exist_ok=True)
        env = self.env
        if index in self.clock_files:
            env = {**env, **faketime_env(self.clock_files[index])}
        self.peers[index] = self.lab.start_peer(
            index,
            peer_command(self.cluster, peer),
            env=env,
            log_path=self.home / f"{peer.peer_id}.log",
        )

    def fake_clocks(self) -> None:
        """Give every peer started from now on a wall clock this run can move."""
        for index in range(PEERS):
            self.clock_files[index] = self.home / f"clock-{peer_id(index)}"
            self.set_clock(index, 0, note=False)

    def set_clock(self, index: int, offset_s: int, *, note: bool = True) -> None:
        """Set ``index``'s wall clock ``offset_s`` from the real one (within
        ``FAKETIME_CACHE_S``); written whole, so that the peer never reads half of it."""
        path = self.clock_files[index]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, path)
        if note:
            self.note(f"{peer_id(index)}'s wall clock {offset_s:+d} s")

    def wait_listening(self, index: int) -> None:
        try:
            self.lab.wait_listening(SIDE_HOSTS["a"], index, PEER_PORT, wait_s=READY_WAIT_S)
        except NetLabError as exc:
            raise FaultLabError(f"{peer_id(index)} not listening: {exc}\n{self.logs()}") from exc

    def wait_ready(self) -> str | None:
        """Wait until every peer is ready and counts all five members, as seen from client
        host ``a``; None once they are, else what the wait saw. A peer that exited is
        the lab's failure (FaultLabError), not a finding."""
        addresses = ",".join(self.cluster.addresses)
        command = [sys.executable, str(CLIENT_SCRIPT), "ready", "--ring", addresses]
        command += ["--members", str(PEERS), "--wait-s", str(READY_WAIT_S)]
        done = self.lab.run(SIDE_HOSTS["a"], command, timeout_s=READY_WAIT_S + 20)
        if done.returncode == 0:
            return None
        exited = [peer_id(i) for i, process in self.peers.items() if process.poll() is not None]
        if exited:
            raise FaultLabError(f"{', '.join(exited)} exited while starting\n{self.logs()}")
        return f"{done.stdout.strip()} {done.stderr.strip()[-500:]}"

    def kill(self, index: int) -> None:
        self.note(f"SIGKILL {peer_id(index)}")
        self.lab.kill(self.peers.pop(index))

    def restart(self, index: int) -> None:
        self.note(f"restart {peer_id(index)}")
        self.start_peer(index)

    def pause(self, index: int) -> None:
        self.note(f"SIGSTOP {peer_id(index)}")
        self.lab.stop(self.peers[index])
        self.paused.add(index)

    def resume(self, index: int) -> None:
        self.note(f"SIGCONT {peer_id(index)}")
        self.lab.cont(self.peers[index])
        self.paused.discard(index)

    def heal(self) -> None:
        """Every link back, every peer running and thawed."""
        self.lab.heal()
        for index in sorted(self.paused):
            self.resume(index)
        for index in range(PEERS):
            if index not in self.peers:
                self.restart(index)

    def logs(self) -> str:
        """The tail of every log of the run, for a failure message."""
        return "\n".join(
            f"--- {log.name}:\n{log.read_text(errors='replace')[-LOG_TAIL_CHARS:]}"
            for log in sorted(self.home.glob("*.log"))
        )

    # -- clients

    def start_clients(self, seed: int) -> dict[str, subprocess.Popen[bytes]]:
        """One client process per side, watching every peer's ring."""
        started = {}
        for position, (side, host) in enumerate(SIDE_HOSTS.items()):
            command = [
                sys.executable, str(CLIENT_SCRIPT), "workload",
                "--ring", ",".join(self.cluster.addresses),
                "--side", side,
                "--keys", ",".join(KEYS),
                "--clients", str(CLIENTS_PER_HOST),
                "--first-client", str(position * CLIENTS_PER_HOST),
                "--seed", str(seed + position),
                "--stop-file", str(self.stop_file),
                "--out", str(self.out(side)),
                "--watch", ",".join(self.cluster.addresses),
                "--call-timeout-s", str(CALL_TIMEOUT_S),
                "--final-wait-s", str(FINAL_WAIT_S),
                "--max-s", str(CLIENT_MAX_S),
                "--fs",
            ]  # fmt: skip
            log_path = self.home / f"client-{side}.log"
            started[side] = self.lab.start_peer(host, command, env=self.env, log_path=log_path)
        return started

    @property
    def stop_file(self) -> Path:
        return self.home / "stop"

    def out(self, side: str) -> Path:
        return self.home / f"client-{side}.jsonl"

    def collect(self, clients: dict[str, subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
        """Stop the clients (they then read every key), wait for them, read their lines."""
        self.stop_file.touch()
        lines: list[dict[str, Any]] = []
        for side, process in clients.items():
            try:
                code = process.wait(CLIENT_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                raise FaultLabError(f"client {side} exited with {code}\n{self.logs()}")
            text = self.out(side).read_text()
            lines += [json.loads(line) for line in text.splitlines() if line.strip()]
        return lines


def peer_id(index: int) -> str:
    return f"peer-{index + 1}"


def peer_index(address: str) -> int:
    """The host of a lab address (10.213.0.I+1:port)."""
    return int(address.rpartition(":")[0].rpartition(".")[2]) - 1


# -- nemeses ------------------------------------------------------------------------------


def minority_partition(run: Run, scale: float) -> None:
    minority = run.rng.randrange(PEERS)
    majority = [index for index in range(PEERS) if index != minority]
    run.minority = (minority,)
    run.note(f"partition {peer_id(minority)} + client b | the other peers + client a")
    run.lab.partition([[minority, SIDE_HOSTS["b"]], [*majority, SIDE_HOSTS["a"]]])
    started_s = time.monotonic()
    time.sleep(MINORITY_CUT_S * scale)
    ended_s = time.monotonic()
    run.lab.heal()
    run.note("heal")
    run.windows["cut"] = (started_s, ended_s)


def bridge(run: Run, scale: float) -> None:
    order = run.rng.sample(range(PEERS), PEERS)
    shared, side_a, side_b = order[0], order[1:3], order[3:5]
    names = [[peer_id(i) for i in side] for side in (side_a, side_b)]
    run.note(f"bridge {names[0]} + client a | {names[1]} + client b, sharing {peer_id(shared)}")
    run.lab.bridge([*side_a, SIDE_HOSTS["a"]], [*side_b, SIDE_HOSTS["b"]], shared)
    time.sleep(BRIDGE_S * scale)
    run.lab.heal()
    run.note("heal")


def flapping(run: Run, scale: float) -> None:
    order = run.rng.sample(range(PEERS), PEERS)
    small, large = [*order[:2], SIDE_HOSTS["b"]], [*order[2:], SIDE_HOSTS["a"]]
    run.note(f"flapping: {[peer_id(i) for i in order[:2]]} + client b | the rest + client a")
    deadline = time.monotonic() + FLAP_S * scale
    cut = False
    toggles = 0
    while time.monotonic() < deadline:
        if cut:
            run.lab.heal()
        else:
            run.lab.partition([small, large])
        cut = not cut
        toggles += 1
        time.sleep(run.rng.uniform(*FLAP_HALF_PERIOD_S))
    run.lab.heal()
    run.note(f"heal after {toggles} toggles")


def one_way_loss(run: Run, scale: float) -> None:
    hosts = range(HOSTS)
    pairs = [(s, d) for s in hosts for d in hosts if s != d and min(s, d) < PEERS]
    chosen = run.rng.sample(pairs, ONE_WAY_PAIRS)
    for src, dst in chosen:
        run.lab.one_way_loss(src, dst)
    run.note(f"one-way loss {', '.join(f'{host_name(s)}->{host_name(d)}' for s, d in chosen)}")
    time.sleep(ONE_WAY_S * scale)
    run.lab.heal()
    run.note("heal")


def random_loss(run: Run, scale: float) -> None:
    for index in range(PEERS):
        run.lab.random_loss(index, LOSS_PERCENT / 100)
    run.note(f"random loss {LOSS_PERCENT} % on every peer")
    time.sleep(LOSS_S * scale)
    run.lab.heal()
    run.note("heal")


def kill_and_pause(run: Run, scale: float) -> None:
    victims = run.rng.sample(range(PEERS), KILLED)
    for index in victims:  # at once: both before either restarts
        run.kill(index)
    time.sleep(KILL_S * scale)
    for index in victims:
        run.restart(index)
    time.sleep(BETWEEN_S * scale)
    frozen = run.rng.randrange(PEERS)
    run.pause(frozen)
    time.sleep(PAUSE_S * scale)
    run.resume(frozen)


def clock_jump(run: Run, scale: float) -> None:
    ahead, behind = run.rng.sample(range(PEERS), 2)
    started_s = time.monotonic()
    run.set_clock(ahead, CLOCK_AHEAD_S)
    time.sleep(CLOCK_S * scale / 2)
    run.set_clock(behind, -CLOCK_BEHIND_S)
    time.sleep(CLOCK_S * scale / 2)
    run.set_clock(ahead, 0)
    run.set_clock(behind, 0)
    # Past the cache of the offset files: every peer reads its clock back.
    time.sleep(FAKETIME_CACHE_S)
    run.windows["clocks"] = (started_s, time.monotonic())


def faketime_library() -> str:
    """libfaketime (Debian's ``faketime`` package); the single-threaded build, which costs
    the peers half as much as the multi-threaded one."""
    found = next((path for path in FAKETIME_LIBRARIES if Path(path).is_file()), None)
    if found is None:
        raise FaultLabError("libfaketime is not installed (Debian's faketime package)")
    return found


def faketime_env(offset_file: Path) -> dict[str, str]:
    """The environment that runs a process under libfaketime, its wall clock offset by
    what ``offset_file`` says (``+90``, ``-600``), its monotonic clock left alone."""
    return {
        "LD_PRELOAD": faketime_library(),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_CACHE_DURATION": str(FAKETIME_CACHE_S),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def require_faketime() -> None:
    """Skip the calling test without libfaketime; fail it instead where the lab is
    required (``SR3_REQUIRE_NETLAB=1``, CI)."""
    try:
        faketime_library()
    except FaultLabError as exc:
        if netlab_required():
            pytest.fail(f"{REQUIRE_NETLAB_ENV}=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


def start_with_fake_clocks(run: Run) -> None:
    run.fake_clocks()
    start_founder_first(run)


def late_founder(run: Run, scale: float) -> None:
    run.note("no fault: the founder started after the others")
    time.sleep(LATE_FOUNDER_S * scale)


def start_founder_first(run: Run) -> None:
    """The founder, then the others once it listens: their first contact with it must
    not be refused (``late-founder`` is that fault, on its own)."""
    run.start_peer(0)
    run.wait_listening(0)
    for index in range(1, PEERS):
        run.start_peer(index)


def start_founder_last(run: Run) -> None:
    for index in range(1, PEERS):
        run.start_peer(index)
    time.sleep(FOUNDER_LATE_S)
    run.start_peer(0)


def host_name(index: int) -> str:
    if index < PEERS:
        return peer_id(index)
    return next(f"client {side}" for side, host in SIDE_HOSTS.items() if host == index)


Nemesis = Callable[[Run, float], None]
NEMESES: dict[str, Nemesis] = {
    "minority-partition": minority_partition,
    "bridge": bridge,
    "flapping": flapping,
    "one-way-loss": one_way_loss,
    "random-loss": random_loss,
    "kill-and-pause": kill_and_pause,
    "late-founder": late_founder,
    "clock-jump": clock_jump,
}
# Nemeses that inject no fault once the ring runs: its configuration must not change.
FAULTLESS = frozenset({"late-founder"})
# How a nemesis starts the peers, when not all at once.
STARTS: dict[str, Callable[[Run], None]] = {
    "late-founder": start_founder_last,
    "clock-jump": start_with_fake_clocks,
}


# -- a run, start to end ------------------------------------------------------------------


def run_scenario(nemesis: str, seed: int, home: Path, *, scale: float = 1.0) -> Report:
    """Run one nemesis on a fresh lab under ``home`` (logs and histories stay there) with
    everything random drawn from ``seed``; the report, with what the checks found."""
    if nemesis not in NEMESES:
        raise ValueError(f"no nemesis {nemesis!r}: one of {sorted(NEMESES)}")
    rng = random.Random(seed)
    started_s = time.monotonic()
    with NetLab(HOSTS) as lab:
        run = Run(lab, home, rng)
        STARTS.get(nemesis, start_founder_first)(run)
        not_ready = run.wait_ready()
        if not_ready is not None:
            report = never_ready(nemesis, seed, run, not_ready, time.monotonic() - started_s)
            report.scale = scale
            return report
        clients = run.start_clients(rng.randrange(2**31))
        origin_s = time.monotonic()
        time.sleep(WARMUP_S)
        nemesis_started_s = time.monotonic()
        try:
            NEMESES[nemesis](run, scale)
        finally:
            run.heal()
        run.nemesis_s = (nemesis_started_s, time.monotonic())
        time.sleep(RECOVERY_S)
        lines = run.collect(clients)
    report = judge(nemesis, seed, run, lines, origin_s)
    report.duration_s = time.monotonic() - started_s
    report.scale = scale
    return report


def never_ready(nemesis: str, seed: int, run: Run, seen: str, duration_s: float) -> Report:
    """The report of a run whose ring never became ready: that alone is the finding."""
    sides = {side: {phase: SideFigures() for phase in PHASES} for side in SIDE_HOSTS}
    report = Report(nemesis, seed, [], sides, {}, home=str(run.home), duration_s=duration_s)
    epochs = collections.Counter(
        line.split("configuration epoch ")[1].split(":")[0]
        for log in sorted(run.home.glob("peer-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "configuration epoch " in line
    )
    report.figures["configurations decided while starting"] = len(epochs)
    report.violations.append(
        f"the ring was not ready {READY_WAIT_S:.0f} s after its peers started (every peer "
        f"ready and counting {PEERS} members), with {len(epochs)} configurations decided: {seen}"
    )
    return report


# -- what the clients saw, and the checks ---------------------------------------------------


@dataclass
class SideFigures:
    """How one side's calls in one phase went."""

    calls: int = 0
    answered: int = 0  # acknowledged, conflict, or read returned
    acknowledged: int = 0
    conflicts: int = 0
    reads: int = 0
    unknown: int = 0
    failed_reads: int = 0
    unavailable: int = 0  # neither answered nor contended: too few acceptors, or no answer

    def add(self, call: Call) -> None:
        self.calls += 1
        self.answered += call.answered
        self.unavailable += not decided(call)
        op = call.op
        if op.kind == "read":
            self.reads += op.outcome == "ok"
            self.failed_reads += op.outcome != "ok"
        else:
            self.acknowledged += op.outcome == "ok"
            self.conflicts += op.outcome == "fail"
            self.unknown += op.outcome == "unknown"

    @property
    def answered_share(self) -> float:
        return self.answered / self.calls if self.calls else math.nan


def decided(call: Call) -> bool:
    """Whether a quorum decided the call: answered, or pre-empted by other writers."""
    return call.answered or call.error in CONTENDED_ERRORS


@dataclass
class Report:
    """One run: what the nemesis did, how each side's calls went, and the violations."""

    nemesis: str
    seed: int
    events: list[tuple[float, str]]
    sides: dict[str, dict[str, SideFigures]]
    verdicts: dict[str, str]
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    scale: float = 1.0
    home: str = ""
    # The monotonic time events are counted from (the clients' lines carry raw times).
    origin_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["events"] = [[round(at_s, 2), what] for at_s, what in self.events]
        return data

    def describe(self) -> str:
        lines = [
            f"{self.nemesis}, seed {self.seed} (scale {self.scale:g}): {self.duration_s:.1f} s; "
            f"histories and logs in {self.home}; times from monotonic {self.origin_s:.2f} s",
            *(f"  {at_s:6.2f} s {what}" for at_s, what in self.events),
        ]
        for side, phases in self.sides.items():
            if not any(figures.calls for figures in phases.values()):
                continue
            for phase, figures in phases.items():
                lines.append(
                    f"  side {side} {phase:>6}: {figures.calls} calls, {figures.answered} "
                    f"answered ({figures.answered_share:.1%}): {figures.acknowledged} "
                    f"acknowledged, {figures.conflicts} conflicts, {figures.reads} reads, "
                    f"{figures.unknown} unknown, {figures.failed_reads} failed reads; "
                    f"{figures.unavailable} unavailable"
                )
        if self.verdicts:
            lines.append(f"  verdicts: {self.verdicts}")
        lines += [f"  {name}: {value}" for name, value in self.figures.items()]
        lines += [f"VIOLATION {text}" for text in self.violations]
        return "\n".join(lines)


@dataclass(frozen=True)
class Seen:
    """The clients' lines, sorted out."""

    calls: list[tuple[str, str, Call]]  # side, phase (workload/final), call
    probes: list[dict[str, Any]]
    anomalies: list[str]

    @classmethod
    def of(cls, lines: Iterable[dict[str, Any]]) -> Seen:
        calls, probes, anomalies = [], [], []
        for line in lines:
            if line["type"] == "call":
                calls.append((line["side"], line["phase"], call_from_json(line)))
            elif line["type"] == "probe":
                probes.append(line)
            elif line["type"] == "anomaly":
                anomalies.append(f"side {line['side']}: {line['text']}")
            # "fs" and "fs-final": the namespace's (``fs_violations``).
        return cls(calls, probes, anomalies)


def judge(
    nemesis: str, seed: int, run: Run, lines: list[dict[str, Any]], origin_s: float
) -> Report:
    seen = Seen.of(lines)
    results = verdicts([call.op for _side, _phase, call in seen.calls if not call.failed_read])
    report = Report(
        nemesis,
        seed,
        [(at_s - origin_s, what) for at_s, what in run.events],
        side_figures(seen, run.nemesis_s),
        {key: result.verdict for key, result in results.items()},
        home=str(run.home),
        origin_s=origin_s,
    )
    report.violations += seen.anomalies
    for result in results.values():
        if result.verdict != "ok":  # "unknown" (past the step budget) proves nothing
            report.violations.append(result.describe()[:VIOLATION_CHARS_MAX])
    report.violations += final_read_violations(seen)
    report.violations += fs_violations(lines, report.figures)
    report.violations += epoch_violations(seen.probes)
    served = configurations(seen.probes)
    report.figures["configurations served (epoch: members)"] = served
    if nemesis in FAULTLESS and max(served, default=0) > PEERS:
        report.violations.append(
            f"with no fault after the start the ring decided {max(served)} configurations "
            f"(founding it and {PEERS - 1} joins make {PEERS}): a member was removed"
        )
    if "cut" in run.windows:
        report.violations += minority_violations(seen, run, report.figures)
    if "clocks" in run.windows:
        clock_figures(seen, run, report.figures)
    return report


def fs_violations(lines: Sequence[dict[str, Any]], figures: dict[str, Any]) -> list[str]:
    """The ``sr3://`` namespace's promises, from both sides' calls (``fs_loop``) and what
    was read back after the heal (``fs_final``):

    - create-if-absent has at most one winner per path, and the file then holds the
      winner's bytes; with no winner it holds nothing or the bytes of a create whose
      outcome is unknown, never those of a refused one;
    - a rename is atomic: acknowledged, the bytes are at the target and the source is
      gone; refused, nothing moved; unknown, the bytes are at exactly one of the two;
    - after the heal every path reads back, and both sides read the same."""
    calls = [line for line in lines if line.get("type") == "fs"]
    finals: dict[str, set[str | None]] = collections.defaultdict(set)
    unread = set()
    for line in lines:
        if line.get("type") == "fs-final":
            if line["read"]:
                finals[line["path"]].add(line["data"])
            else:
                unread.add(line["path"])
    found = [f"{path}: not readable after the heal" for path in sorted(unread - finals.keys())]
    for path, seen in sorted(finals.items()):
        if len(seen) > 1:
            found.append(f"{path}: the two sides read different contents after the heal: {seen}")

    def final(path: str) -> str | None:
        return next(iter(finals[path])) if len(finals.get(path, ())) == 1 else None

    creates: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    renames = [call for call in calls if call["op"] == "rename"]
    renamed_sources = {call["path"] for call in renames}
    for call in calls:
        if call["op"] == "create" and call["path"] not in renamed_sources:
            creates[call["path"]].append(call)
    for path, attempts in sorted(creates.items()):
        if path not in finals:
            continue
        won = [a for a in attempts if a["outcome"] == "ok"]
        maybe = {a["data"] for a in attempts if a["outcome"] == "unknown"}
        refused = {a["data"] for a in attempts if a["outcome"] == "refused"}
        now = final(path)
        if len(won) > 1:
            found.append(f"{path}: {len(won)} creates acknowledged: {[a['data'] for a in won]}")
        elif won and now != won[0]["data"]:
            found.append(f"{path}: holds {now!r}, not the acknowledged create {won[0]['data']!r}")
        elif not won and now is not None and now not in maybe:
            why = "a refused create's" if now in refused else "bytes no create wrote"
            found.append(f"{path}: holds {now!r} ({why}) with no create acknowledged")
    for call in renames:
        source, target, data = call["path"], call["target"], call["data"]
        if source not in finals or target not in finals:
            continue
        at = (final(source), final(target))
        expected = {
            "ok": [(None, data)],
            "refused": [(data, None)],
            "unknown": [(None, data), (data, None)],
        }[call["outcome"]]
        if at not in expected:
            found.append(
                f"rename {source} -> {target} ({call['outcome']}): source holds {at[0]!r}, "
                f"target {at[1]!r}; {data!r} belongs at exactly one of them"
            )
    figures["sr3:// calls (create, rename)"] = (
        f"{len(calls)}: {sum(1 for c in calls if c['outcome'] == 'ok')} acknowledged, "
        f"{sum(1 for c in calls if c['outcome'] == 'refused')} refused, "
        f"{sum(1 for c in calls if c['outcome'] == 'unknown')} unknown"
    )
    figures["sr3:// contested paths won"] = sum(
        1 for attempts in creates.values() if any(a["outcome"] == "ok" for a in attempts)
    )
    return found


def clock_figures(seen: Seen, run: Run, figures: dict[str, Any]) -> None:
    """While wall clocks were off: each side's calls decided, as a figure. Not a
    violation below a bound: libfaketime in every peer costs it about half its request
    rate (every clock read of the interpreter goes through the library, the GIL's
    included), which on two cores is enough to time calls out now and then. The bound
    is held where one peer alone runs under it (``test_ring_records``: a peer 600 s
    behind is one acceptor of five, every call decided)."""
    start_s, end_s = run.windows["clocks"]
    for side in SIDE_HOSTS:
        calls = [
            call
            for call_side, phase, call in seen.calls
            if call_side == side and phase == "workload" and start_s <= call.op.invoke_s < end_s
        ]
        settled = sum(1 for call in calls if decided(call))
        share = settled / len(calls) if calls else 0.0
        figures[f"side {side} decided while clocks were off"] = (
            f"{settled} of {len(calls)} ({share:.2%})"
        )
        refused = sum(1 for call in calls if "clock_skew" in call.message)
        figures[f"side {side} calls failing on a clock_skew answer"] = refused


def side_figures(seen: Seen, nemesis_s: tuple[float, float]) -> dict[str, dict[str, SideFigures]]:
    """Per side, per phase: before the nemesis, during it, after it, final reads."""
    figures: dict[str, dict[str, SideFigures]] = {
        side: {phase: SideFigures() for phase in PHASES} for side in SIDE_HOSTS
    }
    for side, phase, call in seen.calls:
        figures[side][phase_of(phase, call, nemesis_s)].add(call)
    return figures


def phase_of(phase: str, call: Call, nemesis_s: tuple[float, float]) -> str:
    if phase != "workload":
        return phase
    if call.op.invoke_s < nemesis_s[0]:
        return "before"
    return "during" if call.op.invoke_s < nemesis_s[1] else "after"


def final_read_violations(seen: Seen) -> list[str]:
    """Every client read every key after the heal, and read the last write acknowledged
    before its read began, or a later write (acknowledged or of unknown outcome)."""
    acknowledged: dict[str, list[Operation]] = collections.defaultdict(list)
    proposed: dict[tuple[str, int], set[str | None]] = collections.defaultdict(set)
    finals: dict[tuple[int, str], list[Operation]] = collections.defaultdict(list)
    for _side, phase, call in seen.calls:
        op = call.op
        if op.kind != "read" and op.outcome != "fail":
            proposed[(op.key, op.expected_version + 1)].add(op.value)
        if op.kind != "read" and op.outcome == "ok":
            acknowledged[op.key].append(op)
        if phase == "final" and op.outcome == "ok":
            finals[(op.client, op.key)].append(op)
    found = []
    for client in sorted({call.op.client for _side, _phase, call in seen.calls}):
        for key in KEYS:
            if not finals[(client, key)]:
                found.append(f"client {client} never read {key} after the heal")
            for read in finals[(client, key)]:
                before = [op for op in acknowledged[key] if op.return_s < read.invoke_s]
                last = max(before, key=lambda op: op.expected_version, default=None)
                version = 0 if last is None else last.expected_version + 1
                value = None if last is None else last.value
                seen_version = 0 if read.observed is None else read.observed.version
                seen_value = None if read.observed is None else read.observed.value
                later = seen_version > version and seen_value in proposed[(key, seen_version)]
                if (seen_version, seen_value) != (version, value) and not later:
                    found.append(
                        f"client {client} read {key} as {read.observed} after the heal; the "
                        f"last write acknowledged before is version {version} ({value!r})"
                    )
    return found


def epoch_violations(probes: Sequence[dict[str, Any]]) -> list[str]:
    """No two configurations served under one epoch, and one cluster id."""
    by_epoch: dict[int, set[tuple[str, ...]]] = collections.defaultdict(set)
    clusters = {probe["cluster"] for probe in probes if "cluster" in probe}
    for probe in probes:
        if "epoch" in probe:
            by_epoch[probe["epoch"]].add(tuple(probe["config"]))
    found = [
        f"epoch {epoch} served with different members: {sorted(configs)}"
        for epoch, configs in sorted(by_epoch.items())
        if len(configs) > 1
    ]
    if len(clusters) > 1:
        found.append(f"peers serve {len(clusters)} cluster ids: {sorted(clusters)}")
    return found


def configurations(probes: Sequence[dict[str, Any]]) -> dict[int, int]:
    """Every epoch some peer served, with its member count: removals and joins show."""
    served = {(p["epoch"], tuple(p["config"])) for p in probes if "epoch" in p}
    return {epoch: len(config) for epoch, config in sorted(served)}


def minority_violations(seen: Seen, run: Run, figures: dict[str, Any]) -> list[str]:
    """The minority partition's promises, while the cut lasted (and its figures)."""
    cut_start_s, cut_end_s = run.windows["cut"]
    found = []
    minority = [
        call
        for side, phase, call in seen.calls
        if side == "b" and phase == "workload"
        if call.op.invoke_s >= cut_start_s and call.ended_s <= cut_end_s
    ]
    acknowledged = [c for c in minority if c.op.kind != "read" and c.op.outcome == "ok"]
    reads = [c for c in minority if c.op.kind == "read" and c.op.outcome == "ok"]
    figures["minority calls during the cut"] = len(minority)
    figures["minority acknowledged writes"] = len(acknowledged)
    figures["minority reads answered"] = len(reads)
    figures["minority conflicts"] = sum(
        1 for c in minority if c.op.kind != "read" and c.op.outcome == "fail"
    )
    for call in [*acknowledged, *reads]:
        found.append(f"minority side answered while cut off: {call.op.describe()}")
    counted_from_s = cut_start_s + FAILURE_TIMEOUT_S
    majority = [
        call
        for side, phase, call in seen.calls
        if side == "a" and phase == "workload" and counted_from_s <= call.op.invoke_s < cut_end_s
    ]
    answered = sum(1 for call in majority if call.answered)
    settled = sum(1 for call in majority if decided(call))
    share = settled / len(majority) if majority else 0.0
    figures["majority calls from the failure timeout to the heal"] = len(majority)
    figures["majority answered (acknowledged, conflict, read)"] = (
        f"{answered} ({answered / max(1, len(majority)):.2%})"
    )
    figures["majority decided (answered, or pre-empted by writers)"] = f"{settled} ({share:.2%})"
    if share < MAJORITY_DECIDED_MIN:
        errors = collections.Counter(c.error or "failed read" for c in majority if not decided(c))
        found.append(
            f"majority side had {settled} of {len(majority)} calls decided ({share:.2%}) from "
            f"{FAILURE_TIMEOUT_S} s into the cut until the heal, below "
            f"{MAJORITY_DECIDED_MIN:.0%}: {dict(errors)}"
        )
    found += minority_ring_violations(seen.probes, run, figures)
    return found


def minority_ring_violations(
    probes: Sequence[dict[str, Any]], run: Run, figures: dict[str, Any]
) -> list[str]:
    """The cut-off peer removes nobody: during the cut, every ring it serves has every
    member of the configuration the cut began with."""
    cut_start_s, cut_end_s = run.windows["cut"]
    answered = [probe for probe in probes if "members" in probe]
    before = [p for p in answered if p["at_s"] < cut_start_s]
    if not before:
        return ["no peer's ring was seen before the cut"]
    members_before = set(max(before, key=lambda p: p["epoch"])["config"])
    during = [p for p in answered if cut_start_s <= p["at_s"] <= cut_end_s]
    cut_off = {peer_id(index) for index in run.minority}
    minority = [p for p in during if peer_id(peer_index(p["peer"])) in cut_off]
    majority = [p for p in during if peer_id(peer_index(p["peer"])) not in cut_off]
    figures["minority peer's ring during the cut (members, fewest)"] = min(
        (len(p["members"]) for p in minority), default=None
    )
    figures["majority's configuration during the cut (members, fewest)"] = min(
        (len(p["config"]) for p in majority), default=None
    )
    if not minority:
        return ["the minority peer's ring was never seen during the cut"]
    return [
        f"{peer_id(peer_index(p['peer']))} served a ring without "
        f"{sorted(members_before - set(p['members']))} while cut off (epoch {p['epoch']})"
        for p in minority
        if not members_before <= set(p["members"])
    ]
