"""``sr3 status``, ``put``, ``get``, ``ls``, ``rm`` and ``token``: a running ring's state
and its named files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.measure import Measurement
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

from ring.auth import metrics_token, scoped_credential
from ring.client import RingStatus
from ring.client.client import FileInfo
from ring.config import ClusterFile, Settings, cluster_file_path
from ring.errors import NotFound, ProtocolError, SR3Error
from spark_connector.fs_checkpoints import fs_path_of
from sr3.cli._shared import (
    describe_os_error,
    fail,
    fail_cleanly,
    human_size,
    open_client,
    ring_options,
    ring_settings,
    secret_options,
    stderr,
)

PROGRESS_BYTES_MIN = 8 * 1024 * 1024
# ``sr3 ls``: keys listed at most.
LIST_FILES_MAX = 10_000


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
    async with open_client(settings) as client:
        return await client.status()


def _status_json(status: RingStatus, pids: dict[str, int | None]) -> dict[str, Any]:
    peers = []
    for peer in status.peers:
        entry = asdict(peer)
        entry["id"] = entry.pop("peer_id")
        if peer.peer_id in pids:
            entry["pid"] = pids[peer.peer_id]
        peers.append(entry)
    health = ring_health(status)
    return {
        "replication": status.replication,
        "write_quorum": status.write_quorum,
        "chunks_under_replicated": status.chunks_under_replicated,
        "chunks_lost": status.chunks_lost,
        "chunks_unrecoverable": list(status.chunks_unrecoverable),
        "health": health.state,
        "summary": health.summary,
        "peers": peers,
    }


@dataclass(frozen=True, slots=True)
class RingHealth:
    """What the ring is doing, from the peers' last repair rounds and their states."""

    # healthy, moving, under_replicated, lost, corrupt or unknown
    state: str
    summary: str


# Peer ids a summary names at most in one list.
NAMES_SHOWN_MAX = 4


def _known_sum(values: list[int | None]) -> int | None:
    return None if any(value is None for value in values) else sum(v or 0 for v in values)


def _names(peer_ids: list[str]) -> str:
    more = len(peer_ids) - NAMES_SHOWN_MAX
    return ", ".join(peer_ids[:NAMES_SHOWN_MAX]) + (f" and {more} more" if more > 0 else "")


def ring_health(status: RingStatus) -> RingHealth:
    """Tell placement moving (copies not yet on their new owners after a membership
    change) from under-replication (copies gone with members down or removed), and a
    leave from a join.

    A repair round counts one figure, the chunks on fewer than R live owners (the R
    peers placement puts them on): a chunk whose copies still sit on the peers it moves
    from counts the same as one whose copies are gone, as the peers report no count of
    live copies held off the owners. So the members' states decide: members down or
    removed mean copies are gone (under-replicated; reported when both happen at once);
    otherwise placement is moving, after a leave when a member is leaving or left, else
    after a join. The member table keeps left and removed peers without the time they
    went, so movement after a later join is put down to an earlier leave or loss."""
    live = [peer for peer in status.peers if peer.state == "up"]
    down = [peer.peer_id for peer in status.peers if peer.state == "down"]
    removed = [peer.peer_id for peer in status.peers if peer.state == "removed"]
    under = sum(peer.chunks_under_replicated or 0 for peer in live)
    lost = sum(peer.chunks_lost or 0 for peer in live)
    pending = [peer.peer_id for peer in live if peer.chunks_under_replicated is None]
    corrupt = [peer.peer_id for peer in live if peer.chunks_unrecoverable]
    if status.chunks_unrecoverable:
        ids = status.chunks_unrecoverable
        shown = ", ".join(ids[:NAMES_SHOWN_MAX]) + (" ..." if len(ids) > NAMES_SHOWN_MAX else "")
        return RingHealth(
            "corrupt",
            f"{len(ids)} chunks corrupt with no good copy on any live member ({shown}): "
            f"found by {_names(corrupt)}, whose <data>/quarantine keeps the bad files; "
            "write the data again (a good copy replaces them) or restore it from elsewhere",
        )
    if lost:
        return RingHealth("lost", f"{lost} chunks lost: no live peer holds them")
    if under and (down or removed):
        causes = []
        if down:
            causes.append(
                f"{_names(down)} down (copied elsewhere once removed, after --removal-grace)"
            )
        if removed:
            causes.append(f"{_names(removed)} removed (re-replicating what they held)")
        return RingHealth(
            "under_replicated",
            f"under-replicated after a loss: {under} chunks have fewer than "
            f"R={status.replication} live copies on their owners; {'; '.join(causes)}",
        )
    if under:
        return RingHealth("moving", _moving_summary(status, under))
    if pending:
        return RingHealth(
            "unknown", f"not known yet: {_names(pending)} has not finished a repair round"
        )
    if down:
        return RingHealth("under_replicated", f"{_names(down)} down; no chunk counted")
    return RingHealth("healthy", f"healthy: every chunk has R={status.replication} live copies")


def _moving_summary(status: RingStatus, under: int) -> str:
    """Placement moving with no member down or removed: after a leave when a member is
    leaving or left, else after a join."""
    leaving = [peer.peer_id for peer in status.peers if peer.ring_state == "leaving"]
    left = [peer.peer_id for peer in status.peers if "left" in (peer.state, peer.ring_state)]
    moving = f"{under} chunks not yet on all R={status.replication} of their new owners"
    if leaving:
        return f"placement moving after a leave: {moving} ({_names(leaving)} handing over)"
    if left:
        return f"placement moving after a leave: {moving} ({_names(left)} left)"
    return f"placement moving after a join: {moving} (every member up, none leaving or left)"


_STATE_STYLE = {"up": "green", "down": "red", "removed": "yellow", "left": "dim"}


def _figure(value: int | None) -> str:
    return "-" if value is None else str(value)


def _status_table(status: RingStatus, pids: dict[str, int | None]) -> Table:
    live = [peer for peer in status.peers if peer.state == "up"]
    under = _known_sum([peer.chunks_under_replicated for peer in live])
    lost = _known_sum([peer.chunks_lost for peer in live])
    title = (
        f"sr3 ring: R={status.replication}, W={status.write_quorum}, "
        f"{_figure(under)} chunks on fewer than R live owners, {_figure(lost)} lost"
    )
    zones = any(peer.zone for peer in status.peers)
    table = Table(title=title)
    table.add_column("State", no_wrap=True)
    # Whole ids and addresses even on a narrow terminal: they are what one copies.
    ids = [peer.peer_id for peer in status.peers]
    addresses = [peer.address for peer in status.peers]
    table.add_column("ID", no_wrap=True, min_width=max(map(len, ids), default=2))
    table.add_column("Address", no_wrap=True, min_width=max(map(len, addresses), default=7))
    if zones:
        table.add_column("Zone")
    for column in ("Owns", "Stored", "Chunks", "Under", "Lost", "PID"):
        table.add_column(column, justify="right", no_wrap=True)
    for peer in status.peers:
        up = peer.state == "up"
        state = f"[{_STATE_STYLE.get(peer.state, 'red')}]{peer.state}[/]"
        if peer.ring_state != peer.state:
            state += f" (ring: {peer.ring_state})"
        known = [
            _figure(value if up else None)
            for value in (peer.chunk_count, peer.chunks_under_replicated, peer.chunks_lost)
        ]
        table.add_row(
            state, peer.peer_id, peer.address, *([peer.zone or "-"] if zones else []),
            f"{peer.ownership * 100:.1f}%", human_size(peer.stored_bytes if up else None),
            *known, str(pids.get(peer.peer_id) or "-"),
        )  # fmt: skip
    return table


def _print_wide(table: Table, summary: str) -> None:
    """Print the table whole: at its natural width, even past a narrow terminal's edge
    (the terminal wraps a long line; a cut address or figure would be lost). A table too
    wide for the terminal drops its borders first."""
    console = Console()
    natural = Measurement.get(console, console.options.update_width(1_000), table).maximum
    if console.is_terminal and natural > console.width:
        table.box = box.SIMPLE_HEAD
        natural = Measurement.get(console, console.options.update_width(1_000), table).maximum
    if natural > console.width or not console.is_terminal:
        console.width = natural
    console.print(table)
    console.print(Text(summary), soft_wrap=True)


@click.command()
@ring_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@fail_cleanly
def status(ring: str | None, secret_file: Path | None, as_json: bool) -> None:
    """Peers, up/down, effective ownership, stored bytes and chunk counts; whether
    placement is moving after a join or a leave, or the ring is under-replicated after a
    loss."""
    settings = ring_settings(ring, secret_file)
    result = asyncio.run(_status(settings))
    pids = _local_pids(settings)
    if as_json:
        click.echo(json.dumps(_status_json(result, pids), indent=2))
    else:
        _print_wide(_status_table(result, pids), ring_health(result).summary)


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
        async with open_client(settings) as client:
            with _progress(size, "put") as progress:
                await client.put_file(file, name, progress=progress)

    asyncio.run(run())
    click.echo(name)


def _partial_path(output: Path) -> Path:
    """Where ``Client.get_file`` writes before it renames into place."""
    return output.with_name(f".{output.name}.sr3-partial")


def check_target(output: Path, size: int) -> None:
    """Refuse a download that cannot land before fetching a byte: the target folder must
    exist, be writable (tried, so that root on a read-only mount is refused too) and
    have room for ``size`` bytes."""
    folder = output.absolute().parent
    if output.is_dir():
        raise SR3Error(f"cannot write {output}: it is a directory")
    if not folder.is_dir():
        # A file part-way up the path is ENOTDIR for everyone, root included.
        blocker = next((part for part in (folder, *folder.parents) if part.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise SR3Error(f"cannot write {output}: {blocker} is not a directory")
        raise SR3Error(f"cannot write {output}: {folder} does not exist")
    try:
        free = shutil.disk_usage(folder).free
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise SR3Error(describe_os_error(exc, action="cannot write", path=output)) from exc
    if free < size:
        raise SR3Error(
            f"cannot write {output}: no space ({human_size(size)} needed, "
            f"{human_size(free)} free in {folder})"
        )


@click.command()
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@ring_options
@fail_cleanly
def get(key: str, output: Path, ring: str | None, secret_file: Path | None) -> None:
    """Read the file stored under KEY into OUTPUT, verified end to end."""
    settings = ring_settings(ring, secret_file)

    async def run() -> int:
        async with open_client(settings) as client:
            info = await client.file_info(key)
            check_target(output, info.size)
            with _progress(info.size, "get") as progress:
                await client.get_file(info.ref, output, progress=progress)
            return info.size

    try:
        size = asyncio.run(run())
    except OSError as exc:
        # Full or read-only part-way: the partial file goes, quietly, and one line says why.
        with contextlib.suppress(OSError):
            _partial_path(output).unlink(missing_ok=True)
        raise SR3Error(describe_os_error(exc, action="cannot write", path=output)) from exc
    click.echo(f"{output} ({size} bytes, verified)")


@click.command("ls")
@click.argument("prefix", default="")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@ring_options
@fail_cleanly
def ls(prefix: str, as_json: bool, ring: str | None, secret_file: Path | None) -> None:
    """List the named files (what ``sr3 put`` stored) whose key starts with PREFIX."""
    settings = ring_settings(ring, secret_file)

    async def run() -> list[FileInfo]:
        async with open_client(settings) as client:
            return list((await client.list_files(prefix, limit=LIST_FILES_MAX)).values())

    files = asyncio.run(run())
    if as_json:
        entries = [{"key": f.key, "size": f.size, "version": f.version} for f in files]
        click.echo(json.dumps({"files": entries}, indent=2))
        return
    if not files:
        click.echo(f"no file named {prefix}* on the ring" if prefix else "no file on the ring")
        return
    width = max(len(f.key) for f in files)
    for f in files:
        click.echo(f"{f.key:<{width}}  {human_size(f.size):>10}  v{f.version}")
    if len(files) >= LIST_FILES_MAX:
        click.echo(f"(the first {LIST_FILES_MAX} keys; narrow with a PREFIX)", err=True)


@click.command("rm")
@click.argument("keys", nargs=-1, required=True)
@ring_options
@fail_cleanly
def rm(keys: tuple[str, ...], ring: str | None, secret_file: Path | None) -> None:
    """Delete the named files KEYS (tombstones; peers collect their chunks after
    --gc-grace). Exit code 1 when some key names no file."""
    settings = ring_settings(ring, secret_file)
    outcomes = asyncio.run(_remove_files(settings, keys))
    unknown = [key for key, deleted in outcomes.items() if not deleted]
    for key, deleted in outcomes.items():
        if deleted:
            click.echo(f"deleted {key}")
    if unknown:
        fail(f"no file named {', '.join(repr(key) for key in unknown)} on the ring")


async def _remove_files(settings: Settings, keys: tuple[str, ...]) -> dict[str, bool]:
    outcomes: dict[str, bool] = {}
    async with open_client(settings) as client:
        for key in dict.fromkeys(keys):
            try:
                await client.delete_file(key)
                outcomes[key] = True
            except NotFound:
                outcomes[key] = False
    return outcomes


@click.group()
def token() -> None:
    """Tokens derived from the cluster secret."""


@token.command("metrics")
@secret_options
@fail_cleanly
def token_metrics(ring: str | None, secret_file: Path | None) -> None:
    """Print the bearer token that GET /metrics accepts (read-only, metrics only)."""
    click.echo(metrics_token(ring_settings(ring, secret_file).secret))


# A scoped credential lives at most this long; rotate by issuing a new one before then.
CREDENTIAL_DAYS_MAX = 366
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> int:
    number, unit = text[:-1], text[-1:]
    if (
        unit not in _DURATION_UNITS
        or not (number.isascii() and number.isdigit())
        or len(number) > 9
    ):
        raise click.BadParameter(f"{text!r}: a number then s, m, h or d (30d, 12h)")
    seconds = int(number) * _DURATION_UNITS[unit]
    if not 0 < seconds <= CREDENTIAL_DAYS_MAX * 86400:
        raise click.BadParameter(f"between 1 s and {CREDENTIAL_DAYS_MAX} days")
    return seconds


@token.command("scoped")
@click.option("--prefix", required=True,
              help="The sr3:// path the credential reaches (spark/sessions).")  # fmt: skip
@click.option("--expires", default="30d", show_default=True,
              help="Lifetime: Ns, Nm, Nh or Nd, at most 366d.")  # fmt: skip
@secret_options
@fail_cleanly
def token_scoped(prefix: str, expires: str, ring: str | None, secret_file: Path | None) -> None:
    """Print a credential limited to the file namespace under --prefix: what Spark's
    executors hold instead of the cluster secret. Peers verify it from the secret;
    rotating the secret revokes every credential derived from it."""
    lifetime_s = duration_s(expires)
    now = int(time.time())
    secret = ring_settings(ring, secret_file).secret
    try:
        credential = scoped_credential(
            secret, fs_path_of(prefix), expires_at=now + lifetime_s, issued_at=now
        )
    except (ProtocolError, SR3Error) as exc:
        raise click.BadParameter(str(exc), param_hint="--prefix") from exc
    click.echo(credential)
