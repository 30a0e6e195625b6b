"""One trial of ``bench_standby.py``: the settings of a run, the applications it starts,
its input and what it reads from the ring, and one standby trial (application A active,
B on standby; B's idle cost, then A's SIGKILL and B's takeover).

``bench_standby.py`` runs the trials and the baseline, and writes the report.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# This script's folder is first on sys.path: its connector_* modules import by name.
from connector_probes import Bench, settle
from connector_settings import Settings
from connector_spark import write_ids
from proc_cpu import cpu_seconds

from ring.lease import TIMEOUT_S_DEFAULT
from ring.sync_client import SyncClient
from spark_connector.catalog import latest_batch
from spark_connector.manifest import Manifest
from spark_connector.restore import read_manifest
from sr3.process_group import group_pids, kill_group, log_tail
from sr3.standby_app import StandbyJob, read_events, start

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
APP = "standby_query:keys_query"
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


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


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
        return log_tail(self.log_path, LOG_TAIL_LINES)


@contextlib.contextmanager
def launched(name: str, job: StandbyJob, env: dict[str, str], cwd: Path) -> Iterator[App]:
    """Start an application; its whole group is SIGKILLed on the way out, whatever happens."""
    log_path = cwd / f"app-{name}.log"
    process = start(job, env, log_path, cwd)
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
