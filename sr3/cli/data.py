"""``sr3 status``, ``put``, ``get`` and ``token``: a running ring's state and files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ring.auth import metrics_token
from ring.client import Client, RingStatus
from ring.config import ClusterFile, Settings, cluster_file_path
from sr3.cli._shared import fail_cleanly, human_size, ring_options, ring_settings, stderr

PROGRESS_BYTES_MIN = 8 * 1024 * 1024


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    if total < PROGRESS_BYTES_MIN or not stderr.is_terminal:
        yield None
        return
    columns = (
        TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.advance(task, done)


def _local_pids(settings: Settings) -> dict[str, int | None]:
    path = cluster_file_path()
    cluster = settings.cluster or (ClusterFile.read(path) if path.exists() else None)
    if cluster is None:
        return {}
    return {peer.peer_id: peer.pid for peer in cluster.peers}


async def _status(settings: Settings) -> RingStatus:
    async with Client(settings.ring, settings.secret) as client:
        return await client.status()


def _status_json(status: RingStatus, pids: dict[str, int | None]) -> dict[str, Any]:
    peers = []
    for peer in status.peers:
        entry = asdict(peer)
        entry["id"] = entry.pop("peer_id")
        if peer.peer_id in pids:
            entry["pid"] = pids[peer.peer_id]
        peers.append(entry)
    return {
        "replication": status.replication,
        "write_quorum": status.write_quorum,
        "chunks_under_replicated": status.chunks_under_replicated,
        "chunks_lost": status.chunks_lost,
        "peers": peers,
    }


_STATE_STYLE = {"up": "green", "down": "red", "removed": "yellow", "left": "dim"}


def _status_table(status: RingStatus, pids: dict[str, int | None]) -> Table:
    title = (
        f"sr3 ring: R={status.replication}, W={status.write_quorum}, "
        f"{status.chunks_under_replicated} chunks under-replicated, {status.chunks_lost} lost"
    )
    zones = any(peer.zone for peer in status.peers)
    table = Table(title=title)
    table.add_column("State")
    table.add_column("ID")
    table.add_column("Address")
    if zones:
        table.add_column("Zone")
    for column in ("Owns", "Stored", "Chunks", "Under", "Lost", "PID"):
        table.add_column(column, justify="right")
    for peer in status.peers:
        up = peer.state == "up"
        state = f"[{_STATE_STYLE.get(peer.state, 'red')}]{peer.state}[/]"
        if peer.ring_state != peer.state:
            state += f" (ring: {peer.ring_state})"
        known = [
            str(value) if up and value is not None else "?"
            for value in (peer.chunk_count, peer.chunks_under_replicated, peer.chunks_lost)
        ]
        table.add_row(
            state, peer.peer_id, peer.address, *([peer.zone or "-"] if zones else []),
            f"{peer.ownership * 100:.1f}%", human_size(peer.stored_bytes) if up else "?",
            *known, str(pids.get(peer.peer_id) or "-"),
        )  # fmt: skip
    return table


@click.command()
@ring_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@fail_cleanly
def status(ring: str | None, secret_file: Path | None, as_json: bool) -> None:
    """Peers, up/down, effective ownership, stored bytes and chunk counts."""
    settings = ring_settings(ring, secret_file)
    result = asyncio.run(_status(settings))
    pids = _local_pids(settings)
    if as_json:
        click.echo(json.dumps(_status_json(result, pids), indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
        console.print(_status_table(result, pids))


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--key", help="Name to store the file under (default: the file's name).")
@ring_options
@fail_cleanly
def put(file: Path, key: str | None, ring: str | None, secret_file: Path | None) -> None:
    """Store FILE on the ring and print the key it is stored under."""
    settings = ring_settings(ring, secret_file)
    name = key or file.name
    size = file.stat().st_size

    async def run() -> None:
        async with Client(settings.ring, settings.secret) as client:
            with _progress(size, "put") as progress:
                await client.store_file(file, name, progress=progress)

    asyncio.run(run())
    click.echo(name)


@click.command()
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@ring_options
@fail_cleanly
def get(key: str, output: Path, ring: str | None, secret_file: Path | None) -> None:
    """Read the file stored under KEY into OUTPUT, verified end to end."""
    settings = ring_settings(ring, secret_file)

    async def run() -> int:
        async with Client(settings.ring, settings.secret) as client:
            ref = await client.lookup_file(key)
            with _progress(ref.size, "get") as progress:
                await client.get_file(ref, output, progress=progress)
            return ref.size

    size = asyncio.run(run())
    click.echo(f"{output} ({size} bytes, verified)")


@click.group()
def token() -> None:
    """Tokens derived from the cluster secret."""


@token.command("metrics")
@ring_options
@fail_cleanly
def token_metrics(ring: str | None, secret_file: Path | None) -> None:
    """Print the bearer token that GET /metrics accepts (read-only, metrics only)."""
    click.echo(metrics_token(ring_settings(ring, secret_file).secret))
