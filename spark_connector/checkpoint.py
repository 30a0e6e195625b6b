"""Reading a Spark checkpoint directory: the I/O shell around the cut's pure core.

``spark_connector.cut`` decides which files a restart after batch N needs, from names
and sizes alone; this module does what it cannot. ``list_checkpoint`` walks the
directory (skipping what no cut holds: hidden files such as Hadoop's ``.crc`` side
files, and ``*.tmp``), ``read_sst_references`` opens the RocksDB snapshot zips a cut
builds on for the SST lists in their ``metadata`` member, ``read_offsets`` reads the
head of the offset log of a batch, ``read_query_id`` the query id in the checkpoint's
``metadata``, and ``read_cut`` strings them together, stat-ing only the files of the
cut. The file system changes under it while Spark runs: files that vanish while walking
are left out, a file that vanishes before its stat raises ``FileNotFoundError`` (list
again), and other OS errors become ``CheckpointError``. Every read is bounded.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from spark_connector.cut import (
    CheckpointError,
    Cut,
    FileEntry,
    ParsedListing,
    check_sst_size,
    parse_offsets,
    parse_query_id,
    parse_zip_metadata,
)

__all__ = ["list_checkpoint", "read_cut", "read_offsets", "read_query_id", "read_sst_references"]

LISTING_ENTRIES_MAX = 2_000_000
ZIP_METADATA_BYTES_MAX = 16 * 1024 * 1024
OFFSETS_BYTES_MAX = 1024 * 1024
QUERY_METADATA_BYTES_MAX = 64 * 1024


def list_checkpoint(root: Path) -> list[FileEntry]:
    """Every regular file under ``root`` that a cut may hold, with its size and
    modification time, sorted by path.

    Hidden files and directories (Hadoop's ``.crc`` side files, temporary directories) and
    ``*.tmp`` files are not listed (nor stat-ed: a checkpoint holds about as many
    ``.crc`` files as files). Files and directories that disappear while walking
    (Spark's maintenance deletes old versions, temp files are renamed) are left out;
    symbolic links are not followed.
    """
    entries = []
    for path, item in _list_items(root):
        assert item is not None  # no floors: every file comes with its directory entry
        try:
            stat = item.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CheckpointError(f"{root}: cannot list the checkpoint: {exc}") from exc
        entries.append(FileEntry(path, stat.st_size, stat.st_mtime_ns))
    return entries


def _list_items(
    root: Path, floors: Mapping[str, int] | None = None
) -> list[tuple[str, os.DirEntry[str] | None]]:
    """The files ``list_checkpoint`` lists, by path, sorted, without a stat of each (the
    directory entries' types say what is a file). ``floors``: state store directories
    whose versioned files below a version are left out (see ``read_cut``); their files
    come without a directory entry."""
    paths: list[tuple[str, os.DirEntry[str] | None]] = []
    pending = [""]
    try:
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a checkpoint directory")
        while pending:
            relative = pending.pop()
            floor = floors.get(relative) if floors else None
            if floor is None:
                _scan(root, relative, paths, pending)
            else:
                _scan_above(root, relative, floor, paths, pending)
    except OSError as exc:
        raise CheckpointError(f"{root}: cannot list the checkpoint: {exc}") from exc
    paths.sort(key=lambda pair: pair[0])
    return paths


def _scan_above(
    root: Path,
    relative: str,
    floor: int,
    paths: list[tuple[str, os.DirEntry[str] | None]],
    pending: list[str],
) -> None:
    """A state store directory's names (``os.listdir``, no directory entries made), its
    versioned files (``<version>.<kind>``) below ``floor`` left out unparsed: a store
    keeps ``minBatchesToRetain`` (100) versions, of which a cut needs those from its base
    on. Names that are not versioned files (``SSTs``, ``_metadata``) are walked as
    ``_scan`` would."""
    try:
        names = os.listdir(root / relative)
    except FileNotFoundError:
        return
    # Versions compared as text (no leading zeros: longer is larger), not parsed.
    least = str(floor)
    for name in names:
        if name[0] == "." or name.endswith(".tmp"):
            continue
        version, dot, _kind = name.partition(".")
        if dot and version.isascii() and version.isdigit():
            if len(version) > len(least) or (len(version) == len(least) and version >= least):
                paths.append((f"{relative}/{name}", None))
            continue
        path = f"{relative}/{name}"
        if os.path.isdir(root / path):
            pending.append(path)
        elif os.path.isfile(root / path):
            paths.append((path, None))
    if len(paths) > LISTING_ENTRIES_MAX:
        raise CheckpointError(f"{root}: more than {LISTING_ENTRIES_MAX} files")


def _scan(
    root: Path,
    relative: str,
    paths: list[tuple[str, os.DirEntry[str] | None]],
    pending: list[str],
) -> None:
    try:
        with os.scandir(root / relative) as scan:
            for item in scan:
                if item.name.startswith("."):
                    continue
                path = f"{relative}/{item.name}" if relative else item.name
                try:
                    if item.is_dir(follow_symlinks=False):
                        pending.append(path)
                    elif item.is_file(follow_symlinks=False) and not item.name.endswith(".tmp"):
                        paths.append((path, item))
                except FileNotFoundError:
                    continue
                if len(paths) > LISTING_ENTRIES_MAX:
                    raise CheckpointError(f"{root}: more than {LISTING_ENTRIES_MAX} files")
    except FileNotFoundError:
        return


def read_sst_references(root: Path, zip_paths: Iterable[str]) -> dict[str, tuple[FileEntry, ...]]:
    """The SST and log files each RocksDB zip names in its ``metadata`` member.

    Returned paths are relative to ``root`` (``<store>/SSTs/<name>``, ``<store>/logs/<name>``)
    with the sizes Spark recorded. A zip that vanished (maintenance) raises
    ``CheckpointError``: the listing it came from is stale, list again.
    """
    references = {}
    for zip_path in zip_paths:
        try:
            with zipfile.ZipFile(root / zip_path) as archive:
                info = archive.getinfo("metadata")
                if info.file_size > ZIP_METADATA_BYTES_MAX:
                    raise CheckpointError(f"{zip_path}: metadata of {info.file_size} bytes")
                text = archive.read(info).decode("utf-8")
        except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{zip_path}: cannot read its metadata: {exc}") from exc
        references[zip_path] = parse_zip_metadata(zip_path, text)
    return references


def read_offsets(root: Path, batch_id: int) -> tuple[int | None, dict[int, int]]:
    """From ``offsets/<batch_id>``: the state partitions (``spark.sql.shuffle.partitions``
    of its conf: Spark pins the number of state partitions to it for the life of the
    checkpoint; None if absent) and, per file source (offset ``{"logOffset": N}``), its
    source log's end."""
    path = root / "offsets" / str(batch_id)
    try:
        with path.open("rb") as file:
            head = file.read(OFFSETS_BYTES_MAX).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"offsets/{batch_id}: cannot read it: {exc}") from exc
    return parse_offsets(batch_id, head)


def read_query_id(root: Path) -> str | None:
    """The query id in ``root/metadata``; None when the file is absent or holds none."""
    try:
        with (root / "metadata").open("rb") as file:
            head = file.read(QUERY_METADATA_BYTES_MAX)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{root / 'metadata'}: cannot read it: {exc}") from exc
    return parse_query_id(head.decode("utf-8", errors="replace"))


def read_cut(
    root: Path,
    batch_id: int | None = None,
    zip_cache: dict[str, tuple[FileEntry, tuple[FileEntry, ...]]] | None = None,
    floors: Mapping[str, int] | None = None,
) -> Cut:
    """List ``root`` and cut it at ``batch_id`` (default: the newest committed batch),
    reading what the core cannot: the zips' SST lists and the number of partitions.

    ``zip_cache`` (the caller's, kept between calls) holds the SST lists of zips read
    before, by path with the listed entry they were read from: a zip listed again with
    the same size and modification time is not opened again. It is left holding the
    zips of this cut only.

    Only the files of the cut are stat-ed, after it is cut from the names: a checkpoint
    keeps ``spark.sql.streaming.minBatchesToRetain`` (100) versions of every partition,
    of which a cut needs a few. A file that vanishes before its stat (maintenance)
    raises ``FileNotFoundError``: list again.

    ``floors`` (``cut.version_floors`` of an earlier cut of the same checkpoint) leaves
    out, unparsed, each store's versioned files below the base of that cut: a later cut
    never builds on an older base (snapshots are only added, and Spark's cleanup keeps
    the newest one a retained version needs), so what a push reads does not grow with
    the versions Spark retains. A cut that cannot be made so raises ``CheckpointError``;
    the caller cuts again without floors."""
    names = [FileEntry(path, 0) for path, _item in _list_items(root, floors)]
    parsed = ParsedListing.of(names, all_visible=True)
    if batch_id is None:
        batches = parsed.committed()
        if not batches:
            raise CheckpointError(f"{root}: no committed batch")
        batch_id = batches[-1]
    partitions, source_log_ends = read_offsets(root, batch_id)
    zips = parsed.snapshot_zips(batch_id, partitions)
    # Entries stat-ed so far (the zips, when cached), reused for the cut's files.
    listed: dict[str, FileEntry] = {}
    if zip_cache is None:
        references = read_sst_references(root, zips)
    else:
        listed = {path: _stat(root, path) for path in zips}
        fresh = [
            path
            for path in zips
            if path not in zip_cache or not _same_file(zip_cache[path][0], listed[path])
        ]
        for path, files in read_sst_references(root, fresh).items():
            zip_cache[path] = (listed[path], files)
        for path in set(zip_cache) - set(zips):
            del zip_cache[path]
        references = {path: zip_cache[path][1] for path in zips}
    named = parsed.cut(batch_id, references, partitions, source_log_ends, sizes_listed=False)
    files = tuple(listed.get(entry.path) or _stat(root, entry.path) for entry in named.files)
    by_path = {entry.path: entry for entry in files}
    for zip_path, sst_files in references.items():
        for reference in sst_files:
            check_sst_size(zip_path, reference, by_path[reference.path])
    return Cut(named.batch_id, files, named.state_version)


def _stat(root: Path, path: str) -> FileEntry:
    try:
        stat = os.stat(root / path, follow_symlinks=False)
    except FileNotFoundError:
        raise  # deleted since the listing (maintenance): the caller lists again
    except OSError as exc:
        raise CheckpointError(f"{root / path}: cannot stat it: {exc}") from exc
    return FileEntry(path, stat.st_size, stat.st_mtime_ns)


def _same_file(before: FileEntry, now: FileEntry) -> bool:
    return (before.size, before.mtime_ns) == (now.size, now.mtime_ns)
