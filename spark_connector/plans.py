"""Plans: what a batch reads, on the ring before the batch runs.

Spark fixes a micro-batch's input before it runs the batch: a file source first logs the
batch's files (``sources/<s>/<k>``), then the driver writes the offset log entry
``offsets/N``, runs the batch (its sink writes), and writes ``commits/N``. A restart that
finds ``offsets/N`` without ``commits/N`` runs batch N again with exactly those offsets;
one that does not find it plans batch N anew from whatever its sources hold by then,
which may be other rows. An exactly-once sink that skips batch ids it has seen (Delta's
``txnVersion``) then keeps the first version and silently loses the rows only the second
one had.

``StateSync`` pushes a local checkpoint's batches after they commit, so without more the
ring would never hold the plan of the batch a dead driver was running. A **plan** is
what the ring lacks to run batch N as that driver planned it: ``offsets/N``, the source
log files written since the newest pushed batch, and for a new checkpoint its
``metadata`` (the query id). The driver writes it as record ``spark/<query>/plans/<N>``
(its files as chunks, named as the record's refs) from Spark's checkpoint file manager
(``sr3.hadoop.Sr3Plans``), after batch N-1's manifest is on the ring and before
``offsets/N`` appears on the local disk; a plan that cannot be written fails the batch
before it runs. Under a lease the plan is fenced as a manifest is (the lease record is
read first and must carry the writer's fence; the plan carries the fence, and a plan of a
newer fence is never replaced by an older one).

So the ring holds the newest committed batch's manifest, and at most the next batch's
plan beyond it. Whoever resumes the query (a standby taking over, a restart on another
machine) restores the manifest, then lays the plan down (``place_plan``): Spark finds
``offsets/N`` without ``commits/N`` and runs batch N with the dead driver's offsets.

This module holds the value (``Plan``, JSON, no I/O), the writer (``PlanWriter``) and
``place_plan``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ring.blobs import BlobRef
from ring.client.options import Source
from ring.codec import compact_json
from ring.errors import ConfigError, Fenced, ProtocolError, RecordConflict, SR3Error
from ring.files import fsync_dir
from ring.sync_client import SyncClient
from spark_connector.catalog import delete_plans
from spark_connector.checkpoint import list_checkpoint, read_query_id
from spark_connector.manifest import (
    HOST_CHARS_MAX,
    QUERY_ID_CHARS_MAX,
    ManifestFile,
    check_query_name,
    files_json,
    format_wall,
    optional_fence,
    optional_text,
    optional_time,
    plan_key,
)
from spark_connector.restore import fetch_files

__all__ = ["PLAN_FORMAT", "PlacedPlan", "Plan", "PlanWriter", "place_plan", "read_plan"]

log = logging.getLogger(__name__)

PLAN_FORMAT = 1
# A plan names at most this many files (a file source's log between two batches is one
# file, or a compaction of up to ten; other sources keep a few).
PLAN_FILES_MAX = 10_000
# The paths a plan may name, relative to the checkpoint: what fixes a batch's input.
_PLAN_PATH = re.compile(r"^(metadata|offsets/[0-9]{1,18}|sources(/[^/\x00]{1,255}){1,16})$")


def check_plan_path(path: str) -> str:
    """``path`` when a plan may name it: ``metadata``, ``offsets/<N>`` or a file under
    ``sources/`` (no hidden part, no ``..``); ``ProtocolError`` otherwise, so that a plan
    read from the ring never writes outside the log files of a checkpoint."""
    if _PLAN_PATH.match(path) is None or any(part.startswith(".") for part in path.split("/")):
        raise ProtocolError(f"a plan does not name {path[:80]!r}")
    return path


@dataclass(frozen=True, slots=True)
class Plan:
    """Batch ``batch_id`` of ``query`` as planned: the files the ring lacked to run it as
    planned (``offsets/<batch_id>`` among them), from checkpoint ``root``; when and on
    which host it was planned, the checkpoint's query id and the writer's fence."""

    query: str
    batch_id: int
    root: str
    files: tuple[ManifestFile, ...]
    planned_at: float | None = None
    host: str | None = None
    query_id: str | None = None
    fence: int | None = None

    def chunk_ids(self) -> list[str]:
        return sorted({e.chunk_id for f in self.files for e in f.blob.extents})

    @property
    def offsets_path(self) -> str:
        return f"offsets/{self.batch_id}"

    def to_json(self) -> dict[str, Any]:
        head = {"format": PLAN_FORMAT, "query": self.query, "batch_id": self.batch_id}
        optional = {"planned_at": self.planned_at, "host": self.host, "query_id": self.query_id}
        return files_json(
            {**head, "root": self.root}, {**optional, "fence": self.fence}, self.files
        )

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        try:
            if data["format"] != PLAN_FORMAT:
                raise ProtocolError(f"unsupported plan format {data['format']!r:.40}")
            items = data["files"]
            if not isinstance(items, list) or len(items) > PLAN_FILES_MAX:
                raise ProtocolError(f"a plan names a list of at most {PLAN_FILES_MAX} files")
            files = tuple(
                ManifestFile(check_plan_path(str(item["path"])), BlobRef.from_json(item))
                for item in items
            )
            plan = cls(
                check_query_name(str(data["query"])),
                _batch_id(data["batch_id"]),
                str(data["root"]),
                files,
                planned_at=optional_time(data.get("planned_at")),
                host=optional_text(data.get("host"), HOST_CHARS_MAX),
                query_id=optional_text(data.get("query_id"), QUERY_ID_CHARS_MAX),
                fence=optional_fence(data.get("fence")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed plan: {exc!r:.200}") from exc
        if not any(file.path == plan.offsets_path for file in files):
            raise ProtocolError(f"the plan of batch {plan.batch_id} has no {plan.offsets_path}")
        return plan


def _batch_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**18:
        raise ValueError(f"a batch id is an integer in 0..10^18: {value!r:.40}")
    return value


def read_plan(client: SyncClient, query: str, batch_id: int) -> tuple[Plan, int] | None:
    """The plan of ``query``'s batch ``batch_id`` and its record's version, or None."""
    record = client.get_record(plan_key(query, batch_id))
    if record is None:
        return None
    try:
        data = json.loads(record.value)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"the plan of batch {batch_id} of {query} is not JSON") from exc
    return Plan.from_json(data), record.version


def _bytes_source(data: bytes) -> Source:
    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    return Source(len(data), read)


class PlanWriter:
    """Writes the plans of one checkpoint directory's batches as records of one query.

    ``pushed`` gives the files of the newest pushed cut by path, as (size, mtime_ns):
    what the ring holds already, so a plan sends only the source log files written since
    (and ``metadata`` while no manifest holds it). ``guard`` and ``fence`` as a
    ``Pusher``'s: the lease check before the write, and the fence the plan carries."""

    def __init__(
        self,
        client: SyncClient,
        query: str,
        checkpoint_dir: Path,
        *,
        pushed: Callable[[], Mapping[str, tuple[int, int]]],
        guard: Callable[[], None] | None = None,
        fence: Callable[[], int] | None = None,
        host: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.query = query
        self.checkpoint_dir = checkpoint_dir
        self._client = client
        self._pushed = pushed
        self.guard = guard
        self.fence = fence
        self.host = host if host is not None else socket.gethostname()
        self._wall_clock = wall_clock
        # The plans this writer wrote (batch id -> version), deleted once a newer one is
        # on the ring; None until the first write lists an earlier run's.
        self._written: dict[int, int] | None = None

    def write(self, batch_id: int, offsets: bytes) -> Plan:
        """Put batch ``batch_id``'s plan on the ring (``offsets``: the offset log entry
        Spark is writing); returns it once written. ``Fenced`` when a newer holder's."""
        paths, sources = self._unpushed()
        paths.append(f"offsets/{batch_id}")
        sources.append(_bytes_source(offsets))
        blobs = self._client.put_sources(sources)
        plan = Plan(
            self.query, batch_id, str(self.checkpoint_dir),
            tuple(ManifestFile(path, blob) for path, blob in zip(paths, blobs, strict=True)),
            planned_at=self._wall_clock(), host=self.host,
            query_id=read_query_id(self.checkpoint_dir),
            fence=None if self.fence is None else self.fence(),
        )  # fmt: skip
        if self.guard is not None:
            self.guard()
        version = self._put(plan)
        self._retain(batch_id, version)
        return plan

    def _unpushed(self) -> tuple[list[str], list[Source]]:
        """The checkpoint's ``metadata`` and source log files that the newest pushed cut
        does not hold as they are now."""
        pushed = self._pushed()
        entries = []
        if (self.checkpoint_dir / "sources").is_dir():  # not every source keeps a log
            entries = [
                (f"sources/{entry.path}", entry.size, entry.mtime_ns)
                for entry in list_checkpoint(self.checkpoint_dir / "sources")
            ]
        metadata = self.checkpoint_dir / "metadata"
        if "metadata" not in pushed and metadata.is_file():
            stat = metadata.stat()
            entries.append(("metadata", stat.st_size, stat.st_mtime_ns))
        paths: list[str] = []
        sources: list[Source] = []
        for path, size, mtime_ns in entries:
            if pushed.get(path) == (size, mtime_ns):
                continue
            check_plan_path(path)
            paths.append(path)
            sources.append(_bytes_source((self.checkpoint_dir / path).read_bytes()))
        if len(paths) >= PLAN_FILES_MAX:
            raise SR3Error(
                f"{self.checkpoint_dir}: {len(paths)} source log files since the last push; a "
                f"plan holds at most {PLAN_FILES_MAX - 1}"
            )
        return paths, sources

    def _put(self, plan: Plan) -> int:
        key = plan_key(self.query, plan.batch_id)
        value = compact_json(plan.to_json())
        refs = plan.chunk_ids()
        try:
            return self._client.put_record(key, value, expected_version=0, refs=refs)
        except RecordConflict:
            pass
        found = read_plan(self._client, self.query, plan.batch_id)
        current = 0
        if found is not None:
            earlier, current = found
            if (earlier.fence or 0) > (plan.fence or 0):
                raise Fenced(
                    f"batch {plan.batch_id} of query {self.query} was planned with fence "
                    f"{earlier.fence}, above this driver's {plan.fence}: another driver holds it"
                )
        return self._client.put_record(key, value, expected_version=current, refs=refs)

    def _retain(self, batch_id: int, version: int) -> None:
        """Delete the plans before ``batch_id``: their batches' manifests hold them."""
        if self._written is None:
            self._written = {}
            try:
                delete_plans(self._client, self.query, batch_id - 1)
            except SR3Error as exc:
                log.warning("sr3: earlier plans of query %s not deleted: %s", self.query, exc)
        for earlier in sorted(b for b in self._written if b < batch_id):
            try:
                self._client.delete_record(
                    plan_key(self.query, earlier), expected_version=self._written[earlier]
                )
            except RecordConflict:
                pass  # rewritten by another holder: its to keep
            except SR3Error as exc:  # deleted with the next plan
                log.warning("sr3: plan %d of query %s not deleted: %s", earlier, self.query, exc)
                continue
            del self._written[earlier]
        self._written[batch_id] = version


@dataclass(frozen=True, slots=True)
class PlacedPlan:
    """What ``place_plan`` laid down: the plan, and the files it wrote."""

    plan: Plan
    files: int


def place_plan(
    client: SyncClient,
    query: str,
    target: Path,
    after: int | None,
    topology: str = "auto",
) -> PlacedPlan | None:
    """Lay the plan of the batch after ``after`` (None: batch 0) down in checkpoint
    ``target``, which holds batch ``after`` committed: its source log files, then its
    offset log entry, each verified against its digest. None when the ring holds no such
    plan, or ``target`` committed that batch already. A plan of another run of the query
    (another query id) is not laid down (logged)."""
    batch_id = 0 if after is None else after + 1
    found = read_plan(client, query, batch_id)
    if found is None or (target / "commits" / str(batch_id)).exists():
        return None
    plan, _version = found
    local_id = read_query_id(target)
    if plan.query_id is not None and local_id is not None and plan.query_id != local_id:
        log.warning(
            "sr3 does not lay down the plan of batch %d of query %s: planned by query id %s, "
            "the checkpoint %s is query id %s", batch_id, query, plan.query_id, target, local_id,
        )  # fmt: skip
        return None
    if local_id is None and after is not None:
        raise ConfigError(f"{target} holds batch {after} but no metadata: not a checkpoint")
    staging = target.with_name(f".{target.name}.sr3-plan")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        fetch_files(client, plan.files, staging, topology)
        _stale_offsets(target, batch_id)
        # The offset log entry last: until it is in place the directory is the committed
        # batch's checkpoint, and from then on the planned batch's.
        for file in sorted(plan.files, key=lambda f: (f.path == plan.offsets_path, f.path)):
            destination = target / file.path
            destination.parent.mkdir(parents=True, exist_ok=True)
            _remove_checksum(destination)
            os.replace(staging / file.path, destination)
            fsync_dir(destination.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "sr3 laid down the plan of batch %d of query %s (planned at %s on %s, fence %s): "
        "%d files; the batch runs with its offsets", batch_id, query,
        "an unknown time" if plan.planned_at is None else format_wall(plan.planned_at),
        plan.host or "an unknown host", plan.fence, len(plan.files),
    )  # fmt: skip
    return PlacedPlan(plan, len(plan.files))


def _stale_offsets(target: Path, batch_id: int) -> None:
    """Remove offset log entries from ``batch_id`` on that ``target`` holds: planned
    here but never on the ring (their writes failed), so no batch ran with them."""
    offsets = target / "offsets"
    if not offsets.is_dir():
        return
    for entry in offsets.iterdir():
        name = entry.name
        if name.isascii() and name.isdigit() and int(name) >= batch_id:
            log.warning("sr3 removes %s: a plan the ring does not hold", entry)
            _remove_checksum(entry)
            entry.unlink()


def _remove_checksum(path: Path) -> None:
    """Remove Hadoop's checksum side file of ``path`` (``.<name>.crc``, written by its
    local file system): a file replaced under it would fail its check when read."""
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
