"""Record latency by consensus (CASPaxos) against the per-replica compare-and-set before it.

One run measures, on the same machine, two local rings of ``--peers`` peers (R=3, W=2):

- **old**: the code of ``--before`` (default ``6ad95eb``, the last commit with the
  per-replica compare-and-set: a write returns once W of the key's R preferred peers
  applied it, a read once R - W + 1 agree), extracted with ``git archive`` into a
  temporary directory;
- **new**: this checkout (or ``--after REF``, extracted the same way): records are a
  CASPaxos register per key (``ring.client.proposer``).

Each ring runs with its own client in a worker process (``records_worker.py``)
whose ``PYTHONPATH`` and working directory are that code, so its peers run that code
too. The driver sends both workers the same workloads in turn, alternating which goes
first from one repetition to the next, so that drift on a shared machine hits both:

- **create**: one writer, ``put_record(new key, expected_version=0)``, a new key each
  time (what the Spark connector does once per micro-batch);
- **update**: one writer changes one key, ``expected_version`` = its last version;
- **read**: ``get_record`` of that key;
- **contend**: ``--writers`` clients (each its own proposer) on one key, each
  ``--contend-attempts`` times: read, then ``put_record(expected_version=what it read)``.
  Counted: wins, conflicts, other errors, and (new only) the rounds each write took.

Latency is per call (``time.perf_counter``), throughput is calls / wall seconds of one
single-writer phase. Per repetition the ratio new/old of each phase's p50 and p99; the
report gives their median and range over the repetitions (target from the issue: the
single-writer p50 ratio <= 1.5x). Also recorded per phase: CPU milliseconds per call of
the client and of the peers together. Run from the repository root:

    python benchmarks/bench_records.py [--repeat 8] [--ops 300] [--after HEAD]
                                       [--out benchmarks/results/records.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parent.parent
WORKER_SCRIPT = SCRIPT.parent / "records_worker.py"
RESULTS_PATH_DEFAULT = Path(__file__).resolve().parent / "results" / "records.json"
BEFORE_DEFAULT = "6ad95eb"
SEED = 20_240_601
PEERS = 5
REPLICATION = 3
WRITE_QUORUM = 2
VALUE_BYTES = 256
TARGET_P50_RATIO = 1.5
SINGLE_PHASES = ("create", "update", "read")
PHASES = (*SINGLE_PHASES, "contend")
SIDES = ("old", "new")
BASE_PORTS = {"old": 7540, "new": 7640}
# Bounds: operations per phase, writers, attempts, and how long the driver waits.
OPS_MAX = 5_000
WRITERS_MAX = 32
ATTEMPTS_MAX = 100
REPEAT_MAX = 50
SETTLE_S_MAX = 600.0
WARMUP_OPS = 30
# After a peer starts, for its sync window (failure timeout 5 s + 3 repair intervals of
# 10 s by default), an acceptor catches up on every key from the others before its first
# round there (ring.consensus): measurements start once that is over on both rings.
SETTLE_S_DEFAULT = 40.0
CATCH_UPS_METRIC = "sr3_peer_record_catch_ups"
# In a RecordUnknown's message (new only): the version chosen when the writer gave up.
UNKNOWN_CHOSEN = re.compile(r"version (\d+) is now chosen")
WORKER_START_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 180.0
WORKER_STOP_TIMEOUT_S = 90.0
WORKER_LINE_BYTES_MAX = 4 * 1024 * 1024
LOG_TAIL_CHARS = 3_000


# -- figures (pure) ----------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sample."""
    assert values, "a percentile of nothing"
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered) - 1e-9)))
    return ordered[rank - 1]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, minimum and maximum of a non-empty sample."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of one repetition on one ring, as a worker measured it."""

    latencies_ms: list[float]
    wall_s: float
    client_cpu_s: float | None
    peers_cpu_s: float | None
    wins: int = 0
    conflicts: int = 0
    # Versions that more than one writer was told it wrote (a lost update).
    double_wins: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # New only: rounds per write (contend) and the proposer's counters over the phase.
    rounds_histogram: dict[str, int] = field(default_factory=dict)
    round_stats: dict[str, Any] | None = None
    # New only: slots the peers caught up on from others before answering a round.
    catch_ups: int | None = None

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 0.50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 0.99)

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies_ms) / self.wall_s

    def cpu_ms_per_op(self) -> dict[str, float | None]:
        count = len(self.latencies_ms)
        return {
            "client": None if self.client_cpu_s is None else 1000 * self.client_cpu_s / count,
            "peers": None if self.peers_cpu_s is None else 1000 * self.peers_cpu_s / count,
        }


def phase_summary(phases: Sequence[Phase]) -> dict[str, Any]:
    """One ring's figures for one phase over the repetitions."""
    pooled = [latency for phase in phases for latency in phase.latencies_ms]
    histogram: dict[str, int] = {}
    for phase in phases:
        for rounds, count in phase.rounds_histogram.items():
            histogram[rounds] = histogram.get(rounds, 0) + count
    errors: dict[str, int] = {}
    for phase in phases:
        for name, count in phase.errors.items():
            errors[name] = errors.get(name, 0) + count
    cpu = [phase.cpu_ms_per_op() for phase in phases]
    return {
        "calls": len(pooled),
        "p50_ms": spread([phase.p50_ms for phase in phases]),
        "p99_ms": spread([phase.p99_ms for phase in phases]),
        "pooled_p50_ms": percentile(pooled, 0.50),
        "pooled_p99_ms": percentile(pooled, 0.99),
        "ops_per_s": spread([phase.ops_per_s for phase in phases]),
        "client_cpu_ms_per_op": _median_present([figure["client"] for figure in cpu]),
        "peers_cpu_ms_per_op": _median_present([figure["peers"] for figure in cpu]),
        "wins": sum(phase.wins for phase in phases),
        "double_wins": sum(phase.double_wins for phase in phases),
        "conflicts": sum(phase.conflicts for phase in phases),
        "errors": errors,
        "rounds_histogram": dict(sorted(histogram.items(), key=lambda item: int(item[0]))),
        "catch_ups": _sum_present([phase.catch_ups for phase in phases]),
    }


def _sum_present(values: Sequence[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def _median_present(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def ratios(old: Sequence[Phase], new: Sequence[Phase]) -> dict[str, dict[str, float]]:
    """Per repetition new/old of p50, p99 and throughput; median and range over them."""
    pairs = list(zip(old, new, strict=True))
    return {
        "p50": spread([b.p50_ms / a.p50_ms for a, b in pairs]),
        "p99": spread([b.p99_ms / a.p99_ms for a, b in pairs]),
        "ops_per_s": spread([b.ops_per_s / a.ops_per_s for a, b in pairs]),
    }


# -- the driver --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Code:
    """One side's code: where it is and which commit it is."""

    side: str
    path: Path
    commit: str
    dirty: bool


def git(*arguments: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *arguments], check=True, capture_output=True
    ).stdout


def extract(side: str, ref: str, directory: Path) -> Code:
    """The tree of ``ref`` (``git archive``) unpacked into ``directory``."""
    commit = git("rev-parse", "--short", f"{ref}^{{commit}}").decode().strip()
    archive = git("archive", "--format=tar", commit)
    directory.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    return Code(side, directory, commit, dirty=False)


def checkout(side: str) -> Code:
    """This checkout, as it is (uncommitted changes to tracked code files noted)."""
    commit = git("rev-parse", "--short", "HEAD").decode().strip()
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "ring", "sr3").strip())
    return Code(side, REPO_ROOT, commit, dirty)


class WorkerProcess:
    """The driver's handle on one worker: send a command, read its answer (bounded)."""

    def __init__(self, code: Code, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.code = code
        self.process = process
        self.log_path = log_path

    @classmethod
    async def start(cls, code: Code, work: Path, settings: Settings) -> WorkerProcess:
        log_path = work / f"worker-{code.side}.log"
        log_handle = await asyncio.to_thread(open, log_path, "ab")
        with log_handle:
            process = await asyncio.create_subprocess_exec(
                sys.executable, str(WORKER_SCRIPT), str(code.path),
                "--home", str(work / f"ring-{code.side}"),
                "--base-port", str(BASE_PORTS[code.side]), "--writers", str(settings.writers),
                "--settle-s", str(settings.settle_s),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log_handle, cwd=code.path, limit=WORKER_LINE_BYTES_MAX,
                env={**os.environ, "PYTHONPATH": str(code.path)},
            )  # fmt: skip
        worker = cls(code, process, log_path)
        try:
            await worker.read(WORKER_START_TIMEOUT_S)
        except BaseException:
            await worker.stop()
            raise
        return worker

    async def read(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        if not line:
            tail = self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"worker {self.code.side} exited; its log ends:\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def run(self, command: dict[str, Any]) -> Phase:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        return Phase(**(await self.read(COMMAND_TIMEOUT_S))["phase"])

    async def stop(self) -> None:
        """Ask the worker to stop its ring; SIGTERM (it still stops the ring) if it
        does not, SIGKILL as a last resort."""
        if self.process.returncode is None and self.process.stdin is not None:
            self.process.stdin.write(b'{"quit": true}\n')
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), WORKER_STOP_TIMEOUT_S)
        except TimeoutError:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), WORKER_STOP_TIMEOUT_S)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


@dataclass(frozen=True, slots=True)
class Settings:
    repeat: int
    ops: int
    writers: int
    attempts: int
    settle_s: float


async def measure(
    workers: dict[str, WorkerProcess], settings: Settings, log: Callable[[str], None]
) -> dict[str, dict[str, list[Phase]]]:
    """Every phase on both rings, repetition by repetition, alternating the order."""
    phases: dict[str, dict[str, list[Phase]]] = {
        side: {phase: [] for phase in PHASES} for side in SIDES
    }
    for repetition in range(settings.repeat):
        order = SIDES if repetition % 2 == 0 else SIDES[::-1]
        for phase in PHASES:
            command = {
                "phase": phase,
                "tag": f"r{repetition}",
                "ops": settings.ops,
                "writers": settings.writers,
                "attempts": settings.attempts,
            }
            for side in order:
                phases[side][phase].append(await workers[side].run(command))
        log(f"repetition {repetition + 1}/{settings.repeat}: " + describe(phases, repetition))
    return phases


def describe(phases: dict[str, dict[str, list[Phase]]], repetition: int) -> str:
    parts = []
    for phase in PHASES:
        old, new = phases["old"][phase][repetition], phases["new"][phase][repetition]
        parts.append(f"{phase} p50 {old.p50_ms:.1f}/{new.p50_ms:.1f} ms")
    return ", ".join(parts) + " (old/new)"


async def run_rings(
    codes: dict[str, Code], work: Path, settings: Settings, log: Callable[[str], None]
) -> dict[str, dict[str, list[Phase]]]:
    workers: dict[str, WorkerProcess] = {}
    try:
        for side in SIDES:  # one after the other: the second picks ports the first left
            log(f"starting the {side} ring ({codes[side].commit})")
            workers[side] = await WorkerProcess.start(codes[side], work, settings)
        return await measure(workers, settings, log)
    finally:
        for worker in workers.values():
            await worker.stop()


def build_report(
    codes: dict[str, Code], settings: Settings, phases: dict[str, dict[str, list[Phase]]]
) -> dict[str, Any]:
    summaries = {
        side: {phase: phase_summary(phases[side][phase]) for phase in PHASES} for side in SIDES
    }
    ratio = {phase: ratios(phases["old"][phase], phases["new"][phase]) for phase in PHASES}
    return {
        "benchmark": "records",
        "peers": PEERS,
        "replication": REPLICATION,
        "write_quorum": WRITE_QUORUM,
        "value_bytes": VALUE_BYTES,
        "repeat": settings.repeat,
        "ops_per_phase": settings.ops,
        "contend_writers": settings.writers,
        "contend_attempts_per_writer": settings.attempts,
        "settle_s": settings.settle_s,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "code": {
            side: {"commit": code.commit, "dirty": code.dirty, "from": str(code.path)}
            for side, code in codes.items()
        },
        "ratio_new_old": ratio,
        "target_p50_ratio": TARGET_P50_RATIO,
        "target_met": {
            phase: ratio[phase]["p50"]["median"] <= TARGET_P50_RATIO for phase in SINGLE_PHASES
        },
        "old": summaries["old"],
        "new": summaries["new"],
        "notes": [
            "old: per-replica compare-and-set (a write returns after W acks); "
            "new: CASPaxos (fast create needs all R, updates use a held ballot)",
            "p50/p99: per repetition; median, min and max over repetitions; "
            "pooled_*: over all calls of all repetitions",
            "ratio_new_old: per repetition new/old, then median, min and max",
            "contend: latency of each put_record attempt (its read before it not timed); "
            "rounds_histogram: rounds a put took (new only), from proposer.stats",
            "cpu_ms_per_op: CPU of the worker (all its clients) and of the 5 peers / calls",
            "runs: each repetition's figures (per-call latencies are not kept)",
        ],
        "runs": {
            side: {phase: [run_figures(p) for p in phases[side][phase]] for phase in PHASES}
            for side in SIDES
        },
    }


def run_figures(phase: Phase) -> dict[str, Any]:
    """One phase of one repetition for the JSON: its figures, not every call's latency."""
    figures = asdict(phase)
    latencies = figures.pop("latencies_ms")
    return {
        "calls": len(latencies),
        "p50_ms": phase.p50_ms,
        "p99_ms": phase.p99_ms,
        "max_ms": max(latencies),
        "ops_per_s": phase.ops_per_s,
        **figures,
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"{'phase':>8} | {'old p50/p99 ms':>15} | {'new p50/p99 ms':>15} | new/old p50 (range)")
    for phase in PHASES:
        old, new, ratio = report["old"][phase], report["new"][phase], report["ratio_new_old"]
        p50 = ratio[phase]["p50"]
        print(
            f"{phase:>8} | {old['p50_ms']['median']:6.1f} {old['p99_ms']['median']:7.1f} | "
            f"{new['p50_ms']['median']:6.1f} {new['p99_ms']['median']:7.1f} | "
            f"{p50['median']:.2f}x ({p50['min']:.2f}-{p50['max']:.2f})"
        )
    for side in SIDES:
        contend = report[side]["contend"]
        print(
            f"contend {side}: wins {contend['wins']} (double {contend['double_wins']}), "
            f"conflicts {contend['conflicts']}, "
            f"errors {contend['errors']}, rounds {contend['rounds_histogram']}"
        )


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write atomically so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(temporary, out)


def run(
    before: str, after: str | None, settings: Settings, out: Path, log: Callable[[str], None]
) -> None:
    load_average = os.getloadavg()[0]
    if load_average > 1.0:
        log(f"warning: load average {load_average:.2f} before the run; figures will be noisy")
    with tempfile.TemporaryDirectory(prefix="sr3-bench-records-") as temporary:
        work = Path(temporary)
        codes = {
            "old": extract("old", before, work / "old"),
            "new": checkout("new") if after is None else extract("new", after, work / "new"),
        }
        phases = asyncio.run(run_rings(codes, work, settings, log))
    report = build_report(codes, settings, phases)
    report["load_average_1m_before"] = load_average
    print_report(report)
    write_report(report, out)
    print(f"\nwrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", default=BEFORE_DEFAULT, help="commit of the old ring")
    parser.add_argument("--after", help="commit of the new ring (default: this checkout)")
    parser.add_argument("--repeat", type=int, default=8, help="repetitions (ABAB/BABA)")
    parser.add_argument("--ops", type=int, default=300, help="calls per single-writer phase")
    parser.add_argument("--writers", type=int, default=8, help="contending writers")
    parser.add_argument("--contend-attempts", type=int, default=12, help="puts per writer")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S_DEFAULT,
        help="seconds after a ring is up before measuring (see SETTLE_S_DEFAULT)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_PATH_DEFAULT, help="JSON results")
    args = parser.parse_args(argv)
    if not (
        1 <= args.repeat <= REPEAT_MAX
        and 1 <= args.ops <= OPS_MAX
        and 1 <= args.writers <= WRITERS_MAX
        and 1 <= args.contend_attempts <= ATTEMPTS_MAX
        and 0 <= args.settle_s <= SETTLE_S_MAX
    ):
        parser.error(
            f"--repeat 1..{REPEAT_MAX}, --ops 1..{OPS_MAX}, --writers 1..{WRITERS_MAX}, "
            f"--contend-attempts 1..{ATTEMPTS_MAX}, --settle-s 0..{SETTLE_S_MAX:.0f}"
        )
    settings = Settings(args.repeat, args.ops, args.writers, args.contend_attempts, args.settle_s)
    run(args.before, args.after, settings, args.out, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
