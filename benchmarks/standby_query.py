"""The standby benchmark's query, as ``sr3.standby_app`` builds it (``app =
"standby_query:keys_query"``): the connector benchmark's keys query (one row of RocksDB
state per unique id, ``connector_spark.start_keys_query``), not started.

The application's session is ``sr3.standby_app``'s; the settings that differ from the
connector benchmark's session, whose restart is the baseline, are put back to that
session's here, so that both sides run the same query on the same kind of checkpoint.
``bench_standby.py`` puts this folder and the repository root on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

from connector_settings import PROVIDER_CONF, PROVIDERS

# sr3.standby_app's session sets these for the demo query (frequent snapshots); the
# connector benchmark's session leaves them at Spark's defaults.
_DEMO_ONLY_CONF = (
    "spark.sql.streaming.stateStore.maintenanceInterval",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot",
)


def keys_query(spark: Any, job: Any) -> Any:
    """The keys query on ``job.input_dir`` and ``job.checkpoint`` (a ``StandbyJob``): its
    ``DataStreamWriter``, to the ``noop`` sink, every ``job.trigger_s`` seconds."""
    from pyspark.sql import functions

    spark.conf.set(PROVIDER_CONF, PROVIDERS["rocksdb"])
    # As connector_spark.start_spark: one batch per input file, none without data.
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    for name in _DEMO_ONLY_CONF:
        spark.conf.unset(name)
    # The same query as connector_spark.start_keys_query (which starts it at once).
    ids = spark.readStream.option("maxFilesPerTrigger", 1).text(str(job.input_dir))
    key = functions.col("value").cast("long").alias("key")
    text = functions.col("key").cast("string")
    payload = functions.concat_ws(
        "-",
        functions.sha2(text, 256),
        functions.sha2(functions.concat(text, functions.lit("x")), 256),
    )
    rows = ids.select(key).select("key", payload.alias("payload"))
    return (
        rows.groupBy("key")
        .agg(functions.max("payload").alias("payload"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(job.checkpoint))
        .trigger(processingTime=f"{job.trigger_s} seconds")
    )
