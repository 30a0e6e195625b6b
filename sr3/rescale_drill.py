"""``sr3 drill --spark-rescale FROM:TO``: a stateful query rescaled through the ring
mid-stream, and what it produces afterwards compared with an uninterrupted run's.

``run_rescale_drill``, in a temporary home that is always cleaned up:

1. an embedded local ring (R=3 by default) comes up;
2. the reference, one ``sr3.standby_app`` under a query name of its own, runs every
   batch at FROM state partitions (RocksDB's provider), uninterrupted, and writes its
   state rows;
3. **offline**: application A runs the query at FROM partitions (StateSync, a local
   checkpoint) until a third of the input, then stops (its last batch pushed, its
   lease released); ``sr3 spark rescale --partitions TO`` rescales the ring's newest
   batch (restore, Spark's runner, push under the lease); a new application B restores
   from the ring into an empty directory and runs the rest at TO partitions;
4. **handover**: A runs at FROM partitions while B stands by, started with
   ``partitions=TO``; A stops (a planned handover: last batch pushed, lease released),
   B takes the query over, repartitions its own copy and runs the rest at TO;
5. with ``kill_peers``, R-1 peers are SIGKILLed as the rescale starts (offline: right
   after the command starts; handover: as A stops), and started again after the run.

Each run's output (A's and B's rows, every row once) and B's final state (Spark's
``statestore`` reader, as a multiset: which partition holds a row depends on the count)
are compared with the reference's. The pause is from A's last committed batch to B's
first (offline: the stop, the rescale, a new application's start and restore; handover:
the takeover and the rescale of a warm standby's copy).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ring.errors import ConfigError, SR3Error
from ring.lease import RENEW_EVERY_S_DEFAULT
from sr3.demo import work_home
from sr3.local import LocalCluster
from sr3.spark_demo import read_output, write_inputs
from sr3.standby_app import StandbyJob
from sr3.standby_drill import (
    App,
    app_ring,
    compare_state,
    first_event,
    launched,
    require_spark,
    row_counts,
    row_differences,
    wait_done,
    wait_for_events,
)

__all__ = ["MODES", "RescaleDrillOptions", "RescaleDrillReport", "RescaleRun", "run_rescale_drill"]

MODES = ("offline", "handover")
QUERY = "rescale-drill"
BASE_PORT_DEFAULT = 7380
FILES_MIN, FILES_MAX = 6, 300
PARTITIONS_MAX = 256
TRIGGER_S = 0.5
LEASE_S = 3.0
IDLE_STOP_S = 8.0
SPARK_START_S_MAX = 150.0
BATCH_S_MAX = 5.0
RESCALE_S_MAX = 600.0

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RescaleDrillOptions:
    from_partitions: int = 4
    to_partitions: int = 16
    modes: tuple[str, ...] = MODES
    files: int = 12
    kill_peers: bool = False
    peers: int = 5
    replication: int = 3
    seed: int = 1
    base_port: int = BASE_PORT_DEFAULT
    keep_dir: Path | None = None

    def __post_init__(self) -> None:
        for count in (self.from_partitions, self.to_partitions):
            if not 1 <= count <= PARTITIONS_MAX:
                raise ConfigError(f"--spark-rescale: partitions 1 to {PARTITIONS_MAX}")
        if self.from_partitions == self.to_partitions:
            raise ConfigError("--spark-rescale FROM:TO: two different counts")
        if not self.modes or set(self.modes) - set(MODES):
            raise ConfigError(f"rescale modes: {', '.join(MODES)}")
        if not FILES_MIN <= self.files <= FILES_MAX:
            raise ConfigError(f"--files: {FILES_MIN} to {FILES_MAX}")
        if self.kill_peers and self.peers <= 2 * (self.replication - 1):
            raise ConfigError(
                f"killing R-1 = {self.replication - 1} peers must leave a majority: at least "
                f"{2 * self.replication - 1} peers"
            )

    @property
    def rescale_after_batch(self) -> int:
        """A stops once it committed this batch (about a third of the input)."""
        return max(1, self.files // 3 - 1)


@dataclass(frozen=True, slots=True)
class RescaleRun:
    mode: str
    rescaled_batch: int | None  # the batch Spark's runner wrote
    rescale_s: float | None  # the rescale itself (offline: the command's restore+runner+push)
    pause_s: float | None  # A's last commit to B's first
    killed_peers: tuple[str, ...]
    output_matched: bool
    state_matched: bool
    rows_reference: int
    rows_after: int
    state_rows: int
    differences: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.output_matched and self.state_matched and self.rescaled_batch is not None


@dataclass(frozen=True, slots=True)
class RescaleDrillReport:
    from_partitions: int
    to_partitions: int
    files: int
    seed: int
    runs: tuple[RescaleRun, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(run.ok for run in self.runs)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for run, figures in zip(self.runs, data["runs"], strict=True):
            figures["ok"] = run.ok
        return {**data, "ok": self.ok}


def run_rescale_drill(
    options: RescaleDrillOptions, say: Say = lambda _: None
) -> RescaleDrillReport:
    """Run the drill (see the module) on a fresh local ring; the report."""
    require_spark()
    with work_home(options.keep_dir, "sr3-rescale-drill-") as home:
        started = time.monotonic()
        with app_ring(
            home, options.peers, options.replication, options.seed, options.base_port, say
        ) as (cluster, env):
            _reference(options, home, env, say)
            runs = tuple(_run(options, home, env, cluster, mode, say) for mode in options.modes)
        return RescaleDrillReport(
            options.from_partitions, options.to_partitions, options.files, options.seed,
            runs, time.monotonic() - started,
        )  # fmt: skip


def _job(options: RescaleDrillOptions, home: Path, name: str, **more: Any) -> StandbyJob:
    return StandbyJob(
        query=more.pop("query", QUERY), checkpoint=str(home / f"checkpoint-{name}"),
        input_dir=str(home / f"input-{more.pop('input', name)}"),
        output_dir=str(home / f"output-{name}"), events_path=str(home / f"events-{name}.jsonl"),
        holder=f"drill-{name}", lease_timeout_s=LEASE_S, renew_every_s=RENEW_EVERY_S_DEFAULT,
        trigger_s=TRIGGER_S, shuffle_partitions=options.from_partitions,
        state_store="rocksdb", run_s_max=2 * SPARK_START_S_MAX + 4 * options.files * BATCH_S_MAX,
        **more,
    )  # fmt: skip


def _reference(options: RescaleDrillOptions, home: Path, env: dict[str, str], say: Say) -> None:
    write_inputs(home / "input-reference", options.files, options.seed)
    job = _job(
        options, home, "reference", query=f"{QUERY}-reference", until_batch=options.files,
        stop_idle_s=IDLE_STOP_S, state_path=str(home / "state-reference.json"),
    )  # fmt: skip
    with launched("reference", job, env, home) as reference:
        wait_done(reference, SPARK_START_S_MAX + options.files * BATCH_S_MAX * 2)
    say(f"reference: {options.files} files at {options.from_partitions} partitions")


def _run(
    options: RescaleDrillOptions, home: Path, env: dict[str, str], cluster: LocalCluster,
    mode: str, say: Say,
) -> RescaleRun:  # fmt: skip
    """One rescale, ``mode`` offline or handover, under a query name of its own."""
    query = f"{QUERY}-{mode}"
    due = options.rescale_after_batch
    write_inputs(home / f"input-{mode}-staged", options.files, options.seed)
    (home / f"input-{mode}").mkdir()
    a_job = _job(options, home, f"{mode}-a", query=query, input=mode, until_batch=due)
    b_job = _job(
        options, home, f"{mode}-b", query=query, input=mode, until_batch=options.files + 1,
        stop_idle_s=IDLE_STOP_S, state_path=str(home / f"state-{mode}.json"),
        partitions=options.to_partitions if mode == "handover" else 0,
    )  # fmt: skip
    victims: tuple[str, ...] = ()
    rescale_s: float | None = None
    with contextlib.ExitStack() as apps:
        a = apps.enter_context(launched(f"{mode}-A", a_job, env, home))
        wait_for_events(a, lambda e: first_event(e, "took_over") is not None, "took over",
                        SPARK_START_S_MAX)  # fmt: skip
        if mode == "handover":
            b = apps.enter_context(launched(f"{mode}-B", b_job, env, home))
            wait_for_events(b, lambda e: first_event(e, "ready") is not None, "was ready",
                            SPARK_START_S_MAX, others=[a])  # fmt: skip
        (home / f"input-{mode}-staged").rename(home / f"input-{mode}")
        say(f"{mode}: A runs at {options.from_partitions} partitions to batch {due}")
        wait_done(a, (due + 2) * BATCH_S_MAX + SPARK_START_S_MAX)
        if options.kill_peers:
            victims = _kill(cluster, options)
            say(f"{mode}: SIGKILLed {', '.join(victims)}")
        if mode == "offline":
            rescale_s = _rescale_command(options, query, env, home)
            say(f"{mode}: rescaled on the ring to {options.to_partitions} in {rescale_s:.1f} s")
            b = apps.enter_context(launched(f"{mode}-B", b_job, env, home))
        wait_done(b, SPARK_START_S_MAX + 3 * options.files * BATCH_S_MAX)
    for peer_id in victims:
        cluster.start(peer_id)
    return _judge(options, home, mode, a, b, victims, rescale_s)


def _kill(cluster: LocalCluster, options: RescaleDrillOptions) -> tuple[str, ...]:
    members = [peer.peer_id for peer in cluster.cluster.peers]
    victims = tuple(sorted(random.Random(options.seed).sample(members, options.replication - 1)))
    for peer_id in victims:
        cluster.kill(peer_id)
    return victims


def _rescale_command(
    options: RescaleDrillOptions, query: str, env: dict[str, str], home: Path
) -> float:
    """``sr3 spark rescale`` in a process of its own, as an operator runs it; the seconds
    its report gives (restore, Spark's runner, push)."""
    log_path = home / f"rescale-{query}.log"
    with log_path.open("wb") as log:
        done = subprocess.run(
            [sys.executable, "-m", "sr3", "spark", "rescale", "--query", query,
             "--partitions", str(options.to_partitions), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=log, timeout=RESCALE_S_MAX, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise SR3Error(f"sr3 spark rescale failed ({done.returncode}): see {log_path}")
    report = json.loads(done.stdout)
    return float(report["seconds"])


def _judge(
    options: RescaleDrillOptions, home: Path, mode: str, a: App, b: App,
    victims: tuple[str, ...], rescale_s: float | None,
) -> RescaleRun:  # fmt: skip
    events_a, events_b = a.events(), b.events()
    took = first_event(events_b, "took_over") or {}
    commits_a = [e for e in events_a if e.get("event") == "committed"]
    commits_b = [e for e in events_b if e.get("event") == "committed"]
    pause_s = (
        float(commits_b[0]["wall"]) - float(commits_a[-1]["wall"])
        if commits_a and commits_b
        else None
    )
    reference = row_counts(read_output(home / "output-reference"))
    after = row_counts(read_output(home / f"output-{mode}-a")) + row_counts(
        read_output(home / f"output-{mode}-b")
    )
    differences = row_differences(after, reference)
    state_matched, state_rows = compare_state(
        home / "state-reference.json", home / f"state-{mode}.json"
    )
    rescaled = took.get("rescaled") if mode == "handover" else took.get("resumed_after")
    if mode == "handover" and rescaled is not None:
        rescale_s = float(took.get("rescale_s", 0.0))
    return RescaleRun(
        mode, rescaled, rescale_s, pause_s, victims,
        output_matched=bool(reference) and not differences, state_matched=state_matched,
        rows_reference=sum(reference.values()), rows_after=sum(after.values()),
        state_rows=state_rows, differences=differences,
    )  # fmt: skip
