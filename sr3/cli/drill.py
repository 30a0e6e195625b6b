"""``sr3 drill``: rehearse a multi-failure recovery and report how each topology did;
with ``--spark-standby``, a Spark query's active application and R-1 peers die at once
and its hot standby takes over (``sr3.standby_drill``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ring.config import parse_size
from ring.errors import ConfigError
from sr3.cli._shared import fail_cleanly, human_size, parse_rate, ring_options, ring_settings


def _optional_rate(text: str | None) -> float | None:
    if text is None or text.strip().lower() in ("", "none", "unlimited"):
        return None
    return parse_rate(text)


# Options of the recovery drill only, and of the standby drill only (refused otherwise).
RECOVERY_ONLY = (
    "ring", "secret_file", "fail_count", "state_size", "topologies", "peer_bandwidth",
    "requester_bandwidth", "latency_ms", "fan_in", "repeat", "plot_path",
)  # fmt: skip
STANDBY_ONLY = ("checkpoint_mode", "sink", "files", "lease_timeout_s")


def _refuse_other_mode(context: click.Context, spark_standby: bool) -> None:
    other = RECOVERY_ONLY if spark_standby else STANDBY_ONLY
    given = [
        name for name in other
        if context.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)
    ]  # fmt: skip
    if given:
        flags = [param.opts[0] for param in context.command.params if param.name in given]
        mode = (
            "--spark-standby (it runs on a fresh local ring)"
            if spark_standby
            else "the recovery drill"
        )
        raise ConfigError(f"{', '.join(flags)}: not for {mode}")


@click.command()
@ring_options
@click.option("--peers", type=click.IntRange(2, 200),
              help="Peers of the local ring  [default: 8; 5 with --spark-standby]")  # fmt: skip
@click.option("--replication", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--fail", "fail_count", default=2, show_default=True, type=click.IntRange(0, 199))
@click.option("--state-size", default="64MiB", show_default=True)
@click.option(
    "--topology", "topologies", default="all", show_default=True,
    help="star, line, tree, auto or all (comma-separated for several).",
)  # fmt: skip
@click.option("--peer-bandwidth", help="Emulated egress limit per peer, e.g. 50MB/s.")
@click.option("--requester-bandwidth", help="Emulated ingress limit of the requester.")
@click.option("--latency", "latency_ms", default=0.0, type=click.FloatRange(0, 10_000),
              help="Emulated latency added by peers to each answer, in ms.")  # fmt: skip
@click.option("--fan-in", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--seed", default=1, show_default=True, type=int)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Recoveries per topology, in rotated order; each result is the median.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--spark-standby",
    is_flag=True,
    help="Drill a Spark query's hot standby instead (needs sr3[spark] and Java 17).",
)
@click.option(
    "--spark-rescale",
    "spark_rescale",
    metavar="FROM:TO",
    help="Drill rescaling a Spark query's state through the ring from FROM to TO state "
    "partitions, offline and by standby handover (needs sr3[spark] and Java 17).",
)
@click.option(
    "--rescale-mode",
    type=click.Choice(["offline", "handover", "both"]),
    default="both",
    show_default=True,
    help="--spark-rescale: rescale the stopped query on the ring, or hand it to a standby "
    "started at the new count, or both one after the other.",
)
@click.option(
    "--kill-peers",
    is_flag=True,
    help="--spark-rescale: SIGKILL R-1 peers as the rescale starts.",
)
@click.option(
    "--checkpoint-mode",
    type=click.Choice(["sync", "fs"]),
    default="sync",
    show_default=True,
    help="--spark-standby: local checkpoints kept by StateSync, or one shared on sr3://.",
)
@click.option(
    "--sink",
    type=click.Choice(["foreach", "files"]),
    default="foreach",
    show_default=True,
    help="--spark-standby: foreachBatch (JSON per batch) or Spark's parquet file sink.",
)
@click.option(
    "--files",
    default=30,
    show_default=True,
    type=click.IntRange(6, 600),
    help="--spark-standby: input files, one batch each.",
)
@click.option(
    "--lease-timeout",
    "lease_timeout_s",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0.5, 600),
    help="--spark-standby: the query lease's timeout, s.",
)
@click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="--spark-standby: the applications' Spark master: local[N], or "
    "local-cluster[N,CORES,MiB] for executors in JVMs of their own.",
)
@click.pass_context
@fail_cleanly
def drill(
    context: click.Context, ring: str | None, secret_file: Path | None, peers: int | None,
    replication: int, fail_count: int, state_size: str, topologies: str,
    peer_bandwidth: str | None, requester_bandwidth: str | None, latency_ms: float,
    fan_in: int, seed: int, repeat: int, json_path: Path | None, plot_path: Path | None,
    spark_standby: bool, spark_rescale: str | None, rescale_mode: str, kill_peers: bool,
    checkpoint_mode: str, sink: str, files: int, lease_timeout_s: float, master: str,
) -> None:  # fmt: skip
    """Rehearse a multi-failure recovery: write state, SIGKILL --fail peers at once,
    recover it with each topology, verify it, wait for the ring to heal, report.

    Runs on a fresh embedded local cluster unless --ring is given; on a running ring,
    peers are killed through their admin endpoint (started with --enable-admin-kill).

    With --spark-standby (always on a fresh local ring): a Spark query runs in an active
    application with a hot standby; the active one's whole process and R-1 peers are
    SIGKILLed at once, the standby takes over; its output and state must equal an
    uninterrupted run's. Exit code 2 when they do not or the standby never took over.

    With --spark-rescale FROM:TO (always on a fresh local ring): a Spark query runs at
    FROM state partitions, is rescaled through the ring to TO mid-stream (offline, and by
    a standby's handover), and its output and state must equal an uninterrupted run's.
    Exit code 2 when they do not."""
    if spark_rescale is not None:
        if spark_standby:
            raise ConfigError("--spark-rescale and --spark-standby: one drill at a time")
        _refuse_other_mode(context, True)
        _rescale_drill(
            spark_rescale, rescale_mode, kill_peers, peers or 5, replication, seed,
            files if context.get_parameter_source("files") != click.core.ParameterSource.DEFAULT
            else 12,
            json_path,
        )  # fmt: skip
        return
    _refuse_other_mode(context, spark_standby)
    if spark_standby:
        _standby_drill(
            peers or 5, replication, seed, checkpoint_mode, sink, files, lease_timeout_s,
            master, json_path,
        )  # fmt: skip
        return
    peers = peers or 8
    from recovery.drill import DrillOptions

    chosen = tuple(t.strip() for t in topologies.split(",") if t.strip())
    unknown = set(chosen) - {"star", "line", "tree", "auto", "all"}
    if unknown or not chosen:
        raise ConfigError(f"unknown topology {', '.join(sorted(unknown)) or '(none)'}")
    options = DrillOptions(
        fail=fail_count, topologies=chosen, seed=seed,
        peer_bytes_s=_optional_rate(peer_bandwidth),
        requester_bytes_s=_optional_rate(requester_bandwidth), latency_ms=latency_ms,
        fan_in=fan_in, repeat=repeat,
    )  # fmt: skip
    from sr3.drills import drill_local, drill_remote

    if ring or os.environ.get("SR3_RING"):
        report = drill_remote(ring_settings(ring, secret_file), parse_size(state_size), options)
    else:
        report = drill_local(peers, replication, parse_size(state_size), options)
    _print_drill(report)
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if plot_path is not None:
        from recovery.drill import write_plot

        write_plot(report, plot_path)
    if any(not result.verified for result in report.results):
        sys.exit(2)


def _print_drill(report: Any) -> None:
    table = Table(
        title=(
            f"sr3 drill: {report.peers} peers, R={report.replication}, killed "
            f"{', '.join(report.failed_peers) or 'none'} (seed {report.seed}), "
            f"{report.state_bytes / 2**20:.0f} MiB"
        )
    )
    for column in ("Topology", "Recovery s", "MB/s", "Fan-in", "Verified", "Lost", "Model s"):
        table.add_column(column, justify="left" if column == "Topology" else "right")
    for result in report.results:
        table.add_row(
            result.topology + (" *" if result.chosen_by_auto else ""),
            "-" if result.recovery_s is None else f"{result.recovery_s:.2f}",
            "-" if result.throughput_mb_s is None else f"{result.throughput_mb_s:.1f}",
            "-" if result.max_fan_in is None else str(result.max_fan_in),
            "[green]yes[/]" if result.verified else "[red]NO[/]",
            human_size(result.bytes_lost),
            "-" if result.estimated_s is None else f"{result.estimated_s:.2f}",
        )  # fmt: skip
    console = Console() if Console().is_terminal else Console(width=120)
    console.print(table)
    console.print(f"* chosen by auto: {report.auto['reason']}", highlight=False)
    heal = "did not finish" if report.heal_s is None else f"{report.heal_s:.1f} s"
    if not report.heal_possible:
        heal = "not possible while a majority of the voters is down (no removal can be decided)"
    console.print(
        f"ring back to full replication after the recoveries: {heal}; "
        f"chunks lost: {report.chunks_lost_after_heal}",
        highlight=False,
    )
    for result in report.results:
        if result.missing_chunks:
            ranges = ", ".join(f"{o}+{n}" for o, n in result.lost_ranges[:4])
            lost = human_size(result.bytes_lost)
            console.print(
                f"[red]{result.topology}: unrecoverable[/]: {len(result.missing_chunks)} chunks "
                f"({lost} of the state, bytes {ranges}) had no live replica",
                highlight=False,
            )  # fmt: skip


def _standby_drill(
    peers: int, replication: int, seed: int, checkpoint_mode: str, sink: str, files: int,
    lease_timeout_s: float, master: str, json_path: Path | None,
) -> None:  # fmt: skip
    from sr3.standby_drill import StandbyDrillOptions, run_standby_drill

    options = StandbyDrillOptions(
        peers=peers, replication=replication, files=files, seed=seed,
        checkpoint_mode=checkpoint_mode, sink=sink, lease_timeout_s=lease_timeout_s,
        master=master,
    )  # fmt: skip
    progress = Console(stderr=True, highlight=False)
    report = run_standby_drill(options, say=lambda line: progress.print(f"[dim]  {line}[/]"))
    _print_standby(report)
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.ok:
        sys.exit(2)


def _rescale_drill(
    counts: str, mode: str, kill_peers: bool, peers: int, replication: int, seed: int,
    files: int, json_path: Path | None,
) -> None:  # fmt: skip
    from sr3.rescale_drill import MODES, RescaleDrillOptions, run_rescale_drill

    first, _, second = counts.partition(":")
    if not (first.isascii() and first.isdigit() and second.isascii() and second.isdigit()):
        raise ConfigError("--spark-rescale: FROM:TO, two numbers of partitions (4:16)")
    options = RescaleDrillOptions(
        from_partitions=int(first), to_partitions=int(second),
        modes=MODES if mode == "both" else (mode,), files=files, kill_peers=kill_peers,
        peers=peers, replication=replication, seed=seed,
    )  # fmt: skip
    progress = Console(stderr=True, highlight=False)
    report = run_rescale_drill(options, say=lambda line: progress.print(f"[dim]  {line}[/]"))
    table = Table(
        title=(
            f"sr3 drill --spark-rescale {report.from_partitions}:{report.to_partitions}: "
            f"{report.files} files (seed {report.seed})"
        )
    )
    for column in ("Mode", "Rescaled batch", "Rescale", "Pause", "Peers killed", "Output",
                   "State"):  # fmt: skip
        table.add_column(column, justify="left" if column == "Mode" else "right")
    for run in report.runs:
        table.add_row(
            run.mode, "-" if run.rescaled_batch is None else str(run.rescaled_batch),
            _seconds(run.rescale_s), _seconds(run.pause_s), ", ".join(run.killed_peers) or "-",
            "[green]MATCH[/]" if run.output_matched else "[red]MISMATCH[/]",
            "[green]MATCH[/]" if run.state_matched else "[red]MISMATCH[/]",
        )  # fmt: skip
    Console().print(table)
    for run in report.runs:
        for difference in run.differences:
            Console().print(f"  {run.mode}: {difference}", highlight=False)
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.ok:
        sys.exit(2)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _print_standby(report: Any) -> None:
    table = Table(
        title=(
            f"sr3 drill --spark-standby: {report.checkpoint_mode} checkpoint, {report.sink} "
            f"sink, {report.files} batches, {report.peers} peers R={report.replication}; "
            f"killed the active app and {', '.join(report.killed_peers)} (seed {report.seed})"
        )
    )
    table.add_column("Measure")
    table.add_column("Value", justify="right")
    previous = report.previous or "no one"
    resumed = "-" if report.resumed_after is None else str(report.resumed_after)
    caught_up = "-" if report.catch_up_bytes is None else human_size(report.catch_up_bytes)
    first = "" if report.first_batch is None else f" (batch {report.first_batch})"
    rows = [
        ("active app killed after batch", str(report.killed_after_batch)),
        ("lease timeout", _seconds(report.lease_timeout_s)),
        ("lease seen unchanged before taking it", _seconds(report.waited_s)),
        ("SIGKILL -> standby's query running", _seconds(report.takeover_s)),
        ("SIGKILL -> standby's first committed batch", _seconds(report.first_commit_s) + first),
        ("fence (taken from)", f"{report.fence or '-'} ({previous}, fence {report.active_fence})"),
        ("resumed after batch", resumed),
        ("caught up at takeover", caught_up),
        ("output", _verdict(report.output_matched, f"{report.rows_after} rows, "
                            f"reference {report.rows_reference}")),
        ("state", _verdict(report.state_matched, f"{report.state_rows} rows")),
    ]  # fmt: skip
    for measure, value in rows:
        table.add_row(measure, value)
    console = Console() if Console().is_terminal else Console(width=120)
    console.print(table)
    _print_standby_notes(console, report)


def _verdict(matched: bool, detail: str) -> str:
    return f"[green]MATCH[/] ({detail})" if matched else f"[red]MISMATCH[/] ({detail})"


def _print_standby_notes(console: Console, report: Any) -> None:
    if report.replayed:
        same = "the same rows" if report.replays_identical else "other rows"
        first, last = report.replayed[0], report.replayed[-1]
        batches = f"batch {first}" if first == last else f"batches {first}..{last}"
        console.print(
            f"{batches} of the killed app ran again on the standby ({same}); the standby's "
            "output replaces the killed app's",
            highlight=False,
        )  # fmt: skip
    if report.batches_apart and report.output_matched:
        console.print(
            f"rows moved between batches from batch {report.batches_apart[0]} on (the "
            "takeover folded the batch the killed app had planned into the next); every "
            "row is there once", highlight=False,
        )  # fmt: skip
    if report.uncommitted_files:
        console.print(
            f"{report.uncommitted_files} parquet files no file sink log entry lists "
            "(written when the app died) were not read", highlight=False,
        )  # fmt: skip
    if not report.took_over:
        console.print("[red]the standby never took the query over[/]", highlight=False)
    elif not report.finished:
        console.print(
            f"[red]the standby did not finish[/] (exit {report.standby_exit})", highlight=False
        )
    for line in report.differences:
        console.print(f"[red]{line}[/]", highlight=False)
    console.print(f"drill took {report.seconds:.0f} s", highlight=False)
