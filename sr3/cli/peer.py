"""``sr3 peer``: run one storage peer; ``sr3 peer leave``: make one leave the ring.

A peer process imports this module and nothing of the client or the local cluster: what
the peer runs is imported inside the command.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import click

from ring.auth import SECRET_CHARS_MIN
from ring.cluster import check_networks
from ring.config import parse_size
from ring.errors import ConfigError, ProtocolError
from ring.peer_config import RENAME_ABANDONED_S_DEFAULT, RENAME_SWEEP_INTERVAL_S_DEFAULT
from ring.placement import VNODES_DEFAULT
from ring.records import CHANGES_KEPT_S
from ring.tls import ServerTls
from sr3.cli._shared import (
    fail_cleanly,
    open_client,
    parse_rate,
    ring_options,
    ring_settings,
)


def _seeds(text: str) -> tuple[str, ...]:
    seeds = tuple(filter(None, (part.strip() for part in text.split(","))))
    for seed in seeds:
        host, _, port = seed.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ConfigError(f"seed {seed!r} is not HOST:PORT")
    return seeds


@click.group(invoke_without_command=True)
@click.option("--id", "peer_id", envvar="SR3_PEER_ID", help="Stable peer id (required).")
@click.option("--listen", envvar="SR3_LISTEN", help="HOST:PORT to serve on (required).")
@click.option(
    "--advertise", envvar="SR3_ADVERTISE", help="HOST:PORT others reach (default: --listen)."
)
@click.option(
    "--advertise-networks", envvar="SR3_ADVERTISE_NETWORKS", default="",
    help="NAME=HOST:PORT[,...]: where clients on other networks reach this peer (e.g. "
    "external=127.0.0.1:7401 for a published port); --advertise is the 'internal' one.",
)  # fmt: skip
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
    "--repair-settle", default=2.0, show_default=True, type=click.FloatRange(0, CHANGES_KEPT_S),
    help="Seconds repair leaves a chunk or record just written here to its writer's own copies.",
)  # fmt: skip
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
@click.option(
    "--rename-sweep-interval", default=RENAME_SWEEP_INTERVAL_S_DEFAULT, show_default=True,
    type=click.FloatRange(0),
    help="Seconds between sweeps of sr3:// renames nobody finishes (0: never sweep).",
)  # fmt: skip
@click.option(
    "--rename-abandoned-after", default=RENAME_ABANDONED_S_DEFAULT, show_default=True,
    type=click.FloatRange(0),
    help="Seconds after which a sweep aborts a rename still copying and cleans up one "
    "that ended.",
)  # fmt: skip
@click.option("--overlay/--no-overlay", default=True, help="Run the Kademlia discovery overlay.")
@click.option(
    "--direct-io/--no-direct-io", default=True, envvar="SR3_DIRECT_IO", show_default=True,
    help="Write and read chunk files with O_DIRECT where the file system takes it "
    "(--no-direct-io: through the page cache).",
)  # fmt: skip
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
@click.option(
    "--tls-cert",
    envvar="SR3_TLS_CERT",
    type=click.Path(dir_okay=False, path_type=Path),
    help="This peer's certificate chain (PEM, from `sr3 tls issue`): serve HTTPS.",
)
@click.option(
    "--tls-key",
    envvar="SR3_TLS_KEY",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The key of --tls-cert (PEM).",
)
@click.option(
    "--tls-ca",
    envvar="SR3_TLS_CA",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The cluster's CA bundle (PEM): trusted for other peers and client certificates.",
)
@click.option(
    "--tls-client-certs/--no-tls-client-certs",
    envvar="SR3_TLS_CLIENT_CERTS",
    default=False,
    help="Require a client certificate from the cluster's CA on every connection.",
)
@click.option(
    "--tls-check-interval",
    envvar="SR3_TLS_CHECK_INTERVAL",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1, 86400),
    help="Seconds between looks for a renewed --tls-cert.",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
@fail_cleanly
def peer(
    ctx: click.Context, peer_id: str | None, listen: str | None, advertise: str | None,
    advertise_networks: str, data_dir: Path | None, seeds: str, zone: str, replication: int,
    write_quorum: int, vnodes: int, zone_aware: bool, capacity: str | None, failure_timeout: float,
    removal_grace: float, gossip_interval: float, repair_interval: float, repair_rate: str,
    repair_settle: float, scrub_rate: str, scrub_interval: float, gc_interval: float,
    gc_grace: float, tombstone_ttl: float, rename_sweep_interval: float,
    rename_abandoned_after: float, overlay: bool, direct_io: bool, rng_seed: int | None,
    egress_rate: str, added_latency_ms: float, admin_kill: bool, secret_file: Path | None,
    tls_cert: Path | None, tls_key: Path | None, tls_ca: Path | None, tls_client_certs: bool,
    tls_check_interval: float, log_level: str,
) -> None:  # fmt: skip
    """Run one storage peer in the foreground until SIGTERM or Ctrl-C (`sr3 peer leave`
    makes a peer leave the ring for good).

    --egress-rate and --added-latency emulate a slower network on one machine (drills,
    benchmarks): a token bucket on what the peer sends and a delay before it answers."""
    if ctx.invoked_subcommand is not None:
        return
    from filesystem.service import install as install_file_namespace
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
    if not host or not (port.isascii() and port.isdigit()):
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
        advertise=advertise or listen, networks=_networks(advertise_networks),
        failure_timeout_s=failure_timeout,
        removal_grace_s=removal_grace, gossip_interval_s=gossip_interval,
        repair_interval_s=repair_interval, repair_rate_bytes_s=parse_rate(repair_rate),
        repair_settle_s=repair_settle,
        scrub_rate_bytes_s=parse_rate(scrub_rate), scrub_interval_s=scrub_interval,
        gc_interval_s=gc_interval, gc_grace_s=gc_grace,
        tombstone_ttl_s=tombstone_ttl, rename_sweep_interval_s=rename_sweep_interval,
        rename_abandoned_s=rename_abandoned_after, overlay=overlay,
        direct_io=direct_io, rng_seed=rng_seed,
        egress_rate_bytes_s=parse_rate(egress_rate), added_latency_ms=added_latency_ms,
        admin_kill=admin_kill,
        tls=_tls(tls_cert, tls_key, tls_ca, tls_client_certs, tls_check_interval),
    )  # fmt: skip
    # ring/ does not import recovery/: the relay's route is wired in here.
    run_peer(config, extensions=(install_recovery_relay, install_file_namespace))


def _tls(
    cert: Path | None, key: Path | None, ca: Path | None, client_certs: bool, interval_s: float
) -> ServerTls | None:
    """The peer's TLS from its flags: all three files, or none of them."""
    named = (("--tls-cert", cert), ("--tls-key", key), ("--tls-ca", ca))
    given = [flag for flag, value in named if value]
    if not given:
        if client_certs:
            raise ConfigError("--tls-client-certs needs --tls-cert, --tls-key and --tls-ca")
        return None
    if cert is None or key is None or ca is None:
        raise ConfigError(
            f"TLS needs --tls-cert, --tls-key and --tls-ca; only {', '.join(given)} given"
        )
    return ServerTls(cert, key, ca, client_certs, interval_s)


def _networks(text: str) -> tuple[tuple[str, str], ...]:
    """``--advertise-networks``: ``name=host:port`` pairs, comma-separated."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, address = item.partition("=")
        if not equals or name in pairs:
            raise ConfigError(f"--advertise-networks: {item!r} is not NAME=HOST:PORT (once each)")
        pairs[name.strip()] = address.strip()
    try:
        return check_networks(pairs)
    except ProtocolError as exc:
        raise ConfigError(f"--advertise-networks: {exc}") from exc


@peer.command("leave")
@click.argument("peer_id")
@ring_options
@click.option("--wait/--no-wait", default=True, help="Wait until the peer has left.")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, type=float)
@fail_cleanly
def peer_leave(
    peer_id: str, ring: str | None, secret_file: Path | None, wait: bool, timeout_s: float
) -> None:
    """Make PEER_ID hand its data over to the rest of the ring and leave it for good.

    Waits until every chunk and record it held is on R peers without it, then says how
    much it handed over."""
    from ring.client.admin import LeaveReport, leave_summary

    settings = ring_settings(ring, secret_file)

    async def run() -> LeaveReport | None:
        async with open_client(settings) as client:
            return await client.admin.leave(peer_id, wait=wait, timeout_s=timeout_s)

    report = asyncio.run(run())
    click.echo(leave_summary(report) if report is not None else f"{peer_id} is leaving the ring")
