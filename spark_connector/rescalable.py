"""What a rescale may bring to another number of state partitions, the check that refuses
the rest in one line before anything is written, and the runner for the state store
provider Spark's runner refuses.

Spark's offline runner (``StreamingCheckpointManager.repartition``, PySpark 4.3) reads
each stateful operator's state with its ``statestore`` reader, spreads it over the new
partitions by the operator's partition key, and writes it as a new batch. It refuses
some checkpoints itself (the HDFS-backed provider, operators it has no partition key
for) — after writing the new batch's offsets, which leaves a checkpoint Spark will not
start the query from — with messages that do not always say why in their first line;
and it writes some that the query then gets wrong (a stream-stream join in state format
4). Only what the rescale matrix (tests/test_rescale_matrix.py) showed to give the
answers of a query never rescaled is let through: every other operator, provider or
state layout is refused here, naming it, before any runner starts — so nothing reaches
the ring or the checkpoint.

For the HDFS-backed provider sr3 has a runner of its own (``run_repartition``, the
JVM's ``sr3.hadoop.HdfsStateRepartition`` in sr3's jar): the same steps as Spark's,
each store read and written through the provider itself, each row placed by Spark's own
partition key extractor and shuffle hash.

The table is by the names Spark writes in the checkpoint: each operator's name in its
operator metadata (the ``state-metadata`` source) and the settings of the offset log
entry of the batch being rescaled (Spark pins them there for the life of the query).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_connector.cut import CheckpointError

__all__ = [
    "LAYOUTS",
    "OPERATORS",
    "PROVIDERS",
    "REFUSED_OPERATORS",
    "refusal",
    "rescale_refusal",
    "run_repartition",
]

log = logging.getLogger(__name__)

# An offset or commit log entry is read up to this (Spark's are a few KiB).
LOG_ENTRY_BYTES_MAX = 1 << 20
# Where sr3's runner for the HDFS-backed provider writes the new stores before it moves
# them into place: hidden, so no cut of the checkpoint takes it, and removed afterwards.
HDFS_SCRATCH = ".sr3-rescale"
UNVERIFIED = "not shown to give the answers of a query never rescaled, so not offered"

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
JOIN_FORMAT_CONF = "spark.sql.streaming.join.stateFormatVersion"
# Spark's defaults when an offset log entry does not name the setting.
DEFAULTS = {PROVIDER_CONF: HDFS, JOIN_FORMAT_CONF: "2"}

# Operators Spark's runner rescales with the answers of a query never rescaled, by their
# name in the operator metadata, and what users call them. flatMapGroupsWithState and
# the JVM's transformWithState keep the state of their Python forms (the same operator
# classes and state layout); the matrix runs the Python forms.
OPERATORS: Mapping[str, str] = {
    "stateStoreSave": "streaming aggregation",
    "dedupe": "dropDuplicates",
    "dedupeWithinWatermark": "dropDuplicatesWithinWatermark",
    "sessionWindowStateStoreSaveExec": "session window aggregation",
    "symmetricHashJoin": "stream-stream join",
    "flatMapGroupsWithState": "flatMapGroupsWithState",
    "applyInPandasWithState": "applyInPandasWithState",
    "transformWithStateExec": "transformWithState",
    "transformWithStateInPandasExec": "transformWithStateInPandas",
    "transformWithStateInPySparkExec": "transformWithState (Python)",
}
# Operators known not to be rescalable, and why (anything else not in OPERATORS is
# refused as not verified).
REFUSED_OPERATORS: Mapping[str, str] = {
    "globalLimit": "a streaming limit: Spark's runner has no partition key for its state",
    "StatefulStreamlineAggregate": (
        "the streamline aggregation of real-time mode: Spark's runner has no partition key "
        "for its state"
    ),
}
# State store providers a rescale supports: RocksDB's by Spark's runner, the HDFS-backed
# one (which Spark's runner refuses) by sr3's (``run_repartition``).
PROVIDERS: Mapping[str, str] = {ROCKSDB: "RocksDB", HDFS: "HDFS-backed"}
# Settings of the state's layout, the values verified, and why the others are refused.
LAYOUTS: Mapping[str, tuple[frozenset[str], str]] = {
    JOIN_FORMAT_CONF: (
        frozenset({"2", "3"}),
        "stream-stream join state format {value} cannot be rescaled: Spark's runner loses "
        "rows of it (format 4 keeps the rows of one join key and event time as several "
        "values of one state key, and the runner writes one of them back)",
    ),
}


def refusal(
    conf: Mapping[str, str],
    operators: Mapping[int, str] | None,
    *,
    commit_version: str = "v1",
    checkpoint: str = "",
) -> str | None:
    """Why a checkpoint whose newest batch has these settings (``conf``, its offset log
    entry's), stateful operators (id: name in the operator metadata; None: the metadata
    could not be read) and commit log version (``v2``: state checkpoint format 2) must
    not be rescaled, in one line; None when Spark's runner is known to rescale it right."""
    where = f"{checkpoint}: " if checkpoint else ""
    if not operators:
        return (
            f"{where}no stateful operator metadata (a stateless query, or one first run "
            "before Spark 4.0): Spark's runner needs it"
        )
    provider = conf.get(PROVIDER_CONF, DEFAULTS[PROVIDER_CONF])
    if provider not in PROVIDERS:
        return (
            f"{where}the state store provider {provider} cannot be rescaled: Spark's runner "
            "reads and writes RocksDB's stores only, sr3's the HDFS-backed provider's"
        )
    for operator_id, name in sorted(operators.items()):
        if name not in OPERATORS:
            why = REFUSED_OPERATORS.get(name, UNVERIFIED)
            return f"{where}operator {operator_id} ({name}) cannot be rescaled: {why}"
    if commit_version != "v1":
        return (
            f"{where}state checkpoint format version 2 (a commit log {commit_version[:8]}) "
            "cannot be rescaled: sr3 keeps checkpoints of format version 1 only"
        )
    for key, (verified, why) in LAYOUTS.items():
        if key == JOIN_FORMAT_CONF and "symmetricHashJoin" not in operators.values():
            continue
        value = conf.get(key, DEFAULTS[key])
        if value not in verified:
            return where + why.format(value=value)
    return None


def run_repartition(spark: Any, checkpoint: Path | str, partitions: int, base: int | None) -> None:
    """Rescale the stopped query's ``checkpoint`` (its newest committed batch ``base``)
    to ``partitions``: Spark's runner for RocksDB's provider; for the HDFS-backed one,
    which Spark's runner refuses, sr3's (``sr3.hadoop.HdfsStateRepartition`` in sr3's
    jar: the runner's steps, reading and writing each store through the provider
    itself). Errors come back as Spark's runner raises them."""
    if base is None or _provider(spark, checkpoint, base) != HDFS:
        spark._streamingCheckpointManager.repartition(str(checkpoint), partitions)
        return
    runner = spark._jvm.sr3.hadoop.HdfsStateRepartition
    scratch = f"{str(checkpoint).rstrip('/')}/{HDFS_SCRATCH}"
    jvm = spark._jvm
    scratch_path = jvm.org.apache.hadoop.fs.Path(scratch)
    fs = scratch_path.getFileSystem(spark._jsc.hadoopConfiguration())
    try:
        runner.rescale(spark._jsparkSession, str(checkpoint), partitions, scratch)
    finally:
        fs.delete(scratch_path, True)


def _provider(spark: Any, checkpoint: Path | str, batch_id: int) -> str:
    conf = _offsets_conf(batch_id, _head(spark, f"{checkpoint}/offsets/{batch_id}"))
    return conf.get(PROVIDER_CONF, DEFAULTS[PROVIDER_CONF])


def rescale_refusal(spark: Any, checkpoint: Path | str, batch_id: int) -> str | None:
    """``refusal`` for ``checkpoint`` rescaled from its batch ``batch_id``, read through
    the session's Hadoop file system (so an ``sr3://`` checkpoint too)."""
    from py4j.java_gateway import JavaClass

    conf = _offsets_conf(batch_id, _head(spark, f"{checkpoint}/offsets/{batch_id}"))
    commit = _head(spark, f"{checkpoint}/commits/{batch_id}")
    why = refusal(
        conf,
        _operators(spark, checkpoint, batch_id),
        commit_version=commit.partition("\n")[0].strip(),
        checkpoint=str(checkpoint),
    )
    hdfs = conf.get(PROVIDER_CONF, DEFAULTS[PROVIDER_CONF]) == HDFS
    if (
        why is None
        and hdfs
        and not isinstance(spark._jvm.sr3.hadoop.HdfsStateRepartition, JavaClass)
    ):
        return (
            f"{checkpoint}: the HDFS-backed provider's state is rescaled by sr3's jar, which "
            "this SparkSession lacks: start it with spark_connector.local_conf() (spark.jars)"
        )
    return why


def _head(spark: Any, uri: str) -> str:
    """A checkpoint log entry, up to its first ``LOG_ENTRY_BYTES_MAX`` bytes."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)
    try:
        bounded = jvm.org.apache.commons.io.input.BoundedInputStream(stream, LOG_ENTRY_BYTES_MAX)
        head = jvm.org.apache.commons.io.IOUtils.toByteArray(bounded)
    finally:
        stream.close()
    return bytes(head).decode("utf-8", errors="replace")


def _offsets_conf(batch_id: int, text: str) -> dict[str, str]:
    """The settings of an offset log entry (its second line's ``conf``, in both offset
    log formats)."""
    lines = text.split("\n")
    try:
        conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
    except (ValueError, AttributeError) as exc:
        raise CheckpointError(f"offsets/{batch_id}: cannot read it: {exc}") from exc
    if not isinstance(conf, dict):
        raise CheckpointError(f"offsets/{batch_id}: its conf is not an object")
    return {str(key): str(value) for key, value in conf.items()}


def _operators(spark: Any, checkpoint: Path | str, batch_id: int) -> dict[int, str] | None:
    """Each stateful operator's name in its metadata as of ``batch_id``; None when the
    checkpoint has none (Spark's ``state-metadata`` source refuses it)."""
    try:
        rows = (
            spark.read.format("state-metadata")
            .option("batchId", batch_id)
            .load(str(checkpoint))
            .collect()
        )
    except Exception as exc:  # PySpark's translations of the source's refusals
        log.info("sr3: no operator metadata in %s: %s", checkpoint, str(exc)[:300])
        return None
    return {int(row["operatorId"]): str(row["operatorName"]) for row in rows}
