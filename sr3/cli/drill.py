"""``sr3 drill``: rehearse a multi-failure recovery and report how each topology did."""

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


@click.command()
@ring_options
@click.option("--peers", default=8, show_default=True, type=click.IntRange(2, 200))
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
@fail_cleanly
def drill(
    ring: str | None, secret_file: Path | None, peers: int, replication: int, fail_count: int,
    state_size: str, topologies: str, peer_bandwidth: str | None,
    requester_bandwidth: str | None, latency_ms: float, fan_in: int, seed: int, repeat: int,
    json_path: Path | None, plot_path: Path | None,
) -> None:  # fmt: skip
    """Rehearse a multi-failure recovery: write state, SIGKILL --fail peers at once,
    recover it with each topology, verify it, wait for the ring to heal, report.

    Runs on a fresh embedded local cluster unless --ring is given; on a running ring,
    peers are killed through their admin endpoint (started with --enable-admin-kill)."""
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
