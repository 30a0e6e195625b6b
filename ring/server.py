"""Running one peer process: serve the API and the background loops until SIGTERM or
SIGINT (or until the peer has left the ring), then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

from aiohttp import web

from ring.clock import SYSTEM_CLOCKS
from ring.node import Node
from ring.peer import AppExtension, build_app, runner_options
from ring.peer_config import PeerConfig

__all__ = ["run_peer", "serve"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0


async def serve(
    config: PeerConfig, stop: asyncio.Event, *, extensions: Sequence[AppExtension] = ()
) -> None:
    """Serve ``config``'s peer until ``stop`` is set or the peer has left the ring.

    ``extensions`` add routes to the peer's API (``sr3 peer`` passes the recovery relay;
    ``ring`` itself does not know about recovery)."""
    node = Node(config, SYSTEM_CLOCKS)
    node.open()
    runner = web.AppRunner(
        build_app(node, extensions),
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        **runner_options(),
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
        await node.start_overlay()
        log.info("peer %s (epoch %d) listening on %s", config.peer_id, node.epoch, config.address)
        async with asyncio.TaskGroup() as group:
            background = group.create_task(node.run())
            stopped = group.create_task(stop.wait())
            left = group.create_task(node.left.wait())
            await asyncio.wait({stopped, left}, return_when=asyncio.FIRST_COMPLETED)
            for task in (background, stopped, left):
                task.cancel()
        log.info("peer %s stopping", config.peer_id)
        await node.stop()
    finally:
        await runner.cleanup()


def run_peer(config: PeerConfig, *, extensions: Sequence[AppExtension] = ()) -> None:
    """Blocking entry point of ``sr3 peer``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(config, stop, extensions=extensions)

    asyncio.run(main())
