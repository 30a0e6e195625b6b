"""The Spark side of plans (``spark_connector.plans``): a session's offset log entries of a
local checkpoint handed to Python before they appear.

sr3's checkpoint file manager (``sr3.hadoop.Sr3CheckpointFileManager``, in the jar of
``spark_connector.jar``) keeps Spark's own manager for local paths, and hands the offset
log entry of every checkpoint hooked here (``sr3.hadoop.Sr3Plans``) to a Python
``PlanHook`` through py4j before the entry is renamed into place. The session needs the
jar on its class path and the manager named in its conf: ``local_conf()`` gives both, to
pass to the builder before the session starts (the jar cannot be added to a running
driver); the manager alone is set at run time when missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from ring.errors import ConfigError, SR3Error
from spark_connector.jar import JAR_CLASSES, fs_jar

__all__ = [
    "MANAGER_CONF",
    "PlanCancelled",
    "PlanHook",
    "check_session",
    "hook_plans",
    "local_conf",
    "unhook_plans",
]

log = logging.getLogger(__name__)

MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
MANAGER = JAR_CLASSES[2]


def local_conf() -> dict[str, str]:
    """The confs a local-mode session needs for ``StateSync`` to put each batch's plan on
    the ring before the batch runs: sr3's jar (``spark.jars``: merge it with jars of your
    own; built with javac on first use) and its checkpoint file manager, which keeps
    Spark's own manager for every path and only reads the hooked checkpoints' offset log
    entries on their way to the disk."""
    return {"spark.jars": str(fs_jar()), MANAGER_CONF: MANAGER}


class PlanCancelled(SR3Error):
    """A plan given up because its query is stopping: the JVM's ``Sr3Plans`` finds this
    name in py4j's message and tells Spark the batch was interrupted by the stop (a stop,
    not a failure of the query)."""


class PlanHook:
    """What the JVM's ``Sr3Plans`` calls (``sr3.hadoop.Sr3PlanHook``), through py4j, on
    the query's thread: ``planned(batch_id, offsets)`` returns once the plan is on the
    ring, or raises, and the batch does not run."""

    def __init__(self, planned: Callable[[int, bytes], None]) -> None:
        self._planned = planned

    def planned(self, batch_id: int, offsets: bytes) -> None:
        self._planned(int(batch_id), bytes(offsets))

    class Java:
        implements: ClassVar[list[str]] = ["sr3.hadoop.Sr3PlanHook"]


def check_session(spark: Any) -> None:
    """``ConfigError`` unless ``spark`` can hook plans: sr3's jar on its class path and
    no other checkpoint file manager named; names sr3's manager when none is."""
    from py4j.java_gateway import JavaClass

    if not isinstance(spark._jvm.sr3.hadoop.Sr3Plans, JavaClass):
        raise ConfigError(
            "StateSync puts each batch's plan on the ring before the batch runs, through "
            "sr3's checkpoint file manager, which this SparkSession lacks: start it with "
            "spark_connector.local_conf() (sr3's jar and the manager)"
        )
    named = spark.conf.get(MANAGER_CONF, None)
    if named is None:
        spark.conf.set(MANAGER_CONF, MANAGER)
    elif named != MANAGER:
        raise ConfigError(
            f"{MANAGER_CONF} names {named}: StateSync needs {MANAGER}, which keeps Spark's "
            "own manager for every path and hands it the offset log entries of its queries"
        )


def hook_plans(spark: Any, checkpoint_dir: str, hook: PlanHook) -> None:
    """Hand the offset log entries Spark writes under ``checkpoint_dir`` to ``hook``."""
    from pyspark.java_gateway import ensure_callback_server_started

    check_session(spark)
    ensure_callback_server_started(spark.sparkContext._gateway)  # type: ignore[no-untyped-call]
    spark._jvm.sr3.hadoop.Sr3Plans.hook(checkpoint_dir, hook)


def unhook_plans(spark: Any, checkpoint_dir: str) -> None:
    from py4j.protocol import Py4JError

    try:
        spark._jvm.sr3.hadoop.Sr3Plans.unhook(checkpoint_dir)
    except Py4JError as exc:  # the JVM is gone or going: nothing left to unhook
        log.debug("sr3: unhooking %s: %r", checkpoint_dir, exc)
