"""Parts 3 and 4 of the connector benchmark: build a query's RocksDB state to
``--state-mib`` with every batch pushed to the ring, then time the first batch after a
restart from the ring (``restore()`` into an empty directory) against one from an intact
local copy of the same checkpoint, in alternating order: within the benchmark's running
SparkSession (part 3), then as new applications (part 4, ``connector_app.py``: a process
and JVM each, as a restart after a lost machine is)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from connector_probes import (
    Bench,
    RecordingSync,
    cut_state_bytes,
    listing,
    ring_stored_bytes,
    settle,
    step_figures,
    tree_bytes,
)
from connector_settings import APP_MODES, BUILD_BATCHES_MAX, MIB, PROVIDER_CONF, PROVIDERS
from connector_spark import batches_from, check_query, start_keys_query, write_ids
from connector_stats import Listing, app_restart_summary, cpu_delta, restart_summary, upload_summary

from spark_connector.sync import StateSync

RESTART_QUERY = "restart-state"
APP_SCRIPT = Path(__file__).resolve().parent / "connector_app.py"
APP_S_MAX = 600  # one application restart, from its process start to its exit


def build_state(bench: Bench, input_dir: Path, checkpoint: Path) -> dict[str, Any]:
    """Run the keys query with the connector until the cut holds ``--state-mib`` of state;
    every batch is pushed before the next starts. Stops the query."""
    settings, cluster = bench.settings, bench.cluster
    target_bytes = settings.state_mib * MIB
    sync = RecordingSync(cluster.ring, RESTART_QUERY, checkpoint, cluster.secret)
    sync.attach(bench.spark)  # every batch's plan on the ring before it runs
    query = start_keys_query(bench.spark, input_dir, sync.checkpoint_dir)
    steps: list[dict[str, Any]] = []
    state_bytes = state_files = 0
    listed: Listing = {}  # the query's own first files count as the first batch's
    started = time.perf_counter()
    try:
        sync.register(query, bench.spark)
        stored_before = ring_stored_bytes(bench.client)
        while state_bytes < target_bytes:
            index = len(steps)
            if index >= BUILD_BATCHES_MAX:
                raise RuntimeError(f"state still {state_bytes} bytes after {index} batches")
            write_ids(input_dir, index, index * settings.build_rows, settings.build_rows)
            query.processAllAvailable()
            check_query(query)
            batch = batches_from(query, index)
            if [figures.batch_id for figures in batch] != [index]:
                raise RuntimeError(f"expected batch {index}, got {batch}")
            flush_s = sync.wait_pushed(index)
            before, listed = listed, listing(checkpoint)
            steps.append(step_figures(sync, before, listed))
            state_bytes, state_files = cut_state_bytes(checkpoint)
            steps[-1] |= asdict(batch[0]) | {"flush_wait_s": round(flush_s, 3)}
            steps[-1] |= {"cut_state_bytes": state_bytes}
            bench.log(
                f"  build batch {index}: {batch[0].trigger_ms} ms, state {state_bytes / MIB:.0f} "
                f"MiB in {state_files} files, pushed in {flush_s:.1f} s"
            )
        stored_after = ring_stored_bytes(bench.client)
    finally:
        sync.close()
        query.stop()
    return {
        "build_s": round(time.perf_counter() - started, 1),
        "batch_id": len(steps) - 1,
        "state_rows": steps[-1]["state_rows"],
        "cut_state_bytes": state_bytes,
        "cut_state_files": state_files,
        "cut_bytes": steps[-1]["cut_bytes"],
        "state_dir_bytes_on_disk": tree_bytes(checkpoint / "state"),
        "checkpoint_bytes_on_disk": tree_bytes(checkpoint),
        "ring_stored_bytes_delta": stored_after - stored_before,
        "upload": upload_summary(steps),
    }


def check_restored(restored: int | None, batch_id: int) -> None:
    if restored != batch_id:
        raise RuntimeError(f"the ring restored batch {restored}, not {batch_id}")


def run_first_batch(spark: Any, input_dir: Path, checkpoint: Path, batch_id: int) -> Any:
    """Start the keys query on ``checkpoint`` with ``availableNow`` and wait until it
    terminated after its one batch; (wall seconds, the batch's figures)."""
    started = time.perf_counter()
    query = start_keys_query(spark, input_dir, checkpoint, available_now=True)
    query.awaitTermination()
    wall_s = time.perf_counter() - started
    check_query(query)
    batches = batches_from(query, batch_id)
    if [batch.batch_id for batch in batches] != [batch_id]:
        raise RuntimeError(f"expected only batch {batch_id} after the restart, got {batches}")
    return wall_s, batches[0]


def restart_trial(
    bench: Bench, path: str, input_dir: Path, checkpoint: Path, target: Path, batch_id: int
) -> dict[str, Any]:
    """One restart after ``batch_id`` into ``target``: from the ring or from a local copy."""
    cluster = bench.cluster
    copy_s = None
    if path == "local":
        # Untimed in the restart, reported beside it: what laying the checkpoint's bytes
        # into new files costs on this machine, a part every restore also pays.
        copy_started = time.perf_counter()
        shutil.copytree(checkpoint, target, symlinks=True)
        subprocess.run(["sync"], check=True)
        copy_s = round(time.perf_counter() - copy_started, 3)
    elif path == "overlap":
        # Untimed: the batch runs on what the ring path's restore leaves (the cut, not
        # every retained version), as it would on a restore that let it start early.
        restore_beside(bench, target, batch_id)
    restorer = StateSync(cluster.ring, RESTART_QUERY, target, cluster.secret)
    settle(bench.settings.settle_s)
    cpu_before = bench.processes.sample()
    started = time.perf_counter()
    restore_s = 0.0
    try:
        if path == "ring":
            restore_s = timed_restore(restorer, bench.settings.restore_topology, batch_id)
    finally:
        restorer.close()
    restored_bytes = tree_bytes(target)
    if path == "overlap":
        side = target.with_name(f"{target.name}-restored")
        with ThreadPoolExecutor(1, thread_name_prefix="overlap") as pool:
            restoring = pool.submit(restore_beside, bench, side, batch_id)
            wall_s, batch = run_first_batch(bench.spark, input_dir, target, batch_id + 1)
            # Each measured on its own clock from the same start; the batch is the figure.
            side_restore_s: float | None = restoring.result()
        shutil.rmtree(side, ignore_errors=True)
    else:
        wall_s, batch = run_first_batch(bench.spark, input_dir, target, batch_id + 1)
        side_restore_s = None
    total_s = time.perf_counter() - started
    recovery = restorer.last_restore.recovery if restorer.last_restore is not None else None
    return {
        "path": path,
        "topology": recovery.topology if recovery is not None else None,
        "topology_reason": recovery.reason if recovery is not None else None,
        "total_s": round(total_s, 3),
        "restore_s": round(restore_s, 3),
        "first_batch_s": round(wall_s, 3),
        "first_batch_trigger_ms": batch.trigger_ms,
        "first_batch_add_batch_ms": batch.add_batch_ms,
        "state_rows": batch.state_rows,
        "checkpoint_bytes_at_start": restored_bytes,
        "local_copy_s": copy_s,
        "overlapped_restore_s": None if side_restore_s is None else round(side_restore_s, 3),
        "cpu_s": cpu_delta(cpu_before, bench.processes.sample()),
    }


def timed_restore(restorer: StateSync, topology: str, batch_id: int) -> float:
    """Seconds ``restorer.restore()`` took, checked to have restored ``batch_id``."""
    started = time.perf_counter()
    check_restored(restorer.restore(topology=topology), batch_id)
    return time.perf_counter() - started


def restore_beside(bench: Bench, directory: Path, batch_id: int) -> float:
    """The overlap path's restore of the cut into ``directory``: its seconds."""
    cluster = bench.cluster
    with StateSync(cluster.ring, RESTART_QUERY, directory, cluster.secret) as restorer:
        return timed_restore(restorer, bench.settings.restore_topology, batch_id)


def measure_restart(bench: Bench) -> dict[str, Any]:
    settings = bench.settings
    bench.spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
    root = bench.work / "restart"
    input_dir, checkpoint = root / "in", root / "ckpt"
    input_dir.mkdir(parents=True)
    build = build_state(bench, input_dir, checkpoint)
    bench.log(
        f"  state: {build['cut_state_bytes'] / MIB:.0f} MiB in the cut "
        f"({build['state_rows']} rows) after {build['batch_id'] + 1} batches, {build['build_s']} s"
    )
    files = build["batch_id"] + 1
    write_ids(input_dir, files, files * settings.build_rows, settings.restart_rows)
    # Untimed: the first restart in a JVM loads and compiles code the later ones reuse.
    warmup = restart_trial(
        bench, "local", input_dir, checkpoint, root / "warmup", build["batch_id"]
    )
    shutil.rmtree(root / "warmup", ignore_errors=True)
    bench.log(f"  warm-up restart (not counted): {warmup['total_s']:.2f} s")
    paths = ("ring", "local", "overlap") if settings.overlap_bound else ("ring", "local")
    trials = []
    for trial in range(settings.restarts):
        for path in paths if trial % 2 == 0 else paths[::-1]:
            target = root / f"{path}-{trial}"
            figures = restart_trial(bench, path, input_dir, checkpoint, target, build["batch_id"])
            shutil.rmtree(target, ignore_errors=True)
            trials.append({"trial": trial, **figures})
            bench.log(
                f"  restart {trial + 1}/{settings.restarts} {path:>5}: "
                f"{figures['total_s']:.2f} s (restore {figures['restore_s']:.2f} s, "
                f"first batch {figures['first_batch_s']:.2f} s"
                + (
                    ""
                    if figures["overlapped_restore_s"] is None
                    else f" beside a restore of {figures['overlapped_restore_s']:.2f} s"
                )
                + ")"
                + (f" {figures['topology']}" if figures["topology"] else "")
            )
    summary = restart_summary(build, trials)
    if settings.app_restarts:
        summary["app"] = measure_app_restarts(bench, input_dir, checkpoint, build["batch_id"])
    return summary


def measure_app_restarts(
    bench: Bench, input_dir: Path, checkpoint: Path, batch_id: int
) -> dict[str, Any]:
    """Part 4: ``--app-restarts`` restarts per path, each a new application."""
    root = bench.work / "restart-app"
    trials = []
    for trial in range(bench.settings.app_restarts):
        shift = trial % len(APP_MODES)
        for mode in APP_MODES[shift:] + APP_MODES[:shift]:
            target = root / f"{mode}-{trial}"
            figures = app_trial(bench, mode, input_dir, checkpoint, target, batch_id)
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(root / "local", ignore_errors=True)
            trials.append({"trial": trial, **figures})
            restored = figures.get("restored_s")
            bench.log(
                f"  application restart {trial + 1}/{bench.settings.app_restarts} {mode:>10}: "
                f"{figures['done_s']:.2f} s (session at {figures['session_s']:.2f} s"
                + ("" if restored is None else f", restored at {restored:.2f} s")
                + f", first batch {figures['first_batch_s']:.2f} s)"
            )
    return app_restart_summary(trials)


def app_trial(
    bench: Bench, mode: str, input_dir: Path, checkpoint: Path, target: Path, batch_id: int
) -> dict[str, Any]:
    """Run ``connector_app.py`` in ``mode`` on ``target``; its figures and CPU seconds."""
    settings, cluster = bench.settings, bench.cluster
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode == "local":  # untimed, as in part 3
        shutil.copytree(checkpoint, target, symlinks=True)
        subprocess.run(["sync"], check=True)
    settle(settings.settle_s)
    command = [
        sys.executable, str(APP_SCRIPT), "--mode", mode, "--ring", cluster.ring,
        "--query", RESTART_QUERY, "--checkpoint", str(target), "--input", str(input_dir),
        "--local-dir", str(target.parent / "local"), "--batch-id", str(batch_id),
        "--topology", settings.restore_topology, "--spark-cores", str(settings.spark_cores),
        "--driver-memory", settings.driver_memory, "--partitions", str(settings.partitions),
    ]  # fmt: skip
    env = {**os.environ, "SR3_SECRET": cluster.secret}
    peers_before = bench.processes.sample()["peers"]
    command += ["--t0", repr(time.time())]
    # In the work directory, not the caller's: where the JVM writes a crash report
    # (hs_err_pid<N>.log) should one fail, as RocksDB's native threads have at spark.stop().
    crashes_before = set(target.parent.glob("hs_err_pid*.log"))
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=APP_S_MAX, check=False,
        cwd=target.parent,
    )  # fmt: skip
    crashes = sorted(set(target.parent.glob("hs_err_pid*.log")) - crashes_before)
    peers_after = bench.processes.sample()["peers"]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} application restart failed: {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(lines[-1])
    peers_s = None if peers_before is None or peers_after is None else peers_after - peers_before
    figures["cpu_s"]["peers"] = None if peers_s is None else round(peers_s, 2)
    figures["jvm_crash_reports"] = [path.name for path in crashes]
    return figures
