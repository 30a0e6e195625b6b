"""The consistent cut of a Spark checkpoint directory: what a restart after batch N needs.

This is the pure core: it works on a directory *listing* (``FileEntry`` values), never on
the file system, so it can be tested on any history and called on a listing taken while
Spark keeps writing and its maintenance keeps deleting. It also parses the contents the
cut depends on: the SST lists of RocksDB snapshot zips (``parse_zip_metadata``) and the
number of state partitions and the file sources' log ends of the offset log
(``parse_offsets``). The I/O shell, ``spark_connector.checkpoint``, walks a directory
(``list_checkpoint``), reads those files (``read_sst_references``, ``read_offsets``), and
``read_cut`` strings them together.

Layout (observed on Spark 4.3.0, default checkpoint format version 1)::

    metadata                       query id
    offsets/<batch>                planned batches (one file per batch; a restart after N
                                   reads offsets/N and offsets/N-1)
    commits/<batch>                committed batches; written after the batch's state
    sources/<source>/...           source logs (file source: one file per batch, every
                                   10th compacted into <batch>.compact)
    state/<op>/_metadata/metadata             operator metadata (v1)
    state/<op>/_metadata/v2/<batch>           operator metadata (v2, transformWithState)
    state/<op>/_stateSchema/<store>/<batch>_<uuid>   state schema (v3, transformWithState)
    state/<op>/<partition>/[<store>/]         one state store; <store> only for named stores
        _metadata/schema                      state schema (v2; partition 0 only)
        <v>.delta  <v>.snapshot               HDFS-backed provider
        <v>.zip  <v>.changelog  SSTs/<n>-<uuid>.sst  [logs/<n>-<uuid>.log]   RocksDB

Batch N commits state store version N + 1. A store rebuilds version V from the newest
base at or below V (``<b>.snapshot`` or ``<b>.zip``; none means the empty version 0) plus
every step file (``.delta`` or ``.changelog``) from b + 1 to V; that is what Spark's
providers do on load, and what the cut holds.

Decisions:

- Hidden files (any path part starting with ``.``) and ``*.tmp`` are never part of a cut.
  Hadoop's ``.<name>.crc`` checksum side files are hidden, so they are always skipped:
  Hadoop's local file system reads a file without its side file (it just does not verify
  it), and the sr3 manifest checks content by its own hashes.
- A RocksDB zip names the SST (and archived log) files it needs inside its ``metadata``
  member. The core cannot read it; given the references (``sst_references``, from
  ``read_sst_references``) the cut holds exactly those files and checks their sizes;
  without them it holds every SST and log file of the store directory, a superset that
  may include files of uncommitted versions or files still being uploaded.
- Checkpoint format version 2 (``<v>_<uuid>.zip``, Spark's own visible ``.crc`` files) and
  any file this module does not recognise inside ``state/`` raise ``CheckpointError``:
  a cut we cannot vouch for is worse than none.
- Every operator must hold partitions 0..P-1 (P from the offset log when given), each
  with every store the operator has (stores are known from their files and from their
  partition-0 schema files), so a partition whose files all vanished is noticed.
- The oldest commit Spark keeps is no cut: Spark purges ``offsets/N-1`` with it, and a
  restart after N fails without that file.
- A file source's log (``sources/<s>/<k>``) is cut at the ``logOffset`` that
  ``offsets/N`` records for it: a driver that already planned batch N+1 has logged its
  files, and a restart that found that entry would read them together with the next
  files in one batch, moving batch boundaries (and the watermark) away from those of the
  uninterrupted run. If the entries up to the end are not all there (compacted and
  cleaned away), the log is taken whole. Other sources' files are taken whole.
- Batch-tagged operator metadata and state schema files (transformWithState) newer than
  N are left out. Their contents name the schema files by absolute path; restoring into
  another directory has to rewrite them, which is not this module's job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ring.errors import SR3Error

__all__ = [
    "CheckpointError",
    "Cut",
    "FileEntry",
    "ParsedListing",
    "check_sst_size",
    "committed_batches",
    "cut_for_batch",
    "parse_offsets",
    "parse_query_id",
    "parse_zip_metadata",
    "snapshot_zips",
    "version_floors",
]

_BATCH_NAME = re.compile(r"0|[1-9][0-9]*")
_STATE_FILE = re.compile(r"(?P<version>0|[1-9][0-9]*)\.(?P<kind>delta|snapshot|zip|changelog)")
_CHECKPOINT_ID_FILE = re.compile(r"[0-9]+_[^/]+\.(delta|snapshot|zip|changelog)(\.crc)?")
_BATCH_TAGGED = re.compile(r"(?P<batch>0|[1-9][0-9]*)(_.*)?")
_IMMUTABLE_DIRS = frozenset({"SSTs", "logs"})
_BASE_KIND = {"hdfs": "snapshot", "rocksdb": "zip"}
_STEP_KIND = {"hdfs": "delta", "rocksdb": "changelog"}


class CheckpointError(SR3Error):
    """A checkpoint listing does not hold a consistent cut for the batch asked for."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the root ('/'-separated) and size;
    a listed file also carries its modification time (not part of equality)."""

    path: str
    size: int
    mtime_ns: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        parts = self.path.split("/")
        if self.path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise CheckpointError(f"not a relative '/'-separated path: {self.path!r}")
        if self.size < 0:
            raise CheckpointError(f"{self.path}: negative size {self.size}")


@dataclass(frozen=True, slots=True)
class Cut:
    """The files a restart after batch ``batch_id`` needs; state is at ``state_version``."""

    batch_id: int
    files: tuple[FileEntry, ...]
    state_version: int


@dataclass(slots=True)
class _Store:
    """The files of one state store directory, sorted by role."""

    versioned: dict[int, dict[str, FileEntry]] = field(default_factory=dict)
    immutable: dict[str, FileEntry] = field(default_factory=dict)


@dataclass(slots=True)
class _StateListing:
    """``state/`` of a listing: metadata files (with the batch that wrote them) and stores."""

    metadata: list[tuple[FileEntry, int | None]] = field(default_factory=list)
    stores: dict[str, _Store] = field(default_factory=dict)
    # Store names per operator that a schema file under a partition declares ('' = default).
    declared: dict[str, set[str]] = field(default_factory=dict)

    def within(self, state_partitions: int | None) -> _StateListing:
        """This listing without the stores of partitions ``state_partitions`` and above:
        a checkpoint rescaled down keeps the folders of the partitions it no longer has
        (Spark's repartition leaves them), and no batch from then on reads them."""
        if state_partitions is None:
            return self
        stores = {
            store_dir: store
            for store_dir, store in self.stores.items()
            if int(store_dir.split("/")[2]) < state_partitions
        }
        if len(stores) == len(self.stores):
            return self
        return _StateListing(self.metadata, stores, self.declared)


def committed_batches(entries: Iterable[FileEntry]) -> list[int]:
    """Batch ids with both ``commits/N`` and ``offsets/N`` in the listing, ascending."""
    return _committed(_visible(entries))


def _committed(visible: Sequence[FileEntry]) -> list[int]:
    return sorted(_batch_ids(visible, "offsets") & _batch_ids(visible, "commits"))


def version_floors(cut: Cut) -> dict[str, int]:
    """For each state store directory of ``cut``, the lowest version its versioned files
    have (its base, or its first step): what a later cut of the same checkpoint reads
    from (``read_cut(floors=...)``)."""
    floors: dict[str, int] = {}
    for entry in cut.files:
        directory, _slash, name = entry.path.rpartition("/")
        match = _STATE_FILE.fullmatch(name)
        if match is not None and entry.path.startswith("state/"):
            version = int(match["version"])
            floors[directory] = min(version, floors.get(directory, version))
    return floors


def cut_for_batch(
    entries: Iterable[FileEntry],
    batch_id: int,
    sst_references: Mapping[str, Sequence[FileEntry]] | None = None,
    state_partitions: int | None = None,
    source_log_ends: Mapping[int, int] | None = None,
) -> Cut:
    """The files Spark needs to restart after committed batch ``batch_id``.

    ``sst_references`` maps the path of each RocksDB zip the cut builds on (see
    ``snapshot_zips``) to the SST/log files its metadata names (paths relative to the
    checkpoint root, sizes as recorded by Spark). Without it, every SST and log file of the
    store is taken. ``state_partitions`` (``spark.sql.shuffle.partitions`` of the offset
    log, see ``read_offsets``) lets the cut notice that the highest partitions are
    gone altogether, and leaves out the partitions at or above it (a checkpoint
    rescaled down keeps their folders; no later batch reads them); without it only holes
    below the highest partition are noticed.
    ``source_log_ends`` maps a file source's index to the ``logOffset`` that
    ``offsets/<batch_id>`` records for it (see ``read_offsets``): entries the source logged
    for batches planned after that one are left out, so a restarted query plans its next
    batch again exactly as the uninterrupted one did.
    Raises ``CheckpointError`` when a needed file is missing.
    """
    return _cut(
        ParsedListing.of(entries), batch_id, sst_references, state_partitions, source_log_ends
    )


@dataclass(frozen=True, slots=True)
class ParsedListing:
    """A listing sorted once for ``snapshot_zips`` and ``cut_for_batch`` alike (and for
    ``read_cut``, which asks one parsed listing for its batches, zips and cut)."""

    visible: list[FileEntry]
    by_path: dict[str, FileEntry]
    state: _StateListing

    @classmethod
    def of(cls, entries: Iterable[FileEntry], *, all_visible: bool = False) -> ParsedListing:
        """``all_visible``: the entries were walked by ``list_checkpoint``'s walk, which
        skips what ``_visible`` would."""
        visible = list(entries) if all_visible else _visible(entries)
        state = _parse_state(entry for entry in visible if entry.path.startswith("state/"))
        return cls(visible, _index(visible), state)

    def committed(self) -> list[int]:
        """``committed_batches`` of this listing."""
        return _committed(self.visible)

    def snapshot_zips(self, batch_id: int, state_partitions: int | None = None) -> list[str]:
        """``snapshot_zips`` of this listing."""
        return _snapshot_zips(self.state.within(state_partitions), batch_id)

    def cut(
        self,
        batch_id: int,
        sst_references: Mapping[str, Sequence[FileEntry]] | None,
        state_partitions: int | None,
        source_log_ends: Mapping[int, int] | None,
        *,
        sizes_listed: bool = True,
    ) -> Cut:
        """``cut_for_batch`` of this listing; ``sizes_listed=False``: see ``_cut``."""
        return _cut(
            self,
            batch_id,
            sst_references,
            state_partitions,
            source_log_ends,
            sizes_listed=sizes_listed,
        )


def _cut(
    parsed: ParsedListing,
    batch_id: int,
    sst_references: Mapping[str, Sequence[FileEntry]] | None,
    state_partitions: int | None,
    source_log_ends: Mapping[int, int] | None,
    *,
    sizes_listed: bool = True,
) -> Cut:
    """``cut_for_batch`` on a parsed listing; ``sizes_listed=False``: the entries carry
    no sizes yet, so the SST sizes are not checked against the references here."""
    visible, by_path = parsed.visible, parsed.by_path
    state = parsed.state.within(state_partitions)
    state_version = batch_id + 1
    needed = ["metadata", f"offsets/{batch_id}", f"commits/{batch_id}"]
    missing = [path for path in needed if path not in by_path]
    if missing:
        raise CheckpointError(f"batch {batch_id} is not committed: {', '.join(missing)} missing")
    if batch_id > 0:
        # On restart Spark reads the offsets of the batch before the newest one too
        # ("batch N-1 doesn't exist" otherwise), so the oldest batch Spark kept is no cut.
        needed.append(f"offsets/{batch_id - 1}")
        if needed[-1] not in by_path:
            raise CheckpointError(
                f"batch {batch_id} cannot be restarted from: {needed[-1]} is gone (purged)"
            )
    files = [by_path[path] for path in needed]
    files.extend(_source_files(visible, source_log_ends or {}))
    _check_partitions(state, state_partitions)
    files.extend(entry for entry, batch in state.metadata if batch is None or batch <= batch_id)
    for store_dir, store in sorted(state.stores.items()):
        base, steps = _chain(store_dir, store, state_version)
        files.extend(steps)
        if base is not None:
            files.append(base)
            files.extend(_immutable_files(store_dir, store, base, sst_references, sizes_listed))
    files.sort(key=lambda entry: entry.path)
    assert len({entry.path for entry in files}) == len(files), "a cut names a file twice"
    return Cut(batch_id=batch_id, files=tuple(files), state_version=state_version)


_SOURCE_LOG_NAME = re.compile(r"^(0|[1-9][0-9]{0,17})(\.compact)?$")


def _source_files(visible: Sequence[FileEntry], ends: Mapping[int, int]) -> list[FileEntry]:
    """``sources/``, each file source's log trimmed to its end when that is safe (the
    newest compaction at or below the end and every entry after it up to the end are
    there); anything else under ``sources/`` is kept as it is."""
    files = [entry for entry in visible if entry.path.startswith("sources/")]
    by_source: dict[int, dict[int, tuple[FileEntry, bool]]] = {}
    for entry in files:
        parts = entry.path.split("/")
        if len(parts) == 3 and _BATCH_NAME.fullmatch(parts[1]) and int(parts[1]) in ends:
            match = _SOURCE_LOG_NAME.match(parts[2])
            if match is not None:
                log_entries = by_source.setdefault(int(parts[1]), {})
                log_entries[int(match.group(1))] = (entry, match.group(2) is not None)
    dropped: set[str] = set()
    for source, log_entries in by_source.items():
        end = ends[source]
        compactions = [k for k, (_e, compact) in log_entries.items() if compact and k <= end]
        first = max(compactions, default=-1) + 1
        if all(k in log_entries for k in range(first, end + 1)):
            dropped.update(entry.path for k, (entry, _c) in log_entries.items() if k > end)
    return [entry for entry in files if entry.path not in dropped]


def snapshot_zips(
    entries: Iterable[FileEntry], batch_id: int, state_partitions: int | None = None
) -> list[str]:
    """Paths of the RocksDB ``<v>.zip`` files the cut of ``batch_id`` builds on (in the
    partitions below ``state_partitions`` when given, as ``cut_for_batch``).

    The edge reads their SST lists (``read_sst_references``) and passes them back to
    ``cut_for_batch``; HDFS-backed stores contribute nothing here.
    """
    return ParsedListing.of(entries).snapshot_zips(batch_id, state_partitions)


def _snapshot_zips(state: _StateListing, batch_id: int) -> list[str]:
    zips = []
    for store_dir, store in sorted(state.stores.items()):
        base, _steps = _chain(store_dir, store, batch_id + 1)
        if base is not None and base.path.endswith(".zip"):
            zips.append(base.path)
    return zips


def _visible(entries: Iterable[FileEntry]) -> list[FileEntry]:
    """The entries a cut may hold: no hidden files (Hadoop .crc side files) or temp files."""
    visible = []
    for entry in entries:
        parts = entry.path.split("/")
        if any(part.startswith(".") for part in parts) or parts[-1].endswith(".tmp"):
            continue
        visible.append(entry)
    return visible


def _index(entries: Sequence[FileEntry]) -> dict[str, FileEntry]:
    by_path: dict[str, FileEntry] = {}
    for entry in entries:
        if entry.path in by_path:
            raise CheckpointError(f"the listing names {entry.path} twice")
        by_path[entry.path] = entry
    return by_path


def _batch_ids(entries: Iterable[FileEntry], log: str) -> set[int]:
    """Batch ids of a metadata log directory (``offsets`` or ``commits``)."""
    ids = set()
    for entry in entries:
        parts = entry.path.split("/")
        if len(parts) == 2 and parts[0] == log and _BATCH_NAME.fullmatch(parts[1]):
            ids.add(int(parts[1]))
    return ids


def _parse_state(entries: Iterable[FileEntry]) -> _StateListing:
    """Sort the files under ``state/`` into operator metadata and state stores."""
    listing = _StateListing()
    for entry in entries:
        parts = entry.path.split("/")
        if len(parts) < 4 or not _BATCH_NAME.fullmatch(parts[1]):
            raise CheckpointError(f"unexpected file in the state directory: {entry.path}")
        if parts[2] == "_metadata":
            listing.metadata.append((entry, _metadata_batch(parts[3:])))
        elif parts[2] == "_stateSchema":
            listing.metadata.append((entry, _schema_batch(parts[3:])))
        elif _BATCH_NAME.fullmatch(parts[2]):
            _add_store_file(listing, entry, parts)
        else:
            raise CheckpointError(f"unexpected file in the state directory: {entry.path}")
    return listing


def _metadata_batch(rest: Sequence[str]) -> int | None:
    """The batch that wrote an operator metadata file (v2 files are named by it)."""
    if len(rest) == 2 and rest[0] == "v2" and _BATCH_NAME.fullmatch(rest[1]):
        return int(rest[1])
    return None


def _schema_batch(rest: Sequence[str]) -> int | None:
    """The batch that wrote a v3 state schema file, named ``<batch>_<uuid>``."""
    match = _BATCH_TAGGED.fullmatch(rest[-1])
    return int(match["batch"]) if match else None


def _add_store_file(listing: _StateListing, entry: FileEntry, parts: Sequence[str]) -> None:
    """File a path under ``state/<op>/<partition>/`` with its store (default or named)."""
    rest = list(parts[3:])
    store_parts = list(parts[:3])
    if len(rest) > 1 and rest[0] != "_metadata" and rest[0] not in _IMMUTABLE_DIRS:
        store_parts.append(rest.pop(0))  # a named store, e.g. left-keyToNumValues
    store_dir = "/".join(store_parts)
    if rest[0] == "_metadata":
        listing.metadata.append((entry, None))
        store_name = store_parts[3] if len(store_parts) > 3 else ""
        listing.declared.setdefault(parts[1], set()).add(store_name)
        return
    store = listing.stores.setdefault(store_dir, _Store())
    if len(rest) == 2 and rest[0] in _IMMUTABLE_DIRS:
        store.immutable[entry.path] = entry
        return
    name = rest[0]
    match = _STATE_FILE.fullmatch(name) if len(rest) == 1 else None
    if match is None:
        if _CHECKPOINT_ID_FILE.fullmatch(name):
            raise CheckpointError(
                f"{entry.path}: state checkpoint format version 2 "
                "(spark.sql.streaming.stateStore.checkpointFormatVersion=2) is not supported"
            )
        raise CheckpointError(f"unrecognised file in a state store directory: {entry.path}")
    by_kind = store.versioned.setdefault(int(match["version"]), {})
    by_kind[match["kind"]] = entry


# State files are written by executors and read here on the driver: on a cluster that
# only works when the checkpoint directory is on a file system both see.
NOT_VISIBLE_HINT = (
    " (sr3 reads the checkpoint on the driver: on a cluster, the checkpoint directory must "
    "be on a file system the driver shares with the executors)"
)


def _check_partitions(listing: _StateListing, state_partitions: int | None) -> None:
    """Every operator has partitions 0..P-1, each holding every store the operator has."""
    layout: dict[str, dict[int, set[str]]] = {operator: {} for operator in listing.declared}
    # An operator with metadata (written by the driver) has state partitions too.
    for entry, _batch in listing.metadata:
        layout.setdefault(entry.path.split("/")[1], {})
    for store_dir in listing.stores:
        parts = store_dir.split("/")
        store_name = parts[3] if len(parts) > 3 else ""
        layout.setdefault(parts[1], {}).setdefault(int(parts[2]), set()).add(store_name)
    for operator, partitions in sorted(layout.items()):
        count = state_partitions if state_partitions is not None else max(partitions, default=0) + 1
        absent = sorted(set(range(count)) - set(partitions))
        extra = sorted(set(partitions) - set(range(count)))
        if absent or extra:
            raise CheckpointError(
                f"state/{operator}: expected partitions 0-{count - 1}; "
                f"no state files for {absent}"
                + (f", unexpected {extra}" if extra else "")
                + (NOT_VISIBLE_HINT if absent else "")
            )
        stores = set(listing.declared.get(operator, set())).union(*partitions.values())
        for partition, names in sorted(partitions.items()):
            if names != stores:
                missing = ", ".join(sorted(name or "(default)" for name in stores - names))
                raise CheckpointError(
                    f"state/{operator}/{partition}: no state files for store(s) {missing}"
                    + NOT_VISIBLE_HINT
                )


def _chain(store_dir: str, store: _Store, version: int) -> tuple[FileEntry | None, list[FileEntry]]:
    """The base (newest snapshot or zip at or below ``version``) and the steps after it."""
    provider = _provider(store_dir, store)
    base_kind, step_kind = _BASE_KIND[provider], _STEP_KIND[provider]
    base_version = max(
        (v for v, by_kind in store.versioned.items() if base_kind in by_kind and v <= version),
        default=0,
    )
    missing = [
        v
        for v in range(base_version + 1, version + 1)
        if step_kind not in store.versioned.get(v, {})
    ]
    if missing:
        start = f"{base_version}.{base_kind}" if base_version else "the empty version 0"
        raise CheckpointError(
            f"{store_dir}: cannot rebuild state version {version} from {start}: "
            f"{step_kind} file(s) for version(s) {_ranges(missing)} missing" + NOT_VISIBLE_HINT
        )
    base = store.versioned[base_version][base_kind] if base_version else None
    steps = [store.versioned[v][step_kind] for v in range(base_version + 1, version + 1)]
    return base, steps


def _provider(store_dir: str, store: _Store) -> str:
    kinds = {kind for by_kind in store.versioned.values() for kind in by_kind}
    hdfs = bool(kinds & {"delta", "snapshot"})
    rocksdb = bool(kinds & {"zip", "changelog"}) or bool(store.immutable)
    if hdfs and rocksdb:
        raise CheckpointError(f"{store_dir}: files of both the HDFS and RocksDB providers")
    if not hdfs and not rocksdb:
        raise CheckpointError(f"{store_dir}: no state files")
    return "hdfs" if hdfs else "rocksdb"


def _immutable_files(
    store_dir: str,
    store: _Store,
    base: FileEntry,
    sst_references: Mapping[str, Sequence[FileEntry]] | None,
    sizes_listed: bool = True,
) -> list[FileEntry]:
    """The SST/log files a RocksDB zip needs: the ones it names, or all of the store's
    (their listed sizes checked against the names' unless ``sizes_listed`` is False)."""
    if not base.path.endswith(".zip"):
        return []
    if sst_references is None:
        return sorted(store.immutable.values(), key=lambda entry: entry.path)
    references = sst_references.get(base.path)
    if references is None:
        raise CheckpointError(f"{base.path}: no SST references given for this zip")
    files = []
    for reference in references:
        listed = store.immutable.get(reference.path)
        if listed is None:
            raise CheckpointError(f"{base.path} needs {reference.path}, which is not listed")
        if sizes_listed:
            check_sst_size(base.path, reference, listed)
        files.append(listed)
    return files


def check_sst_size(zip_path: str, reference: FileEntry, listed: FileEntry) -> None:
    """The size of an SST/log file as listed is the one the zip that names it recorded."""
    if listed.size != reference.size:
        raise CheckpointError(
            f"{reference.path}: {listed.size} bytes listed, {zip_path} "
            f"expects {reference.size} (a partial upload?)"
        )


def _ranges(versions: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9`` for error messages."""
    spans: list[list[int]] = []
    for version in versions:
        if spans and version == spans[-1][1] + 1:
            spans[-1][1] = version
        else:
            spans.append([version, version])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def parse_offsets(batch_id: int, text: str) -> tuple[int | None, dict[int, int]]:
    """From the head of ``offsets/<batch_id>``: the state partitions
    (``spark.sql.shuffle.partitions`` of its conf: Spark pins the number of state
    partitions to it for the life of the checkpoint; None if absent) and, per file source
    (offset ``{"logOffset": N}``), its source log's end."""
    try:
        lines = text.split("\n")
        conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
        value = conf.get("spark.sql.shuffle.partitions")
        ends: dict[int, int] = {}
        for index, line in enumerate(lines[2:]):
            if line.startswith("{"):
                offset = json.loads(line)
                if isinstance(offset, dict) and set(offset) == {"logOffset"}:
                    ends[index] = int(offset["logOffset"])
        return (None if value is None else int(value)), ends
    except (ValueError, AttributeError, TypeError) as exc:
        raise CheckpointError(f"offsets/{batch_id}: cannot read it: {exc}") from exc


def parse_query_id(text: str) -> str | None:
    """The query id in a checkpoint's ``metadata`` file (Spark writes ``{"id":"<uuid>"}``
    once, when the checkpoint is created); None when it holds none."""
    try:
        metadata = json.loads(text.partition("\n")[0])
    except ValueError:
        return None
    query_id = metadata.get("id") if isinstance(metadata, dict) else None
    return query_id if isinstance(query_id, str) and 0 < len(query_id) <= 128 else None


def parse_zip_metadata(zip_path: str, text: str) -> tuple[FileEntry, ...]:
    """The SST and log files named by the ``metadata`` member of RocksDB zip ``zip_path``
    (paths relative to the checkpoint root, sizes as Spark recorded them). Spark writes
    ``v1`` on the first line, then JSON with ``sstFiles`` and ``logFiles``."""
    store_dir = zip_path.rpartition("/")[0]
    version, _newline, body = text.partition("\n")
    try:
        if not re.fullmatch(r"v[0-9]+", version):
            raise ValueError(f"unknown header {version[:20]!r}")
        metadata = json.loads(body)
        files = [
            FileEntry(f"{store_dir}/SSTs/{item['dfsSstFileName']}", int(item["sizeBytes"]))
            for item in metadata.get("sstFiles", [])
        ]
        files += [
            FileEntry(f"{store_dir}/logs/{item['dfsLogFileName']}", int(item["sizeBytes"]))
            for item in metadata.get("logFiles", [])
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{zip_path}: malformed RocksDB metadata: {exc}") from exc
    return tuple(files)
