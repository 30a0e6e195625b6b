"""What a hot standby saves when the active application dies, and what it costs idle.

One process, one local ring of ``--peers`` peers (R=3, W=2) on 127.0.0.x, and the
connector benchmark's keys query (one row of RocksDB state per unique id). The state is
built once to ``--state-mib`` (the consistent cut's ``state/`` bytes) with every batch
pushed (``connector_restart.build_state``, in this process's SparkSession, which is
stopped afterwards). Then ``--runs`` times, in alternating order:

- **baseline**: a new application on an intact local copy of that checkpoint
  (``connector_app.py --mode local``, as the connector benchmark's part 4): a new
  process, JVM and SparkSession, timed from the process's start until its first batch
  (one input file) is done. A restart after a lost driver pays at least this.
- **standby**: application A (``sr3.standby_app``, query ``standby_query:keys_query``)
  starts on another intact local copy under a query name of the trial's own; it takes
  the lease (default lease settings) and pushes every batch (its first push puts the
  whole state on the ring under that name). Input files of ``--feed-rows`` new ids
  arrive every ``--feed-s`` seconds, so batches keep committing. Once A's first batch is
  on the ring, application B starts on an empty directory: it pulls the whole
  checkpoint, starts its session, runs a tiny job and is ``ready``. Then, while B keeps
  up (from its first pull after ``ready``), ``--idle-batches`` batches pass: the **idle
  cost** is B's CPU seconds (its Python process and its JVM) and the bytes it pulled
  (its log's "holds batch" lines) per batch, against the bytes each batch changed
  (files new in each manifest against the previous one, read from the ring) and the
  whole state's size. Then A's whole process
  group is SIGKILLed and the next input file written at once (so that the new holder's
  first batch has input, as the baseline's has); the **takeover** is the time from the
  SIGKILL to B's first committed batch (its ``committed`` event's wall-clock time),
  broken down with B's ``took_over`` figures (lease seen unchanged, catch-up, query
  start).

Targets (checked, never asserted): takeover <= 0.4x the baseline of the same run, and
<= the lease timeout + 3 s. Writes ``benchmarks/results/standby.json``
(``standby-quick.json`` with ``--quick``) and prints a summary. Every process shares
the machine's cores: run on a quiet machine before quoting figures. From the
repository root:

    .venv/bin/python benchmarks/bench_standby.py [--quick] [--state-mib 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# This script's folder is first on sys.path: its connector_* modules import by name.
from bench_store import cpu_seconds
from connector_probes import Bench, Processes, settle
from connector_restart import app_trial, build_state
from connector_settings import MIB, PROVIDER_CONF, PROVIDERS, REPLICATION, WRITE_QUORUM, Settings
from connector_spark import environment, jvm_pid, start_spark, write_ids

from ring.lease import TIMEOUT_S_DEFAULT
from ring.sync_client import SyncClient
from spark_connector.catalog import latest_batch
from spark_connector.manifest import Manifest
from spark_connector.restore import read_manifest
from sr3.local import LocalCluster
from sr3.process_group import group_pids, kill_group
from sr3.standby_app import StandbyJob, read_events

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
BASE_PORT = 7860
APP = "standby_query:keys_query"
TARGET_RATIO_MAX = 0.4
TARGET_MARGIN_S = 3.0  # over the lease timeout
# Bounds for a busy two-core machine.
APP_START_S_MAX = 300.0  # a process to its SparkSession, first pull and first batch
IDLE_S_MAX = 180.0
TAKEOVER_S_MAX = 120.0  # after the lease lapsed: catch-up, query start, first batch
APP_RUN_S_MAX = 1800.0  # an application nobody kills stops by itself after this long
POLL_S = 0.1
MANIFEST_POLL_S = 0.5  # the ring keeps 3 manifests of a query: read each before it goes
LOG_TAIL_LINES = 30
PULL_LINE = re.compile(
    r"holds batch (\d+): fetched (\d+) files, (\d+) of (\d+) bytes in ([0-9.]+) s( \(whole\))?"
)


@dataclass(frozen=True, slots=True)
class StandbySettings:
    """Sizes of one run (see ``--help``)."""

    peers: int = 5
    # The build stops at the first batch whose cut holds at least this much: 256 gives the
    # connector benchmark's 295 MiB (7 batches of 300 000 new ids).
    state_mib: int = 256
    runs: int = 3
    build_rows: int = 300_000  # new ids per batch while the state is built
    feed_rows: int = 10_000  # new ids per input file afterwards (the baseline's file too)
    feed_s: float = 1.5
    idle_batches: int = 5
    trigger_s: float = 0.5
    spark_cores: int = 2
    driver_memory: str = "6g"
    partitions: int = 8
    settle_s: float = 2.0
    warmup: bool = True  # one untimed baseline application first (page cache, JIT files)
    peer_root: str = ""

    def connector(self) -> Settings:
        """The connector benchmark's settings that ``build_state`` and ``app_trial`` read."""
        return replace(
            Settings(), peers=self.peers, spark_cores=self.spark_cores,
            driver_memory=self.driver_memory, partitions=self.partitions,
            state_mib=self.state_mib, build_rows=self.build_rows, restart_rows=self.feed_rows,
            settle_s=self.settle_s, peer_root=self.peer_root,
        )  # fmt: skip


QUICK = StandbySettings(
    state_mib=20, runs=1, build_rows=50_000, feed_rows=1_000, idle_batches=3,
    driver_memory="2g", settle_s=0.5,
)  # fmt: skip


# -- applications ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class App:
    """A ``sr3.standby_app`` in a process group of its own (Python and its JVM)."""

    name: str
    process: subprocess.Popen[bytes]
    events_path: Path
    log_path: Path

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.events_path)

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join([f"--- last lines of {self.log_path}:", *lines[-LOG_TAIL_LINES:]])


@contextlib.contextmanager
def launched(name: str, job: StandbyJob, env: dict[str, str], cwd: Path) -> Iterator[App]:
    """Start an application; its whole group is SIGKILLed on the way out, whatever happens."""
    log_path = cwd / f"app-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sr3.standby_app", job.to_json()],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield App(name, process, Path(job.events_path), log_path)
    finally:
        kill_group(process)


def group_cpu_s(group_id: int) -> float:
    """CPU seconds of the group's live processes (an application's Python and JVM)."""
    return sum(cpu_seconds(pid) or 0.0 for pid in group_pids(group_id))


def wait_until(
    what: str, done: Callable[[], bool], timeout_s: float, apps: Sequence[App],
    tick: Callable[[], None],
) -> None:  # fmt: skip
    """Poll ``done`` (calling ``tick`` between polls); fail if an app exits first."""
    deadline = time.monotonic() + timeout_s
    while not done():
        for app in apps:
            if app.process.poll() is not None:
                raise RuntimeError(
                    f"application {app.name} exited ({app.process.returncode}) before "
                    f"{what}\n{app.tail()}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(app.tail() for app in apps)
            raise RuntimeError(f"not {what} after {timeout_s:.0f} s\n{tails}")
        tick()
        time.sleep(POLL_S)


def first_event(
    events: Sequence[dict[str, Any]], name: str, after: float = 0.0
) -> dict[str, Any] | None:
    return next((e for e in events if e.get("event") == name and e["wall"] >= after), None)


def newest_committed(events: Sequence[dict[str, Any]]) -> int:
    return max((int(e["batch"]) for e in events if e.get("event") == "committed"), default=-1)


# -- input and the ring ----------------------------------------------------------------------


class Feeder:
    """Writes the next input file (``rows`` new ids) every ``every_s`` seconds, on ``tick``."""

    def __init__(self, input_dir: Path, first_index: int, id_step: int, rows: int,
                 every_s: float) -> None:  # fmt: skip
        self.input_dir, self.index, self.id_step = input_dir, first_index, id_step
        self.rows, self.every_s = rows, every_s
        self._due = time.monotonic() + every_s

    def tick(self) -> None:
        if time.monotonic() >= self._due:
            self.write_now()

    def write_now(self) -> None:
        write_ids(self.input_dir, self.index, self.index * self.id_step, self.rows)
        self.index += 1
        self._due = time.monotonic() + self.every_s


def reset_input(input_dir: Path, last_index: int) -> None:
    """Delete the input files after ``last_index`` (a trial's feed): the next application
    on a copy of the built checkpoint then finds exactly one new file."""
    for path in input_dir.glob("ids-*.txt"):
        if int(path.stem.removeprefix("ids-")) > last_index:
            path.unlink()


class Manifests:
    """Every manifest of ``query`` read while it is on the ring (retention drops them)."""

    def __init__(self, client: SyncClient, query: str) -> None:
        self.client, self.query = client, query
        self.held: dict[int, Manifest] = {}
        self._due = 0.0

    def poll(self) -> None:
        if time.monotonic() < self._due:
            return
        self._due = time.monotonic() + MANIFEST_POLL_S
        newest = latest_batch(self.client, self.query)
        if newest is None:
            return
        first = max(self.held) + 1 if self.held else newest
        for batch_id in range(first, newest + 1):
            manifest = read_manifest(self.client, self.query, batch_id)
            if manifest is not None:
                self.held[batch_id] = manifest


def changed_bytes(before: Manifest, after: Manifest) -> int:
    """Bytes of the files ``after`` names that ``before`` does not hold with that digest:
    what a directory at ``before`` must fetch to be at ``after``."""
    held = {f.path: f.blob.digest for f in before.files}
    return sum(f.blob.size for f in after.files if held.get(f.path) != f.blob.digest)


@dataclass(frozen=True, slots=True)
class Pull:
    batch_id: int
    files: int
    bytes_fetched: int
    bytes_total: int
    seconds: float
    whole: bool


def read_pulls(log_path: Path) -> list[Pull]:
    """The standby's pulls, from its log's "holds batch" lines."""
    pulls = []
    for line in log_path.read_text(errors="replace").splitlines():
        match = PULL_LINE.search(line)
        if match:
            batch, files, fetched, total, seconds, whole = match.groups()
            pulls.append(Pull(int(batch), int(files), int(fetched), int(total), float(seconds),
                              whole is not None))  # fmt: skip
    return pulls


# -- one standby trial -----------------------------------------------------------------------


@dataclass
class Trial:
    """What one standby trial shares between its steps."""

    run: int
    root: Path
    input_dir: Path
    checkpoint: Path
    batch_id: int  # the built checkpoint's newest batch
    settings: StandbySettings
    env: dict[str, str]
    manifests: Manifests
    feeder: Feeder
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def query(self) -> str:
        return self.manifests.query

    def tick(self) -> None:
        self.feeder.tick()
        self.manifests.poll()

    def job(self, name: str, checkpoint: Path) -> StandbyJob:
        settings = self.settings
        return StandbyJob(
            query=self.query, checkpoint=str(checkpoint), input_dir=str(self.input_dir),
            output_dir=str(self.root / f"out-{name}"),
            events_path=str(self.root / f"events-{name}.jsonl"),
            holder=f"bench-{name}-{self.run}", trigger_s=settings.trigger_s,
            run_s_max=APP_RUN_S_MAX, app=APP, master=f"local[{settings.spark_cores}]",
            shuffle_partitions=settings.partitions, state_store="rocksdb",
        )  # fmt: skip


def standby_trial(bench: Bench, settings: StandbySettings, run: int, input_dir: Path,
                  checkpoint: Path, batch_id: int) -> dict[str, Any]:  # fmt: skip
    """A on a copy of the built checkpoint, B standing by; the idle cost, then the kill."""
    root = bench.work / f"standby-{run}"
    root.mkdir(parents=True)
    query = f"standby-{run}"
    trial = Trial(
        run, root, input_dir, checkpoint, batch_id, settings, app_env(bench, settings),
        Manifests(bench.client, query),
        Feeder(input_dir, batch_id + 2, settings.build_rows, settings.feed_rows, settings.feed_s),
    )  # fmt: skip
    shutil.copytree(checkpoint, root / "a", symlinks=True)  # untimed, as the baseline's
    subprocess.run(["sync"], check=True)
    settle(settings.settle_s)
    try:
        with contextlib.ExitStack() as apps:
            app_a = apps.enter_context(launched("a", trial.job("a", root / "a"), trial.env, root))
            wait_until(
                f"A's first batch ({batch_id + 1}) was on the ring",
                lambda: bool(trial.manifests.held), APP_START_S_MAX * 2, [app_a], trial.tick,
            )  # fmt: skip
            started = time.monotonic()
            app_b = apps.enter_context(launched("b", trial.job("b", root / "b"), trial.env, root))
            wait_until(
                "B was ready", lambda: first_event(app_b.events(), "ready") is not None,
                APP_START_S_MAX, [app_a, app_b], trial.tick,
            )  # fmt: skip
            trial.figures["standby_ready_s"] = round(time.monotonic() - started, 3)
            trial.figures["idle"] = idle_window(trial, app_a, app_b)
            trial.figures |= kill_and_take_over(trial, app_a, app_b)
    finally:
        reset_input(input_dir, batch_id + 1)
        shutil.rmtree(root, ignore_errors=True)
    return trial.figures


def app_env(bench: Bench, settings: StandbySettings) -> dict[str, str]:
    env = {
        **os.environ, "SR3_RING": bench.cluster.ring, "SR3_SECRET": bench.cluster.secret,
        "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(BENCH_DIR), str(REPO_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        # The baseline's heap (connector_app.py sets spark.driver.memory the same way).
        "PYSPARK_SUBMIT_ARGS": f"--driver-memory {settings.driver_memory} pyspark-shell",
    }  # fmt: skip
    env.pop("SR3_CREDENTIAL", None)
    return env


def idle_window(trial: Trial, app_a: App, app_b: App) -> dict[str, Any]:
    """B keeps up while ``idle_batches`` batches pass: its CPU and pulls per batch. The
    window opens at B's first pull after ``ready`` (the one that catches up on what was
    pushed while its session started)."""
    ready_pulls = len(read_pulls(app_b.log_path))
    if not ready_pulls:
        raise RuntimeError(f"B was ready without a pull\n{app_b.tail()}")
    wait_until(
        "B pulled a batch after it was ready",
        lambda: len(read_pulls(app_b.log_path)) > ready_pulls, IDLE_S_MAX, [app_a, app_b],
        trial.tick,
    )  # fmt: skip
    cpu_b, cpu_a = group_cpu_s(app_b.process.pid), group_cpu_s(app_a.process.pid)
    started = time.monotonic()
    pulls_before = read_pulls(app_b.log_path)
    held_first = pulls_before[-1].batch_id

    def advanced() -> bool:
        return read_pulls(app_b.log_path)[-1].batch_id - held_first >= trial.settings.idle_batches

    wait_until(
        f"B pulled {trial.settings.idle_batches} batches", advanced, IDLE_S_MAX,
        [app_a, app_b], trial.tick,
    )  # fmt: skip
    cpu_b = group_cpu_s(app_b.process.pid) - cpu_b
    cpu_a = group_cpu_s(app_a.process.pid) - cpu_a
    window_s = time.monotonic() - started
    trial.manifests.poll()
    pulls = read_pulls(app_b.log_path)[len(pulls_before) :]
    figures = idle_figures(trial.manifests.held, pulls_before[-1], pulls)
    return {
        "window_s": round(window_s, 3),
        "standby_cpu_s": round(cpu_b, 3),
        "standby_cpu_s_per_batch": round(cpu_b / figures["batches"], 4),
        "standby_cores": round(cpu_b / window_s, 4),
        "active_cpu_s_per_batch": round(cpu_a / figures["batches"], 4),
        **figures,
        "whole_pull": asdict(pulls_before[0]),
        "catch_up_pull": asdict(pulls_before[ready_pulls]),
    }


def idle_figures(
    manifests: dict[int, Manifest], first: Pull, pulls: Sequence[Pull]
) -> dict[str, Any]:
    """B's pulled bytes per batch from the batch ``first`` held on, against what it had
    to fetch (the files new since the batch it held, pull by pull) and what each batch
    changed (consecutive manifests); None where a manifest went before it was read."""
    batches = pulls[-1].batch_id - first.batch_id
    pulled = sum(pull.bytes_fetched for pull in pulls)
    steps = [
        {
            "batch": after.batch_id,
            "fetched_bytes": after.bytes_fetched,
            "changed_bytes": (
                changed_bytes(manifests[before.batch_id], manifests[after.batch_id])
                if before.batch_id in manifests and after.batch_id in manifests
                else None
            ),
        }
        for before, after in itertools.pairwise([first, *pulls])
    ]
    changed = [step["changed_bytes"] for step in steps]
    delta = None if None in changed else sum(c or 0 for c in changed)
    per_batch = [
        changed_bytes(manifests[batch - 1], manifests[batch])
        for batch in range(first.batch_id + 1, pulls[-1].batch_id + 1)
        if batch in manifests and batch - 1 in manifests
    ]
    return {
        "batches": batches,
        "pulls": len(pulls),
        "pulled_bytes": pulled,
        "pulled_bytes_per_batch": pulled / batches,
        "changed_bytes": delta,
        "changed_bytes_per_batch": None if delta is None else delta / batches,
        "pulled_to_changed": None if not delta else pulled / delta,
        "batch_delta_bytes_mean": statistics.fmean(per_batch) if per_batch else None,
        "batch_delta_bytes_median": median(per_batch),
        "batch_delta_bytes_max": max(per_batch, default=None),
        "state_bytes": pulls[-1].bytes_total,
        "pulled_per_batch_to_state": pulled / batches / pulls[-1].bytes_total,
        "pull_s_median": median([pull.seconds for pull in pulls]),
        "steps": steps,
    }


def kill_and_take_over(trial: Trial, app_a: App, app_b: App) -> dict[str, Any]:
    """SIGKILL A's group; B's first committed batch after it took over."""
    active_batch = newest_committed(app_a.events())
    killed_at = time.time()
    os.killpg(app_a.process.pid, signal.SIGKILL)
    trial.feeder.write_now()  # input for the new holder's first batch, as the baseline has
    kill_group(app_a.process)

    def committed() -> dict[str, Any] | None:
        events = app_b.events()
        took = first_event(events, "took_over", killed_at)
        return None if took is None else first_event(events, "committed", took["wall"])

    wait_until(
        "B committed a batch after taking over", lambda: committed() is not None,
        TIMEOUT_S_DEFAULT + TAKEOVER_S_MAX, [app_b], trial.feeder.tick,
    )  # fmt: skip
    took = first_event(app_b.events(), "took_over", killed_at)
    first = committed()
    assert took is not None and first is not None
    return {
        "takeover_s": round(first["wall"] - killed_at, 3),
        "took_over_s": round(took["wall"] - killed_at, 3),
        "first_batch_s": round(first["wall"] - took["wall"], 3),
        "waited_s": round(took["waited_s"], 3),
        "catch_up_bytes": took["catch_up_bytes"],
        "catch_up_s": round(took["catch_up_s"], 3),
        "start_s": round(took["start_s"], 3),
        "fence": took["fence"],
        "active_batch": active_batch,
        "resumed_after": took["resumed_after"],
        "first_batch": first["batch"],
        "first_batch_rows": first.get("rows"),
    }


# -- the run ---------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "mean": None, "min": None, "max": None}
    return {
        "median": round(statistics.median(values), 3),
        "mean": round(statistics.fmean(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


IDLE_SUMMARY = (
    "standby_cpu_s_per_batch", "standby_cores", "active_cpu_s_per_batch",
    "pulled_bytes_per_batch", "changed_bytes_per_batch", "pulled_to_changed",
    "batch_delta_bytes_mean", "batch_delta_bytes_median", "state_bytes",
    "pulled_per_batch_to_state",
)  # fmt: skip


def summary(trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Spreads, ratios and target checks of the trials (pure)."""
    baseline = [t["done_s"] for t in trials if t["kind"] == "baseline"]
    takeover = [t["takeover_s"] for t in trials if t["kind"] == "standby"]
    standby = [t for t in trials if t["kind"] == "standby"]
    base, take = spread(baseline), spread(takeover)
    ratio_median = take["median"] / base["median"] if base["median"] and take["median"] else None
    ratio_mean = take["mean"] / base["mean"] if base["mean"] and take["mean"] else None
    lease_bound_s = TIMEOUT_S_DEFAULT + TARGET_MARGIN_S
    idle = [t["idle"] for t in standby]
    return {
        "baseline_s": base,
        "takeover_s": take,
        "ratio_median": ratio_median,
        "ratio_mean": ratio_mean,
        "targets": {
            "ratio_max": TARGET_RATIO_MAX,
            "takeover_s_max": lease_bound_s,
            "ratio_met": ratio_median is not None and ratio_median <= TARGET_RATIO_MAX,
            "lease_bound_met": take["median"] is not None and take["median"] <= lease_bound_s,
            "lease_bound_met_every_trial": bool(takeover) and max(takeover) <= lease_bound_s,
        },
        "takeover_parts_s": {
            name: spread([t[name] for t in standby])
            for name in ("took_over_s", "waited_s", "catch_up_s", "start_s", "first_batch_s")
        },
        "catch_up_bytes": spread([t["catch_up_bytes"] for t in standby]),
        "standby_ready_s": spread([t["standby_ready_s"] for t in standby]),
        "idle": {
            name: spread([i[name] for i in idle if i[name] is not None]) for name in IDLE_SUMMARY
        },
    }


def measure(bench: Bench, settings: StandbySettings) -> dict[str, Any]:
    root = bench.work / "state"
    input_dir, checkpoint = root / "in", root / "ckpt"
    input_dir.mkdir(parents=True)
    bench.spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
    build = build_state(bench, input_dir, checkpoint)
    bench.spark.stop()  # its JVM and RocksDB stores idle from here: free their memory
    batch_id = build["batch_id"]
    bench.log(
        f"state: {build['cut_state_bytes'] / MIB:.0f} MiB in the cut ({build['state_rows']} "
        f"rows) after {batch_id + 1} batches, {build['build_s']} s"
    )
    build.pop("upload")
    write_ids(input_dir, batch_id + 1, (batch_id + 1) * settings.build_rows, settings.feed_rows)
    apps = bench.work / "apps"
    if settings.warmup:
        warmup = app_trial(bench, "local", input_dir, checkpoint, apps / "warmup", batch_id)
        shutil.rmtree(apps, ignore_errors=True)
        bench.log(f"warm-up application (not counted): {warmup['done_s']:.2f} s")
    trials: list[dict[str, Any]] = []
    for run in range(settings.runs):
        for kind in ("baseline", "standby") if run % 2 == 0 else ("standby", "baseline"):
            if kind == "baseline":
                target = apps / f"baseline-{run}"
                figures = app_trial(bench, "local", input_dir, checkpoint, target, batch_id)
                shutil.rmtree(apps, ignore_errors=True)
                bench.log(f"  run {run + 1} baseline: first batch {figures['done_s']:.2f} s "
                          f"after the process started")  # fmt: skip
            else:
                figures = standby_trial(bench, settings, run, input_dir, checkpoint, batch_id)
                log_standby(bench, run, figures)
            trials.append({"run": run, "kind": kind, **figures})
    return {"build": build, "summary": summary(trials), "trials": trials}


def log_standby(bench: Bench, run: int, figures: dict[str, Any]) -> None:
    idle = figures["idle"]
    bench.log(
        f"  run {run + 1} standby: first batch {figures['takeover_s']:.2f} s after the kill "
        f"(took over at {figures['took_over_s']:.2f} s, lease seen unchanged "
        f"{figures['waited_s']:.2f} s, query started in {figures['start_s']:.2f} s); idle: "
        f"{idle['standby_cpu_s_per_batch']:.3f} CPU s and "
        f"{idle['pulled_bytes_per_batch'] / MIB:.2f} MiB pulled per batch"
    )


def run(settings: StandbySettings, out: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    load_average = os.getloadavg()[0]
    if load_average > 1.0:
        log(f"warning: load average {load_average:.2f} before the run; figures will be noisy")
    connector = settings.connector()
    with (
        tempfile.TemporaryDirectory(prefix="sr3-bench-standby-") as temporary,
        tempfile.TemporaryDirectory(
            prefix="sr3-bench-peers-", dir=settings.peer_root or None
        ) as peer_home,
    ):
        work = Path(temporary)
        cluster = LocalCluster.create(
            Path(peer_home) / "cluster", settings.peers, replication=REPLICATION,
            write_quorum=WRITE_QUORUM, base_port=BASE_PORT, cluster_file=work / "cluster.json",
        )  # fmt: skip
        spark = None
        try:
            cluster.up()
            log(f"ring of {settings.peers} peers up; building the state")
            spark = start_spark(connector, work / "spark-local")
            env = environment(spark, connector)
            peer_pids = tuple(peer.pid for peer in cluster.cluster.peers if peer.pid is not None)
            processes = Processes(os.getpid(), jvm_pid(spark), peer_pids)
            with SyncClient(cluster.ring, cluster.secret) as client:
                bench = Bench(spark, cluster, client, processes, connector, work, log)
                figures = measure(bench, settings)
        finally:
            if spark is not None:
                spark.stop()
            cluster.down(purge=True)
    report = {
        "benchmark": "standby",
        "environment": env,
        "load_average_1m_before": load_average,
        "settings": asdict(settings),
        "replication": REPLICATION,
        "write_quorum": WRITE_QUORUM,
        "lease_timeout_s": TIMEOUT_S_DEFAULT,
        **figures,
        "run_s": round(time.perf_counter() - started, 1),
        "notes": NOTES,
    }
    print_summary(report)
    write_report(report, out)
    print(f"\nwrote {out}")


NOTES = [
    "baseline: connector_app.py --mode local, a new process, JVM and session on an intact "
    "copy of the checkpoint (copied before the clock starts), from its process start to "
    "its first batch done (availableNow, one input file)",
    "takeover: from A's SIGKILL (this process's wall clock) to B's first committed event "
    "(B's wall clock, seen within 50 ms); the next input file is written right after the "
    "kill. took_over_s: B's took_over event; waited_s: lease seen unchanged (from A's last "
    "renewal, which precedes the kill by up to renew_every_s); catch_up: B's "
    "last pull at the takeover; start_s: the query's start; first_batch_s: took_over to "
    "the first committed batch",
    "idle: from B's first pull after its ready event (the catch-up on what was pushed "
    "while its session started, reported apart) until B held idle_batches more batches; "
    "CPU of B's process group (Python and JVM) and of A's for comparison; pulled = B's "
    "'holds batch' log lines; changed = bytes of the files each pulled batch's manifest "
    "names that the batch B held before did not (path and digest); batch_delta = the same "
    "between consecutive manifests; manifests read from the ring during the window",
    "every process shares the machine's cores: re-run on a quiet machine before quoting",
]


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.2f} MiB"


def print_summary(report: dict[str, Any]) -> None:
    s, build = report["summary"], report["build"]
    base, take, targets = s["baseline_s"], s["takeover_s"], s["targets"]
    parts = {name: spread["median"] for name, spread in s["takeover_parts_s"].items()}
    idle = {name: spread["median"] for name, spread in s["idle"].items()}
    ratio = s["ratio_median"]
    print(
        f"\nstandby: {build['cut_state_bytes'] / MIB:.0f} MiB of RocksDB state "
        f"({build['state_rows']} rows), lease timeout {report['lease_timeout_s']} s, "
        f"{report['settings']['runs']} run(s); medians (min-max)\n"
        f"  baseline, new application on an intact local copy  {base['median']:6.2f} s "
        f"({base['min']:.2f}-{base['max']:.2f})\n"
        f"  standby, SIGKILL to first committed batch          {take['median']:6.2f} s "
        f"({take['min']:.2f}-{take['max']:.2f})\n"
        f"    took over at {parts['took_over_s']:.2f} s (lease seen unchanged "
        f"{parts['waited_s']:.2f} s), catch-up {parts['catch_up_s']:.2f} s, query start "
        f"{parts['start_s']:.2f} s, first batch {parts['first_batch_s']:.2f} s later\n"
        f"  ratio {_times(ratio)} (mean {_times(s['ratio_mean'])}; "
        f"<= {targets['ratio_max']}x {'ok' if targets['ratio_met'] else 'MISSED'}); "
        f"<= lease + {TARGET_MARGIN_S:.0f} s = {targets['takeover_s_max']:.1f} s "
        f"{'ok' if targets['lease_bound_met'] else 'MISSED'}"
    )
    print(
        f"  idle standby per batch: {idle['standby_cpu_s_per_batch']:.3f} CPU s "
        f"({idle['standby_cores']:.2f} cores; the active side "
        f"{idle['active_cpu_s_per_batch']:.3f}), pulled {_mib(idle['pulled_bytes_per_batch'])}"
        f" against {_mib(idle['changed_bytes_per_batch'])} changed "
        f"({_times(idle['pulled_to_changed'])}; each batch changed "
        f"{_mib(idle['batch_delta_bytes_mean'])} on average) of a {_mib(idle['state_bytes'])} "
        f"state"
    )
    print(f"run {report['run_s']:.0f} s, cores {report['environment']['cores']}")


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write atomically so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(temporary, out)


def parse_settings(argv: list[str] | None) -> tuple[StandbySettings, Path]:
    defaults = StandbySettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run (a few minutes)")
    parser.add_argument("--out", type=Path, help="JSON results (default results/standby.json)")
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                help=f"default {value}")  # fmt: skip
        else:
            parser.add_argument(flag, type=type(value), help=f"default {value} (quick: QUICK)")
    args = parser.parse_args(argv)
    chosen = {n: getattr(args, n) for n in asdict(defaults) if getattr(args, n) is not None}
    settings = replace(QUICK if args.quick else defaults, **chosen)
    positive = ("peers", "state_mib", "runs", "build_rows", "feed_rows", "idle_batches")
    problems = [f"--{n.replace('_', '-')} must be positive" for n in positive
                if getattr(settings, n) < 1]  # fmt: skip
    if settings.peers < REPLICATION:
        problems.append(f"--peers must be at least {REPLICATION}")
    if settings.feed_s <= 0 or settings.trigger_s <= 0:
        problems.append("--feed-s and --trigger-s must be positive")
    if problems:
        parser.error("; ".join(problems))
    out = args.out or RESULTS_DIR / ("standby-quick.json" if args.quick else "standby.json")
    return settings, out


def main(argv: list[str] | None = None) -> int:
    settings, out = parse_settings(argv)
    # SIGTERM unwinds like Ctrl-C: every application's group is killed, the ring stopped.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    run(settings, out, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
