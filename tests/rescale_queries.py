"""One small deterministic query per stateful operator Spark runs, for the rescale matrix
(tests/test_rescale_matrix.py): its input, its output as a multiset, and its whole state
as Spark's ``statestore`` reader sees it (every store of a join, every state variable
and the timers of transformWithState).

Input: JSON files written one per batch (``maxFilesPerTrigger=1``) into ``left/`` and,
for the joins, ``right/``: file i holds minute i, five keys of k0..k4 and one duplicate
row, so watermarks advance a minute a file and evict state as the query goes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INPUT_MTIME_BASE_S = 1_704_067_200  # 2024-01-01, the minute the rows are about
HOUR_MS = 3_600_000
RUN_TIMEOUT_S = 240
# Fields of the state reader whose values come from the wall clock (a TTL's expiry):
# two runs never agree on them, so comparisons leave them out.
WALL_CLOCK_FIELDS = frozenset({"expiration_timestamp_ms", "ttlExpirationMs"})


def ship_by_value() -> None:
    """Python workers cannot import this module (tests/ is not on their path): the
    functions and processors of these queries travel by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def write_input(directory: Path, index: int) -> None:
    """Input file ``index`` on both sides: rows in minute ``index``, one a duplicate."""
    # The right side has three keys a minute: some left rows find no match (outer joins).
    for side, stride, shift, keys in (("left", 7, 0, 5), ("right", 3, 5, 3)):
        rows = [
            {
                "key": f"k{(index * stride + second) % 5}",
                "ts": f"2024-01-01T00:{index:02d}:{second * 10 + shift:02d}",
                "value": index * 10 + second,
            }
            for second in range(keys)
        ]
        rows.append(rows[0])
        folder = directory / side
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".input-{index}.tmp"
        temporary.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
        # The file source takes files oldest first by modification time.
        modified_s = INPUT_MTIME_BASE_S + 10 * index
        os.utime(temporary, (modified_s, modified_s))
        temporary.rename(folder / f"input-{index:03d}.json")


def _read(spark: Any, input_dir: Path, side: str = "left") -> Any:
    return (
        spark.readStream.schema("key STRING, ts TIMESTAMP, value LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir / side))
    )


def _aggregation(spark: Any, input_dir: Path) -> Any:
    from pyspark.sql import functions as F

    return _read(spark, input_dir).groupBy("key").agg(F.count("*").alias("n"), F.sum("value"))


def _aggregation_watermark(spark: Any, input_dir: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        _read(spark, input_dir)
        .withWatermark("ts", "30 seconds")
        .groupBy(F.window("ts", "1 minute"), "key")
        .agg(F.count("*").alias("n"), F.sum("value"))
    )


def _dedup(spark: Any, input_dir: Path) -> Any:
    return _read(spark, input_dir).dropDuplicates(["key", "value"])


def _dedup_watermark(spark: Any, input_dir: Path) -> Any:
    return _read(spark, input_dir).withWatermark("ts", "30 seconds").dropDuplicates(["key", "ts"])


def _dedup_within_watermark(spark: Any, input_dir: Path) -> Any:
    return (
        _read(spark, input_dir)
        .withWatermark("ts", "90 seconds")
        .dropDuplicatesWithinWatermark(["key"])
    )


def _session_window(spark: Any, input_dir: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        _read(spark, input_dir)
        .withWatermark("ts", "30 seconds")
        .groupBy(F.session_window("ts", "45 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value"))
    )


def _limit(spark: Any, input_dir: Path) -> Any:
    return _read(spark, input_dir).limit(20)


def _join(how: str) -> Callable[[Any, Path], Any]:
    def build(spark: Any, input_dir: Path) -> Any:
        from pyspark.sql import functions as F

        left = _read(spark, input_dir, "left").withWatermark("ts", "30 seconds")
        right = (
            _read(spark, input_dir, "right")
            .select(
                F.col("key").alias("rkey"), F.col("ts").alias("rts"), F.col("value").alias("rv")
            )
            .withWatermark("rts", "30 seconds")
        )
        condition = F.expr(
            "key = rkey AND rts >= ts - INTERVAL 40 SECONDS AND rts <= ts + INTERVAL 40 SECONDS"
        )
        return left.join(right, condition, how)

    return build


def _apply_in_pandas_with_state(spark: Any, input_dir: Path) -> Any:
    """applyInPandasWithState (flatMapGroupsWithState's Python form, the same operator
    and state): a running count and sum per key, emitted each batch, and a last time
    when an event-time timeout a minute after the key's newest row fires."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def update(key: tuple[str], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        if state.hasTimedOut:
            count, total = state.get
            state.remove()
            yield pd.DataFrame({"key": [key[0]], "n": [count], "total": [total], "done": [True]})
            return
        count, total = state.get if state.exists else (0, 0)
        newest = 0
        for frame in frames:
            count += len(frame)
            total += int(frame["value"].sum())
            newest = max(newest, int(frame["ts"].max().value // 1_000_000))
        state.update((count, total))
        state.setTimeoutTimestamp(newest + 60_000)
        yield pd.DataFrame({"key": [key[0]], "n": [count], "total": [total], "done": [False]})

    return (
        _read(spark, input_dir)
        .withWatermark("ts", "30 seconds")
        .groupBy("key")
        .applyInPandasWithState(
            update,
            "key STRING, n LONG, total LONG, done BOOLEAN",
            "n LONG, total LONG",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )
    )


def _processor(pandas: bool, ttl_ms: int | None) -> Any:
    """transformWithState's processor: a value (count), a list (the values) and a map
    (rows per minute) per key; with ``ttl_ms`` every variable expires that long after
    its last update (processing time), without it an event-time timer 90 s after the
    key's newest row emits the key's totals and clears its state."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class Processor(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "n LONG", ttl_ms)
            self.values = handle.getListState("values", "value LONG", ttl_ms)
            self.minutes = handle.getMapState("minutes", "minute INT", "n LONG", ttl_ms)

        def _emit(self, key: str, n: int, listed: int, done: bool) -> Iterator[Any]:
            if pandas:
                import pandas as pd

                yield pd.DataFrame({"key": [key], "n": [n], "listed": [listed], "done": [done]})
            else:
                yield Row(key=key, n=n, listed=listed, done=done)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            count = self.count.get()[0] if self.count.exists() else 0
            stamps: list[Any] = []
            values: list[int] = []
            if pandas:
                for frame in rows:
                    stamps.extend(frame["ts"])
                    values.extend(int(v) for v in frame["value"])
            else:
                for row in rows:
                    stamps.append(row.ts)
                    values.append(int(row.value))
            for stamp, value in zip(stamps, values, strict=True):
                minute = int(stamp.minute)
                seen = (
                    self.minutes.getValue((minute,))
                    if self.minutes.containsKey((minute,))
                    else None
                )
                self.minutes.updateValue((minute,), ((seen[0] if seen else 0) + 1,))
                self.values.appendValue((value,))
            count += len(values)
            self.count.update((count,))
            if ttl_ms is None:
                newest_ms = max(int(_epoch_ms(stamp)) for stamp in stamps)
                for timer in list(self.handle.listTimers()):
                    self.handle.deleteTimer(timer)
                self.handle.registerTimer(newest_ms + 90_000)
            listed = sum(1 for _ in self.values.get())
            yield from self._emit(key[0], count, listed, False)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            count = self.count.get()[0] if self.count.exists() else 0
            listed = sum(1 for _ in self.values.get())
            self.count.clear()
            self.values.clear()
            self.minutes.clear()
            yield from self._emit(key[0], count, listed, True)

        def close(self) -> None:
            pass

    return Processor()


def _epoch_ms(stamp: Any) -> int:
    """Milliseconds since the epoch of a pandas or Python timestamp (Spark hands both
    over in the session's time zone, naive)."""
    import calendar

    if hasattr(stamp, "to_pydatetime"):
        stamp = stamp.to_pydatetime()
    return calendar.timegm(stamp.timetuple()) * 1000 + stamp.microsecond // 1000


def _transform_with_state(pandas: bool, ttl_ms: int | None) -> Callable[[Any, Path], Any]:
    def build(spark: Any, input_dir: Path) -> Any:
        stream = _read(spark, input_dir)
        if ttl_ms is None:
            stream = stream.withWatermark("ts", "30 seconds")
        grouped = stream.groupBy("key")
        method = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
        return method(
            _processor(pandas, ttl_ms),
            "key STRING, n LONG, listed LONG, done BOOLEAN",
            "Update" if ttl_ms is not None else "Append",
            "ProcessingTime" if ttl_ms is not None else "EventTime",
        )

    return build


@dataclass(frozen=True, slots=True)
class StatefulQuery:
    """A query of one stateful operator: how to build it, its output mode, and whether
    Spark runs it on the RocksDB provider only (transformWithState)."""

    name: str
    operator: str  # the operator's name in Spark's operator metadata
    build: Callable[[Any, Path], Any]
    output_mode: str
    rocksdb_only: bool = False
    # Session settings the query starts with (Spark keeps them in its offset log).
    conf: tuple[tuple[str, str], ...] = ()


QUERIES = {
    query.name: query
    for query in (
        StatefulQuery("aggregation", "stateStoreSave", _aggregation, "update"),
        StatefulQuery("aggregation-watermark", "stateStoreSave", _aggregation_watermark, "append"),
        StatefulQuery("dedup", "dedupe", _dedup, "append"),
        StatefulQuery("dedup-watermark", "dedupe", _dedup_watermark, "append"),
        StatefulQuery(
            "dedup-within-watermark", "dedupeWithinWatermark", _dedup_within_watermark, "append"
        ),
        StatefulQuery(
            "session-window", "sessionWindowStateStoreSaveExec", _session_window, "append"
        ),
        StatefulQuery(
            "apply-in-pandas-with-state",
            "applyInPandasWithState",
            _apply_in_pandas_with_state,
            "update",
        ),
        StatefulQuery(
            "transform-with-state-in-pandas",
            "transformWithStateInPySparkExec",
            _transform_with_state(True, None),
            "append",
            rocksdb_only=True,
        ),
        StatefulQuery(
            "transform-with-state",
            "transformWithStateInPySparkExec",
            _transform_with_state(False, None),
            "append",
            rocksdb_only=True,
        ),
        StatefulQuery(
            "transform-with-state-ttl",
            "transformWithStateInPySparkExec",
            _transform_with_state(True, HOUR_MS),
            "update",
            rocksdb_only=True,
            # TTL needs processing time, where Spark runs a batch on every trigger even
            # without data (a timer could fire) and availableNow never ends: no such batches.
            conf=(("spark.sql.streaming.noDataMicroBatches.enabled", "false"),),
        ),
        StatefulQuery("join-inner", "symmetricHashJoin", _join("inner"), "append"),
        StatefulQuery("join-left-outer", "symmetricHashJoin", _join("left_outer"), "append"),
        StatefulQuery("join-full-outer", "symmetricHashJoin", _join("full_outer"), "append"),
        # Settings and operators beyond the defaults, each what a user may turn on.
        StatefulQuery(
            "join-inner-state-v3",
            "symmetricHashJoin",
            _join("inner"),
            "append",
            rocksdb_only=True,
            conf=(("spark.sql.streaming.join.stateFormatVersion", "3"),),
        ),
        StatefulQuery(
            "join-inner-state-v4",
            "symmetricHashJoin",
            _join("inner"),
            "append",
            rocksdb_only=True,
            conf=(("spark.sql.streaming.join.stateFormatVersion", "4"),),
        ),
        StatefulQuery(
            "aggregation-checkpoint-v2",
            "stateStoreSave",
            _aggregation,
            "update",
            rocksdb_only=True,
            conf=(("spark.sql.streaming.stateStore.checkpointFormatVersion", "2"),),
        ),
        StatefulQuery(
            "aggregation-offset-log-v2",
            "stateStoreSave",
            _aggregation,
            "update",
            conf=(("spark.sql.streaming.offsetLog.formatVersion", "2"),),
        ),
        StatefulQuery(
            "aggregation-streamline",
            "StatefulStreamlineAggregate",
            _aggregation,
            "update",
            conf=(("spark.sql.streaming.useStreamlineAggregator", "true"),),
        ),
        StatefulQuery(
            "transform-with-state-avro",
            "transformWithStateInPySparkExec",
            _transform_with_state(False, None),
            "append",
            rocksdb_only=True,
            conf=(("spark.sql.streaming.stateStore.encodingFormat", "avro"),),
        ),
        StatefulQuery(
            "aggregation-row-checksum",
            "stateStoreSave",
            _aggregation_watermark,
            "append",
            conf=(("spark.sql.streaming.stateStore.rowChecksum.enabled", "true"),),
        ),
        StatefulQuery("limit", "globalLimit", _limit, "append"),
    )
}


def run(
    spark: Any, query: StatefulQuery, input_dir: Path, checkpoint: Path, start: Any = None
) -> list[str]:
    """Run ``query`` over every input file present (availableNow) and stop; its output
    rows as sorted JSON lines. ``start``: how to start the writer (StateSync.start_query
    bound to the session), default a plain start on ``checkpoint``."""
    ship_by_value()
    rows: list[str] = []

    def collect(batch: Any, _batch_id: int) -> None:
        rows.extend(_json(row.asDict(recursive=True)) for row in batch.collect())

    for key, value in query.conf:
        spark.conf.set(key, value)
    try:  # the query's session is cloned at its start, with these settings
        writer = (
            query.build(spark, input_dir)
            .writeStream.outputMode(query.output_mode)
            .foreachBatch(collect)
            .trigger(availableNow=True)
        )
        if start is None:
            started = writer.option("checkpointLocation", str(checkpoint)).start()
        else:
            started = start(writer)
    finally:
        for key, _value in query.conf:
            spark.conf.unset(key)
    if not started.awaitTermination(RUN_TIMEOUT_S):
        started.stop()
        raise AssertionError(f"{query.name} did not finish in {RUN_TIMEOUT_S} s")
    if started.exception() is not None:
        raise AssertionError(f"{query.name} failed: {started.exception()}")
    return sorted(rows)


def state(spark: Any, checkpoint: Path | str, *, partition_ids: bool = True) -> list[str]:
    """Every store's rows in the checkpoint's newest batch as sorted JSON lines: each
    operator's default store, both sides of a join, every state variable and the timers
    of transformWithState. Fields a TTL takes from the wall clock are left out."""
    metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    lines: list[str] = []
    for operator in sorted({int(row["operatorId"]) for row in metadata}):
        rows = [row for row in metadata if int(row["operatorId"]) == operator]
        name = rows[0]["operatorName"]
        stores = sorted(str(row["stateStoreName"]) for row in rows)
        for label, options in _readings(name, rows[0]["operatorProperties"], stores):
            reader = spark.read.format("statestore").option("operatorId", operator)
            for key, value in options.items():
                reader = reader.option(key, value)
            for row in reader.load(str(checkpoint)).collect():
                fields = _clean(row.asDict(recursive=True))
                if not partition_ids:
                    fields.pop("partition_id", None)
                lines.append(_json([operator, label, fields]))
    return sorted(lines)


def _readings(
    operator_name: str, properties: str | None, stores: list[str]
) -> list[tuple[str, dict[str, str]]]:
    """The reader options that together cover an operator's state: for a join, each side
    and each of its stores (row indexes and matched flags too, in state format 2)."""
    if operator_name == "symmetricHashJoin":
        sides = [(side, {"joinSide": side}) for side in ("left", "right")]
        named = [(store, {"storeName": store}) for store in stores if store != "default"]
        return sides + named
    if operator_name.startswith("transformWithState"):
        variables = json.loads(properties or "{}").get("stateVariables", [])
        readings = [
            (v["stateName"], {"stateVarName": v["stateName"]})
            for v in variables
            if v["stateVariableType"] != "TimerState"
        ]
        if any(v["stateVariableType"] == "TimerState" for v in variables):
            readings.append(("timers", {"readRegisteredTimers": "true"}))
        return readings
    return [("default", {})]


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in WALL_CLOCK_FIELDS}
    if isinstance(value, list):
        return sorted((_clean(v) for v in value), key=_json)
    return value


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def placement(spark: Any, checkpoint: Path | str) -> list[str]:
    """Where each RocksDB state row sits: (operator, store, state partition, column
    family, partition key) for every row of every store, internal column families too
    (TTL and timer indexes, a join's indexes), as sorted JSON lines. It reads the raw
    rows as Spark's runner does (``_readAllColumnFamilies``); the key's bytes are left
    out, since a TTL index's key holds a wall-clock expiry."""
    from pyspark.sql import functions as F

    metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    lines: list[str] = []
    for row in metadata:
        operator, store = int(row["operatorId"]), str(row["stateStoreName"])
        frame = (
            spark.read.format("statestore")
            .option("operatorId", operator)
            .option("storeName", store)
            .option("_readAllColumnFamilies", "true")
            .load(str(checkpoint))
            .select(
                F.spark_partition_id().alias("partition"),
                "column_family_name",
                F.to_json("partition_key").alias("partition_key"),
            )
        )
        lines.extend(
            _json([operator, store, r["partition"], r["column_family_name"], r["partition_key"]])
            for r in frame.collect()
        )
    return sorted(lines)
