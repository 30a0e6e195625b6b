"""What cutting a checkpoint costs a push, against the partitions and the versions Spark
retains.

Each push lists the query's checkpoint directory and cuts it at the newest committed
batch (``spark_connector.checkpoint.read_cut``). Spark keeps
``spark.sql.streaming.minBatchesToRetain`` (100) versions of every partition's state, of
which a cut needs a few; a push now cuts from the bases of its last cut
(``version_floors``) and reads the other versions' names no further. This builds
HDFS-provider checkpoints on disk (a delta per partition and version, a snapshot every
10, their ``.crc`` files, offsets, commits and source logs) with 8 and 200 partitions and
10 and 100 retained versions, and times the cut of the newest batch both ways (CPU
seconds of this process, the best of ``--repeat``). Writes
``benchmarks/results/push-cut.json``:

    python benchmarks/bench_push_cut.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_connector.checkpoint import read_cut
from spark_connector.cut import version_floors

RESULTS = Path(__file__).resolve().parent / "results" / "push-cut.json"
PARTITIONS = (8, 200)
VERSIONS = (10, 100)


def build(root: Path, partitions: int, versions: int) -> None:
    for directory in ("offsets", "commits", "sources/0"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text('{"id":"q"}')
    conf = f'{{"batchWatermarkMs":0,"conf":{{"spark.sql.shuffle.partitions":"{partitions}"}}}}'
    for batch in range(versions):
        (root / "offsets" / str(batch)).write_text(f'v1\n{conf}\n{{"logOffset":{batch}}}')
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (root / "sources/0" / str(batch)).write_text(f'v1\n{{"path":"in/{batch}"}}')
    for partition in range(partitions):
        store = root / "state/0" / str(partition)
        store.mkdir(parents=True)
        for version in range(1, versions + 1):
            (store / f"{version}.delta").write_bytes(b"d" * 100)
            (store / f".{version}.delta.crc").write_bytes(b"c")
            if version % 10 == 0:
                (store / f"{version}.snapshot").write_bytes(b"s" * 200)
                (store / f".{version}.snapshot.crc").write_bytes(b"c")


def cpu_s(step: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        step()
        best = min(best, time.process_time() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    points = []
    with tempfile.TemporaryDirectory(prefix="sr3-push-cut-") as temporary:
        for partitions in PARTITIONS:
            for versions in VERSIONS:
                root = Path(temporary) / f"p{partitions}-v{versions}"
                build(root, partitions, versions)
                batch = versions - 1
                floors = version_floors(read_cut(root, batch - 1))
                full = read_cut(root, batch)
                assert read_cut(root, batch, floors=floors) == full
                point = {
                    "partitions": partitions,
                    "versions_retained": versions,
                    "files": sum(1 for path in root.rglob("*") if path.is_file()),
                    "full_listing_cpu_s": cpu_s(
                        lambda r=root, b=batch: read_cut(r, b), args.repeat
                    ),
                    "from_last_bases_cpu_s": cpu_s(
                        lambda r=root, b=batch, f=floors: read_cut(r, b, floors=f), args.repeat
                    ),
                }
                points.append(point)
                print(f"{partitions:4} partitions, {versions:3} versions ({point['files']} files): "
                      f"full listing {point['full_listing_cpu_s'] * 1000:.1f} ms, from the last "
                      f"cut's bases {point['from_last_bases_cpu_s'] * 1000:.1f} ms",
                      flush=True)  # fmt: skip
    RESULTS.write_text(json.dumps({"points": points}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
