"""Keeping a standby's checkpoint directory at the ring's newest batch, fetching only
what changed.

``Puller.pull()`` reads the query's newest manifest; when it is newer than the batch the
directory holds, it fetches the files this puller does not hold with the same digest
(new state deltas, snapshots, SST files, the offset and commit logs: what the batch
changed), each verified against its digest, into a staging directory beside the target;
then moves them into place, state files first and the commit log last, and deletes the
files the manifest no longer names (those Spark's retention dropped). So the directory
is always a checkpoint Spark can start from: the previous batch's until the commit file
moves in, the new batch's after.

The first pull of a puller is a whole ``restore_manifest`` (the directory may hold an
earlier state of the same query from a previous run, or nothing); what a pull fetched
is remembered by path and digest in memory only, so a restarted standby starts again
with a whole restore.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ring.errors import SR3Error
from ring.files import fsync_dir
from ring.sync_client import SyncClient
from spark_connector.manifest import Manifest, ManifestFile
from spark_connector.restore import fetch_files, newest_manifest, restore_manifest, rewrite_root

__all__ = ["PullReport", "Puller"]

log = logging.getLogger(__name__)

# Files moved in last, in this order: the offset log, then the commit log that makes
# the batch committed.
_LAST = ("offsets/", "commits/")


@dataclass(frozen=True, slots=True)
class PullReport:
    """One pull: the batch the directory holds now, the files and bytes fetched for it
    (all of them on a first pull), the files deleted, and the manifest's whole size."""

    batch_id: int
    files_fetched: int
    bytes_fetched: int
    files_deleted: int
    bytes_total: int
    seconds: float
    whole: bool


class Puller:
    """Brings ``target`` to the newest batch of ``query`` on the ring, incrementally."""

    def __init__(
        self,
        client: SyncClient,
        query: str,
        target: Path,
        *,
        topology: str = "auto",
        overwrite: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.query = query
        self.target = target
        self.topology = topology
        self.overwrite = overwrite
        self._client = client
        self._clock = clock
        # path -> digest of every file the directory holds as a manifest named it; None
        # before the first pull.
        self._held: dict[str, str] | None = None
        self.batch_id: int | None = None
        self.root: str | None = None

    def behind(self, manifest: Manifest) -> tuple[int, int]:
        """How far the directory is behind ``manifest``: batches, and bytes to fetch."""
        held = self._held or {}
        missing = sum(f.blob.size for f in manifest.files if held.get(f.path) != f.blob.digest)
        batches = manifest.batch_id - (-1 if self.batch_id is None else self.batch_id)
        return max(0, batches), missing

    def newest(self) -> Manifest | None:
        return newest_manifest(self._client, self.query)

    def pull(self, manifest: Manifest | None = None) -> PullReport | None:
        """Bring the directory to ``manifest`` (default: the newest on the ring); None
        when it holds that batch already or the ring has none."""
        if manifest is None:
            manifest = self.newest()
        if manifest is None or (self.batch_id is not None and manifest.batch_id <= self.batch_id):
            return None
        started = self._clock()
        if self._held is None:
            return self._first(manifest, started)
        wanted = [f for f in manifest.files if self._held.get(f.path) != f.blob.digest]
        if manifest.root != self.root:
            raise SR3Error(
                f"query {self.query}'s batch {manifest.batch_id} comes from checkpoint "
                f"{manifest.root}, not {self.root}: another run; restart the standby"
            )
        self._fetch(manifest, wanted)
        deleted = self._delete_unnamed(manifest)
        self._held = {f.path: f.blob.digest for f in manifest.files}
        self.batch_id = manifest.batch_id
        return PullReport(
            manifest.batch_id, len(wanted), sum(f.blob.size for f in wanted), deleted,
            manifest.size, self._clock() - started, whole=False,
        )  # fmt: skip

    def _first(self, manifest: Manifest, started: float) -> PullReport:
        report = restore_manifest(
            self._client, manifest, self.target, self.topology, overwrite=self.overwrite
        )
        if report.action == "kept-local" and report.batch_id != manifest.batch_id:
            raise SR3Error(
                f"{self.target} holds batch {report.batch_id} of query {self.query}, newer than "
                f"the ring's {manifest.batch_id}: a standby's directory must not run ahead"
            )
        self._held = {f.path: f.blob.digest for f in manifest.files}
        self.batch_id, self.root = manifest.batch_id, manifest.root
        fetched = report.bytes_total if report.action == "restored" else 0
        return PullReport(
            manifest.batch_id, report.files, fetched, 0, manifest.size,
            self._clock() - started, whole=True,
        )  # fmt: skip

    def _fetch(self, manifest: Manifest, files: list[ManifestFile]) -> None:
        if not files:
            return
        staging = self.target.with_name(f".{self.target.name}.sr3-pulling")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            fetch_files(self._client, files, staging, self.topology)
            rewrite_root(staging, manifest.root, str(self.target))
            for file in sorted(files, key=_move_order):
                destination = self.target / file.path
                destination.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / file.path, destination)
            for directory in {(self.target / f.path).parent for f in files}:
                fsync_dir(directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _delete_unnamed(self, manifest: Manifest) -> int:
        """Delete the files this puller placed that ``manifest`` no longer names."""
        named = {f.path for f in manifest.files}
        deleted = 0
        for path in sorted(set(self._held or {}) - named):
            try:
                (self.target / path).unlink()
                deleted += 1
            except FileNotFoundError:
                pass
        return deleted


def _move_order(file: ManifestFile) -> tuple[int, str]:
    for rank, prefix in enumerate(_LAST, start=1):
        if file.path.startswith(prefix):
            return rank, file.path
    return 0, file.path
