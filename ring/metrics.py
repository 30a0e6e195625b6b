"""Prometheus metrics of one peer, in a registry of its own (not the global one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from ring.node import Node

__all__ = ["PeerMetrics", "watch_node"]


class PeerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "sr3_peer_requests",
            "Requests handled, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "sr3_peer_request_seconds",
            "Request handling time, by route.",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        )
        # No input should make a peer answer 5xx: the fuzz tests assert this stays 0.
        # A client that hangs up before its request is read is counted under status 499
        # ("client closed"), not here.
        self.responses_5xx = Counter(
            "sr3_peer_responses_5xx",
            "Answers with a 5xx status (internal errors, storage full, not ready).",
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "sr3_peer_auth_failures", "Requests refused for credentials.", registry=self.registry
        )
        self.chunk_bytes_written = Counter(
            "sr3_peer_chunk_bytes_written",
            "Stored bytes of chunks written.",
            registry=self.registry,
        )
        self.chunk_bytes_read = Counter(
            "sr3_peer_chunk_bytes_read", "Stored bytes of chunks served.", registry=self.registry
        )
        self.chunks_corrupt = Counter(
            "sr3_peer_chunks_corrupt",
            "Chunks found corrupt on disk and quarantined.",
            registry=self.registry,
        )

    def gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        Gauge(name, documentation, registry=self.registry).set_function(read)


def watch_node(metrics: PeerMetrics, node: Node) -> None:
    """The gauges that read a node's stores and loops when scraped."""
    gauge = metrics.gauge
    gauge("sr3_peer_chunks", "Chunks stored.", lambda: node.chunks.stats().chunk_count)
    gauge("sr3_peer_stored_bytes", "Stored bytes.", lambda: node.chunks.stats().stored_bytes)
    gauge(
        "sr3_peer_chunk_bytes_read_locally",
        "Stored bytes of chunks this peer's file namespace read from its own store.",
        lambda: node.own_chunks.bytes_read,
    )
    gauge("sr3_peer_records", "Records stored.", node.records.count)
    gauge(
        "sr3_peer_record_catch_ups",
        "Record slots this peer caught up on from others before answering a round.",
        lambda: node.acceptor.syncs,
    )
    gauge("sr3_peer_hints_pending", "Hinted chunks not yet handed back.", lambda: len(node.hints))
    gauge("sr3_peer_members_up", "Members this peer sees up.", lambda: len(node.table.live()))
    gauge("sr3_repair_rounds", "Repair rounds finished.", lambda: node.repairer.rounds)
    gauge(
        "sr3_repair_chunks_under_replicated",
        "Chunks this peer coordinates that have fewer than R live replicas (last round).",
        lambda: node.repairer.last.chunks_under_replicated if node.repairer.last else 0,
    )
    gauge(
        "sr3_repair_chunks_lost",
        "Referenced chunks no live peer holds (last round).",
        lambda: node.repairer.last.chunks_lost if node.repairer.last else 0,
    )
    gauge(
        "sr3_repair_bytes_pushed",
        "Bytes copied by repair.",
        lambda: node.repairer.totals.bytes_pushed,
    )
    gauge(
        "sr3_repair_extra_copies_deleted",
        "Extra copies collected by repair.",
        lambda: node.repairer.totals.extra_copies_deleted,
    )
    gauge(
        "sr3_repair_pushes_deferred",
        "Pushes repair left to the next round: written here less than --repair-settle ago.",
        lambda: node.repairer.totals.pushes_deferred,
    )
    gauge(
        "sr3_scrub_bytes_verified",
        "Bytes re-verified by the scrubber.",
        lambda: node.scrubber.stats.bytes_verified,
    )
    gauge(
        "sr3_scrub_repaired",
        "Corrupt chunks the scrubber restored.",
        lambda: node.scrubber.stats.repaired,
    )
    gauge(
        "sr3_peer_chunks_unrecoverable",
        "Chunks found corrupt here that no member had a good copy of (listed in /v1/info).",
        lambda: len(node.scrubber.unrecoverable()),
    )
    gauge(
        "sr3_gc_chunks_collected",
        "Unreferenced chunks deleted by chunk collection.",
        lambda: node.collector.totals.chunks_collected,
    )
    gauge(
        "sr3_gc_bytes_collected",
        "Stored bytes freed by chunk collection.",
        lambda: node.collector.totals.bytes_collected,
    )
