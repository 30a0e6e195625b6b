"""What a rescale may bring to another number of state partitions, and the check that
refuses the rest in one line before anything is written.

Spark's offline runner (``StreamingCheckpointManager.repartition``, PySpark 4.3) reads
each stateful operator's state with its ``statestore`` reader, spreads it over the new
partitions by the operator's partition key, and writes it as a new batch. It refuses
some checkpoints itself (the HDFS-backed provider, operators it has no partition key
for), with messages that do not always say why in their first line; and it writes some
that the query then cannot run (a stream-stream join in state format 4). Only what the
rescale matrix (tests/test_rescale_matrix.py) showed to give the answers of a query
never rescaled is let through: every other operator, provider or state layout is
refused here, naming it, before Spark's runner starts — so nothing reaches the ring.

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
]

log = logging.getLogger(__name__)

# An offset or commit log entry is read up to this (Spark's are a few KiB).
LOG_ENTRY_BYTES_MAX = 1 << 20
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
# State store providers Spark's runner rescales.
PROVIDERS: Mapping[str, str] = {ROCKSDB: "RocksDB"}
PROVIDER_REFUSALS: Mapping[str, str] = {
    HDFS: (
        "the HDFS-backed state store provider cannot be rescaled by Spark's runner: it reads "
        "and writes RocksDB's stores only (UNSUPPORTED_PROVIDER); a query keeps its provider "
        "for the life of its checkpoint"
    ),
}
# Settings of the state's layout, the values verified, and why the others are refused.
LAYOUTS: Mapping[str, tuple[frozenset[str], str]] = {
    JOIN_FORMAT_CONF: (
        frozenset({"2", "3"}),
        "stream-stream join state format {value} cannot be rescaled: Spark's runner writes "
        "state the join then fails to read (format 4 keeps its eviction index by event "
        "time, not by join key)",
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
        return where + PROVIDER_REFUSALS.get(
            provider,
            f"the state store provider {provider} cannot be rescaled by Spark's runner: it "
            "reads and writes RocksDB's stores only",
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


def rescale_refusal(spark: Any, checkpoint: Path | str, batch_id: int) -> str | None:
    """``refusal`` for ``checkpoint`` rescaled from its batch ``batch_id``, read through
    the session's Hadoop file system (so an ``sr3://`` checkpoint too)."""
    offsets = _head(spark, f"{checkpoint}/offsets/{batch_id}")
    commit = _head(spark, f"{checkpoint}/commits/{batch_id}")
    return refusal(
        _offsets_conf(batch_id, offsets),
        _operators(spark, checkpoint, batch_id),
        commit_version=commit.partition("\n")[0].strip(),
        checkpoint=str(checkpoint),
    )


def _head(spark: Any, uri: str) -> str:
    """The first ``LOG_ENTRY_BYTES_MAX`` bytes of a checkpoint log entry."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)
    try:
        head = jvm.org.apache.commons.io.IOUtils.toByteArray(stream, LOG_ENTRY_BYTES_MAX)
    except Exception:  # py4j's translation of an EOFException: a shorter file, read whole
        stream.close()
        stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)
        head = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
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
