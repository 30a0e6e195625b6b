"""The connector benchmark's sizes and fixed figures: ``Settings`` (one field per
command-line option of ``bench_connector.py``), the ``--quick`` sizes, the targets, the
ring's shape and the state store providers measured."""

from __future__ import annotations

from dataclasses import dataclass

SEED = 20_240_601
MIB = 1024 * 1024
REPLICATION = 3
WRITE_QUORUM = 2
BASE_PORT = 7760
TARGET_OVERHEAD_RATIO = 1.05
TARGET_RESTART_RATIO = 1.2
TARGET_UPLOAD_RATIO = 1.0
FLUSH_TIMEOUT_S = 600.0
RECENT_PROGRESS_MAX = 100  # spark.sql.streaming.numRecentProgressUpdates
BUILD_BATCHES_MAX = 200
INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01: the minute the first events are about
EVENT_SECONDS_PER_FILE = 60
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
# Part 4's paths (connector_app.py --mode), in the order of its first trial; later
# trials rotate it so that each comes first, second and third alike.
APP_MODES = ("ring", "local", "ring-first")


@dataclass(frozen=True, slots=True)
class Settings:
    """Sizes of one run (see ``--help``)."""

    peers: int = 5
    spark_cores: int = 2
    driver_memory: str = "6g"
    partitions: int = 8
    providers: tuple[str, ...] = ("hdfs", "rocksdb")
    rows_per_batch: int = 20_000
    keys: int = 50_000
    warmup_batches: int = 20
    blocks: int = 8
    block_batches: int = 10
    upload_batches: int = 10
    state_mib: int = 256
    build_rows: int = 300_000
    restart_rows: int = 10_000
    restarts: int = 5
    # Part 3's third path, "overlap": the first batch on a restored copy while a restore
    # of the same cut runs into another directory. No restore that overlaps the query's
    # start, however well it ordered its files, can beat this on the same cores.
    overlap_bound: bool = True
    # Part 4: restarts as new applications (a process and JVM each), per path; 0: none.
    app_restarts: int = 5
    settle_s: float = 2.0
    # Where the peers keep their data (default: beside the checkpoints, on one disk).
    peer_root: str = ""
    restart: bool = True  # --no-restart: parts 1 and 2 only
    overhead: bool = True  # --no-overhead: the restart part only
    # The recovery topology of the restarts from the ring (star, line, tree or auto).
    restore_topology: str = "auto"
    # CPUs the peers are pinned to, comma-separated ("": unpinned, sharing every core);
    # Spark's JVM and this process are then pinned to the other CPUs.
    ring_cpus: str = ""


QUICK = Settings(
    providers=("hdfs", "rocksdb"), rows_per_batch=2_000, keys=5_000, warmup_batches=1,
    blocks=2, block_batches=3, upload_batches=3, state_mib=16, build_rows=50_000,
    restart_rows=1_000, restarts=1, app_restarts=1, settle_s=0.5,
)  # fmt: skip
