"""One application restart of the connector benchmark's part 4, in a process of its own.

A restart after a lost machine is a new application: a new Python process, a new JVM
and SparkSession, then the query on the checkpoint directory. This script is that
application. ``--mode``:

- ``local``: the directory already holds an intact copy of the checkpoint;
- ``ring``: the directory is empty; ``StateSync.restore_in_background`` fetches the
  ring's newest batch while the SparkSession starts, and the query starts once both are
  done (what docs/spark-connector.md tells an application to do);
- ``ring-first``: the same restore, finished before the SparkSession starts.

Then the keys query runs its one batch (``availableNow``). Prints one JSON line: seconds
from ``--t0`` (``time.time()`` when the parent started this process) to each step, and
the CPU seconds this process and its JVM had used when the batch was done.
The ring's secret comes from ``SR3_SECRET``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from connector_restart import check_restored, run_first_batch
from connector_settings import APP_MODES, PROVIDER_CONF, PROVIDERS, Settings
from connector_spark import jvm_pid, start_spark
from proc_cpu import cpu_seconds

from spark_connector.sync import StateSync

DEFAULTS = Settings()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mode", choices=APP_MODES, required=True)
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--ring", required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--local-dir", type=Path, required=True)
    parser.add_argument("--batch-id", type=int, required=True, help="the batch to restore")
    parser.add_argument("--topology", default="auto")
    parser.add_argument("--spark-cores", type=int, default=DEFAULTS.spark_cores)
    parser.add_argument("--driver-memory", default=DEFAULTS.driver_memory)
    parser.add_argument("--partitions", type=int, default=DEFAULTS.partitions)
    figures = run(parser.parse_args())
    print(json.dumps(figures), flush=True)
    return 0


def run(args: argparse.Namespace) -> dict[str, object]:
    t0 = args.t0
    marks: dict[str, float] = {"imported_s": time.time() - t0}
    sync = None if args.mode == "local" else StateSync(args.ring, args.query, args.checkpoint)
    try:
        restoring = None
        if sync is not None and args.mode == "ring":
            restoring = sync.restore_in_background(topology=args.topology)
        elif sync is not None:
            restored = sync.restore(topology=args.topology)
            marks["restored_s"] = time.time() - t0
            check_restored(restored, args.batch_id)
        settings = Settings(
            spark_cores=args.spark_cores,
            driver_memory=args.driver_memory,
            partitions=args.partitions,
        )
        spark = start_spark(settings, args.local_dir)
        spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
        marks["session_s"] = time.time() - t0
        if restoring is not None:
            check_restored(restoring.result(), args.batch_id)
            marks["restored_s"] = time.time() - t0
        first_batch_s, batch = run_first_batch(
            spark, args.input, args.checkpoint, args.batch_id + 1
        )
        marks["done_s"] = time.time() - t0
        marks["first_batch_s"] = first_batch_s
        times = os.times()
        cpu_s = {"python": round(times.user + times.system, 2), "jvm": cpu_seconds(jvm_pid(spark))}
        recovery = sync.last_restore.recovery if sync and sync.last_restore else None
        figures = {
            "mode": args.mode,
            **{name: round(value, 3) for name, value in marks.items()},
            "restore_s": round(recovery.seconds, 3) if recovery else None,
            "topology": recovery.topology if recovery else None,
            "state_rows": batch.state_rows,
            "cpu_s": cpu_s,
        }
        spark.stop()
    finally:
        if sync is not None:
            sync.close()
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
