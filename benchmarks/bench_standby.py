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
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# This script's folder is first on sys.path: its connector_* modules import by name.
from connector_probes import Bench, Processes
from connector_restart import app_trial, build_state
from connector_settings import MIB, PROVIDER_CONF, PROVIDERS, REPLICATION, WRITE_QUORUM
from connector_spark import environment, jvm_pid, start_spark, write_ids
from standby_trial import BENCH_DIR, StandbySettings, standby_trial

from ring.lease import TIMEOUT_S_DEFAULT
from ring.sync_client import SyncClient
from sr3.local import LocalCluster

RESULTS_DIR = BENCH_DIR / "results"
BASE_PORT = 7860
TARGET_RATIO_MAX = 0.4
TARGET_MARGIN_S = 3.0  # over the lease timeout
QUICK = StandbySettings(
    state_mib=20, runs=1, build_rows=50_000, feed_rows=1_000, idle_batches=3,
    driver_memory="2g", settle_s=0.5,
)  # fmt: skip

# -- the run ---------------------------------------------------------------------------------


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
