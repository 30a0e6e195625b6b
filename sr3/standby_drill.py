"""``sr3 drill --spark-standby``: a query's active application and R-1 storage peers die
at the same moment; its hot standby takes the query over, and what it produces must be
exactly what an uninterrupted run produces.

``run_standby_drill``, in a temporary home that is always cleaned up:

1. an embedded local ring (R=3 by default) comes up;
2. the reference, one ``sr3.standby_app`` under a query name of its own, runs every
   batch uninterrupted and writes its state rows (it holds its lease alone);
3. meanwhile the active application A starts on its input directory, still empty, and
   takes the query's lease (fence 1); then the standby B starts and stands by (sync:
   its own local checkpoint, pulled from what A pushes; fs: the ``sr3://`` checkpoint
   both share);
4. once B is ready and the reference has finished, the input appears (one rename), A
   runs, and once A committed about a third of the batches, A's whole process group
   (Python and JVM) and R-1 peers are SIGKILLed together;
5. B takes the query over when A's lease lapses and runs past the last file
   (``until_batch``); its output (with A's) and its state are compared with the
   reference's: every row once, whichever batch emitted it, and the same state rows.

Why the input waits: a standby's Spark start takes tens of seconds on a busy machine,
longer than the active needs for a small input. All input arrives in one rename (a full
directory replacing the empty one), so that the file source lists none or all of it and
runs one batch per file, as in the reference run.

Outputs: ``foreach`` writes one JSON file per batch (a replayed batch overwrites its own
file; B's batches override A's). Spark's file sink is exactly-once through its metadata
log (``_spark_metadata``), which lives next to the data: both applications write to one
output directory, and only the parquet files that log lists are committed (a file A was
writing when it died is not).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ring.errors import ConfigError, SR3Error
from ring.lease import DRIFT_DEFAULT, RENEW_EVERY_S_DEFAULT, TIMEOUT_S_DEFAULT, check_timing
from sr3.demo import work_home
from sr3.drills import DRILL_PEER_FLAGS
from sr3.local import LocalCluster
from sr3.process_group import kill_group, log_tail
from sr3.spark_demo import Output, Row, read_output, write_inputs
from sr3.standby_app import SINKS, StandbyJob, read_events, start

__all__ = [
    "CHECKPOINT_MODES",
    "App",
    "app_ring",
    "compare_state",
    "first_event",
    "launched",
    "newest_batch",
    "row_counts",
    "row_differences",
    "wait_done",
    "wait_for_events",
    "StandbyDrillOptions",
    "StandbyDrillReport",
    "committed_parquet_files",
    "merge_outputs",
    "run_standby_drill",
]

CHECKPOINT_MODES = ("sync", "fs")
QUERY = "standby-drill"
REFERENCE_QUERY = "standby-drill-reference"
BASE_PORT_DEFAULT = 7340
FILES_MIN, FILES_MAX = 6, 600
TRIGGER_S = 0.5
MASTER = re.compile(r"local\[[1-9][0-9]?\]|local-cluster\[[1-9],[1-9],[1-9][0-9]{2,4}\]")
# An application whose query ran no batch for this long after its last one is done
# (every file read, the windows closed): the end of a run whose batch ids shifted.
IDLE_STOP_S = 8.0
POLL_S = 0.2
# Bounds for a busy two-core machine: a Spark start, then each batch.
SPARK_START_S_MAX = 150.0
BATCH_S_MAX = 5.0
TAKEOVER_S_MAX = 90.0  # after the lease lapsed: catch-up, query start, first batch
LOG_TAIL_LINES = 30
DIFFERENCES_MAX = 10

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class StandbyDrillOptions:
    peers: int = 5
    replication: int = 3
    files: int = 30  # input files, one batch each
    seed: int = 1
    checkpoint_mode: str = "sync"  # sync: StateSync local checkpoints; fs: one sr3:// one
    sink: str = "foreach"  # foreach (JSON per batch) or files (parquet)
    lease_timeout_s: float = TIMEOUT_S_DEFAULT
    master: str = "local[2]"  # or local-cluster[N,CORES,MiB]: executors in JVMs of their own
    base_port: int = BASE_PORT_DEFAULT
    keep_dir: Path | None = None  # work there and keep the files (else a temporary home)

    def __post_init__(self) -> None:
        if self.checkpoint_mode not in CHECKPOINT_MODES:
            raise ConfigError(f"checkpoint mode: one of {', '.join(CHECKPOINT_MODES)}")
        if self.sink not in SINKS:
            raise ConfigError(f"sink: one of {', '.join(SINKS)}")
        if not FILES_MIN <= self.files <= FILES_MAX:
            raise ConfigError(f"--files: {FILES_MIN} to {FILES_MAX}")
        if self.replication < 2:
            raise ConfigError("the standby drill kills R-1 peers: R must be at least 2")
        if self.peers <= 2 * self.killed_peers:
            raise ConfigError(
                f"killing {self.killed_peers} peers (R-1) must leave a majority running: "
                f"at least {2 * self.killed_peers + 1} peers"
            )
        check_timing(self.lease_timeout_s, self.renew_every_s, DRIFT_DEFAULT)
        if MASTER.fullmatch(self.master) is None:
            raise ConfigError("--master: local[N] or local-cluster[N,CORES,MiB]")

    @property
    def killed_peers(self) -> int:
        return self.replication - 1

    @property
    def renew_every_s(self) -> float:
        return min(RENEW_EVERY_S_DEFAULT, self.lease_timeout_s * (1 - DRIFT_DEFAULT) / 3)

    @property
    def until_batch(self) -> int:
        """Every application stops after this batch: the one after the last file's, with
        no input, in which Spark closes the windows the last file's watermark passed.
        A takeover may fold the batch the killed application had planned into the
        standby's first one (the file source's log runs a batch ahead of the offset
        log), so that the standby's batch ids run one behind the reference's: it then
        stops once idle for ``IDLE_STOP_S`` after its batch with no input, at the same
        point."""
        return self.files

    @property
    def kill_after_batch(self) -> int:
        """A dies once it committed this batch (about a third of the input)."""
        return max(1, self.files // 3 - 1)

    @property
    def run_s_max(self) -> float:
        """How long any application may run before it stops by itself."""
        return 2 * SPARK_START_S_MAX + 2 * self.files * BATCH_S_MAX + TAKEOVER_S_MAX


@dataclass(frozen=True, slots=True)
class StandbyDrillReport:
    checkpoint_mode: str
    sink: str
    peers: int
    replication: int
    files: int
    seed: int
    lease_timeout_s: float
    killed_peers: tuple[str, ...]
    killed_after_batch: int  # A's newest committed batch when it was killed
    active_fence: int | None  # A's
    took_over: bool  # B took the query over
    fence: int | None  # B's
    previous: str | None  # whom B took it from
    resumed_after: int | None
    catch_up_bytes: int | None
    waited_s: float | None  # how long B saw the lease unchanged before taking it
    start_s: float | None  # B's query start
    takeover_s: float | None  # from the SIGKILL to B's query running
    first_commit_s: float | None  # from the SIGKILL to B's first committed batch
    first_batch: int | None
    finished: bool  # B committed the last batch and wrote its state
    standby_exit: int | None  # B's exit code (None: killed after the time allowed)
    output_matched: bool
    state_matched: bool
    rows_reference: int
    rows_after: int  # rows A and B emitted together (committed ones, replays once)
    state_rows: int
    replayed: tuple[int, ...]  # A's batches after the one B resumed after, run again
    batches_apart: tuple[int, ...]  # foreach: batches whose rows moved to another batch
    replays_identical: bool
    uncommitted_files: int  # files sink: parquet files the log does not list
    differences: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.took_over and self.finished and self.output_matched and self.state_matched

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True, slots=True)
class _Kill:
    wall: float  # time.time(): compared with the applications' event times
    after_batch: int
    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Comparison:
    matched: bool
    rows_reference: int
    rows_after: int
    replayed: tuple[int, ...] = ()
    batches_apart: tuple[int, ...] = ()
    replays_identical: bool = True
    uncommitted_files: int = 0
    differences: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class App:
    name: str
    job: StandbyJob
    process: subprocess.Popen[bytes]
    log_path: Path

    def events(self) -> list[dict[str, Any]]:
        return read_events(Path(self.job.events_path))

    def tail(self) -> str:
        return log_tail(self.log_path, LOG_TAIL_LINES)


# -- the drill ------------------------------------------------------------------------------


def require_spark() -> None:
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigError("the standby drill needs PySpark: pip install 'sr3[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigError("the standby drill needs a Java runtime (Java 17): none on PATH")


@contextlib.contextmanager
def app_ring(
    home: Path, peers: int, replication: int, seed: int, base_port: int, say: Say
) -> Iterator[tuple[LocalCluster, dict[str, str]]]:
    """A fresh local ring for a Spark drill under ``home`` (the drill's peer flags), and
    the environment its applications get: the ring and its secret, loopback Spark, no
    scoped credential of the caller's. Taken down (purged) on the way out."""
    cluster = LocalCluster.create(
        home / "cluster", peers, replication=replication,
        write_quorum=min(2, replication), cluster_file=home / "cluster.json",
        base_port=base_port, peer_flags=[*DRILL_PEER_FLAGS, "--seed", str(seed)],
    )  # fmt: skip
    cluster.up()
    say(f"ring up: {peers} peers, R={replication}")
    try:
        env = {
            **os.environ, "SR3_RING": cluster.ring, "SR3_SECRET": cluster.secret,
            "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        env.pop("SR3_CREDENTIAL", None)
        yield cluster, env
    finally:
        cluster.down(purge=True)


def run_standby_drill(
    options: StandbyDrillOptions, say: Say = lambda _: None
) -> StandbyDrillReport:
    """Run the drill (see the module) on a fresh local ring; the report."""
    require_spark()
    if options.sink == "files" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError("--sink files needs pyarrow to read the parquet output")
    with work_home(options.keep_dir, "sr3-standby-drill-") as home:
        started = time.monotonic()
        with app_ring(
            home, options.peers, options.replication, options.seed, options.base_port, say
        ) as (cluster, env):
            kill, standby_exit = _run_apps(cluster, env, home, options, say)
            return _report(options, home, kill, standby_exit, time.monotonic() - started)


def _run_apps(
    cluster: LocalCluster, env: dict[str, str], home: Path, options: StandbyDrillOptions,
    say: Say,
) -> tuple[_Kill, int | None]:  # fmt: skip
    """Steps 2 to 5: the reference, A and B; the kill, and B's exit code (None: B did
    not exit in the time allowed)."""
    write_inputs(home / "input-reference", options.files, options.seed)
    write_inputs(home / "input-staged", options.files, options.seed)
    (home / "input").mkdir()
    start_s = SPARK_START_S_MAX
    with contextlib.ExitStack() as apps:
        reference = apps.enter_context(
            launched("reference", _job(options, home, "reference"), env, home)
        )
        app_a = apps.enter_context(launched("A", _job(options, home, "a"), env, home))
        wait_for_events(
            app_a, lambda events: first_event(events, "took_over") is not None,
            "it took the query over", start_s,
        )  # fmt: skip
        say("A holds the query (fence 1); B starts")
        app_b = apps.enter_context(launched("B", _job(options, home, "b"), env, home))
        wait_for_events(
            app_b, lambda events: first_event(events, "ready") is not None, "it was ready",
            start_s, others=[app_a],
        )  # fmt: skip
        say("B stands by; waiting for the reference run to finish")
        wait_done(reference, start_s + options.files * BATCH_S_MAX)
        (home / "input-staged").rename(home / "input")  # replaces the empty directory
        say(f"input released: {options.files} files; A runs")
        due = options.kill_after_batch
        wait_for_events(
            app_a, lambda events: newest_batch(events) >= due, f"it committed batch {due}",
            (due + 1) * BATCH_S_MAX + 30, others=[app_b],
        )  # fmt: skip
        kill = _kill_together(app_a, cluster, options)
        say(f"SIGKILLed A (after batch {kill.after_batch}) and {', '.join(kill.peers)}")
        finish_s = options.lease_timeout_s + TAKEOVER_S_MAX + options.files * BATCH_S_MAX
        try:
            standby_exit: int | None = app_b.process.wait(finish_s)
        except subprocess.TimeoutExpired:
            standby_exit = None
        say(f"B exited ({standby_exit})")
    return kill, standby_exit


def _job(options: StandbyDrillOptions, home: Path, name: str) -> StandbyJob:
    reference = name == "reference"
    query = REFERENCE_QUERY if reference else QUERY
    if options.checkpoint_mode == "fs":
        checkpoint = f"sr3:///spark/{query}/checkpoint"
    else:
        checkpoint = str(home / f"checkpoint-{name}")
    if options.sink == "files" and not reference:
        output = home / "output"  # the file sink's log is shared with its data
    else:
        output = home / f"output-{name}"
    return StandbyJob(
        query=query, checkpoint=checkpoint,
        input_dir=str(home / ("input-reference" if reference else "input")),
        output_dir=str(output), events_path=str(home / f"events-{name}.jsonl"),
        sink=options.sink, holder=f"drill-{name}", lease_timeout_s=options.lease_timeout_s,
        renew_every_s=options.renew_every_s, trigger_s=TRIGGER_S,
        master=options.master, until_batch=options.until_batch, stop_idle_s=IDLE_STOP_S,
        run_s_max=options.run_s_max,
        state_path=str(home / f"state-{name}.json"),
    )  # fmt: skip


@contextlib.contextmanager
def launched(name: str, job: StandbyJob, env: dict[str, str], home: Path) -> Iterator[App]:
    """An application in a session of its own; its whole group is SIGKILLed on the way out."""
    log_path = home / f"app-{name.lower()}.log"
    process = start(job, env, log_path)
    try:
        yield App(name, job, process, log_path)
    finally:
        kill_group(process)


def wait_for_events(
    app: App, done: Callable[[list[dict[str, Any]]], bool], what: str, timeout_s: float,
    *, others: Sequence[App] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """Poll ``app``'s events until ``done``; fail if it (or one of ``others``) exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = app.events()
        if done(events):
            return events
        for watched in (app, *others):
            if watched.process.poll() is not None:
                raise SR3Error(
                    f"application {watched.name} exited ({watched.process.returncode}) "
                    f"before {app.name} {what}\n{watched.tail()}"
                )
        if time.monotonic() > deadline:
            raise SR3Error(
                f"application {app.name}: not {what} after {timeout_s:.0f} s\n{app.tail()}"
            )
        time.sleep(POLL_S)


def wait_done(app: App, timeout_s: float) -> None:
    try:
        code = app.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise SR3Error(
            f"application {app.name} did not finish in {timeout_s:.0f} s\n{app.tail()}"
        ) from None
    if code != 0 or first_event(app.events(), "done") is None:
        raise SR3Error(f"application {app.name} failed (exit {code})\n{app.tail()}")


def _kill_together(app: App, cluster: LocalCluster, options: StandbyDrillOptions) -> _Kill:
    """SIGKILL A's whole group and R-1 seeded peers at once."""
    members = [peer.peer_id for peer in cluster.cluster.peers]
    victims = tuple(sorted(random.Random(options.seed).sample(members, options.killed_peers)))
    wall = time.time()
    os.killpg(app.process.pid, signal.SIGKILL)
    for peer_id in victims:
        cluster.kill(peer_id)
    kill_group(app.process)
    return _Kill(wall, newest_batch(app.events()), victims)


def first_event(events: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((event for event in events if event.get("event") == name), None)


def newest_batch(events: list[dict[str, Any]]) -> int:
    batches = [int(e["batch"]) for e in events if e.get("event") == "committed"]
    return max(batches, default=-1)


# -- the report -------------------------------------------------------------------------------


def _report(
    options: StandbyDrillOptions, home: Path, kill: _Kill, standby_exit: int | None,
    seconds: float,
) -> StandbyDrillReport:  # fmt: skip
    events_a = read_events(home / "events-a.jsonl")
    events_b = read_events(home / "events-b.jsonl")
    took_a, took = first_event(events_a, "took_over"), first_event(events_b, "took_over") or {}
    commits = [e for e in events_b if e.get("event") == "committed"]
    first = commits[0] if commits else {}
    done = first_event(events_b, "done")
    resumed = took.get("resumed_after")
    output = _compare_output(options, home)
    state_matched, state_rows = compare_state(home / "state-reference.json", home / "state-b.json")

    def since_kill(event: dict[str, Any]) -> float | None:
        # Wall clocks of one machine: the applications' event times against the kill's.
        return None if "wall" not in event else float(event["wall"]) - kill.wall

    return StandbyDrillReport(
        checkpoint_mode=options.checkpoint_mode, sink=options.sink, peers=options.peers,
        replication=options.replication, files=options.files, seed=options.seed,
        lease_timeout_s=options.lease_timeout_s, killed_peers=kill.peers,
        killed_after_batch=kill.after_batch,
        active_fence=None if took_a is None else int(took_a["fence"]),
        took_over=bool(took), fence=took.get("fence"), previous=took.get("previous"),
        resumed_after=resumed, catch_up_bytes=took.get("catch_up_bytes"),
        waited_s=took.get("waited_s"), start_s=took.get("start_s"),
        takeover_s=since_kill(took), first_commit_s=since_kill(first),
        first_batch=first.get("batch"),
        finished=done is not None and standby_exit == 0,
        standby_exit=standby_exit, output_matched=output.matched,
        state_matched=state_matched, rows_reference=output.rows_reference,
        rows_after=output.rows_after, state_rows=state_rows, replayed=output.replayed,
        batches_apart=output.batches_apart,
        replays_identical=output.replays_identical,
        uncommitted_files=output.uncommitted_files, differences=output.differences,
        seconds=seconds,
    )  # fmt: skip


def compare_state(reference_path: Path, path: Path) -> tuple[bool, int]:
    """Whether B's state rows at the last batch are the reference's; how many rows."""
    reference = json.loads(reference_path.read_text())
    if not path.exists():
        return False, 0
    rows = json.loads(path.read_text())
    return bool(reference) and rows == reference, len(rows)


def _compare_output(options: StandbyDrillOptions, home: Path) -> _Comparison:
    if options.sink == "files":
        return _compare_files(home / "output", home / "output-reference")
    reference = _up_to(read_output(home / "output-reference"), options.until_batch)
    active = read_output(home / "output-a")
    standby = read_output(home / "output-b")
    merged = merge_outputs(active, standby, options.until_batch)
    replayed = tuple(sorted(batch for batch in active if batch in standby))
    identical = all(active[batch] == standby[batch] for batch in replayed)
    differences = row_differences(row_counts(merged), row_counts(reference))
    apart = [b for b in sorted(set(merged) | set(reference)) if merged.get(b) != reference.get(b)]
    # What must hold is every row once; which batch emits it may move (``until_batch``).
    return _Comparison(
        matched=bool(reference) and not differences, rows_reference=_rows(reference),
        rows_after=_rows(merged), replayed=replayed, batches_apart=tuple(apart),
        replays_identical=identical, differences=differences,
    )  # fmt: skip


def merge_outputs(active: Output, standby: Output, until_batch: int) -> Output:
    """A's batches, then B's over them (a batch B ran again replaces A's run of it), up
    to ``until_batch``."""
    return _up_to({**active, **standby}, until_batch)


def _up_to(output: Output, until_batch: int) -> Output:
    return {batch: rows for batch, rows in sorted(output.items()) if batch <= until_batch}


def _compare_files(output_dir: Path, reference_dir: Path) -> _Comparison:
    committed = committed_parquet_files(output_dir)
    written = {path.resolve() for path in output_dir.glob("*.parquet")}
    rows = _parquet_rows(committed)
    reference = _parquet_rows(committed_parquet_files(reference_dir))
    differences = row_differences(rows, reference)
    return _Comparison(
        matched=bool(reference) and not differences,
        rows_reference=sum(reference.values()), rows_after=sum(rows.values()),
        uncommitted_files=len(written - set(committed)), differences=differences,
    )  # fmt: skip


def _is_batch_name(name: str) -> bool:
    return name.isascii() and name.isdigit()


def committed_parquet_files(output_dir: Path) -> list[Path]:
    """The files Spark's file sink committed in ``output_dir``: those its metadata log
    (``_spark_metadata/<batch>`` and ``<batch>.compact`` files: a version line, then one
    JSON object per file) adds and does not delete."""
    log_dir = output_dir / "_spark_metadata"
    if not log_dir.is_dir():
        raise SR3Error(f"{output_dir} holds no file sink log (_spark_metadata)")
    batches = [p for p in log_dir.iterdir() if _is_batch_name(p.name.removesuffix(".compact"))]
    added: set[str] = set()
    deleted: set[str] = set()
    for path in sorted(batches, key=lambda p: int(p.name.removesuffix(".compact"))):
        lines = path.read_text().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise SR3Error(f"{path}: not a file sink log entry")
        for line in lines[1:]:
            if line.strip():
                entry = json.loads(line)
                (deleted if entry.get("action") == "delete" else added).add(entry["path"])
    return sorted(_local_path(uri) for uri in added - deleted)


def _local_path(uri: str) -> Path:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise SR3Error(f"{uri}: the drill reads local output only")
    return Path(unquote(parsed.path)).resolve()


def _parquet_rows(paths: Sequence[Path]) -> Counter[Row]:
    parquet: Any = importlib.import_module("pyarrow.parquet")  # no type stubs
    rows: Counter[Row] = Counter()
    for path in paths:
        for record in parquet.read_table(path).to_pylist():
            start = record["start"]
            text = start.isoformat() if hasattr(start, "isoformat") else str(start)
            rows[(text, str(record["key"]), int(record["count"]))] += 1
    return rows


def row_counts(output: Output) -> Counter[Row]:
    return Counter(row for rows in output.values() for row in rows)


def _rows(output: Output) -> int:
    return sum(len(rows) for rows in output.values())


def row_differences(after: Counter[Row], reference: Counter[Row]) -> tuple[str, ...]:
    """Rows only one side has, a few: "+" after the kill, "-" the reference."""
    extra = [f"+ {row}" for row in sorted((after - reference).elements())]
    missing = [f"- {row}" for row in sorted((reference - after).elements())]
    return tuple((extra + missing)[:DIFFERENCES_MAX])
