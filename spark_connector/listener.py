"""The ``StreamingQueryListener`` that tells ``StateSync`` a batch committed.

Spark posts a query's progress event after the batch's ``commits/N`` file is written;
the listener runs on the driver's listener thread and only records the batch id, so it
never slows the listener bus down. Imported lazily: pyspark is an optional dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

__all__ = ["make_listener"]


class _CommitListener(StreamingQueryListener):
    def __init__(self, query_id: str, committed: Callable[[int], None]) -> None:
        self._query_id = query_id
        self._committed = committed

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if str(progress.id) == self._query_id:
            self._committed(int(progress.batchId))

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None


def make_listener(query_id: str, committed: Callable[[int], None]) -> Any:
    return _CommitListener(query_id, committed)
