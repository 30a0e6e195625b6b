"""``sr3 cluster``: the embedded local cluster, its peers as subprocesses on 127.0.0.x."""

from __future__ import annotations

from pathlib import Path

import click

from ring.config import cluster_file_path, sr3_home
from ring.errors import ConfigError
from sr3.cli._shared import fail_cleanly
from sr3.local import BASE_PORT_DEFAULT, LocalCluster


@click.group()
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
@click.option(
    "--tls", is_flag=True,
    help="HTTPS on every hop: a CA and certificates under the cluster's home (tls/); peers "
    "require client certificates, and clients using the cluster file present client.pem.",
)  # fmt: skip
@fail_cleanly
def cluster_up(
    peers: int, replication: int, write_quorum: int, zones: int, base_port: int,
    failure_timeout: float | None, removal_grace: float | None, repair_interval: float | None,
    home: Path | None, tls: bool,
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
        peer_flags=flags, tls=tls,
    )  # fmt: skip
    local.up()
    secured = f", TLS (CA {local.cluster.tls_dir}/ca.pem)" if tls else ""
    click.echo(
        f"{peers} peers up (R={replication}, W={write_quorum}{secured}); cluster file {path}"
    )
    for member in local.cluster.peers:
        click.echo(f"  {member.peer_id}  {member.address}  pid {member.pid}")


@cluster.command("down")
@click.option("--purge", is_flag=True, help="Also delete the peers' data.")
@fail_cleanly
def cluster_down(purge: bool) -> None:
    """Stop every local peer (SIGTERM, then SIGKILL) and remove the cluster file."""
    local = LocalCluster.load()
    local.down(purge=purge)
    click.echo(
        f"stopped {len(local.cluster.peers)} peers" + (" and deleted their data" if purge else "")
    )


@cluster.command("add")
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 50))
@fail_cleanly
def cluster_add(count: int) -> None:
    """Start new peers that join the ring (it rebalances about 1/N of the data to each)."""
    local = LocalCluster.load()
    for _ in range(count):
        member = local.add_peer()
        click.echo(f"{member.peer_id} joined at {member.address} (pid {member.pid})")


@cluster.command("kill")
@click.argument("peer_ids", nargs=-1, required=True)
@fail_cleanly
def cluster_kill(peer_ids: tuple[str, ...]) -> None:
    """SIGKILL local peers (to rehearse failures)."""
    local = LocalCluster.load()
    for peer_id in peer_ids:
        local.kill(peer_id)
        click.echo(f"killed {peer_id}")


@cluster.command("start")
@click.argument("peer_ids", nargs=-1)
@fail_cleanly
def cluster_start(peer_ids: tuple[str, ...]) -> None:
    """Start local peers that are not running (all of them without arguments)."""
    local = LocalCluster.load()
    for peer_id in peer_ids or (None,):
        local.start(peer_id)
    click.echo("started " + (", ".join(peer_ids) or "every stopped peer"))
