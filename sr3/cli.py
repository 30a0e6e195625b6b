"""The ``sr3`` command line.

    sr3 peer ...                    run one storage peer in the foreground
    sr3 cluster up --peers N        start the embedded local cluster (127.0.0.x)
    sr3 cluster down [--purge]      stop it
    sr3 cluster kill|start PEER     SIGKILL or (re)start one local peer
    sr3 status [--json]             peers, state, ownership, stored bytes, chunks
    sr3 put FILE [--key NAME]       store a file; prints the key
    sr3 get KEY -o FILE             read it back, verified
    sr3 token metrics               the bearer token Prometheus scrapes /metrics with
    sr3 demo                        the end-to-end demonstration on a local cluster

Ring and secret come from --ring/--secret-file, then SR3_RING/SR3_SECRET, then the
cluster file written by ``sr3 cluster up``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

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
from rich.text import Text

from ring.auth import SECRET_CHARS_MIN, metrics_token
from ring.client import Client, RingStatus
from ring.config import ClusterFile, Settings, cluster_file_path, parse_size, resolve, sr3_home
from ring.errors import ConfigError, SR3Error
from ring.placement import VNODES_DEFAULT
from ring.sync_client import SyncClient
from sr3.local import BASE_PORT_DEFAULT, LocalCluster

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])
PROGRESS_BYTES_MIN = 8 * 1024 * 1024
stderr = Console(stderr=True)


def _fail_cleanly(function: F) -> F:
    """Turn sr3 errors into one line on stderr and exit code 1, not a traceback."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SR3Error as exc:
            # One line whatever the terminal width, and the message is not rich markup.
            stderr.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _ring_options(function: F) -> F:
    function = click.option(
        "--secret-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="File holding the cluster secret (else SR3_SECRET, else the cluster file).",
    )(function)
    function = click.option(
        "--ring", help="host:port of one or more peers, comma-separated (else SR3_RING)."
    )(function)
    return function


def _settings(ring: str | None, secret_file: Path | None) -> Settings:
    secret = secret_file.read_text().strip() if secret_file else None
    return resolve(ring, secret)


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


@click.group()
@click.version_option(package_name="sr3")
def cli() -> None:
    """sr3: replicated state recovery for stream processing."""


# -- peer ----------------------------------------------------------------------------------


def _rate(text: str) -> float:
    """Bytes per second in ``64MB/s``, ``64MiB`` or ``0`` (unlimited)."""
    return float(parse_size(text.strip().removesuffix("/s")))


def _seeds(text: str) -> tuple[str, ...]:
    seeds = tuple(filter(None, (part.strip() for part in text.split(","))))
    for seed in seeds:
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"seed {seed!r} is not HOST:PORT")
    return seeds


@cli.group(invoke_without_command=True)
@click.option("--id", "peer_id", envvar="SR3_PEER_ID", help="Stable peer id (required).")
@click.option("--listen", envvar="SR3_LISTEN", help="HOST:PORT to serve on (required).")
@click.option(
    "--advertise", envvar="SR3_ADVERTISE", help="HOST:PORT others reach (default: --listen)."
)
@click.option(
    "--data", "data_dir", envvar="SR3_DATA",
    type=click.Path(file_okay=False, path_type=Path), help="Data folder (required).",
)  # fmt: skip
@click.option(
    "--seeds", default="", envvar="SR3_SEEDS",
    help="Comma-separated HOST:PORT of peers to join through (none for the first peer).",
)  # fmt: skip
@click.option("--zone", default="", envvar="SR3_ZONE", help="Failure zone of this peer.")
@click.option("--replication", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--write-quorum", default=2, show_default=True, type=click.IntRange(1, 16))
@click.option("--vnodes", default=VNODES_DEFAULT, show_default=True, type=click.IntRange(1, 4096))
@click.option("--zone-aware/--no-zone-aware", default=False, help="Spread replicas over zones.")
@click.option("--capacity", help="Storage capacity, e.g. 100GiB (default: the disk).")
@click.option(
    "--failure-timeout", default=5.0, show_default=True, envvar="SR3_FAILURE_TIMEOUT",
    type=click.FloatRange(0.1), help="Seconds without a heartbeat before a peer is down.",
)  # fmt: skip
@click.option(
    "--removal-grace", default=60.0, show_default=True, envvar="SR3_REMOVAL_GRACE",
    type=click.FloatRange(0.1),
    help="Seconds without a heartbeat before a peer leaves placement and is re-replicated.",
)  # fmt: skip
@click.option("--gossip-interval", default=1.0, show_default=True, type=click.FloatRange(0.05))
@click.option("--repair-interval", default=10.0, show_default=True, type=click.FloatRange(0.05))
@click.option("--repair-rate", default="64MB/s", show_default=True, help="Repair bandwidth cap.")
@click.option(
    "--scrub-rate", default="8MB/s", show_default=True,
    help="Scrubber read rate cap (0: no scrubbing).",
)  # fmt: skip
@click.option(
    "--scrub-interval", default=24 * 3600.0, show_default=True, type=click.FloatRange(0),
    help="Seconds from the start of one scrub pass over every chunk to the next "
    "(0: back to back).",
)  # fmt: skip
@click.option(
    "--gc-interval", default=300.0, show_default=True, type=click.FloatRange(0),
    help="Seconds between chunk collection rounds (0: never collect).",
)  # fmt: skip
@click.option(
    "--gc-grace", default=3600.0, show_default=True, type=click.FloatRange(0),
    help="Seconds a chunk no record references is kept (since it was last stored and since "
    "it was last referenced) before it is collected.",
)  # fmt: skip
@click.option(
    "--tombstone-ttl", default=7 * 24 * 3600.0, show_default=True, type=click.FloatRange(0),
    help="Seconds a deleted record's tombstone is kept.",
)  # fmt: skip
@click.option("--overlay/--no-overlay", default=True, help="Run the Kademlia discovery overlay.")
@click.option("--seed", "rng_seed", type=int, help="Seed for gossip partner choice (replays).")
@click.option(
    "--egress-rate", default="0", show_default=True,
    help="Network emulation, not a production control: cap on the bytes this peer sends "
    "in chunk reads and recovery streams, e.g. 50MB/s (0: no cap).",
)  # fmt: skip
@click.option(
    "--added-latency", "added_latency_ms", default=0.0, show_default=True,
    type=click.FloatRange(0, 60_000),
    help="Network emulation: milliseconds this peer waits before answering a chunk read "
    "or starting a recovery stream.",
)  # fmt: skip
@click.option(
    "--enable-admin-kill", "admin_kill", is_flag=True, envvar="SR3_ENABLE_ADMIN_KILL",
    help="Let `sr3 drill --ring` kill this peer through POST /v1/admin/kill (off by default).",
)  # fmt: skip
@click.option(
    "--secret-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the cluster secret (else SR3_SECRET).",
)  # fmt: skip
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
@_fail_cleanly
def peer(
    ctx: click.Context, peer_id: str | None, listen: str | None, advertise: str | None,
    data_dir: Path | None, seeds: str, zone: str, replication: int, write_quorum: int,
    vnodes: int, zone_aware: bool, capacity: str | None, failure_timeout: float,
    removal_grace: float, gossip_interval: float, repair_interval: float, repair_rate: str,
    scrub_rate: str, scrub_interval: float, gc_interval: float, gc_grace: float,
    tombstone_ttl: float, overlay: bool, rng_seed: int | None, egress_rate: str,
    added_latency_ms: float, admin_kill: bool, secret_file: Path | None, log_level: str,
) -> None:  # fmt: skip
    """Run one storage peer in the foreground until SIGTERM or Ctrl-C (`sr3 peer leave`
    makes a peer leave the ring for good).

    --egress-rate and --added-latency emulate a slower network on one machine (drills,
    benchmarks): a token bucket on what the peer sends and a delay before it answers."""
    if ctx.invoked_subcommand is not None:
        return
    from recovery.relay import install as install_recovery_relay
    from ring.peer_config import PeerConfig
    from ring.server import run_peer

    if not (peer_id and listen and data_dir):
        raise ConfigError("sr3 peer needs --id, --listen and --data (or SR3_* variables)")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    secret = secret_file.read_text().strip() if secret_file else os.environ.get("SR3_SECRET", "")
    if len(secret) < SECRET_CHARS_MIN:
        raise ConfigError(f"a cluster secret of at least {SECRET_CHARS_MIN} characters is required")
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {listen!r} is not HOST:PORT")
    if write_quorum > replication:
        raise ConfigError("--write-quorum cannot exceed --replication")
    if removal_grace < failure_timeout:
        raise ConfigError("--removal-grace cannot be shorter than --failure-timeout")
    config = PeerConfig(
        peer_id=peer_id, host=host, port=int(port), data_dir=data_dir, secret=secret,
        seeds=_seeds(seeds), zone=zone, replication=replication, write_quorum=write_quorum,
        vnodes=vnodes, zone_aware=zone_aware,
        capacity_bytes=parse_size(capacity) if capacity else None,
        advertise=advertise or listen, failure_timeout_s=failure_timeout,
        removal_grace_s=removal_grace, gossip_interval_s=gossip_interval,
        repair_interval_s=repair_interval, repair_rate_bytes_s=_rate(repair_rate),
        scrub_rate_bytes_s=_rate(scrub_rate), scrub_interval_s=scrub_interval,
        gc_interval_s=gc_interval, gc_grace_s=gc_grace,
        tombstone_ttl_s=tombstone_ttl, overlay=overlay, rng_seed=rng_seed,
        egress_rate_bytes_s=_rate(egress_rate), added_latency_ms=added_latency_ms,
        admin_kill=admin_kill,
    )  # fmt: skip
    # ring/ does not import recovery/: the relay's route is wired in here.
    run_peer(config, extensions=(install_recovery_relay,))


@peer.command("leave")
@click.argument("peer_id")
@_ring_options
@click.option("--wait/--no-wait", default=True, help="Wait until the peer has left.")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, type=float)
@_fail_cleanly
def peer_leave(
    peer_id: str, ring: str | None, secret_file: Path | None, wait: bool, timeout_s: float
) -> None:
    """Make PEER_ID hand its data over to the rest of the ring and leave it for good."""
    settings = _settings(ring, secret_file)

    async def run() -> None:
        async with Client(settings.ring, settings.secret) as client:
            await client.leave(peer_id, wait=wait, timeout_s=timeout_s)

    asyncio.run(run())
    click.echo(f"{peer_id} has left the ring" if wait else f"{peer_id} is leaving the ring")


# -- cluster -------------------------------------------------------------------------------


@cli.group()
def cluster() -> None:
    """The embedded local cluster: peers as subprocesses on 127.0.0.x."""


@cluster.command("up")
@click.option("--peers", default=5, show_default=True, type=click.IntRange(1, 250))
@click.option("--replication", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--write-quorum", default=2, show_default=True, type=click.IntRange(1, 16))
@click.option(
    "--zones",
    default=0,
    show_default=True,
    type=click.IntRange(0, 64),
    help="Spread peers over this many zones (0: none).",
)
@click.option("--base-port", default=BASE_PORT_DEFAULT, show_default=True, type=int)
@click.option("--failure-timeout", type=float, help="Peers' --failure-timeout (seconds).")
@click.option("--removal-grace", type=float, help="Peers' --removal-grace (seconds).")
@click.option("--repair-interval", type=float, help="Peers' --repair-interval (seconds).")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for peer data (default: $SR3_HOME/cluster).",
)
@_fail_cleanly
def cluster_up(
    peers: int, replication: int, write_quorum: int, zones: int, base_port: int,
    failure_timeout: float | None, removal_grace: float | None, repair_interval: float | None,
    home: Path | None,
) -> None:  # fmt: skip
    """Start N peers and write the cluster file other commands use."""
    flags: list[str] = []
    for flag, value in (
        ("--failure-timeout", failure_timeout),
        ("--removal-grace", removal_grace),
        ("--repair-interval", repair_interval),
    ):
        if value is not None:
            flags += [flag, str(value)]
    path = cluster_file_path()
    if path.exists():
        raise ConfigError(f"a cluster is already recorded in {path}; run `sr3 cluster down` first")
    local = LocalCluster.create(
        (home or sr3_home() / "cluster").resolve(), peers, replication=replication,
        write_quorum=write_quorum, base_port=base_port, zones=zones, cluster_file=path,
        peer_flags=flags,
    )  # fmt: skip
    local.up()
    click.echo(f"{peers} peers up (R={replication}, W={write_quorum}); cluster file {path}")
    for member in local.cluster.peers:
        click.echo(f"  {member.peer_id}  {member.address}  pid {member.pid}")


@cluster.command("down")
@click.option("--purge", is_flag=True, help="Also delete the peers' data.")
@_fail_cleanly
def cluster_down(purge: bool) -> None:
    """Stop every local peer (SIGTERM, then SIGKILL) and remove the cluster file."""
    local = LocalCluster.load()
    local.down(purge=purge)
    click.echo(
        f"stopped {len(local.cluster.peers)} peers" + (" and deleted their data" if purge else "")
    )


@cluster.command("add")
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 50))
@_fail_cleanly
def cluster_add(count: int) -> None:
    """Start new peers that join the ring (it rebalances about 1/N of the data to each)."""
    local = LocalCluster.load()
    for _ in range(count):
        member = local.add_peer()
        click.echo(f"{member.peer_id} joined at {member.address} (pid {member.pid})")


@cluster.command("kill")
@click.argument("peer_ids", nargs=-1, required=True)
@_fail_cleanly
def cluster_kill(peer_ids: tuple[str, ...]) -> None:
    """SIGKILL local peers (to rehearse failures)."""
    local = LocalCluster.load()
    for peer_id in peer_ids:
        local.kill(peer_id)
        click.echo(f"killed {peer_id}")


@cluster.command("start")
@click.argument("peer_ids", nargs=-1)
@_fail_cleanly
def cluster_start(peer_ids: tuple[str, ...]) -> None:
    """Start local peers that are not running (all of them without arguments)."""
    local = LocalCluster.load()
    for peer_id in peer_ids or (None,):
        local.start(peer_id)
    click.echo("started " + (", ".join(peer_ids) or "every stopped peer"))


# -- status, put, get ----------------------------------------------------------------------


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
            f"{peer.ownership * 100:.1f}%", _human(peer.stored_bytes) if up else "?",
            *known, str(pids.get(peer.peer_id) or "-"),
        )  # fmt: skip
    return table


def _human(size: int | None) -> str:
    value = float(size or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@cli.command()
@_ring_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_fail_cleanly
def status(ring: str | None, secret_file: Path | None, as_json: bool) -> None:
    """Peers, up/down, effective ownership, stored bytes and chunk counts."""
    settings = _settings(ring, secret_file)
    result = asyncio.run(_status(settings))
    pids = _local_pids(settings)
    if as_json:
        click.echo(json.dumps(_status_json(result, pids), indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
        console.print(_status_table(result, pids))


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--key", help="Name to store the file under (default: the file's name).")
@_ring_options
@_fail_cleanly
def put(file: Path, key: str | None, ring: str | None, secret_file: Path | None) -> None:
    """Store FILE on the ring and print the key it is stored under."""
    settings = _settings(ring, secret_file)
    name = key or file.name
    size = file.stat().st_size

    async def run() -> None:
        async with Client(settings.ring, settings.secret) as client:
            with _progress(size, "put") as progress:
                await client.store_file(file, name, progress=progress)

    asyncio.run(run())
    click.echo(name)


@cli.command()
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@_ring_options
@_fail_cleanly
def get(key: str, output: Path, ring: str | None, secret_file: Path | None) -> None:
    """Read the file stored under KEY into OUTPUT, verified end to end."""
    settings = _settings(ring, secret_file)

    async def run() -> int:
        async with Client(settings.ring, settings.secret) as client:
            ref = await client.lookup_file(key)
            with _progress(ref.size, "get") as progress:
                await client.get_file(ref, output, progress=progress)
            return ref.size

    size = asyncio.run(run())
    click.echo(f"{output} ({size} bytes, verified)")


@cli.group()
def token() -> None:
    """Tokens derived from the cluster secret."""


@token.command("metrics")
@_ring_options
@_fail_cleanly
def token_metrics(ring: str | None, secret_file: Path | None) -> None:
    """Print the bearer token that GET /metrics accepts (read-only, metrics only)."""
    click.echo(metrics_token(_settings(ring, secret_file).secret))


# -- spark ---------------------------------------------------------------------------------


@cli.group()
def spark() -> None:
    """Spark queries' state on the ring: list, restore, forget."""


@spark.command("list")
@click.option("--query", help="Only this query.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_ring_options
@_fail_cleanly
def spark_list(
    query: str | None, as_json: bool, ring: str | None, secret_file: Path | None
) -> None:
    """Queries with state on the ring and the batches kept for each."""
    from spark_connector.sync import ring_queries

    settings = _settings(ring, secret_file)
    with SyncClient(settings.ring, settings.secret) as client:
        queries = ring_queries(client, query)
    if as_json:
        entries = [
            {"query": name, "batches": batches, "latest": batches[-1]}
            for name, batches in queries.items()
        ]
        click.echo(json.dumps({"queries": entries}, indent=2))
        return
    if not queries:
        click.echo("no query has state on the ring")
        return
    for name, batches in queries.items():
        shown = ", ".join(str(batch) for batch in batches)
        click.echo(f"{name}  latest {batches[-1]}  batches {shown}")


@spark.command("restore")
@click.option("--query", required=True, help="Name the query was registered under.")
@click.option("--to", "target", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint directory to create (empty or absent).")  # fmt: skip
@click.option("--batch", "batch_id", type=click.IntRange(0), help="Batch (default: newest).")
@click.option("--topology", default="auto", show_default=True,
              help="star, line, tree[:FANOUT] or auto.")  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --to directory.")
@_ring_options
@_fail_cleanly
def spark_restore(
    query: str, target: Path, batch_id: int | None, topology: str, overwrite: bool,
    ring: str | None, secret_file: Path | None,
) -> None:  # fmt: skip
    """Restore a query's checkpoint directory from the ring; start the query on it."""
    from spark_connector.sync import StateSync

    settings = _settings(ring, secret_file)
    sync = StateSync(settings.ring, query, target, settings.secret)
    try:
        restored = sync.restore(topology, batch_id=batch_id, overwrite=overwrite)
        report = sync.last_restore
    finally:
        sync.close()
    if restored is None or report is None:
        click.echo(f"the ring has no state of query {query!r}", err=True)
        sys.exit(3)
    recovery = report.recovery
    click.echo(
        f"restored batch {restored} of {query} into {sync.checkpoint_dir}: {report.files} "
        f"files, {report.bytes_total} bytes, {recovery.topology} in {recovery.seconds:.2f} s"
        + (f" ({recovery.reason})" if recovery.reason else "")
    )


@spark.command("forget")
@click.option("--query", required=True, help="Name the query was registered under.")
@click.option("--keep", required=True, type=click.IntRange(0),
              help="Newest batches to keep (0: forget the query).")  # fmt: skip
@_ring_options
@_fail_cleanly
def spark_forget(query: str, keep: int, ring: str | None, secret_file: Path | None) -> None:
    """Delete a query's older batches from the ring (peers collect their chunks once no
    kept batch references them, after --gc-grace)."""
    from spark_connector.manifest import check_query_name
    from spark_connector.sync import forget

    settings = _settings(ring, secret_file)
    with SyncClient(settings.ring, settings.secret) as client:
        deleted = forget(client, check_query_name(query), keep)
    shown = ", ".join(str(batch) for batch in deleted) or "none"
    click.echo(f"{query}: deleted {len(deleted)} batches ({shown}); kept the newest {keep}")


@cli.command()
@click.option("--batches", default=12, show_default=True, type=click.IntRange(3, 600),
              help="Input files, one micro-batch each.")  # fmt: skip
@click.option("--kill-at", default=5, show_default=True, type=click.IntRange(0, 597),
              help="SIGKILL the driver once the ring holds this batch.")  # fmt: skip
@click.option("--peers", default=5, show_default=True, type=click.IntRange(3, 50))
@click.option("--fail", "fail_count", default=2, show_default=True, type=click.IntRange(0, 49))
@click.option("--seed", default=7, show_default=True, type=int)
@click.option("--storage-only", is_flag=True,
              help="No Spark: store a state file, kill --fail peers, read it back.")  # fmt: skip
@click.option("--state-size", default="64MiB", show_default=True,
              help="Size of the state file (--storage-only).")  # fmt: skip
@_fail_cleanly
def demo(
    batches: int, kill_at: int, peers: int, fail_count: int, seed: int, storage_only: bool,
    state_size: str,
) -> None:  # fmt: skip
    """The main job: a Spark query loses its driver, its checkpoint and --fail peers,
    restores its state from the ring and produces exactly the output of a run without
    failures (needs sr3[spark] and Java 17)."""
    from sr3.demo import SparkDemoOptions, run_demo, run_spark_demo

    if storage_only:
        sys.exit(run_demo(parse_size(state_size), peers=peers, fail=fail_count, seed=seed))
    options = SparkDemoOptions(
        batches=batches, kill_at=kill_at, peers=peers, fail=fail_count, seed=seed
    )
    sys.exit(run_spark_demo(options))


def main() -> None:
    cli(prog_name="sr3")


# -- drill ---------------------------------------------------------------------------------


def _optional_rate(text: str | None) -> float | None:
    if text is None or text.strip().lower() in ("", "none", "unlimited"):
        return None
    return _rate(text)


@cli.command()
@_ring_options
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
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path))
@_fail_cleanly
def drill(
    ring: str | None, secret_file: Path | None, peers: int, replication: int, fail_count: int,
    state_size: str, topologies: str, peer_bandwidth: str | None,
    requester_bandwidth: str | None, latency_ms: float, fan_in: int, seed: int,
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
        fan_in=fan_in,
    )  # fmt: skip
    from sr3.drills import drill_local, drill_remote

    if ring or os.environ.get("SR3_RING"):
        report = drill_remote(_settings(ring, secret_file), parse_size(state_size), options)
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
            _human(result.bytes_lost),
            "-" if result.estimated_s is None else f"{result.estimated_s:.2f}",
        )  # fmt: skip
    console = Console() if Console().is_terminal else Console(width=120)
    console.print(table)
    console.print(f"* chosen by auto: {report.auto['reason']}", highlight=False)
    heal = "did not finish" if report.heal_s is None else f"{report.heal_s:.1f} s"
    console.print(
        f"ring back to full replication after the recoveries: {heal}; "
        f"chunks lost: {report.chunks_lost_after_heal}",
        highlight=False,
    )
    for result in report.results:
        if result.missing_chunks:
            ranges = ", ".join(f"{o}+{n}" for o, n in result.lost_ranges[:4])
            console.print(
                f"[red]{result.topology}: unrecoverable[/]: {len(result.missing_chunks)} chunks "
                f"({_human(result.bytes_lost)} of the state, bytes {ranges}) had no live replica",
                highlight=False,
            )  # fmt: skip
