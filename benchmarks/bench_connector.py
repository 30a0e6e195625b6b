"""What the Spark connector costs a running query and what it saves at a restart.

One process, one local SparkSession (``local[2]`` by default, ``--driver-memory`` set
before the JVM starts) and one local cluster of ``--peers`` peer processes (R=3, W=2),
all on 127.0.0.x. The input is deterministic: files generated from a seed beside a file
source directory and renamed into it, one per micro-batch (``maxFilesPerTrigger=1``),
oldest first by modification time.

By default every process shares every core, so the peers' work lands on the query's
cores too: the worst case, not how a ring is deployed. ``--ring-cpus 1`` pins the peers
to CPU 1 and Spark's JVM and this process (the driver, which pushes) to the others: the
query's machine then pays for the connector's driver side only, as it does when the
ring runs elsewhere.

1. **overhead**, per state store provider (``--providers``): two copies of the same
   stateful query (a one-minute-per-file event stream, ``withWatermark`` and a count and
   sum per five-minute window and key, append mode to the ``noop`` sink) run side by
   side in the session, one with ``StateSync.register`` (every committed batch pushed
   by the worker thread), one without. They are fed in alternating blocks of
   ``--block-batches`` files (with, without, without, with, ...): a block renames its
   staged files in, waits until the query has processed them all, and for the
   connector side waits for the push of the block's last batch, so that a push never
   shares the cores with the other query's block. Per batch, ``durationMs.triggerExecution`` from
   ``recentProgress``; the medians of both sides and their ratio (target <= 1.05x).
2. **upload**: after the blocks, ``--upload-batches`` single batches of the connector
   side, each waited for (query, then push): per batch, the bytes the connector read
   and uploaded (``PushReport.bytes_read``) against the bytes of the checkpoint files
   that are new or changed since the previous batch (a listing before and after; the
   "visible" figure leaves out Hadoop's hidden ``.crc`` side files and temporary files,
   which no cut holds). Target: uploaded / new visible bytes <= 1.0. The same is taken
   while building the large RocksDB state of part 3, and the ring's stored bytes (all
   replicas, compressed) are recorded around each phase.
3. **restart**: a query with at least ``--state-mib`` of RocksDB state (the consistent
   cut's ``state/`` bytes: one row per unique key with a ~130-byte string) is pushed to
   the ring and stopped. Then, ``--restarts`` times in alternating order and from the
   same checkpoint (batch N): **ring** = ``restore()`` into an empty directory and run the
   first batch after the restart; **local** = run the first batch on an intact copy of
   the checkpoint (copied before the clock starts). Both process the same small input
   file with ``availableNow``; the time is from ``restore()`` (ring) or ``start()``
   (local) until the query terminated after that batch. Target: ring / local <= 1.2x.
   **overlap** (``--no-overlap-bound``: not run): the first batch on a restored copy
   (restored before the clock starts) while another restore of the same cut runs into
   another directory, on the same cores; the bound of any restore that overlapped the
   query's start instead of preceding it.
4. **restart as a new application** (``--app-restarts`` per path, 0: none), as a restart
   after a lost machine is: a new process and JVM each (``connector_app.py``), timed
   from its process start until the first batch is done. **ring**: the restore runs in
   the background while the SparkSession starts (``restore_in_background``); **ring-first**:
   the restore, then the session; **local**: an intact copy, as in part 3.

Writes ``benchmarks/results/connector.json`` (``connector-quick.json`` with ``--quick``)
and prints a table. Every figure is from one machine where Spark, the peers and this
process share the cores: re-run on a quiet machine before quoting the figures. Run from
the repository root:

    python benchmarks/bench_connector.py [--quick] [--state-mib 256] [--providers hdfs,rocksdb]

This script holds the command line, the run and the report; the measuring lives beside
it: ``connector_settings`` (sizes, targets), ``connector_stats`` (pure figures),
``connector_probes`` (CPU time, checkpoint listings, the recording ``StateSync``),
``connector_spark`` (session, queries, input files), ``connector_overhead`` (parts 1 and
2), ``connector_restart`` (parts 3 and 4) and ``connector_app`` (one application of part 4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# This script's folder is first on sys.path: its connector_* modules import by name.
from connector_overhead import measure_overhead
from connector_probes import Bench, Processes
from connector_restart import measure_restart
from connector_settings import (
    APP_MODES,
    BASE_PORT,
    MIB,
    PROVIDERS,
    QUICK,
    RECENT_PROGRESS_MAX,
    REPLICATION,
    TARGET_OVERHEAD_RATIO,
    TARGET_RESTART_RATIO,
    TARGET_UPLOAD_RATIO,
    WRITE_QUORUM,
    Settings,
)
from connector_spark import environment, jvm_pid, start_spark

from ring.sync_client import SyncClient
from sr3.local import LocalCluster

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# -- report --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.0f}"


def _ratio(value: float | None, target: float) -> str:
    if value is None:
        return "  n/a"
    return f"{value:5.2f}x (<= {target:.2f}x {'ok' if value <= target else 'MISSED'})"


def print_report(report: dict[str, Any]) -> None:
    print("\noverhead: median micro-batch ms (triggerExecution), with / without the connector")
    for provider, figures in report["overhead"].items():
        medians = figures["trigger_ms_median"]
        print(
            f"  {provider:8} without {_ms(medians['without'])}  with {_ms(medians['with'])}  "
            f"ratio {_ratio(figures['ratio'], TARGET_OVERHEAD_RATIO)}  "
            f"({figures['with']['batches']} batches each)"
        )
        extra = ", ".join(
            f"{name} {'n/a' if seconds is None else f'{seconds * 1000:.0f} ms'}"
            for name, seconds in figures["extra_cpu_s_per_batch"].items()
        )
        print(f"  {'':8} extra CPU per batch with the connector: {extra}")
        print(f"  {'':8} per block pair, with / without: {figures['pair_ratios']}")
        interval = figures.get("pair_ratio_interval") or []
        if interval:
            mean, low, high = interval
            print(f"  {'':8} pairs' mean {mean:.3f}, 95 % interval {low:.3f}-{high:.3f}")
    print("\nupload: bytes the connector uploaded / new checkpoint bytes (no .crc, no .tmp)")
    for name, upload in report["upload"].items():
        print(
            f"  {name:16} {upload['batches']:3} batches  "
            f"uploaded {upload['uploaded_bytes'] / MIB:8.2f} MiB  "
            f"new {upload['new_bytes_visible'] / MIB:8.2f} MiB  "
            f"ratio {_ratio(upload['ratio_visible'], TARGET_UPLOAD_RATIO)}"
        )
    if "restart" in report:
        print_restart(report["restart"])
    print(
        f"\ncores {report['environment']['cores']}, Spark {report['environment']['spark']}, "
        f"peers {report['peers']} (R={REPLICATION} W={WRITE_QUORUM}), run {report['run_s']:.0f} s"
    )
    ring_cpus = report["settings"]["ring_cpus"]
    print(
        f"peers pinned to CPUs {ring_cpus}, Spark and the driver to the others"
        if ring_cpus
        else "peers, Spark and the driver share every core"
    )


def print_restart(restart: dict[str, Any]) -> None:
    build = restart["build"]
    print(
        f"\nrestart: {build['cut_state_bytes'] / MIB:.0f} MiB of RocksDB state in the cut "
        f"({build['state_rows']} rows, state/ on disk {build['state_dir_bytes_on_disk'] / MIB:.0f}"
        f" MiB), {sum(t['path'] == 'ring' for t in restart['trials'])} trial(s) per path,"
        " medians"
    )
    print(
        f"  ring   {restart['ring_total_s_median']:7.2f} s  (restore "
        f"{restart['restore_s_median']:.2f} s, first batch "
        f"{restart['first_batch_after_ring_s_median']:.2f} s)\n"
        f"  local  {restart['local_total_s_median']:7.2f} s  (first batch only; copying "
        f"the {build['checkpoint_bytes_on_disk'] / MIB:.0f} MiB checkpoint there took "
        f"{restart['local_copy_s_median']:.2f} s, untimed)\n"
        f"  ratio  {_ratio(restart['ratio'], TARGET_RESTART_RATIO)}"
    )
    if restart["overlap_total_s_median"] is not None:
        print(
            f"  overlap {restart['overlap_total_s_median']:6.2f} s  (the first batch on a "
            f"restored copy beside a restore of {restart['overlapped_restore_s_median']:.2f} s: "
            f"the bound of any restore overlapped with the start), "
            f"{restart['overlap_ratio']:.2f}x local"
        )
    app = restart.get("app")
    if app:
        sessions, batches = app["session_s_median"], app["first_batch_s_median"]
        print(
            f"restart as a new application (process start to first batch done), "
            f"{len(app['trials']) // len(APP_MODES)} trial(s) per path, medians"
        )
        for mode in APP_MODES:
            key = mode.replace("-", "_")
            restore = app.get(f"{key}_restore_s_median")
            ratio = "" if key == "local" else _ratio(app[f"{key}_ratio"], TARGET_RESTART_RATIO)
            print(
                f"  {mode:10} {app[f'{key}_done_s_median']:7.2f} s  (session up at "
                f"{sessions[mode]:.2f} s, first batch {batches[mode]:.2f} s"
                + ("" if restore is None else f", restore {restore:.2f} s")
                + ")"
                + (f"  ratio {ratio}" if ratio else "")
            )


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write atomically so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(temporary, out)


def measure(bench: Bench) -> dict[str, Any]:
    overhead: dict[str, Any] = {}
    upload: dict[str, Any] = {}
    for provider in bench.settings.providers if bench.settings.overhead else ():
        bench.log(f"overhead and upload, {provider} provider")
        overhead[provider] = measure_overhead(bench, provider)
        upload[f"overhead-{provider}"] = overhead[provider]["upload"]
    figures: dict[str, Any] = {"overhead": overhead, "upload": upload}
    if bench.settings.restart:
        bench.log("restart, rocksdb provider")
        figures["restart"] = restart = measure_restart(bench)
        upload["restart-build"] = restart["build"]["upload"]
    return figures


def cpu_set(text: str) -> set[int]:
    """``"1"`` or ``"2,3"``: a set of CPU numbers (empty for ``""``)."""
    return {int(part) for part in text.split(",") if part.strip()}


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def run(settings: Settings, out: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    ring_cpus = cpu_set(settings.ring_cpus)
    query_cpus = os.sched_getaffinity(0) - ring_cpus
    if ring_cpus:  # before the JVM starts: it inherits this process's CPUs
        pin(os.getpid(), query_cpus)
        log(f"peers on CPUs {sorted(ring_cpus)}; Spark and the driver on {sorted(query_cpus)}")
    load_average = os.getloadavg()[0]
    if load_average > 1.0:
        log(f"warning: load average {load_average:.2f} before the run; figures will be noisy")
    with (
        tempfile.TemporaryDirectory(prefix="sr3-bench-connector-") as temporary,
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
            if ring_cpus:
                for peer in cluster.cluster.peers:
                    if peer.pid is not None:
                        pin(peer.pid, ring_cpus)
            log(f"ring of {settings.peers} peers up; starting Spark")
            spark = start_spark(settings, work / "spark-local")
            peer_pids = tuple(peer.pid for peer in cluster.cluster.peers if peer.pid is not None)
            processes = Processes(os.getpid(), jvm_pid(spark), peer_pids)
            with SyncClient(cluster.ring, cluster.secret) as client:
                bench = Bench(spark, cluster, client, processes, settings, work, log)
                figures = measure(bench)
            env = environment(spark, settings)
        finally:
            if spark is not None:
                spark.stop()
            cluster.down(purge=True)
    report = {
        "benchmark": "connector",
        "environment": env,
        "load_average_1m_before": load_average,
        "settings": asdict(settings),
        "peers": settings.peers,
        "replication": REPLICATION,
        "write_quorum": WRITE_QUORUM,
        "targets": {
            "overhead_ratio_max": TARGET_OVERHEAD_RATIO,
            "restart_ratio_max": TARGET_RESTART_RATIO,
            "upload_ratio_max": TARGET_UPLOAD_RATIO,
        },
        **figures,
        "run_s": round(time.perf_counter() - started, 1),
        "notes": NOTES,
    }
    print_report(report)
    write_report(report, out)
    print(f"\nwrote {out}")


NOTES = [
    "overhead: durationMs.triggerExecution of each batch from recentProgress; both queries "
    "in one SparkSession, fed in alternating blocks, the connector's push of a block's "
    "last batch waited for before the other query's block",
    "upload: uploaded = PushReport.bytes_read (raw bytes of files new to the connector); "
    "new = new or changed files between listings before and after each batch; "
    "ratio_visible leaves out hidden (.crc) and .tmp files, ratio_all counts them",
    "ring_stored_bytes_delta: compressed chunk bytes on all peers, every replica",
    "restart: ring = restore() into an empty directory + first batch (availableNow); "
    "local = first batch on an intact copy of the same checkpoint (copy not timed); "
    "both in the running JVM, after os.sync and settle_s idle seconds",
    "one machine shares its cores between Spark, the peers and the push: re-run on a "
    "quiet machine before quoting figures",
]


def parse_settings(argv: list[str] | None) -> tuple[Settings, Path]:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run (about 3 min)")
    parser.add_argument("--out", type=Path, help="JSON results (default results/connector.json)")
    parser.add_argument("--providers", help=f"comma-separated of {sorted(PROVIDERS)}")
    for name, value in asdict(defaults).items():
        if name == "providers":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, help=f"default {value}"
            )
            continue
        parser.add_argument(flag, type=type(value), help=f"default {value} (quick: see QUICK)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else defaults
    chosen: dict[str, Any] = {
        name: getattr(args, name)
        for name in asdict(defaults)
        if name != "providers" and getattr(args, name) is not None
    }
    if args.providers:
        chosen["providers"] = tuple(args.providers.split(","))
    settings = replace(base, **chosen)
    problems = check_settings(settings)
    if problems:
        parser.error("; ".join(problems))
    out = args.out or RESULTS_DIR / ("connector-quick.json" if args.quick else "connector.json")
    return settings, out


def check_settings(settings: Settings) -> list[str]:
    problems = [f"unknown provider {p!r}" for p in settings.providers if p not in PROVIDERS]
    if settings.peers < REPLICATION:
        problems.append(f"--peers must be at least {REPLICATION}")
    try:
        ring_cpus = cpu_set(settings.ring_cpus)
    except ValueError:
        problems.append("--ring-cpus must be CPU numbers separated by commas")
    else:
        available = os.sched_getaffinity(0)
        if not ring_cpus <= available or not available - ring_cpus:
            problems.append(f"--ring-cpus must leave the query some of CPUs {sorted(available)}")
    if not 1 <= settings.block_batches <= RECENT_PROGRESS_MAX // 2:
        problems.append(f"--block-batches must be 1..{RECENT_PROGRESS_MAX // 2}")
    positive = ("blocks", "upload_batches", "state_mib", "build_rows", "restart_rows", "restarts")
    problems += [
        f"--{n.replace('_', '-')} must be positive" for n in positive if getattr(settings, n) < 1
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    settings, out = parse_settings(argv)
    run(settings, out, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
