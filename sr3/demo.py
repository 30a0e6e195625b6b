"""The main job on the embedded default: a Spark query loses its driver, its checkpoint
and two storage peers, and carries on from the ring as if nothing had happened.

``run_spark_demo`` (``sr3 demo``), in a temporary home that is always cleaned up:

1. a local ring of ``peers`` peers comes up;
2. a stateful query (``sr3.spark_demo``) runs in its own driver process, one input file
   per trigger, and ``StateSync`` pushes every committed batch to the ring;
3. once the ring holds batch ``kill_at``, the driver's process group (Python and JVM)
   is SIGKILLed;
4. ``fail`` peers are SIGKILLed (chosen with a seeded generator) and the checkpoint
   directory is deleted;
5. a new driver restores the newest batch from the ring into the empty checkpoint
   directory and finishes the input from there;
6. the same driver runs the query uninterrupted over all input in a fresh checkpoint.

The killed driver's output up to the restored batch plus the restored driver's output
must hold exactly the rows of the reference output, each once; batches the killed driver
ran after the restored one run again after the restore, and their first output is
dropped. Whether every batch read and emitted what the reference's did is reported too.
Exit code 0 only on a match.

``run_demo`` (``sr3 demo --storage-only``) is the Spark-free version: store a
state file, SIGKILL peers, read it back byte for byte.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ring.client import Client
from ring.errors import ConfigError, SR3Error
from ring.files import file_digest
from spark_connector.sync import StateSync
from sr3.local import BASE_PORT_DEFAULT, LocalCluster
from sr3.process_group import kill_group, log_tail
from sr3.spark_demo import (
    JobArgs,
    Output,
    ResumeResult,
    Row,
    read_output,
    scratch_beside,
    with_scratch,
    write_inputs,
)
from sr3.statedata import write_state_file

__all__ = ["SparkDemoOptions", "compare_outputs", "run_demo", "run_spark_demo", "work_home"]

QUERY = "demo"
POLL_S = 0.2
# Bounds on the drivers, generous for a busy two-core machine: Spark starts, then batches.
SPARK_START_S_MAX = 90.0
BATCH_S_MAX = 4.0
LOG_TAIL_LINES = 30
DIFFERENCES_SHOWN = 10


@dataclass(frozen=True, slots=True)
class SparkDemoOptions:
    batches: int = 12  # input files, one micro-batch each
    kill_at: int = 5  # the driver dies once the ring holds this batch (or a newer one)
    peers: int = 5
    fail: int = 2
    seed: int = 7
    trigger_s: float = 1.0
    base_port: int = BASE_PORT_DEFAULT
    keep_dir: Path | None = None  # work there and keep the files (else a temporary home)

    @property
    def driver_wait_s(self) -> float:
        """How long the first driver may take until the ring holds batch ``kill_at``."""
        return SPARK_START_S_MAX + (self.kill_at + 1) * max(BATCH_S_MAX, 2 * self.trigger_s)

    @property
    def resume_s(self) -> float:
        """How long the new driver may take: restore, the rest, and the reference run."""
        return SPARK_START_S_MAX + 2 * (self.batches + 1) * BATCH_S_MAX

    def __post_init__(self) -> None:
        if not 0 <= self.kill_at < self.batches - 1:
            raise ConfigError("--kill-at must leave at least two batches for after the restore")
        if not 0 <= self.fail < self.peers:
            raise ConfigError("--fail must leave at least one peer running")


@dataclass(frozen=True, slots=True)
class Comparison:
    combined: Output  # killed run up to the restored batch, then the restored run
    reference: Output
    dropped: tuple[int, ...]  # killed-run batches after the restored one (run again)
    replays_identical: bool  # those batches gave the same rows when run again

    @property
    def rows_combined(self) -> int:
        return sum(len(rows) for rows in self.combined.values())

    @property
    def rows_reference(self) -> int:
        return sum(len(rows) for rows in self.reference.values())

    @property
    def match(self) -> bool:
        """The same rows (window, key, count), each as often as in the reference: what
        the query computed, whichever batch emitted it."""
        return self.rows_reference > 0 and not self.differences()

    def differences(self) -> list[tuple[str, Row]]:
        """Rows only one side has (``"+"``: after the failures, ``"-"``: the reference)."""
        combined, reference = _row_counts(self.combined), _row_counts(self.reference)
        extra = [("+", row) for row in sorted((combined - reference).elements())]
        return extra + [("-", row) for row in sorted((reference - combined).elements())]

    def first_batch_apart(self) -> int | None:
        """The first batch id whose rows differ from the reference's (None: none)."""
        batches = sorted(set(self.combined) | set(self.reference))
        return next((b for b in batches if self.combined.get(b) != self.reference.get(b)), None)


def _row_counts(output: Output) -> Counter[Row]:
    return Counter(row for rows in output.values() for row in rows)


def compare_outputs(
    killed: Output, restored_batch: int, resumed: Output, reference: Output
) -> Comparison:
    """Put the killed run's batches up to ``restored_batch`` and the resumed run's together."""
    combined = {batch: rows for batch, rows in killed.items() if batch <= restored_batch}
    overlap = sorted(set(combined) & set(resumed))
    assert not overlap, f"the resumed run re-ran restored batches {overlap}"
    combined.update(resumed)
    dropped = tuple(sorted(batch for batch in killed if batch > restored_batch))
    identical = all(killed[batch] == resumed.get(batch) for batch in dropped)
    return Comparison(dict(sorted(combined.items())), reference, dropped, identical)


@dataclass
class _Timeline:
    started: float = field(default_factory=time.monotonic)
    steps: list[tuple[str, float, str]] = field(default_factory=list)

    def add(self, step: str, seconds: float, detail: str) -> None:
        self.steps.append((step, seconds, detail))
        print(f"  [{time.monotonic() - self.started:6.1f} s] {step}: {detail}", flush=True)


def require_pyspark() -> None:
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigError(
            "the Spark demo needs PySpark: pip install 'sr3[spark]' "
            "(or run `sr3 demo --storage-only`)"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigError("the Spark demo needs a Java runtime (Java 17): none on PATH")


def run_spark_demo(options: SparkDemoOptions) -> int:
    require_pyspark()
    rng = random.Random(options.seed)
    timeline = _Timeline()
    print(
        f"sr3 demo: Spark query on a local ring, {options.batches} batches, driver killed at "
        f"batch {options.kill_at}, {options.fail} of {options.peers} peers killed "
        f"(seed {options.seed})",
        flush=True,
    )
    with work_home(options.keep_dir) as home:
        begin = time.monotonic()
        cluster = LocalCluster.create(
            home / "cluster", options.peers, cluster_file=home / "cluster.json",
            base_port=options.base_port,
        )  # fmt: skip
        cluster.up()
        try:
            timeline.add(
                "ring up", time.monotonic() - begin,
                f"{options.peers} peers, R={cluster.cluster.replication}, "
                f"W={cluster.cluster.write_quorum}",
            )  # fmt: skip
            return _spark_story(cluster, home, options, rng, timeline)
        finally:
            cluster.down(purge=True)


def _spark_story(
    cluster: LocalCluster, home: Path, options: SparkDemoOptions, rng: random.Random,
    timeline: _Timeline,
) -> int:  # fmt: skip
    begin = time.monotonic()
    rows = write_inputs(home / "input", options.batches, options.seed)
    timeline.add("input", time.monotonic() - begin, f"{options.batches} files, {rows} events")
    job = JobArgs(
        input_dir=str(home / "input"), checkpoint_dir=str(home / "checkpoint"),
        output_dir=str(home / "output-killed"), query=QUERY, trigger_s=options.trigger_s,
        run_s_max=options.driver_wait_s + 60,
    )  # fmt: skip
    # SPARK_LOCAL_IP: Spark binds and resolves on loopback from its first line on.
    env = {
        **os.environ, "SR3_RING": cluster.ring, "SR3_SECRET": cluster.secret,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }  # fmt: skip
    env["PYTHONUNBUFFERED"] = "1"
    log_path = home / "driver-killed.log"
    with _driver("run", job, env, log_path) as driver:
        begin = time.monotonic()
        ring_batch = _wait_for_batch(
            cluster, job, driver, options.kill_at, log_path, options.driver_wait_s
        )
        timeline.add(
            "driver runs", time.monotonic() - begin,
            f"Spark start and batches 0..{ring_batch} pushed as they committed",
        )  # fmt: skip
        begin = time.monotonic()
        kill_group(driver)
        committed = _newest_commit(Path(job.checkpoint_dir))
        timeline.add(
            "driver killed", time.monotonic() - begin,
            f"SIGKILL to process group {driver.pid} (Python and JVM); ring held batch "
            f"{ring_batch}, checkpoint had committed {committed}",
        )  # fmt: skip
    begin = time.monotonic()
    victims = sorted(rng.sample([peer.peer_id for peer in cluster.cluster.peers], options.fail))
    for peer_id in victims:
        cluster.kill(peer_id)
    wiped = sum(1 for path in Path(job.checkpoint_dir).rglob("*") if path.is_file())
    shutil.rmtree(job.checkpoint_dir)
    timeline.add(
        "failures", time.monotonic() - begin,
        f"SIGKILLed {', '.join(victims) or 'no peers'}; deleted the checkpoint ({wiped} files)",
    )  # fmt: skip
    result = _resume(home, job, env, timeline, options.resume_s)
    begin = time.monotonic()
    comparison = compare_outputs(
        read_output(Path(job.output_dir)), result.restored_batch,
        read_output(home / "output-restored"), read_output(home / "output-reference"),
    )  # fmt: skip
    timeline.add(
        "compare", time.monotonic() - begin,
        f"{comparison.rows_combined} rows after the failures, "
        f"{comparison.rows_reference} without them",
    )  # fmt: skip
    _report(timeline, result, comparison, victims)
    return 0 if comparison.match else 1


def _resume(
    home: Path, job: JobArgs, env: dict[str, str], timeline: _Timeline, timeout_s: float
) -> ResumeResult:
    resume_job = JobArgs(
        input_dir=job.input_dir, checkpoint_dir=job.checkpoint_dir,
        output_dir=str(home / "output-restored"), query=QUERY, topology="auto",
        reference_checkpoint_dir=str(home / "checkpoint-reference"),
        reference_output_dir=str(home / "output-reference"),
        result_path=str(home / "resume-result.json"),
    )  # fmt: skip
    log_path = home / "driver-restored.log"
    print("  a new driver restores, finishes the input and runs the reference...", flush=True)
    with _driver("resume", resume_job, env, log_path) as driver:
        try:
            code = driver.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise SR3Error(
                f"the restored driver did not finish in {timeout_s:.0f} s\n{_tail(log_path)}"
            ) from None
    if code != 0:
        raise SR3Error(f"the restored driver failed (exit {code})\n{_tail(log_path)}")
    result = ResumeResult.from_json(Path(resume_job.result_path).read_text())
    timeline.add("new driver: Spark start", result.spark_start_s, "a fresh SparkSession")
    timeline.add(
        "restore", result.restore_s,
        f"batch {result.restored_batch}: {result.restored_files} files, "
        f"{_human(result.restored_bytes)}, topology auto -> {result.topology}",
    )  # fmt: skip
    timeline.add(
        "restored run", result.resumed.seconds,
        f"batches {result.restored_batch + 1}..{result.resumed.last_batch} from the restored "
        "checkpoint (availableNow)",
    )  # fmt: skip
    timeline.add(
        "reference run", result.reference.seconds,
        f"batches 0..{result.reference.last_batch}, no failures, fresh checkpoint",
    )  # fmt: skip
    return result


@contextlib.contextmanager
def work_home(keep_dir: Path | None, prefix: str = "sr3-demo-") -> Iterator[Path]:
    """Where a demo or drill works: ``keep_dir`` (must be empty; kept afterwards), or a
    temporary directory named ``prefix...`` removed afterwards."""
    if keep_dir is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as name:
            yield Path(name)
        return
    if keep_dir.exists() and any(keep_dir.iterdir()):
        raise ConfigError(f"{keep_dir} is not empty")
    keep_dir.mkdir(parents=True, exist_ok=True)
    yield keep_dir.resolve()


@contextlib.contextmanager
def _driver(
    command: str, job: JobArgs, env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A Spark driver in a session of its own; its whole group is SIGKILLed on the way out.
    Its JVM's scratch files go to the folder beside the log named after it."""
    env = with_scratch(env, scratch_beside(log_path))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sr3.spark_demo", command, job.to_json()],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        kill_group(process)


def _wait_for_batch(
    cluster: LocalCluster, job: JobArgs, driver: subprocess.Popen[bytes], batch_min: int,
    log_path: Path, timeout_s: float,
) -> int:  # fmt: skip
    """Poll the ring until it holds ``batch_min`` or newer of the query; that batch."""
    watcher = StateSync(cluster.ring, QUERY, job.checkpoint_dir, cluster.secret)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            newest = watcher.latest_batch()
            if newest is not None and newest >= batch_min:
                return newest
            if driver.poll() is not None:
                raise SR3Error(
                    f"the driver exited ({driver.returncode}) before the ring held batch "
                    f"{batch_min}\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise SR3Error(
                    f"the ring did not hold batch {batch_min} within {timeout_s:.0f} s "
                    f"(newest: {newest})\n{_tail(log_path)}"
                )
            time.sleep(POLL_S)
    finally:
        watcher.close()


def _newest_commit(checkpoint_dir: Path) -> int | None:
    commits = [int(path.name) for path in (checkpoint_dir / "commits").glob("[0-9]*")]
    return max(commits, default=None)


def _tail(log_path: Path) -> str:
    return log_tail(log_path, LOG_TAIL_LINES, log_path.name)


def _human(size: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _report(
    timeline: _Timeline, result: ResumeResult, comparison: Comparison, victims: list[str]
) -> None:
    console = Console() if Console().is_terminal else Console(width=120)
    table = Table(title="sr3 demo: Spark driver, checkpoint and peers lost; state from the ring")
    table.add_column("Step")
    table.add_column("Seconds", justify="right")
    table.add_column("What happened")
    for step, seconds, detail in timeline.steps:
        table.add_row(step, f"{seconds:.1f}", detail)
    table.add_row("total", f"{time.monotonic() - timeline.started:.1f}", "")
    console.print(table)
    dropped = comparison.dropped
    same = "the same" if comparison.replays_identical else "not the same"
    replayed = (
        f"batches {dropped[0]}..{dropped[-1]} of the killed driver ran again after the restore "
        f"({same} rows as before); their first output is dropped"
        if dropped
        else "the killed driver had output nothing after the restored batch"
    )
    windows = {start for rows in comparison.combined.values() for start, _, _ in rows}
    lines = [
        f"restored batch {result.restored_batch}: {result.restored_files} files, "
        f"{_human(result.restored_bytes)}, with {', '.join(victims) or 'no peers'} down",
        f"topology: auto chose {result.topology}: {result.topology_reason}",
        replayed,
        f"compared {comparison.rows_combined} rows ({len(windows)} windows, "
        f"{len(comparison.combined)} batches) with the reference's {comparison.rows_reference} "
        f"rows ({len(comparison.reference)} batches)",
        _batch_note(comparison, result),
    ]
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    if comparison.match:
        console.print("[bold green]MATCH[/]: the restored query produced the reference output")
        return
    console.print("[bold red]MISMATCH[/]: rows differ (+ after the failures, - reference):")
    differences = comparison.differences()
    for sign, row in differences[:DIFFERENCES_SHOWN]:
        console.print(f"  {sign} {row}", highlight=False)
    if len(differences) > DIFFERENCES_SHOWN:
        console.print(f"  ... and {len(differences) - DIFFERENCES_SHOWN} more", highlight=False)


def _batch_note(comparison: Comparison, result: ResumeResult) -> str:
    """Whether the batches after the restore read and emitted what the reference's did."""
    resumed, reference = result.resumed.input_rows, result.reference.input_rows
    moved = next((b for b in sorted(resumed) if resumed[b] != reference.get(b)), None)
    apart = comparison.first_batch_apart()
    if moved is not None:
        return (
            f"batch by batch: apart from batch {moved} on, which read {resumed[moved]} input "
            f"rows after the restore and {reference.get(moved, 0)} in the reference run"
        )
    if apart is not None:
        return f"batch by batch: same input per batch, output apart from batch {apart} on"
    return "batch by batch: the same input and output as the reference run"


# -- storage only -------------------------------------------------------------------------


def run_demo(state_bytes: int, *, peers: int = 5, fail: int = 2, seed: int = 7) -> int:
    """Store a generated state file, SIGKILL ``fail`` peers, read it back byte for byte."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="sr3-demo-") as home_name:
        home = Path(home_name)
        cluster = LocalCluster.create(home / "cluster", peers, cluster_file=home / "cluster.json")
        started = time.monotonic()
        cluster.up()
        try:
            return _exercise(cluster, home, state_bytes, fail, rng, seed, started)
        finally:
            cluster.down(purge=True)


def _exercise(
    cluster: LocalCluster, home: Path, state_bytes: int, fail: int, rng: random.Random,
    seed: int, started: float,
) -> int:  # fmt: skip
    import asyncio

    source = home / "state.bin"
    restored = home / "restored.bin"
    write_state_file(source, state_bytes, seed)
    up_s = time.monotonic() - started
    print(
        f"sr3 demo: {len(cluster.cluster.peers)} peers up in {up_s:.1f} s "
        f"(R={cluster.cluster.replication}, W={cluster.cluster.write_quorum})"
    )

    async def store() -> float:
        async with Client(cluster.ring, cluster.secret) as client:
            begin = time.monotonic()
            await client.store_file(source, "demo/state")
            return time.monotonic() - begin

    async def fetch() -> tuple[float, dict[int, int]]:
        async with Client(cluster.ring, cluster.secret) as client:
            begin = time.monotonic()
            ref = await client.lookup_file("demo/state")
            await client.get_file(ref, restored)
            elapsed = time.monotonic() - begin
            view = await client.ring()
            lost: dict[int, int] = {}
            for extent in ref.extents:
                holders = view.ring.preference_list(extent.chunk_id, view.replication)
                gone = sum(1 for member in holders if member.peer_id in victims)
                lost[gone] = lost.get(gone, 0) + 1
            return elapsed, lost

    put_s = asyncio.run(store())
    print(f"stored {state_bytes / 2**20:.0f} MiB of state in {put_s:.2f} s")
    victims = sorted(rng.sample([p.peer_id for p in cluster.cluster.peers], fail))
    for peer_id in victims:
        cluster.kill(peer_id)
    print(f"SIGKILLed {', '.join(victims) or 'no peers'} (seed {seed})")
    get_s, lost = asyncio.run(fetch())
    replication = cluster.cluster.replication
    for gone, count in sorted(lost.items()):
        print(f"  {count:4d} chunks had {gone} of {replication} replicas on killed peers")
    identical = file_digest(source) == file_digest(restored)
    print(
        f"read back {restored.stat().st_size / 2**20:.0f} MiB in {get_s:.2f} s "
        f"with {len(cluster.cluster.peers) - fail} of {len(cluster.cluster.peers)} peers up"
    )
    print("byte-identical: " + ("yes" if identical else "NO"))
    return 0 if identical else 1
