"""Running one peer process: serve the app until SIGTERM or SIGINT, then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from aiohttp import web

from ring.peer import PeerConfig, build_app, runner_options

__all__ = ["run_peer", "serve"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0


async def serve(config: PeerConfig, stop: asyncio.Event) -> None:
    """Serve ``config``'s peer until ``stop`` is set."""
    app = build_app(config, time.time)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S, **runner_options()
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
        log.info("peer %s listening on %s", config.peer_id, config.address)
        await stop.wait()
        log.info("peer %s stopping", config.peer_id)
    finally:
        await runner.cleanup()


def run_peer(config: PeerConfig) -> None:
    """Blocking entry point of ``sr3 peer``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(config, stop)

    asyncio.run(main())
