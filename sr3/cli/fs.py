"""``sr3 fs``: the ``sr3://`` namespace Spark's executors write, from a shell.

    sr3 fs ls [-R] PATH         entries: type, size, modification time, name
    sr3 fs cat PATH             a file's bytes on stdout
    sr3 fs get PATH LOCAL       a file, or a directory recursively, into LOCAL
    sr3 fs put LOCAL PATH       a local file or directory into the namespace
    sr3 fs rm [-r] PATH         delete a file (a directory with -r)
    sr3 fs du [-s] PATH         bytes under each entry (-s: the total only)

PATH is ``sr3:///a/b``, ``sr3:/a/b`` or ``/a/b``. Ring and secret as for every command,
or ``--credential`` (``SR3_CREDENTIAL``): a scoped credential reaches its prefix only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import click

from ring.config import resolve_tls
from ring.errors import SR3Error
from ring.fs_api import Stat
from spark_connector.fs_checkpoints import copy_to_local, fs_path_of
from spark_connector.fs_client import FsClient
from sr3.cli._shared import fail, fail_cleanly, human_size, ring_options, ring_settings

__all__ = ["fs"]

T = TypeVar("T")
# Bounds of a recursive walk (ls -R, du, get and put of a directory).
WALK_ENTRIES_MAX = 1_000_000
PUT_FILE_BYTES_MAX = 4 * 1024**3


def _run(
    ring: str | None,
    secret_file: Path | None,
    credential: str | None,
    action: Callable[[FsClient], Awaitable[T]],
) -> T:
    if credential:
        settings_ring = ring or os.environ.get("SR3_RING")
        key = credential
        tls = resolve_tls(None)
    else:
        settings = ring_settings(ring, secret_file)
        settings_ring, key = settings.ring, settings.secret
        tls = resolve_tls(settings.cluster)

    async def go() -> T:
        async with FsClient(settings_ring, key, tls=tls) as client:
            return await action(client)

    return asyncio.run(go())


def _path(text: str) -> str:
    try:
        return fs_path_of(text)
    except SR3Error as exc:
        fail(str(exc))


def fs_options(function: Callable[..., None]) -> Callable[..., None]:
    function = click.option(
        "--credential",
        envvar="SR3_CREDENTIAL",
        help="A scoped credential (sr3 token scoped) instead of the secret.",
    )(function)
    return ring_options(function)


async def _walk(client: FsClient, path: str) -> list[Stat]:
    """Every entry under ``path`` (files and directories), depth first, bounded."""
    found: list[Stat] = []
    pending = [path]
    while pending:
        for entry in await client.list(pending.pop()):
            found.append(entry)
            if len(found) > WALK_ENTRIES_MAX:
                raise SR3Error(f"more than {WALK_ENTRIES_MAX} entries under {path}")
            if entry.type == "directory":
                pending.append(entry.path)
    return found


def _line(entry: Stat) -> str:
    when = datetime.fromtimestamp(entry.mtime_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    kind = "d" if entry.type == "directory" else "-"
    size = "" if entry.type == "directory" else human_size(entry.size)
    return f"{kind}  {size:>10}  {when if entry.mtime_ms else ' ' * 19}  {entry.path}"


@click.group()
def fs() -> None:
    """The sr3:// namespace (what Spark's executors write): ls, cat, get, put, rm, du."""


@fs.command("ls")
@click.argument("path", default="/")
@click.option("-R", "recursive", is_flag=True, help="Everything under PATH.")
@fs_options
@fail_cleanly
def fs_ls(
    path: str, recursive: bool, ring: str | None, secret_file: Path | None, credential: str | None
) -> None:
    """List a directory (or show a file)."""
    target = _path(path)

    async def listing(client: FsClient) -> list[Stat]:
        return await (_walk(client, target) if recursive else client.list(target))

    for entry in _run(ring, secret_file, credential, listing):
        click.echo(_line(entry))


@fs.command("cat")
@click.argument("path")
@fs_options
@fail_cleanly
def fs_cat(path: str, ring: str | None, secret_file: Path | None, credential: str | None) -> None:
    """Write a file's bytes to stdout."""
    target = _path(path)
    data = _run(ring, secret_file, credential, lambda client: client.read(target))
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@fs.command("get")
@click.argument("path")
@click.argument("local", type=click.Path(path_type=Path))
@fs_options
@fail_cleanly
def fs_get(
    path: str, local: Path, ring: str | None, secret_file: Path | None, credential: str | None
) -> None:
    """Copy a file, or a directory recursively, to LOCAL (which must not exist)."""
    target = _path(path)
    if local.exists():
        fail(f"{local} exists: name a new path")

    async def get(client: FsClient) -> tuple[int, int]:
        if (await client.stat(target)).type == "directory":
            return await copy_to_local(client, target, local)
        data = await client.read(target)
        await asyncio.to_thread(_write_new, local, data)
        return 1, len(data)

    files, size = _run(ring, secret_file, credential, get)
    click.echo(f"{target} -> {local}: {files} files, {human_size(size)}")


def _write_new(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.sr3-get")
    temporary.write_bytes(data)
    os.replace(temporary, path)


@fs.command("put")
@click.argument("local", type=click.Path(exists=True, path_type=Path))
@click.argument("path")
@click.option("--overwrite", is_flag=True, help="Replace files that exist.")
@fs_options
@fail_cleanly
def fs_put(
    local: Path, path: str, overwrite: bool, ring: str | None, secret_file: Path | None,
    credential: str | None,
) -> None:  # fmt: skip
    """Copy a local file, or a directory recursively, to PATH."""
    target = _path(path)
    is_dir = local.is_dir()
    files = sorted(p for p in local.rglob("*") if p.is_file()) if is_dir else [local]
    if len(files) > WALK_ENTRIES_MAX:
        fail(f"more than {WALK_ENTRIES_MAX} files under {local}")
    for file in files:
        if file.stat().st_size > PUT_FILE_BYTES_MAX:
            fail(f"{file} is above {human_size(PUT_FILE_BYTES_MAX)}: sr3 fs put reads it whole")

    async def put(client: FsClient) -> int:
        total = 0
        for file in files:
            relative = file.relative_to(local).as_posix() if is_dir else ""
            destination = f"{target.rstrip('/')}/{relative}" if relative else target
            data = await asyncio.to_thread(file.read_bytes)
            await client.write(destination, data, overwrite=overwrite)
            total += len(data)
        return total

    size = _run(ring, secret_file, credential, put)
    click.echo(f"{local} -> sr3://{target}: {len(files)} files, {human_size(size)}")


@fs.command("rm")
@click.argument("path")
@click.option("-r", "recursive", is_flag=True, help="A directory and everything under it.")
@fs_options
@fail_cleanly
def fs_rm(
    path: str, recursive: bool, ring: str | None, secret_file: Path | None, credential: str | None
) -> None:
    """Delete a file, or a directory with -r."""
    target = _path(path)
    removed = _run(
        ring, secret_file, credential, lambda client: client.delete(target, recursive=recursive)
    )
    if removed == 0:
        fail(f"nothing at sr3://{target}")
    click.echo(f"deleted sr3://{target} ({removed} entries)")


@fs.command("mv")
@click.argument("source")
@click.argument("target")
@click.option("--overwrite", is_flag=True,
              help="Replace a file at TARGET (an empty directory, for one).")  # fmt: skip
@fs_options
@fail_cleanly
def fs_mv(
    source: str, target: str, overwrite: bool, ring: str | None, secret_file: Path | None,
    credential: str | None,
) -> None:  # fmt: skip
    """Rename a file or a directory (a directory's whole tree moves at once)."""
    origin, destination = _path(source), _path(target)
    stat = _run(
        ring, secret_file, credential,
        lambda client: client.rename(origin, destination, overwrite=overwrite),
    )  # fmt: skip
    click.echo(f"sr3://{origin} -> sr3://{stat.path} ({stat.type})")


@fs.command("du")
@click.argument("path", default="/")
@click.option("-s", "summary", is_flag=True, help="The total only.")
@fs_options
@fail_cleanly
def fs_du(
    path: str, summary: bool, ring: str | None, secret_file: Path | None, credential: str | None
) -> None:
    """Bytes under each entry of PATH, and the total."""
    target = _path(path)

    async def usage(client: FsClient) -> list[tuple[Stat, int]]:
        top = await client.list(target)
        sizes = []
        for entry in top:
            inside = await _walk(client, entry.path) if entry.type == "directory" else [entry]
            sizes.append((entry, sum(e.size for e in inside if e.type == "file")))
        return sizes

    sizes = _run(ring, secret_file, credential, usage)
    if not summary:
        for entry, size in sizes:
            click.echo(f"{size:>14}  {entry.path}")
    click.echo(f"{sum(size for _e, size in sizes):>14}  total ({target})")
