"""Spark checkpoints written to ``sr3://`` by executors, seen from outside Spark: found,
copied into a local directory, forgotten (``sr3 spark list|restore|forget``).

A directory is a checkpoint when it has an ``offsets`` directory (Spark's offset log);
its newest committed batch is the highest numbered file in ``commits``. Copies skip
Spark's temporary files (``.NAME.UUID.tmp``, left by a writer that died before its
rename), as Spark itself ignores them.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from ring.errors import NotFound, SR3Error
from ring.files import fsync_dir
from ring.fs_api import ROOT, Stat, validate_path
from spark_connector.fs_client import FsClient

__all__ = ["FsCheckpoint", "copy_to_local", "find_checkpoints", "forget_checkpoint", "fs_path_of"]

# Bounds of a search for checkpoints and of a copy.
SEARCH_DEPTH_MAX = 8
SEARCH_DIRECTORIES_MAX = 10_000
COPY_FILES_MAX = 1_000_000
COPIES_AT_ONCE = 8
SCHEME = "sr3://"


@dataclass(frozen=True, slots=True)
class FsCheckpoint:
    path: str
    latest_committed: int | None  # None: no batch committed yet
    latest_offset: int | None


def fs_path_of(uri_or_path: str) -> str:
    """``sr3:///a/b``, ``sr3:/a/b``, ``/a/b`` or ``a/b`` as the namespace path ``/a/b``."""
    text = uri_or_path
    if text.startswith(SCHEME):
        text = text[len(SCHEME) :]
        if not text.startswith("/"):
            raise SR3Error(f"{uri_or_path}: sr3:// paths have no host (sr3:///a/b)")
    elif text.startswith("sr3:"):
        text = text[len("sr3:") :]
    text = "/" + text.strip("/") if text.strip("/") else ROOT
    return validate_path(text)


def _batch_numbers(entries: list[Stat]) -> list[int]:
    return sorted(
        int(e.name) for e in entries if e.type == "file" and e.name.isascii() and e.name.isdigit()
    )


async def _latest(fs: FsClient, directory: str) -> int | None:
    try:
        numbers = _batch_numbers(await fs.list(directory))
    except NotFound:
        return None
    return numbers[-1] if numbers else None


async def find_checkpoints(fs: FsClient, root: str = "/spark") -> list[FsCheckpoint]:
    """Every checkpoint under ``root`` (breadth first, bounded), by path."""
    found: list[FsCheckpoint] = []
    level = [fs_path_of(root)]
    seen = 0
    for _depth in range(SEARCH_DEPTH_MAX):
        following: list[str] = []
        for directory in level:
            seen += 1
            if seen > SEARCH_DIRECTORIES_MAX:
                raise SR3Error(f"more than {SEARCH_DIRECTORIES_MAX} directories under {root}")
            try:
                entries = await fs.list(directory)
            except NotFound:
                continue
            names = {e.name: e.type for e in entries}
            if names.get("offsets") == "directory":
                base = "" if directory == ROOT else directory
                committed, offset = await asyncio.gather(
                    _latest(fs, f"{base}/commits"), _latest(fs, f"{base}/offsets")
                )
                found.append(FsCheckpoint(directory, committed, offset))
                continue
            following += [e.path for e in entries if e.type == "directory"]
        level = following
        if not level:
            break
    return sorted(found, key=lambda checkpoint: checkpoint.path)


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


async def _files_under(fs: FsClient, path: str) -> list[Stat]:
    files: list[Stat] = []
    pending = [path]
    while pending:
        for entry in await fs.list(pending.pop()):
            if entry.type == "directory":
                pending.append(entry.path)
            elif not _temporary(entry.name):
                files.append(entry)
            if len(files) > COPY_FILES_MAX:
                raise SR3Error(f"more than {COPY_FILES_MAX} files under {path}")
    return files


async def copy_to_local(fs: FsClient, source: str, target: Path) -> tuple[int, int]:
    """Copy the checkpoint (or any directory) at ``source`` into ``target``, which must
    be empty or absent; (files, bytes) copied. Each file is written and fsynced under a
    temporary name, then renamed."""
    source = fs_path_of(source)
    if (await fs.stat(source)).type != "directory":
        raise SR3Error(f"{source} is a file, not a checkpoint directory")
    if await asyncio.to_thread(_occupied, target):
        raise SR3Error(f"{target} is not empty")
    files = await _files_under(fs, source)
    slots = asyncio.Semaphore(COPIES_AT_ONCE)
    copied = 0

    async def one(entry: Stat) -> None:
        nonlocal copied
        relative = entry.path[len(source) :].lstrip("/")
        async with slots:
            data = await fs.read(entry.path)
        if len(data) != entry.size:
            raise SR3Error(f"{entry.path} changed while it was copied")
        await asyncio.to_thread(_write_file, target / relative, data)
        copied += len(data)

    async with asyncio.TaskGroup() as group:
        for entry in files:
            group.create_task(one(entry))
    return len(files), copied


def _occupied(path: Path) -> bool:
    return path.exists() and any(path.iterdir())


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.sr3-copy")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_dir(path.parent)


async def forget_checkpoint(fs: FsClient, path: str) -> int:
    """Delete the checkpoint at ``path`` (everything under it); entries removed."""
    return await fs.delete(fs_path_of(path), recursive=True)
