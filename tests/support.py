"""Helpers shared by the ring tests: signed raw HTTP, on-disk chunk lookup, metrics parsing.

These talk to real peers over loopback and look at real files. They deliberately use the
same signing code as the client (``ring.auth.Signer``) but not the client itself, so a
test can send exactly the request it is about: a tampered body, a replayed nonce, a body
that is not a chunk.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from ring.auth import Signer
from sr3.local import LocalCluster

__all__ = [
    "Answer",
    "HttpProbe",
    "chunk_file",
    "chunk_holders",
    "metric_value",
    "next_base_port",
    "peer_address",
]

# Each test run takes its own stretch of ports (other runs may share the machine), below
# the kernel's ephemeral range so client sockets never sit on a port a peer wants.
# LocalCluster skips ports that are busy, scanning upwards from the base it is given.
_BASE_PORTS = itertools.count(21000 + (os.getpid() % 40) * 250, 5)


def next_base_port() -> int:
    return next(_BASE_PORTS)


LARGE_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HttpProbe:
    """A bare aiohttp session that sends signed or unsigned requests to one cluster."""

    def __init__(self, secret: str) -> None:
        self.signer = Signer(secret, time.time)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False
        )

    async def __aenter__(self) -> HttpProbe:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._session.close()

    async def send(
        self,
        address: str,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Send exactly these headers (none added) and return the peer's answer."""
        url = URL(f"http://{address}{path_qs}", encoded=True)
        # aiohttp warns (an error under our warning filter) about large raw bytes bodies.
        data = io.BytesIO(body) if body is not None and len(body) > LARGE_BODY_BYTES else body
        async with self._session.request(
            method, url, data=data, headers=dict(headers or {})
        ) as answer:
            return Answer(answer.status, dict(answer.headers), await answer.read())

    async def signed(
        self, address: str, method: str, path_qs: str, *, body: bytes | None = None
    ) -> Answer:
        headers = self.signer.headers(method, path_qs, body, target=address)
        return await self.send(address, method, path_qs, body=body, headers=headers)

    async def info(self, address: str) -> dict[str, Any]:
        answer = await self.signed(address, "GET", "/v1/info")
        assert answer.status == 200, answer
        info: dict[str, Any] = answer.json()
        return info

    async def health(self, address: str) -> int:
        return (await self.send(address, "GET", "/v1/health")).status

    async def metrics(self, address: str) -> str:
        answer = await self.signed(address, "GET", "/metrics")
        assert answer.status == 200, answer
        return answer.body.decode()


def peer_address(cluster: LocalCluster, peer_id: str) -> str:
    return cluster.peer(peer_id).address


def chunk_file(cluster: LocalCluster, peer_id: str, chunk_id: str) -> Path:
    """Where ``peer_id`` keeps ``chunk_id`` on disk (whether or not it exists)."""
    return Path(cluster.peer(peer_id).data_dir) / "chunks" / chunk_id[:2] / chunk_id


def chunk_holders(cluster: LocalCluster, chunk_id: str) -> list[str]:
    """Peer ids whose data folder holds a file for ``chunk_id``, found on disk."""
    return [
        peer.peer_id
        for peer in cluster.cluster.peers
        if chunk_file(cluster, peer.peer_id, chunk_id).is_file()
    ]


def metric_value(text: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` in Prometheus text; 0.0 when absent."""
    match = re.search(rf"^{re.escape(name)} ([0-9.eE+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
