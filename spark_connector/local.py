"""What a checkpoint directory holds before a restore, and whether the ring's batch
continues it.

``inspect_local`` reads what a restore must know of the target directory: how many
files it holds, its committed batches, and its ``metadata`` file (the query id Spark
writes once, when the checkpoint is created). ``divergence`` says why the local
checkpoint is not a prefix of the history a manifest ends: every file the local cut of
its newest committed batch shares with the manifest (by path) must be the same file:
the same size, and, outside ``state/``, the same digest (the metadata, offset, commit
and source logs are small; state files are compared by size only, so that the check
costs a few small reads whatever the size of the state). A checkpoint whose cut cannot
be read is compared on its ``metadata``, offset and commit logs alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ring.files import READ_BYTES
from spark_connector.checkpoint import list_checkpoint, read_cut, read_query_id
from spark_connector.cut import CheckpointError, FileEntry, committed_batches
from spark_connector.manifest import Manifest

__all__ = ["LocalCheckpoint", "divergence", "inspect_local"]

# Files counted in a directory before the count is given as "at least" this many.
COUNT_FILES_MAX = 2_000_000
_LOGS = ("offsets", "commits")


@dataclass(frozen=True, slots=True)
class LocalCheckpoint:
    """What a checkpoint directory holds: its files (all of them, hidden ones included),
    its committed batches (oldest first) and its ``metadata`` file's digest and query id
    (None when there is no such file)."""

    path: Path
    files: int
    batches: tuple[int, ...]
    metadata_digest: str | None
    query_id: str | None

    @property
    def empty(self) -> bool:
        return self.files == 0

    @property
    def newest(self) -> int | None:
        """The newest committed batch, or None when none committed."""
        return self.batches[-1] if self.batches else None

    def describe(self) -> str:
        """``12 files, batches 3..7, query id X``, for messages."""
        if not self.batches:
            batches = "no committed batch"
        elif len(self.batches) == 1:
            batches = f"batch {self.batches[0]}"
        else:
            batches = f"batches {self.batches[0]}..{self.batches[-1]}"
        query_id = self.query_id or "unknown"
        files = f"{self.files} file" + ("" if self.files == 1 else "s")
        return f"{files}, {batches}, query id {query_id}"


def inspect_local(root: Path) -> LocalCheckpoint:
    """What ``root`` holds (an absent directory holds nothing)."""
    files = _count_files(root)
    if files == 0:
        return LocalCheckpoint(root, 0, (), None, None)
    try:
        batches = tuple(committed_batches(list_checkpoint(root)))
    except CheckpointError:
        batches = ()  # not a directory: a file in the way, refused like any other
    metadata = root / "metadata"
    digest = _digest(metadata) if metadata.is_file() else None
    return LocalCheckpoint(root, files, batches, digest, read_query_id(root) if digest else None)


def divergence(local: LocalCheckpoint, manifest: Manifest) -> str | None:
    """Why ``local`` is not a prefix of the history that ``manifest`` ends, or None
    when it is (the same query's checkpoint, and the files both hold are the same)."""
    ring_metadata = manifest.file("metadata")
    if local.metadata_digest is None:
        return "it has no metadata file (not a Spark checkpoint)"
    if ring_metadata is None or ring_metadata.blob.digest != local.metadata_digest:
        return (
            f"its metadata (query id {local.query_id or 'unknown'}) is not the ring's "
            f"(query id {manifest.query_id or 'unknown'}): another query or run"
        )
    ring_files = {file.path: file.blob for file in manifest.files}
    for entry in _committed_files(local):
        blob = ring_files.get(entry.path)
        if blob is None or entry.path == "metadata":
            continue
        if entry.size != blob.size:
            return f"{entry.path} has {entry.size} bytes here, {blob.size} on the ring"
        if not entry.path.startswith("state/") and _digest(local.path / entry.path) != blob.digest:
            return f"{entry.path} differs from the ring's"
    return None


def _committed_files(local: LocalCheckpoint) -> Sequence[FileEntry]:
    """The files of the cut of ``local``'s newest committed batch; when that cannot be
    cut, its offset and commit logs up to that batch."""
    newest = local.newest
    if newest is None:
        return ()
    try:
        return read_cut(local.path, newest).files
    except (CheckpointError, FileNotFoundError):
        pass
    entries = []
    for entry in list_checkpoint(local.path):
        parts = entry.path.split("/")
        is_log = len(parts) == 2 and parts[0] in _LOGS and parts[1].isascii() and parts[1].isdigit()
        if is_log and int(parts[1]) <= newest:
            entries.append(entry)
    return entries


def _count_files(root: Path) -> int:
    """Regular files under ``root`` (0 when it is absent or empty), counted up to
    ``COUNT_FILES_MAX``; 1 when ``root`` is itself a file."""
    if not root.exists():
        return 0
    if not root.is_dir():
        return 1
    count = 0
    for _directory, _subdirectories, names in os.walk(root):
        count += len(names)
        if count >= COUNT_FILES_MAX:
            return COUNT_FILES_MAX
    return count  # 0 also when it holds only empty directories: nothing to keep


def _digest(path: Path) -> str:
    hasher = xxhash.xxh3_128()
    try:
        with path.open("rb") as file:
            while block := file.read(READ_BYTES):
                hasher.update(block)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it: {exc}") from exc
    return hasher.hexdigest()
