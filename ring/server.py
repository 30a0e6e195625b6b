"""Running one peer process: serve the API and the background loops until SIGTERM or
SIGINT (or until the peer has left the ring), then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ring.clock import SYSTEM_CLOCKS
from ring.node import Node
from ring.peer import AppExtension, build_app, runner_options
from ring.peer_config import PeerConfig
from ring.tls import CertificateReloader, server_context

__all__ = ["run_peer", "serve"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
# Requests aiohttp's parser refuses (a line too long, a bad header) are reported in one
# line at most this often, with the count of those not reported.
PARSER_REPORT_INTERVAL_S = 60.0
PARSER_DETAIL_CHARS_MAX = 160


class ParserRejections(logging.Filter):
    """aiohttp logs every request its parser refuses at error, with a traceback: one
    client sending bad request lines fills the disk and buries real errors. The peer
    answers those 400 itself (before any handler); this turns the log into one warning
    line at most every ``interval_s``, with how many were refused since the last."""

    def __init__(
        self,
        interval_s: float = PARSER_REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._refused = 0
        self._reported_at: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        self._refused += 1
        now = self._clock()
        if self._reported_at is not None and now - self._reported_at < self._interval_s:
            return False
        detail = " ".join(f"{type(error).__name__}: {error.message}".split())
        record.msg = "refused %d malformed request(s) (400) since the last report; latest: %s"
        record.args = (self._refused, detail[:PARSER_DETAIL_CHARS_MAX])
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self._refused = 0
        self._reported_at = now
        return True


_PARSER_REJECTIONS = ParserRejections()


async def serve(
    config: PeerConfig, stop: asyncio.Event, *, extensions: Sequence[AppExtension] = ()
) -> None:
    """Serve ``config``'s peer until ``stop`` is set or the peer has left the ring.

    ``extensions`` add routes to the peer's API (``sr3 peer`` passes the recovery relay;
    ``ring`` itself does not know about recovery)."""
    server_log = logging.getLogger("aiohttp.server")
    if _PARSER_REJECTIONS not in server_log.filters:
        server_log.addFilter(_PARSER_REJECTIONS)
    node = Node(config, SYSTEM_CLOCKS)
    node.open()
    runner = web.AppRunner(
        build_app(node, extensions),
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        **runner_options(),
    )
    await runner.setup()
    tls = server_context(config.tls) if config.tls is not None else None
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True, ssl_context=tls)
    try:
        await site.start()
        await node.start_overlay()
        log.info(
            "peer %s (epoch %d) listening on %s%s", config.peer_id, node.epoch, config.address,
            " (TLS)" if tls is not None else "",
        )  # fmt: skip
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(node.run())]
            if tls is not None and config.tls is not None:
                tasks.append(group.create_task(CertificateReloader(tls, config.tls).run()))
            stopped = group.create_task(stop.wait())
            left = group.create_task(node.left.wait())
            await asyncio.wait({stopped, left}, return_when=asyncio.FIRST_COMPLETED)
            for task in (*tasks, stopped, left):
                task.cancel()
        log.info("peer %s stopping", config.peer_id)
        await node.stop()
    finally:
        await runner.cleanup()


def run_peer(config: PeerConfig, *, extensions: Sequence[AppExtension] = ()) -> None:
    """Blocking entry point of ``sr3 peer`` (whose ``main`` keeps chunk buffers,
    ``ring.heap``)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(config, stop, extensions=extensions)

    asyncio.run(main())
