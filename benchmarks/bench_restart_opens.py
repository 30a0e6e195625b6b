"""When the first batch after a restart opens each checkpoint file: how much of a
restore could overlap the query's start, were Spark made to wait for a file still
arriving instead of finding it missing.

Builds the connector benchmark's restart state (the keys query, RocksDB provider, 8
partitions, ``--batches`` files of 300 000 new ids, ``availableNow``), then ``--restarts``
times, on a fresh copy of the checkpoint in the same warm SparkSession, runs the first
batch after the restart (one file of 10 000 ids) while inotify records every open under
the copy. Per restart: seconds from ``start()`` to the batch's end, to the first open of
any file, of a state file (``.zip`` or ``.sst``) and of the last state file opened.
The first restart warms the JVM and is not counted. Writes
``benchmarks/results/restart-opens.json``. Linux only. Run from the repository root:

    python benchmarks/bench_restart_opens.py [--batches 7] [--restarts 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from connector_settings import PROVIDER_CONF, PROVIDERS, Settings
from connector_spark import start_keys_query, start_spark, write_ids

RESULTS = Path(__file__).parent / "results" / "restart-opens.json"
IN_OPEN = 0x20
EVENT = struct.Struct("iIII")  # struct inotify_event without its name
BUILD_IDS = 300_000
RESTART_IDS = 10_000
READ_BYTES = 65536


class Opens:
    """inotify on every directory under ``root``: the first time each file was opened."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init()
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init failed")
        self.dirs: dict[int, Path] = {}
        for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            watch = self.libc.inotify_add_watch(self.fd, str(directory).encode(), IN_OPEN)
            if watch < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory} failed")
            self.dirs[watch] = directory
        self.first: dict[str, float] = {}
        self.thread = threading.Thread(target=self._read, name="inotify", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                buffer = os.read(self.fd, READ_BYTES)
            except OSError:
                return  # closed
            now = time.perf_counter()
            offset = 0
            while offset < len(buffer):
                watch, _mask, _cookie, length = EVENT.unpack_from(buffer, offset)
                start = offset + EVENT.size
                name = buffer[start : start + length].rstrip(b"\0").decode()
                path = str((self.dirs[watch] / name).relative_to(self.root))
                self.first.setdefault(path, now)
                offset = start + length

    def close(self) -> None:
        os.close(self.fd)
        self.thread.join(timeout=5)


def restart(spark: Any, input_dir: Path, checkpoint: Path, target: Path) -> dict[str, Any]:
    shutil.copytree(checkpoint, target)
    opens = Opens(target)
    try:
        time.sleep(1.0)  # the copy's writeback and the watcher settle
        started = time.perf_counter()
        query = start_keys_query(spark, input_dir, target, available_now=True)
        query.awaitTermination()
        batch_s = time.perf_counter() - started
        time.sleep(0.3)  # late events
    finally:
        opens.close()
    since = {path: at - started for path, at in opens.first.items() if at >= started}
    state = [at for path, at in since.items() if path.startswith("state/") and _is_state(path)]
    return {
        "batch_s": round(batch_s, 3),
        "first_open_s": round(min(since.values()), 3),
        "first_state_open_s": round(min(state), 3),
        "last_state_open_s": round(max(state), 3),
        "state_files_opened": len(state),
    }


def _is_state(path: str) -> bool:
    return path.endswith(".zip") or path.endswith(".sst")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--restarts", type=int, default=5)
    args = parser.parse_args()
    if args.batches < 1 or args.restarts < 1:
        parser.error("--batches and --restarts must be positive")
    with tempfile.TemporaryDirectory(prefix="sr3-opens-") as work:
        root = Path(work)
        input_dir, checkpoint = root / "in", root / "ckpt"
        for index in range(args.batches):
            write_ids(input_dir, index, index * BUILD_IDS, BUILD_IDS)
        spark = start_spark(Settings(), root / "local")
        spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
        try:
            start_keys_query(spark, input_dir, checkpoint, available_now=True).awaitTermination()
            write_ids(input_dir, args.batches, args.batches * BUILD_IDS, RESTART_IDS)
            trials = []
            for trial in range(args.restarts + 1):  # the first warms the JVM
                target = root / f"restart-{trial}"
                figures = restart(spark, input_dir, checkpoint, target)
                shutil.rmtree(target)
                print(f"restart {trial}{' (warm-up)' if trial == 0 else ''}: {figures}")
                if trial:
                    trials.append(figures)
        finally:
            spark.stop()
    names = ("batch_s", "first_open_s", "first_state_open_s", "last_state_open_s")
    medians = {name: statistics.median(t[name] for t in trials) for name in names}
    RESULTS.write_text(
        json.dumps({"batches": args.batches, "medians": medians, "trials": trials}, indent=2) + "\n"
    )
    print(f"medians: {medians}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
