"""The ``StreamingQueryListener`` that tells ``StateSync`` a batch committed.

Spark posts a query's progress event after the batch's ``commits/N`` file is written;
the listener runs on the driver's listener thread and only records the batch id, so it
never slows the listener bus down. Imported lazily: pyspark is an optional dependency.

PySpark's own listener bridge turns every event of every query into Python objects
before a listener sees it: one py4j round trip per field, per source, per state
operator and per custom metric, each a call into the JVM. Measured on a RocksDB query,
that was about 75 ms of driver CPU per batch, more than the push itself. This listener
is handed Spark's Java event instead and asks it for two values (the query id and the
batch id); the other events are not looked at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pyspark.sql.streaming.listener import StreamingQueryListener

__all__ = ["make_listener"]


class _JavaEvents:
    """What the JVM's ``PythonStreamingQueryListenerWrapper`` calls, through py4j."""

    def __init__(self, query_id: str, committed: Callable[[int], None]) -> None:
        self._query_id = query_id
        self._committed = committed

    def onQueryStarted(self, jevent: Any) -> None:
        return None

    def onQueryProgress(self, jevent: Any) -> None:
        progress = jevent.progress()
        if str(progress.id().toString()) == self._query_id:
            self._committed(int(progress.batchId()))

    def onQueryIdle(self, jevent: Any) -> None:
        return None

    def onQueryTerminated(self, jevent: Any) -> None:
        return None

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]


class _CommitListener(StreamingQueryListener):
    """Registered with ``spark.streams.addListener`` like any listener; Spark calls
    ``_JavaEvents`` directly, never the (abstract, so defined) methods below."""

    def __init__(self, query_id: str, committed: Callable[[int], None]) -> None:
        self._events = _JavaEvents(query_id, committed)

    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            jvm = SparkContext._jvm
            if jvm is None:
                raise RuntimeError("no SparkContext: start the SparkSession first")
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(self._events)
        return self._jlistenerobj

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        return None

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None


def make_listener(query_id: str, committed: Callable[[int], None]) -> Any:
    return _CommitListener(query_id, committed)
