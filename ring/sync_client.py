"""A blocking facade over ``Client`` for scripts and for callers on foreign threads.

The async client runs on an event loop owned by one daemon thread; each method submits
a coroutine there and waits for its result. Safe to call from any thread, including
threads that run an event loop of their own.

``close()`` closes the client's sessions before the loop stops; a script that never
calls it (it raised first, or just ended) gets the same at exit or when the object is
collected (``weakref.finalize``), rather than aiohttp's "Unclosed client session".
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ring.blobs import BlobRef
from ring.client import Client, ClientOptions, Progress, RecordValue, RingStatus, Source
from ring.client.client import FileInfo

__all__ = ["SyncClient", "SyncClientClosed"]

T = TypeVar("T")

# How long closing waits for the client's sessions to close, and for its thread to end.
CLOSE_TIMEOUT_S = 30.0


class SyncClientClosed(RuntimeError):
    """A call on a ``SyncClient`` that is closed."""


class SyncClient:
    """``Client``'s calls, blocking. ``ring`` and ``secret`` default as for ``Client``
    (``SR3_RING``/``SR3_SECRET``, else the cluster file of ``sr3 cluster up``)."""

    def __init__(
        self,
        ring: str | Sequence[str] | None = None,
        secret: str | None = None,
        *,
        options: ClientOptions | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sr3-client", daemon=True
        )
        self._thread.start()
        try:
            self._client = self._call(self._make(ring, secret, options))
        except BaseException:
            _stop_loop(self._loop, self._thread)
            raise
        # Holds no reference to self: it runs at close(), at exit, or on collection.
        self._closer = weakref.finalize(self, _shut_down, self._loop, self._thread, self._client)

    @staticmethod
    async def _make(
        ring: str | Sequence[str] | None, secret: str | None, options: ClientOptions | None
    ) -> Client:
        return Client(ring, secret, options=options or ClientOptions())

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coroutine.close()
            raise SyncClientClosed("this SyncClient is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        """Close the client's sessions, then stop its loop (once; later calls do nothing)."""
        self._closer()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def client(self) -> Client:
        return self._client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that uses ``client`` on the client's loop; wait for its result."""
        return self._call(coroutine)

    # -- named files: kept until deleted ------------------------------------------------

    def put_file(self, path: Path, key: str, *, progress: Progress | None = None) -> FileInfo:
        return self._call(self._client.put_file(path, key, progress=progress))

    def put_bytes(self, data: bytes, key: str) -> FileInfo:
        return self._call(self._client.put_bytes(data, key))

    def get_file(self, key: str | BlobRef, path: Path, *, progress: Progress | None = None) -> None:
        self._call(self._client.get_file(key, path, progress=progress))

    def get_bytes(self, key: str) -> bytes:
        return self._call(self._client.get_bytes(key))

    def file_info(self, key: str) -> FileInfo:
        return self._call(self._client.file_info(key))

    def list_files(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, FileInfo]:
        return self._call(self._client.list_files(prefix, limit=limit))

    def delete_file(self, key: str) -> int:
        return self._call(self._client.delete_file(key))

    def store_file(self, path: Path, key: str, *, progress: Progress | None = None) -> BlobRef:
        return self._call(self._client.store_file(path, key, progress=progress))

    def lookup_file(self, key: str) -> BlobRef:
        return self._call(self._client.lookup_file(key))

    # -- chunks: internal ---------------------------------------------------------------

    def put_sources(self, sources: Sequence[Source]) -> list[BlobRef]:
        """Internal: ``Client.put_sources``. The caller must write a record naming the
        returned refs' chunks within the peers' ``--gc-grace``, or they are collected."""
        return self._call(self._client.put_sources(sources))

    # -- records ------------------------------------------------------------------------

    def get_record(
        self, key: str, *, include_deleted: bool = False, allow_stale: bool = False
    ) -> RecordValue | None:
        return self._call(
            self._client.get_record(key, include_deleted=include_deleted, allow_stale=allow_stale)
        )

    def delete_record(self, key: str, *, expected_version: int) -> int:
        return self._call(self._client.delete_record(key, expected_version=expected_version))

    def put_record(
        self, key: str, value: bytes, *, expected_version: int, refs: Sequence[str] = ()
    ) -> int:
        return self._call(
            self._client.put_record(key, value, expected_version=expected_version, refs=refs)
        )

    def list_records(self, prefix: str = "") -> dict[str, int]:
        return self._call(self._client.list_records(prefix))

    def status(self) -> RingStatus:
        return self._call(self._client.status())


def _shut_down(loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Client) -> None:
    if loop.is_closed():
        return
    try:
        asyncio.run_coroutine_threadsafe(_close_client(client), loop).result(CLOSE_TIMEOUT_S)
    finally:
        _stop_loop(loop, thread)


async def _close_client(client: Client) -> None:
    """Close ``client``; then cancel what is left on the loop (calls abandoned by their
    threads) and close it again, since a request that ran after the first close opened
    a new session."""
    await client.close()
    current = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)
    await client.close()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(CLOSE_TIMEOUT_S)
    if not thread.is_alive():
        loop.close()
