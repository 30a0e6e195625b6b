"""Signed HTTP requests from a client to peers, with bounded pools, bodies and timeouts.

aiohttp and OS errors are translated here into ``sr3.errors``: a peer that cannot be
reached raises ``PeerUnavailable``, an error answer ``PeerRejected`` (or ``AuthError`` on
401). Nothing else in the client sees aiohttp exceptions.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from ring.auth import ANY_TARGET, Signer
from sr3.errors import AuthError, PeerRejected, PeerUnavailable, ProtocolError

__all__ = ["Response", "Timeouts", "Transport"]

CONNECTIONS_MAX = 64
CONNECTIONS_PER_PEER_MAX = 8
JSON_BYTES_MAX = 16 * 1024 * 1024
# Bodies above aiohttp's TOO_LARGE_BYTES_BODY (1 MiB) are streamed from a BytesIO.
STREAM_BODY_BYTES_MIN = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 3.0
    read_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProtocolError(f"peer answered with invalid JSON: {exc}") from exc


class Transport:
    """One pooled aiohttp session for all peers; create and close it on one event loop."""

    def __init__(
        self,
        secret: str,
        *,
        timeouts: Timeouts = Timeouts(),
        connections_per_peer_max: int = CONNECTIONS_PER_PEER_MAX,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._signer = Signer(secret, clock)
        self._timeouts = timeouts
        self._connections_per_peer_max = connections_per_peer_max
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=CONNECTIONS_MAX, limit_per_host=self._connections_per_peer_max
            )
            timeout = aiohttp.ClientTimeout(
                total=None,
                connect=self._timeouts.connect_s,
                sock_connect=self._timeouts.connect_s,
                sock_read=self._timeouts.read_s,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        address: str,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        body_bytes_max: int = JSON_BYTES_MAX,
        ok: tuple[int, ...] = (200, 201),
        any_target: bool = False,
    ) -> Response:
        """Send one signed request; raise unless the status is in ``ok``.

        The signature names ``address`` as its target, or ``*`` with ``any_target`` (only
        peers' ``GET /v1/ring`` accepts that: a seed's advertised address is not yet known).
        """
        target = ANY_TARGET if any_target else address
        headers = self._signer.headers(method, path_qs, body, target=target)
        url = URL(f"http://{address}{path_qs}", encoded=True)
        # aiohttp sends a large bytes body in one write and warns (ResourceWarning) that
        # it may stall the loop; a BytesIO body is streamed in pieces instead.
        data = io.BytesIO(body) if body is not None and len(body) > STREAM_BODY_BYTES_MIN else body
        try:
            async with self._open().request(method, url, data=data, headers=headers) as answer:
                payload = await _read_bounded(answer, body_bytes_max, address)
                response = Response(answer.status, answer.headers, payload)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise PeerUnavailable(address, f"{method} {path_qs[:60]}: {exc!r}") from exc
        if response.status not in ok:
            raise _rejection(address, response)
        return response


async def _read_bounded(answer: aiohttp.ClientResponse, limit: int, address: str) -> bytes:
    declared = answer.content_length
    if declared is not None:
        if declared > limit:
            raise ProtocolError(f"{address}: answer of {declared} bytes is above {limit}")
        return await answer.read()
    pieces: list[bytes] = []
    total = 0
    async for piece in answer.content.iter_chunked(256 * 1024):
        total += len(piece)
        if total > limit:
            raise ProtocolError(f"{address}: answer is above {limit} bytes")
        pieces.append(piece)
    return b"".join(pieces)


def _rejection(address: str, response: Response) -> Exception:
    code, message = "error", response.body[:200].decode("utf-8", "replace")
    try:
        parsed = json.loads(response.body)
        code, message = str(parsed.get("error", code)), str(parsed.get("message", message))
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        pass
    if response.status == 401:
        return AuthError(f"{address} refused our credentials: {message}")
    return PeerRejected(address, response.status, code, message)
