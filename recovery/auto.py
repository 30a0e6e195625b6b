"""Choosing a topology for a recovery about to run: the cost model fed with what the
ring looks like now (holders, sizes) and with the network as given or as measured from
the client's recent transfers."""

from __future__ import annotations

from collections.abc import Sequence

from recovery.cost import Choice, Network, Workload, choose, measured_network
from recovery.plan import ChunkSpec
from ring.client import Client

__all__ = ["choose_for", "measured", "workload_of"]


def workload_of(specs: Sequence[ChunkSpec], *, failed_peers: int = 0) -> Workload:
    holders = {holder for spec in specs for holder in spec.holders}
    return Workload(
        state_bytes=sum(spec.stored_bytes for spec in specs),
        chunks=len(specs),
        holders=max(len(holders), 1) if specs else len(holders),
        failed_peers=failed_peers,
    )


def measured(client: Client, base: Network | None = None) -> Network:
    """``base`` with bandwidth and round trip measured from the client's recent requests
    (medians); values without samples stay as ``base`` has them."""
    transport = client.transport
    return measured_network(transport.transfers(), transport.round_trips(), base=base)


def choose_for(
    client: Client,
    specs: Sequence[ChunkSpec],
    network: Network | None = None,
    *,
    failed_peers: int = 0,
) -> Choice:
    """The cost model's choice for recovering ``specs``; ``network`` None: measured."""
    return choose(workload_of(specs, failed_peers=failed_peers), network or measured(client))
