"""The per-byte CPU budget of sr3's write and read paths, stage by stage.

What one GiB of raw state costs in CPU seconds at each step a chunk goes through, on
this machine, measured in one process with ``time.process_time`` (no network, no other
process: the stages, not their scheduling):

- client write: the content address (xxh3-128), compression (zstd level 1, or the
  sampled decision to store raw), the payload checksum (xxh3-64), the body digest the
  request signature covers (SHA-256, or BLAKE3), once per replica or once per chunk;
- peer write, per replica: the body digest check, the chunk check before writing (the
  stored form's checksum, or a full decode: decompress and re-address), the file write
  and its fsync (CPU, and wall time beside it);
- read: the peer's stored-form check, the client's full decode.

Data: state-like synthetic bytes (``sr3.statedata``), and, with ``--spark``, the files of
real Spark checkpoints (a keyed aggregation holding SHA-256 strings, on the HDFS-backed
provider, whose delta and snapshot files are LZ4-compressed, and on RocksDB, whose SST
files are compressed), packed into 4 MiB chunks as the connector does. ``--checkpoint
DIR`` adds any checkpoint directory. Writes ``benchmarks/results/cpu-budget.json``; the
end-to-end CPU of the same paths with HTTP is in ``bench_store.py``'s "cores busy".

    python benchmarks/bench_cpu_budget.py [--size 256MiB] [--spark] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blake3
import xxhash
import zstandard

from ring import codec
from ring.config import parse_size
from ring.files import DirectIO, write_file_atomic
from sr3.statedata import state_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "cpu-budget.json"
CHUNK_BYTES = 4 * 1024 * 1024
GIB = 1024**3
REPLICATION = 3
SPARK_IDS_PER_FILE = 300_000
SPARK_FILES = 3
# zstd levels compared (``zstd_levels``): the default and the fast (negative) levels.
LEVELS = (3, 1, -1, -2, -3, -5)


def chunks_of_files(paths: list[Path]) -> list[bytes]:
    """The files' bytes packed back to back and cut every ``CHUNK_BYTES``."""
    buffer = bytearray()
    out: list[bytes] = []
    for path in sorted(paths):
        buffer += path.read_bytes()
        while len(buffer) >= CHUNK_BYTES:
            out.append(bytes(buffer[:CHUNK_BYTES]))
            del buffer[:CHUNK_BYTES]
    if buffer:
        out.append(bytes(buffer))
    return out


def state_like_chunks(size: int) -> list[bytes]:
    data = state_bytes(size, seed=7)
    return [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]


def sha256(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def blake3_digest(body: bytes) -> bytes:
    return blake3.blake3(body).digest()


def per_gib(raw_bytes: int, step: Callable[[], None], rounds: int = 1) -> float:
    """CPU seconds ``step`` takes per GiB of ``raw_bytes``."""
    started = time.process_time()
    for _ in range(rounds):
        step()
    return (time.process_time() - started) / rounds * GIB / raw_bytes


def each(step: Callable[[bytes], object], data: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        for item in data:
            step(item)

    return run


def measure(chunks: list[bytes], work: Path) -> dict[str, Any]:
    raw_bytes = sum(len(c) for c in chunks)
    compressor = zstandard.ZstdCompressor(level=codec.ZSTD_LEVEL)
    stored = [codec.encode(c, sample=False)[1] for c in chunks]
    stored_bytes = sum(len(s) for s in stored)
    sampled = [codec.encode(c)[1] for c in chunks]

    figures: dict[str, float] = {
        "address xxh3-128": per_gib(raw_bytes, each(xxhash.xxh3_128_digest, chunks)),
        "compress zstd-1 (always)": per_gib(raw_bytes, each(compressor.compress, chunks)),
        "compress decision by sample": per_gib(raw_bytes, each(codec.worth_compressing, chunks)),
        "encode, compressing every chunk (before)": per_gib(
            raw_bytes, each(lambda c: codec.encode(c, sample=False), chunks)
        ),
        "encode, sampled decision": per_gib(raw_bytes, each(codec.encode, chunks)),
        "body digest SHA-256": per_gib(raw_bytes, each(sha256, stored)),
        "body digest BLAKE3": per_gib(raw_bytes, each(blake3_digest, stored)),
        "check stored form (xxh3-64 of payload)": per_gib(
            raw_bytes, each(codec.verify_stored, stored)
        ),
        "full decode (decompress, re-address)": per_gib(raw_bytes, each(codec.decode_view, stored)),
        "full decode, sampled encoding": per_gib(raw_bytes, each(codec.decode_view, sampled)),
    }
    figures |= write_stages(stored, raw_bytes, work)
    return {
        "raw_bytes": raw_bytes,
        "chunks": len(chunks),
        "zstd_levels": zstd_levels(chunks),
        "stored_over_raw": stored_bytes / raw_bytes,
        "stored_over_raw_sampled": sum(len(s) for s in sampled) / raw_bytes,
        "cpu_s_per_gib": figures,
    }


def write_stages(stored: list[bytes], raw_bytes: int, work: Path) -> dict[str, float]:
    """A peer's file write and fsync of every stored chunk, CPU and wall per GiB raw:
    buffered into files that are removed at once (their pages reused), buffered into
    files kept as a peer keeps them (new page-cache pages each time), and with
    ``O_DIRECT`` (``ring.files.DirectIO``, what peers use where the file system takes
    it). The files are removed after each stage, untimed."""
    direct = DirectIO(buffers=1)
    folder = work / "writes"
    folder.mkdir(exist_ok=True)

    def buffered(path: Path, body: bytes) -> None:
        write_file_atomic(folder, path, body)

    def direct_write(path: Path, body: bytes) -> None:
        direct.write_atomic(folder, path, body)

    figures: dict[str, float] = {}
    for name, write, keep in (
        ("write and fsync a file, pages reused", buffered, False),
        ("write and fsync a file, kept (new pages)", buffered, True),
        ("write and fsync a file, O_DIRECT", direct_write, True),
    ):
        paths = [work / f"{index}.chunk" for index in range(len(stored))]
        wall_started = time.perf_counter()

        def write_all(
            write: Callable[[Path, bytes], None] = write,
            keep: bool = keep,
            paths: list[Path] = paths,
        ) -> None:
            for path, body in zip(paths, stored, strict=True):
                write(path, body)
                if not keep:
                    path.unlink()

        figures[f"{name} (CPU)"] = per_gib(raw_bytes, write_all)
        figures[f"{name} (wall)"] = (time.perf_counter() - wall_started) * GIB / raw_bytes
        for path in paths:
            path.unlink(missing_ok=True)
    return figures


def zstd_levels(chunks: list[bytes]) -> dict[str, dict[str, float]]:
    """Stored/raw and CPU per GiB raw of compressing and of a full decode at each level
    in ``LEVELS`` (every chunk compressed, no sampling): the level's trade-off."""
    raw_bytes = sum(len(c) for c in chunks)
    decompressor = zstandard.ZstdDecompressor()
    found: dict[str, dict[str, float]] = {}
    for level in LEVELS:
        compressor = zstandard.ZstdCompressor(level=level)
        packed = [compressor.compress(c) for c in chunks]
        found[str(level)] = {
            "stored_over_raw": sum(len(p) for p in packed) / raw_bytes,
            "compress_cpu_s_per_gib": per_gib(raw_bytes, each(compressor.compress, chunks)),
            "decode_cpu_s_per_gib": per_gib(
                raw_bytes,
                each(lambda p: xxhash.xxh3_128_digest(decompressor.decompress(p)), packed),
            ),
        }
    return found


def budget(stages: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per GiB raw written with R=3 (client once, each peer once): before the earlier
    work, after it, and with the content checked on every replica (``door``)."""
    before = {
        "client": stages["encode, compressing every chunk (before)"]
        + REPLICATION * stages["body digest SHA-256"],
        "peers": REPLICATION
        * (
            stages["body digest SHA-256"]
            + stages["full decode (decompress, re-address)"]
            + stages["write and fsync a file, kept (new pages) (CPU)"]
        ),
    }
    after = {
        # The writer decodes what it compressed before any replica sees it.
        "client": stages["encode, sampled decision"]
        + stages["body digest BLAKE3"]
        + stages["full decode, sampled encoding"],
        "peers": REPLICATION
        * (
            stages["body digest BLAKE3"]
            + stages["check stored form (xxh3-64 of payload)"]
            + stages["write and fsync a file, O_DIRECT (CPU)"]
        ),
    }
    door = {
        # Since issue 26 every replica decodes (decompress, re-address) before it writes,
        # and the writer no longer does.
        "client": stages["encode, sampled decision"] + stages["body digest BLAKE3"],
        "peers": REPLICATION
        * (
            stages["body digest BLAKE3"]
            + stages["full decode, sampled encoding"]
            + stages["write and fsync a file, O_DIRECT (CPU)"]
        ),
    }
    return {"before": before, "after": after, "door": door}


def spark_checkpoints(work: Path) -> dict[str, Path]:
    """Checkpoints of a keyed aggregation of SHA-256 strings on each provider."""
    from connector_spark import start_keys_query
    from pyspark.sql import SparkSession

    providers = {
        "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    }
    inputs = work / "ids"
    inputs.mkdir()
    for number in range(SPARK_FILES):
        first = number * SPARK_IDS_PER_FILE
        ids = range(first, first + SPARK_IDS_PER_FILE)
        (inputs / f"ids-{number}.txt").write_text("\n".join(map(str, ids)) + "\n")
    found: dict[str, Path] = {}
    for name, provider in providers.items():
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.sql.streaming.stateStore.providerClass", provider)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            checkpoint = work / f"checkpoint-{name}"
            start_keys_query(spark, inputs, checkpoint, available_now=True).awaitTermination()
        finally:
            spark.stop()
        found[f"spark {name} checkpoint"] = checkpoint
    return found


def files_under(directory: Path) -> Iterator[Path]:
    for path in directory.rglob("*"):
        if path.is_file() and not path.name.endswith(".crc"):
            yield path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB", type=parse_size)
    parser.add_argument("--spark", action="store_true", help="build real Spark checkpoints")
    parser.add_argument("--checkpoint", action="append", default=[], type=Path)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "chunk_bytes": CHUNK_BYTES,
        "data": {},
    }
    with tempfile.TemporaryDirectory(prefix="sr3-budget-") as temporary:
        work = Path(temporary)
        sets: dict[str, list[bytes]] = {"state-like (synthetic)": state_like_chunks(args.size)}
        directories = {str(d): d for d in args.checkpoint}
        if args.spark:
            directories |= {k: v for k, v in spark_checkpoints(work).items()}
        for name, directory in directories.items():
            sets[name] = chunks_of_files(list(files_under(directory)))
        for name, chunks in sets.items():
            figure = measure(chunks, work)
            figure["budget_cpu_s_per_gib"] = budget(figure["cpu_s_per_gib"])
            results["data"][name] = figure
            print(f"\n{name}: {figure['raw_bytes'] / 2**20:.0f} MiB in {figure['chunks']} "
                  f"chunks, stored/raw {figure['stored_over_raw']:.2f} "
                  f"(sampled {figure['stored_over_raw_sampled']:.2f})")  # fmt: skip
            for stage, seconds in figure["cpu_s_per_gib"].items():
                print(f"  {stage:45} {seconds:6.3f} s/GiB")
            for level, row in figure["zstd_levels"].items():
                print(f"  zstd level {level:>3}: stored/raw {row['stored_over_raw']:.3f}, "
                      f"compress {row['compress_cpu_s_per_gib']:.2f} s/GiB, "
                      f"decode {row['decode_cpu_s_per_gib']:.2f} s/GiB")  # fmt: skip
            for when, sides in figure["budget_cpu_s_per_gib"].items():
                print(f"  budget {when:6}: client {sides['client']:.2f} s/GiB, peers "
                      f"{sides['peers']:.2f} s/GiB (R={REPLICATION})")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
