"""What the connector benchmark measures with and what its phases share: the CPU time of
this process, Spark's JVM and the peers; checkpoint listings and sizes; a ``StateSync``
that records each push; the ring's stored bytes; and ``Bench``, the session, cluster and
settings every phase runs with.

Imported by ``bench_connector.py``, which puts the repository root on ``sys.path``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_settings import FLUSH_TIMEOUT_S, Settings
from connector_stats import Listing, new_files
from proc_cpu import cpu_seconds

from ring.sync_client import SyncClient
from spark_connector.checkpoint import read_cut
from spark_connector.sync import PushReport, StateSync
from sr3.local import LocalCluster


@dataclass(frozen=True, slots=True)
class Processes:
    """The processes whose CPU time is accounted: this one, Spark's JVM and the peers."""

    python: int
    jvm: int
    peers: tuple[int, ...]

    def sample(self) -> dict[str, float | None]:
        peers = [cpu_seconds(pid) for pid in self.peers]
        return {
            "python": cpu_seconds(self.python),
            "jvm": cpu_seconds(self.jvm),
            "peers": None if None in peers else sum(p or 0.0 for p in peers),
        }


def listing(root: Path) -> Listing:
    """Every file under ``root``: relative path -> (size, mtime_ns); vanishing files skipped."""
    found: Listing = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def tree_bytes(root: Path) -> int:
    return sum(size for size, _ in listing(root).values())


def cut_state_bytes(root: Path) -> tuple[int, int]:
    """Bytes and files under ``state/`` in the cut of the newest committed batch."""
    state = [entry for entry in read_cut(root).files if entry.path.startswith("state/")]
    return sum(entry.size for entry in state), len(state)


def settle(seconds: float) -> None:
    """Flush dirty pages of the previous phase and idle, so that neither lands in the next."""
    os.sync()
    time.sleep(seconds)


class RecordingSync(StateSync):
    """``StateSync`` that keeps each push's report and duration (its worker drops them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pushes: list[tuple[PushReport, float]] = []
        self._pushes_lock = threading.Lock()

    def push(self, batch_id: int | None = None) -> PushReport:
        started = time.perf_counter()
        report = super().push(batch_id)
        with self._pushes_lock:
            self._pushes.append((report, time.perf_counter() - started))
        return report

    def take_pushes(self) -> list[tuple[PushReport, float]]:
        with self._pushes_lock:
            pushes, self._pushes = self._pushes, []
        return pushes

    def wait_pushed(self, batch_id: int) -> float:
        """Note ``batch_id`` as committed (its progress event may still be on the listener
        bus) and wait until it is on the ring; the seconds waited."""
        started = time.perf_counter()
        self.committed(batch_id)
        self.flush(timeout_s=FLUSH_TIMEOUT_S)
        return time.perf_counter() - started


def ring_stored_bytes(client: SyncClient) -> int:
    """Chunk bytes on all peers (every replica, stored compressed)."""
    status = client.status()
    down = [peer.peer_id for peer in status.peers if peer.stored_bytes is None]
    if down:
        raise RuntimeError(f"peers did not answer the status probe: {down}")
    return sum(peer.stored_bytes or 0 for peer in status.peers)


def step_figures(sync: RecordingSync, before: Listing, after: Listing) -> dict[str, Any]:
    pushes = sync.take_pushes()
    created = new_files(before, after)
    uploaded = sum(report.bytes_read for report, _ in pushes)
    return {
        "pushes": len(pushes),
        "push_s": [round(seconds, 3) for _, seconds in pushes],
        "uploaded_bytes": uploaded,
        "new_files": created.files,
        "new_bytes_visible": created.bytes_visible,
        "new_bytes_all": created.bytes_all,
        "cut_files": pushes[-1][0].files if pushes else None,
        "cut_bytes": pushes[-1][0].bytes_total if pushes else None,
    }


@dataclass(frozen=True, slots=True)
class Bench:
    """What every phase shares."""

    spark: Any
    cluster: LocalCluster
    client: SyncClient
    processes: Processes
    settings: Settings
    work: Path
    log: Callable[[str], None]
