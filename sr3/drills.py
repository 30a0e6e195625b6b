"""Wiring for ``sr3 drill``: where the drill's ring and its failures come from.

``drill_local`` runs on a fresh embedded cluster whose peers get the emulated network
(``--egress-rate``, ``--added-latency``) and short failure timeouts, and kills peers with
SIGKILL. ``drill_remote`` uses a running ring and kills peers through their
authenticated admin endpoint, which peers serve only when started with
``--enable-admin-kill``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from recovery.drill import DrillOptions, DrillReport, run_drill
from ring.client import Client, ClientOptions
from ring.config import Settings, resolve_tls
from sr3.local import LocalCluster
from sr3.statedata import write_state_file

__all__ = ["drill_local", "drill_remote"]

DRILL_PEER_FLAGS = (
    "--failure-timeout", "2", "--removal-grace", "6", "--repair-interval", "1",
    "--gossip-interval", "0.5",
)  # fmt: skip


def _emulation_flags(options: DrillOptions) -> list[str]:
    flags: list[str] = []
    if options.peer_bytes_s is not None:
        flags += ["--egress-rate", f"{options.peer_bytes_s:.0f}"]
    if options.latency_ms:
        flags += ["--added-latency", f"{options.latency_ms:g}"]
    return flags


def drill_local(
    peers: int, replication: int, state_bytes: int, options: DrillOptions
) -> DrillReport:
    with tempfile.TemporaryDirectory(prefix="sr3-drill-") as work_name:
        work = Path(work_name)
        cluster = LocalCluster.create(
            work / "cluster", peers, replication=replication,
            write_quorum=min(2, replication), cluster_file=work / "cluster.json",
            base_port=7300,
            peer_flags=[*DRILL_PEER_FLAGS, "--seed", str(options.seed), *_emulation_flags(options)],
        )  # fmt: skip
        cluster.up()
        try:
            state = work / "state.bin"
            write_state_file(state, state_bytes, options.seed)

            async def kill(victims: list[str]) -> None:
                for peer_id in victims:
                    cluster.kill(peer_id)

            async def run() -> DrillReport:
                async with Client(cluster.ring, cluster.secret) as client:
                    return await run_drill(client, state, work, options, kill)

            return asyncio.run(run())
        finally:
            cluster.down(purge=True)


def drill_remote(settings: Settings, state_bytes: int, options: DrillOptions) -> DrillReport:
    with tempfile.TemporaryDirectory(prefix="sr3-drill-") as work_name:
        work = Path(work_name)
        state = work / "state.bin"
        write_state_file(state, state_bytes, options.seed)

        async def run() -> DrillReport:
            client_options = ClientOptions(tls=resolve_tls(settings.cluster))
            ring, secret = settings.ring, settings.secret
            async with Client(ring, secret, options=client_options) as client:

                async def kill(victims: list[str]) -> None:
                    for peer_id in victims:
                        await client.admin_kill(peer_id)

                return await run_drill(client, state, work, options, kill)

        return asyncio.run(run())
