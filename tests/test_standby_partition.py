"""A hot-standby driver that was only partitioned away must not commit again after it
comes back (``spark_connector.standby``, ``sr3.standby_app``), on five hosts of the
network lab (``tests/netlab.py``).

Layout: hosts 0-2 run a ring of three peers (R=3, W=2); hosts 3 and 4 each run one
driver of the same query (``python -m sr3.standby_app``: the demo query, ``foreachBatch``
into an output directory of its own, a lease of ``LEASE_TIMEOUT_S``). The checkpoint is
either local, one directory per driver pushed by ``StateSync`` (``sync``), or one on the
ring, ``sr3:///spark/tests/<query>``, whose offset and commit files are written fenced
(``fs``). Both drivers start at once; the first to take the lease is the active driver,
the other waits as its standby. A watcher on host 0 (this module, run as a script)
records every version of the lease record and of the query's manifests it sees: with the
drivers' event files, their outputs and, for ``fs``, the checkpoint's commit log on the
ring after the run, that is the history the checker reads. The reference is the same job
run alone to the same batch under another query name, once for the module.

What breaks, once the active driver committed ``COMMITTED_BEFORE_CUT`` batches (and,
with ``sync``, pushed its newest: see ``cut_off``) and the standby is ready:

- ``test_a_driver_cut_off_past_its_lease_never_commits_after_the_takeover`` (both
  checkpoints): the active driver's host is cut off from every other host (peers and
  standby) until it gave its query up, then healed;
- ``test_a_driver_cut_off_briefly_keeps_its_lease`` (local checkpoints): the same cut, for
  ``BRIEF_CUT_S``, well inside the lease's timeout.

What must hold after the long cut (``takeover_violations``): the standby takes over with
fence 2 from the active driver, which logs ``lost`` while still cut off and exits 4, and
records no commit after the heal; the lease's fences only grow, one holder each; the
old driver's batches up to the one the new driver resumed after and the new driver's
after it are the reference's output. With ``sync`` that holds batch for batch (as for
every batch either wrote), and on the ring no manifest of the old driver is of a batch
past the resume point or was pushed after the new fence was taken, and every batch past
it is the new driver's. With ``fs`` it holds row for row (the old driver may have logged
the input of the batch it planned next, unfenced, and the new one reads it with its
first batch, so batch ids may run one behind), the commit log holds each batch of the
run once, every commit written after the takeover is of a batch past the resume point
and every one past it was written after the takeover, and the state the new driver ends
with is the reference's. After the brief cut (``kept_violations``) nobody takes over
while the active driver holds the lease (fence 1 until it released it, once done, and
no takeover logged before), the active driver loses nothing and finishes with the
reference's output, and every manifest is its own. How many batches the old driver
still committed locally after the takeover is printed, not checked (``late_commits``).
The checks themselves are tested on made-up histories that must (and must not) fail
them; those need no lab.

Run as a script inside a lab host (``SR3_RING``, ``SR3_SECRET``), this module is the
watcher and the lister of the ring::

    python tests/test_standby_partition.py watch QUERY OUT STOP_FILE
    python tests/test_standby_partition.py list PATH

``watch`` polls until ``STOP_FILE`` exists and writes JSON lines to ``OUT``; ``list``
prints the entries of a namespace directory as one JSON list. Everything a run leaves
(events, logs, the watcher's lines) stays in the module's temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from netlab import NetLab, require_netlab
from support import SEED, SEED_ENV, require_spark

from ring.auth import generate_secret
from ring.config import ClusterFile, ClusterPeer
from ring.errors import SR3Error
from ring.lease import parse_lease
from ring.placement import VNODES_DEFAULT
from sr3.local import peer_command
from sr3.spark_demo import Output, Row, read_output, scratch_beside, with_scratch, write_inputs
from sr3.standby_app import StandbyJob, read_events

PEERS = 3
DRIVER_HOSTS = (3, 4)
WATCH_HOST = 0
HOSTS = PEERS + len(DRIVER_HOSTS)
PEER_PORT = 7401
PEER_FLAGS = (
    "--failure-timeout", "1.5",
    "--removal-grace", "4.0",
    "--gossip-interval", "0.2",
    "--repair-interval", "5",
    "--scrub-rate", "0",
)  # fmt: skip
FILES = 10
# The batch after the last file's: with no input, Spark closes the windows the last
# file's watermark passed (the reference's state and output are then final).
UNTIL_BATCH = FILES
LEASE_TIMEOUT_S = 3.0
# The pair's trigger bounds how far a cut-off driver runs ahead before it stops (about
# the lease's timeout and one renewal's write timeout): it must not reach UNTIL_BATCH.
TRIGGER_S = 1.5
REFERENCE_TRIGGER_S = 0.5
BRIEF_CUT_S = 1.0
COMMITTED_BEFORE_CUT = 2
FS_ROOT = "/spark/tests"
MODES = ("sync", "fs")
# Bounds of one run.
READY_WAIT_S = 60.0
START_WAIT_S = 150.0
TAKEOVER_WAIT_S = 45.0
FINISH_WAIT_S = 150.0
EXIT_WAIT_S = 30.0
LIST_WAIT_S = 30.0
RUN_S_MAX = 300.0
# One test, with the module's lab and reference run when it is the first (a loaded
# 2-core machine starts two Spark drivers at once in about a minute).
TEST_TIMEOUT_S = 480
# After the brief cut's heal the active driver runs at least this long (past a lapse and
# a standby's poll), or the run proves nothing.
KEEP_WATCH_S = 1.5 * LEASE_TIMEOUT_S
# A run whose batch ids shifted at the takeover ends once no batch ran for this long.
IDLE_STOP_S = 6.0
WATCH_POLL_S = 0.25
WATCH_ERRORS_MAX = 200
LOG_TAIL_CHARS = 4000
EVENT_POLL_S = 0.1


# -- the lab: three peers, two driver hosts --------------------------------------------------


@dataclass
class Lab:
    """The module's lab and ring, shared by its tests (each with queries of its own),
    and the reference run's output and final state."""

    net: NetLab
    home: Path
    cluster: ClusterFile
    input_dir: Path
    reference: Output = field(default_factory=dict)
    reference_state: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SR3_RING": ",".join(self.cluster.addresses),
            "SR3_SECRET": self.cluster.secret,
            # A driver's Spark binds its host's loopback, never the lab link.
            "SPARK_LOCAL_IP": "127.0.0.1",
        }

    def logs(self, *names: str) -> str:
        paths = [self.home / name for name in names] or sorted(self.home.glob("*.log"))
        return "\n".join(
            f"--- {path.name}:\n{path.read_text(errors='replace')[-LOG_TAIL_CHARS:]}"
            for path in paths
            if path.exists()
        )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_netlab()
    require_spark()
    home = tmp_path_factory.mktemp("standby-lab")
    with NetLab(HOSTS) as net:
        cluster = ClusterFile(
            secret=generate_secret(),
            replication=3,
            write_quorum=2,
            vnodes=VNODES_DEFAULT,
            peers=tuple(
                ClusterPeer(f"peer-{i + 1}", f"{net.address(i)}:{PEER_PORT}", str(home / f"p{i}"))
                for i in range(PEERS)
            ),
            home=str(home),
            peer_flags=PEER_FLAGS,
        )
        env = {**os.environ, "SR3_SECRET": cluster.secret}
        for index, peer in enumerate(cluster.peers):
            Path(peer.data_dir).mkdir()
            net.start_peer(
                index, peer_command(cluster, peer), env=env, log_path=home / f"{peer.peer_id}.log"
            )
            if index == 0:  # the founder first: the others join through it
                net.wait_listening(DRIVER_HOSTS[0], 0, PEER_PORT, wait_s=READY_WAIT_S)
        ready = net.run(
            DRIVER_HOSTS[0],
            [sys.executable, str(Path(__file__).with_name("fault_client.py")), "ready",
             "--ring", ",".join(cluster.addresses), "--members", str(PEERS),
             "--wait-s", str(READY_WAIT_S)],
            timeout_s=READY_WAIT_S + 20,
        )  # fmt: skip
        assert ready.returncode == 0, f"the ring is not ready: {ready.stdout} {ready.stderr}"
        built = Lab(net, home, cluster, home / "input")
        write_inputs(built.input_dir, FILES, SEED % 10_000)
        run_reference(built)
        yield built


def run_reference(lab: Lab) -> None:
    """The job run alone to ``UNTIL_BATCH`` under a query of its own: its output and
    state are the lab's reference."""
    driver = Driver(lab, DRIVER_HOSTS[0], f"reference-{SEED % 10**8}", "reference", "sync",
                    REFERENCE_TRIGGER_S, keep_state=True)  # fmt: skip
    driver.start()
    code = driver.wait_exit(START_WAIT_S + FINISH_WAIT_S)
    events = driver.events()
    assert code == 0 and events and events[-1]["event"] == "done", (
        f"the reference run ended with {code}: {events}\n{lab.logs('reference.log')}"
    )
    lab.reference = driver.output()
    lab.reference_state = driver.state()
    assert sorted(lab.reference) == list(range(UNTIL_BATCH + 1)) and lab.reference_state


# -- drivers, the watcher, the lister ---------------------------------------------------------


class Driver:
    """One ``sr3.standby_app`` process on a lab host, and what it wrote."""

    def __init__(
        self, lab: Lab, host: int, query: str, name: str, mode: str,
        trigger_s: float = TRIGGER_S, keep_state: bool = False,
    ) -> None:  # fmt: skip
        self.lab = lab
        self.host = host
        self.name = name
        folder = lab.home / name
        checkpoint = f"sr3://{FS_ROOT}/{query}" if mode == "fs" else str(folder / "checkpoint")
        self.job = StandbyJob(
            query=query,
            checkpoint=checkpoint,
            input_dir=str(lab.input_dir),
            output_dir=str(folder / "output"),
            events_path=str(folder / "events.jsonl"),
            holder=name,
            lease_timeout_s=LEASE_TIMEOUT_S,
            trigger_s=trigger_s,
            until_batch=UNTIL_BATCH,
            stop_idle_s=IDLE_STOP_S,
            run_s_max=RUN_S_MAX,
            # The state is compared where the output alone may not show it (sr3://).
            state_path=str(folder / "state.json") if mode == "fs" or keep_state else "",
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "sr3.standby_app", self.job.to_json()]
        log_path = self.lab.home / f"{self.name}.log"
        env = with_scratch(self.lab.env, scratch_beside(log_path))
        self.process = self.lab.net.start_peer(self.host, command, env=env,
                                               log_path=log_path)  # fmt: skip

    def events(self) -> list[dict[str, Any]]:
        return read_events(Path(self.job.events_path))

    def output(self) -> Output:
        return read_output(Path(self.job.output_dir))

    def state(self) -> list[str]:
        """The state rows the driver wrote at ``UNTIL_BATCH`` (none if it did not)."""
        path = Path(self.job.state_path) if self.job.state_path else None
        rows = json.loads(path.read_text()) if path is not None and path.exists() else []
        return [str(row) for row in rows]

    @property
    def root(self) -> str:
        """Its checkpoint directory, as its manifests name it."""
        return str(Path(self.job.checkpoint).resolve())

    def exit_code(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def wait_exit(self, timeout_s: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> int | None:
        assert self.process is not None
        return self.lab.net.kill(self.process)


class Watcher:
    """The watcher process on ``WATCH_HOST`` (this module as a script)."""

    def __init__(self, lab: Lab, query: str) -> None:
        self.lab = lab
        self.out = lab.home / f"watch-{query}.jsonl"
        self.stop_file = lab.home / f"watch-{query}.stop"
        command = [sys.executable, str(Path(__file__)), "watch", query, str(self.out),
                   str(self.stop_file)]  # fmt: skip
        log_path = lab.home / f"watch-{query}.log"
        self.process = lab.net.start_peer(WATCH_HOST, command, env=lab.env, log_path=log_path)

    def lines(self) -> list[dict[str, Any]]:
        return read_events(self.out)

    def stop(self) -> list[dict[str, Any]]:
        self.stop_file.touch()
        code: int | None
        try:
            code = self.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = self.lab.net.kill(self.process)
        assert code == 0, f"the watcher exited with {code}\n{self.lab.logs(self.out.name)}"
        return self.lines()


def list_ring(lab: Lab, path: str) -> list[dict[str, Any]]:
    """The entries of namespace directory ``path`` (name, mtime_ms), read from a peer
    host (``[]`` when it does not exist)."""
    command = [sys.executable, str(Path(__file__)), "list", path]
    done = lab.net.run(WATCH_HOST, command, timeout_s=LIST_WAIT_S, env=lab.env)
    assert done.returncode == 0, f"listing {path}: {done.stdout} {done.stderr}"
    entries: list[dict[str, Any]] = json.loads(done.stdout)
    return entries


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float, lab: Lab) -> None:
    """Poll ``predicate`` until it is true; fail with the logs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout_s:.0f} s: {what}\n{lab.logs()}")
        time.sleep(EVENT_POLL_S)


def first(events: Sequence[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((event for event in events if event["event"] == kind), None)


def committed(events: Sequence[dict[str, Any]]) -> list[int]:
    return [event["batch"] for event in events if event["event"] == "committed"]


def start_pair(lab: Lab, query: str, mode: str) -> tuple[Driver, Driver, Watcher]:
    """Both drivers started at once, and the watcher; once one holds the lease and has
    committed ``COMMITTED_BEFORE_CUT`` batches while the other is ready: the active
    driver and the standby."""
    drivers = [Driver(lab, host, query, f"{query}-h{host}", mode) for host in DRIVER_HOSTS]
    watcher = Watcher(lab, query)
    for driver in drivers:
        driver.start()

    def active() -> Driver | None:
        return next((d for d in drivers if first(d.events(), "took_over") is not None), None)

    wait_for(f"a driver of {query} takes the lease", lambda: active() is not None,
             START_WAIT_S, lab)  # fmt: skip
    holder = active()
    assert holder is not None
    standby = next(driver for driver in drivers if driver is not holder)

    def settled() -> bool:
        ready = first(standby.events(), "ready") is not None
        return ready and len(committed(holder.events())) >= COMMITTED_BEFORE_CUT

    wait_for(f"{holder.name} commits, {standby.name} is ready", settled, START_WAIT_S, lab)
    for driver in drivers:
        assert driver.exit_code() is None, f"{driver.name} exited\n{lab.logs()}"
    return holder, standby, watcher


def cut_off(lab: Lab, active: Driver, watcher: Watcher, mode: str) -> float:
    """Cut the active driver's host off from every other host; the wall-clock time of
    the cut. With ``sync``, between two pushes: once the manifest of the newest batch it
    wrote output for (before committing it) is on the ring. A cut in the middle of a
    manifest write can leave it to show up on the ring later, after the takeover: the
    write is checked against the lease before it is sent, not fenced by the ring
    (docs/standby.md, "What fencing does not close"); that gap is not what this module
    tests."""

    def pushed() -> bool:
        manifests = [line["batch"] for line in watcher.lines() if line["kind"] == "manifest"]
        return max(active.output(), default=-2) == max(manifests, default=-1)

    if mode == "sync":
        wait_for(f"{active.name} pushes its newest batch", pushed, START_WAIT_S, lab)
    lab.net.partition([[active.host], [h for h in range(HOSTS) if h != active.host]])
    return time.time()


# -- the history and its checks --------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """What one run left: both drivers' events, outputs and exit codes, the ring as the
    watcher saw it (and, for an ``sr3://`` checkpoint, its commit log afterwards), when
    the cut began and was healed (wall clock), and the reference's output and state."""

    mode: str
    active: str
    standby: str
    active_root: str
    standby_root: str
    active_events: list[dict[str, Any]]
    standby_events: list[dict[str, Any]]
    ring: list[dict[str, Any]]
    active_output: Output
    standby_output: Output
    active_exit: int | None
    standby_exit: int | None
    cut_at: float
    healed_at: float
    reference: Output
    until_batch: int
    commits: list[dict[str, Any]] = field(default_factory=list)
    standby_state: list[str] = field(default_factory=list)
    reference_state: list[str] = field(default_factory=list)


def taken_at(history: History) -> float | None:
    """When (wall clock) the lease was first taken with a fence above 1, as recorded."""
    return min(
        (line["acquired_at"] for line in history.ring
         if line["kind"] == "lease" and line["fence"] >= 2),
        default=None,
    )  # fmt: skip


def lease_violations(history: History) -> list[str]:
    """Fences only grow, each has one holder, and the watcher could read the ring."""
    found = []
    leases = [line for line in history.ring if line["kind"] == "lease"]
    holders: dict[int, str] = {}
    for before, after in itertools.pairwise(leases):
        if after["fence"] < before["fence"]:
            found.append(f"the lease's fence went back from {before['fence']} to {after}")
    for line in leases:
        if holders.setdefault(line["fence"], line["holder"]) != line["holder"]:
            found.append(f"fence {line['fence']} held by {holders[line['fence']]} and {line}")
    found += [f"the watcher gave up reading the ring: {line}" for line in history.ring
              if line["kind"] == "gave_up"]  # fmt: skip
    return found


def output_violations(history: History, output: Output, who: str) -> list[str]:
    """Every batch ``who`` wrote is the reference's."""
    return [
        f"{who} wrote batch {batch} as {rows}; the reference has {history.reference.get(batch)}"
        for batch, rows in sorted(output.items())
        if batch <= history.until_batch and history.reference.get(batch) != rows
    ]


def takeover_violations(history: History) -> list[str]:
    """The checks after a cut past the lease (see the module)."""
    found = lease_violations(history)
    took = first(history.standby_events, "took_over")
    if took is None:
        return [*found, f"{history.standby} never took over: {history.standby_events}"]
    if (took["fence"], took["previous"]) != (2, history.active):
        found.append(f"{history.standby} took over with fence {took['fence']} from "
                     f"{took['previous']}, not fence 2 from {history.active}")  # fmt: skip
    resumed = took["resumed_after"]
    if not isinstance(resumed, int):
        return [*found, f"{history.standby} resumed after {resumed!r}, not after a batch"]
    lost = first(history.active_events, "lost")
    if lost is None or history.active_exit != 4:
        found.append(f"{history.active} exited {history.active_exit} without losing the "
                     f"lease: {history.active_events[-3:]}")  # fmt: skip
    elif not history.cut_at < lost["wall"] < history.healed_at:
        found.append(f"{history.active} lost its lease at {lost['wall']}, not while cut off "
                     f"({history.cut_at}..{history.healed_at})")  # fmt: skip
    found += [
        f"{history.active} committed batch {event['batch']} after the heal"
        for event in history.active_events
        if event["event"] == "committed" and event["wall"] >= history.healed_at
    ]
    if history.standby_exit != 0 or first(history.standby_events, "done") is None:
        found.append(f"{history.standby} exited {history.standby_exit} before batch "
                     f"{history.until_batch}: {history.standby_events[-3:]}")  # fmt: skip
    taken = taken_at(history)
    if taken is None:
        return [*found, "the watcher never saw the lease taken over (fence 2)"]
    if history.mode == "sync":
        found += manifest_violations(history, resumed, taken)
    else:
        found += commit_log_violations(history, resumed, taken)
    return found + merged_output_violations(history, resumed)


def merged_output_violations(history: History, resumed: int) -> list[str]:
    """The old driver's output up to the resume point and the new one's after it are
    the reference's: batch for batch with local checkpoints (the pushed cut keeps the
    batches' boundaries), row for row with ``sr3://`` (the old driver may have logged the
    files of the batch it planned next, which the new one then reads with its first)."""
    merged = {b: rows for b, rows in history.active_output.items() if b <= resumed}
    merged |= {b: rows for b, rows in history.standby_output.items() if b > resumed}
    merged = {b: rows for b, rows in merged.items() if b <= history.until_batch}
    expected = {b: rows for b, rows in history.reference.items() if b <= history.until_batch}
    if history.mode == "fs":
        rows, reference = Counter(rows_of(merged)), Counter(rows_of(expected))
        extra = sorted((rows - reference).elements())
        missing = sorted((reference - rows).elements())
        if extra or missing:
            return [f"the output has rows the reference has not: {extra[:10]}, and lacks "
                    f"{missing[:10]} ({history.active}'s up to batch {resumed}, then "
                    f"{history.standby}'s)"]  # fmt: skip
        return []
    found = output_violations(history, history.active_output, history.active)
    found += output_violations(history, history.standby_output, history.standby)
    if merged != expected:
        found.append(f"the output (batches {sorted(merged)}: {history.active}'s up to "
                     f"{resumed}, then {history.standby}'s) is not the reference's "
                     f"(batches {sorted(expected)})")  # fmt: skip
    return found


def rows_of(output: Output) -> list[Row]:
    return [row for _batch, rows in sorted(output.items()) for row in rows]


def manifest_violations(history: History, resumed: int, taken: float) -> list[str]:
    """Local checkpoints: the old driver's manifests are of batches up to the resume
    point and were pushed before the takeover; every later batch is the new driver's."""
    found = []
    for line in history.ring:
        if line["kind"] != "manifest":
            continue
        batch, root = line["batch"], line["root"]
        if root == history.active_root and batch > resumed:
            found.append(f"{history.active} pushed batch {batch}, past batch {resumed} that "
                         f"{history.standby} resumed after: {line}")  # fmt: skip
        if root == history.active_root and line["pushed_at"] > taken:
            found.append(f"{history.active} pushed batch {batch} after the takeover: {line}")
        if batch > resumed and root != history.standby_root:
            found.append(f"batch {batch} on the ring is not {history.standby}'s: {line}")
    return found


def commit_log_violations(history: History, resumed: int, taken: float) -> list[str]:
    """An ``sr3://`` checkpoint: each batch committed once; commits after the takeover
    are the new driver's batches, past the resume point, and only those; the new
    driver's final state is the reference's."""
    found = []
    batches = sorted(int(entry["name"]) for entry in history.commits if entry["name"].isdigit())
    # The new driver's batch ids may run one behind the reference's (see above).
    if batches not in (list(range(n + 1)) for n in (history.until_batch - 1, history.until_batch)):
        found.append(f"the commit log holds batches {batches}, not 0..{history.until_batch} "
                     "(or one fewer) once each")  # fmt: skip
    for entry in history.commits:
        if not entry["name"].isdigit():
            continue
        after = entry["mtime_ms"] / 1000 > taken
        if after != (int(entry["name"]) > resumed):
            found.append(f"commit {entry['name']} written {'after' if after else 'before'} the "
                         f"takeover ({taken}), {history.standby} resumed after {resumed}: "
                         f"{entry}")  # fmt: skip
    if history.standby_state != history.reference_state:
        found.append(f"{history.standby} ended with {len(history.standby_state)} state rows "
                     f"unlike the reference's {len(history.reference_state)}")  # fmt: skip
    return found


def kept_violations(history: History) -> list[str]:
    """The checks after a brief cut (see the module). Once done, the active driver
    releases the lease, and the standby may take it then: only a take before is one."""
    found = lease_violations(history)
    done = first(history.active_events, "done")
    if first(history.active_events, "lost") is not None or done is None:
        found.append(f"{history.active} exited {history.active_exit} after a brief cut: "
                     f"{history.active_events[-3:]}")  # fmt: skip
    done_at = float("inf") if done is None else done["wall"]
    took = first(history.standby_events, "took_over")
    if took is not None and took["wall"] <= done_at:
        found.append(f"{history.standby} took over after a brief cut: {took}")
    found += [f"the lease was taken from {history.active} after a brief cut: {line}"
              for line in history.ring
              if line["kind"] == "lease" and line["fence"] != 1
              and line["acquired_at"] <= done_at]  # fmt: skip
    found += [f"a manifest not {history.active}'s: {line}" for line in history.ring
              if line["kind"] == "manifest" and line["root"] != history.active_root]  # fmt: skip
    expected = {b: rows for b, rows in history.reference.items() if b <= history.until_batch}
    output = {b: rows for b, rows in history.active_output.items() if b <= history.until_batch}
    if output != expected:
        found.append(f"{history.active}'s output (batches {sorted(output)}) is not the "
                     f"reference's (batches {sorted(expected)})")  # fmt: skip
    return found


def late_commits(history: History) -> list[int]:
    """Batches the old driver committed (to its own checkpoint and output) after the
    lease was taken over: it stops its query when a renewal has failed, which may be a
    write timeout after its validity ran out. Reported, not checked."""
    taken = taken_at(history)
    return [
        event["batch"]
        for event in history.active_events
        if event["event"] == "committed" and taken is not None and event["wall"] > taken
    ]


def describe(history: History) -> str:
    lines = [f"run seed {SEED} (replay with {SEED_ENV}={SEED}), {history.mode}: cut "
             f"{history.cut_at:.2f}, healed {history.healed_at:.2f}, lease taken over "
             f"{taken_at(history)}; {history.active} committed {late_commits(history)} "
             "after that"]  # fmt: skip
    for who, events in ((history.active, history.active_events),
                        (history.standby, history.standby_events)):  # fmt: skip
        lines += [f"  {who}: {json.dumps(event)}" for event in events]
    lines += [
        f"  ring: {json.dumps(line)}"
        for line in history.ring
        if line["kind"] != "lease" or line["at"] >= history.cut_at - LEASE_TIMEOUT_S
    ]
    lines += [f"  commit log: {json.dumps(entry)}" for entry in history.commits]
    return "\n".join(lines)


def history_of(
    mode: str, active: Driver, standby: Driver, ring: list[dict[str, Any]], lab: Lab,
    cut_at: float, healed_at: float,
) -> History:  # fmt: skip
    commits = list_ring(lab, f"{FS_ROOT}/{active.job.query}/commits") if mode == "fs" else []
    return History(
        mode, active.name, standby.name, active.root, standby.root, active.events(),
        standby.events(), ring, active.output(), standby.output(), active.exit_code(),
        standby.exit_code(), cut_at, healed_at, lab.reference, UNTIL_BATCH, commits,
        standby.state(), lab.reference_state,
    )  # fmt: skip


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.standby
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("mode", MODES)
def test_a_driver_cut_off_past_its_lease_never_commits_after_the_takeover(
    mode: str, lab: Lab, rng: random.Random
) -> None:
    """Breaks: the active driver's host is cut off from the peers and the standby until
    it has given its query up, then healed. Must hold: ``takeover_violations``."""
    query = f"cut-{mode}-{rng.randrange(10**8)}"
    active, standby, watcher = start_pair(lab, query, mode)
    cut_at = cut_off(lab, active, watcher, mode)
    try:
        wait_for(f"{standby.name} takes over",
                 lambda: first(standby.events(), "took_over") is not None,
                 TAKEOVER_WAIT_S, lab)  # fmt: skip
        wait_for(f"{active.name} gives its query up", lambda: active.exit_code() is not None,
                 TAKEOVER_WAIT_S, lab)  # fmt: skip
    finally:
        lab.net.heal()
    healed_at = time.time()
    standby.wait_exit(FINISH_WAIT_S)
    history = history_of(mode, active, standby, watcher.stop(), lab, cut_at, healed_at)
    print(describe(history))
    assert takeover_violations(history) == [], describe(history)


@pytest.mark.slow
@pytest.mark.standby
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_driver_cut_off_briefly_keeps_its_lease(lab: Lab, rng: random.Random) -> None:
    """Breaks: the active driver's host is cut off from the peers and the standby for
    ``BRIEF_CUT_S``, then healed. Must hold: ``kept_violations``."""
    query = f"brief-{rng.randrange(10**8)}"
    active, standby, watcher = start_pair(lab, query, "sync")
    cut_at = cut_off(lab, active, watcher, "sync")
    try:
        time.sleep(BRIEF_CUT_S)
    finally:
        lab.net.heal()
    healed_at = time.time()
    active.wait_exit(FINISH_WAIT_S)
    # The standby may take the lease the active driver released once done; it has shown
    # what it does while the lease is held.
    standby.kill()
    history = history_of("sync", active, standby, watcher.stop(), lab, cut_at, healed_at)
    done = first(history.active_events, "done")
    # A run that ended before a lapse could have passed after the heal proves nothing.
    assert done is None or done["wall"] >= healed_at + KEEP_WATCH_S, describe(history)
    assert kept_violations(history) == [], describe(history)


# -- the checks themselves, on made-up histories (no lab needed) -----------------------------


def made_up(mode: str = "sync", **changes: Any) -> History:
    """A takeover that went right: A committed and pushed batches 0-1, was cut at 10,
    B took the lease at 13 and over after batch 1, A lost it at 15, the heal at 16, B
    ran batches 2-3."""
    reference = {batch: [(f"2024-01-01T00:0{batch}:00", "k1", batch + 1)] for batch in range(4)}

    def event(kind: str, wall: float, **fields: Any) -> dict[str, Any]:
        return {"event": kind, "wall": wall, **fields}

    lease = {"kind": "lease", "holder": "a", "fence": 1, "acquired_at": 1.0, "at": 1.0}
    base = History(
        mode=mode, active="a", standby="b", active_root="/a", standby_root="/b",
        active_events=[event("took_over", 1.0, fence=1), event("committed", 5.0, batch=0),
                       event("committed", 9.0, batch=1), event("lost", 15.0)],
        standby_events=[event("ready", 2.0),
                        event("took_over", 14.0, fence=2, previous="a", resumed_after=1),
                        event("committed", 20.0, batch=2), event("committed", 22.0, batch=3),
                        event("done", 22.1, batch=3)],
        ring=[lease, {**lease, "holder": "b", "fence": 2, "acquired_at": 13.0, "at": 13.1},
              *({"kind": "manifest", "batch": b, "root": root, "pushed_at": at}
                for b, root, at in ((0, "/a", 5.1), (1, "/a", 9.1), (2, "/b", 20.1)))],
        active_output={0: reference[0], 1: reference[1]},
        standby_output={2: reference[2], 3: reference[3]},
        active_exit=4, standby_exit=0, cut_at=10.0, healed_at=16.0, reference=reference,
        until_batch=3,
        commits=[{"name": str(b), "mtime_ms": at} for b, at in
                 ((0, 5_000), (1, 9_000), (2, 20_000), (3, 22_000))],
        standby_state=["row"], reference_state=["row"],
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("mode", MODES)
def test_the_takeover_checks_pass_a_takeover_that_went_right(mode: str) -> None:
    assert takeover_violations(made_up(mode)) == []


def changed(history: History, **changes: Any) -> list[str]:
    """The takeover checks' violations of ``history`` with ``changes``."""
    return takeover_violations(dataclasses.replace(history, **changes))


def test_the_takeover_checks_catch_what_the_old_driver_did_after_the_takeover() -> None:
    """Each made-up fault is found: a manifest of the old driver past the resume point
    (chosen late, as a cut mid-write can leave one), a commit after the heal, a lease
    never lost, an sr3:// commit of the old driver's batch after the takeover, a gap in
    the commit log, output that is not the reference's."""
    good, fs = made_up(), made_up("fs")
    late = {"kind": "manifest", "batch": 2, "root": "/a", "pushed_at": 9.9, "at": 20.0}
    assert any("past batch 1" in v for v in changed(good, ring=[*good.ring, late]))
    after_heal = {"event": "committed", "wall": 17.0, "batch": 2}
    found = changed(good, active_events=[*good.active_events, after_heal])
    assert any("after the heal" in v for v in found)
    found = changed(good, active_events=good.active_events[:-1], active_exit=0)
    assert any("without losing" in v for v in found)
    late_commit = [fs.commits[0], {"name": "1", "mtime_ms": 14_000}, *fs.commits[2:]]
    assert any("written after" in v for v in changed(fs, commits=late_commit))
    assert any("commit log holds" in v for v in changed(fs, commits=fs.commits[1:]))
    wrong = {**good.standby_output, 3: [("2024-01-01T00:03:00", "k1", 5)]}
    assert changed(good, standby_output=wrong)
    assert changed(fs, standby_output=wrong)


def test_the_brief_cut_checks_catch_a_takeover_before_the_release() -> None:
    took = made_up()
    done = {"event": "done", "wall": 22.0, "batch": 3}
    good = dataclasses.replace(
        took,
        active_events=[*took.active_events[:-1], done],
        active_exit=0,
        ring=took.ring[:1],
        standby_events=took.standby_events[:1],
        active_output=dict(took.reference),
    )
    assert kept_violations(good) == []
    released = {**took.ring[1], "acquired_at": 22.5}
    taken_after = {**took.standby_events[1], "wall": 23.0}
    after = dataclasses.replace(good, ring=[*good.ring, released], standby_events=[taken_after])
    assert kept_violations(after) == []
    assert kept_violations(dataclasses.replace(good, standby_events=took.standby_events))
    assert kept_violations(dataclasses.replace(good, ring=took.ring))


# -- the watcher and the lister, run as a script inside a lab host ---------------------------


def watch(query: str, out: Path, stop_file: Path) -> int:
    """Record each new version of the lease and of the query's manifests until
    ``stop_file`` exists (ring errors are recorded and retried, at most
    ``WATCH_ERRORS_MAX``)."""
    from ring.sync_client import SyncClient
    from spark_connector.lease import lease_key
    from spark_connector.manifest import Manifest, manifests_prefix

    client = SyncClient(os.environ["SR3_RING"], os.environ["SR3_SECRET"])
    seen: dict[str, int] = {}
    errors = 0
    with out.open("a", encoding="utf-8") as sink:

        def write(kind: str, **fields: Any) -> None:
            sink.write(json.dumps({"kind": kind, "at": time.time(), **fields}) + "\n")
            sink.flush()

        while not stop_file.exists():
            try:
                record = client.get_record(lease_key(query))
                if record is not None and seen.get("lease") != record.version:
                    seen["lease"] = record.version
                    lease = parse_lease(record.value)
                    write("lease", version=record.version, holder=lease.holder,
                          fence=lease.fence, released=lease.released,
                          acquired_at=lease.acquired_at)  # fmt: skip
                for key, version in sorted(client.list_records(manifests_prefix(query)).items()):
                    if seen.get(key) == version:
                        continue
                    manifest_record = client.get_record(key)
                    seen[key] = version
                    if manifest_record is None:
                        continue  # deleted by retention since the listing
                    manifest = Manifest.from_json(json.loads(manifest_record.value))
                    write("manifest", key=key, version=manifest_record.version,
                          batch=manifest.batch_id, root=manifest.root, host=manifest.host,
                          pushed_at=manifest.pushed_at)  # fmt: skip
            except SR3Error as exc:
                errors += 1
                write("error", text=str(exc)[:300])
                if errors >= WATCH_ERRORS_MAX:
                    write("gave_up", errors=errors)
                    break
            time.sleep(WATCH_POLL_S)
    client.close()
    return 0


async def list_directory(path: str) -> list[dict[str, Any]]:
    from ring.errors import NotFound
    from spark_connector.fs_client import FsClient

    async with FsClient(os.environ["SR3_RING"], os.environ["SR3_SECRET"]) as fs:
        try:
            entries = await fs.list(path)
        except NotFound:
            return []
    return [{"name": entry.name, "mtime_ms": entry.mtime_ms} for entry in entries]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the ring watcher of the standby tests")
    commands = parser.add_subparsers(dest="command", required=True)
    watching = commands.add_parser("watch")
    watching.add_argument("query")
    watching.add_argument("out", type=Path)
    watching.add_argument("stop_file", type=Path)
    listing = commands.add_parser("list")
    listing.add_argument("path")
    options = parser.parse_args(argv)
    if options.command == "list":
        print(json.dumps(asyncio.run(list_directory(options.path))))
        return 0
    return watch(options.query, options.out, options.stop_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
