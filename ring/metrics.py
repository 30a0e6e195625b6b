"""Prometheus metrics of one peer, in a registry of its own (not the global one)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["PeerMetrics"]


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
