"""Signed HTTP requests from a client to peers, with bounded pools, bodies and timeouts.

``Transport.request`` buffers a bounded answer; ``Transport.stream`` hands a long answer
(a recovery stream) over in pieces as they arrive, never holding more than one piece.

aiohttp and OS errors are translated here into ``ring.errors``: a peer that cannot be
reached (or breaks a stream off) raises ``PeerUnavailable``, an error answer
``PeerRejected`` (or ``AuthError`` on 401). Nothing else in the client sees aiohttp
exceptions.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from yarl import URL

from ring import api
from ring.auth import ANY_TARGET, BodyDigest, Signer, digest_of
from ring.errors import AuthError, PeerRejected, PeerUnavailable, ProtocolError
from ring.tls import describe_tls_error

__all__ = ["BodyStream", "Response", "Timeouts", "Transport"]

CONNECTIONS_MAX = 64
CONNECTIONS_PER_PEER_MAX = 8
JSON_BYTES_MAX = 16 * 1024 * 1024
# Bodies above aiohttp's TOO_LARGE_BYTES_BODY (1 MiB) are streamed in slices.
STREAM_BODY_BYTES_MIN = 1024 * 1024
SAMPLES_MAX = 256
# Addresses whose requests in flight are tracked (for the download samples); idle ones
# are dropped past this many.
ADDRESSES_TRACKED_MAX = 1024
TRANSFER_SAMPLE_BYTES_MIN = 256 * 1024
ROUND_TRIP_SAMPLE_BYTES_MAX = 16 * 1024
BODY_SLICE_BYTES = 256 * 1024
# The error answer of a stream request is read whole; it is a short JSON document.
ERROR_BYTES_MAX = 64 * 1024


class _InFlight:
    """Requests in flight to one address, and their integral over time: the mean number
    in flight over any interval is the integral's growth over the interval's length."""

    __slots__ = ("count", "integral", "since")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.integral = 0.0
        self.since = now

    def advance(self, now: float) -> float:
        self.integral += self.count * (now - self.since)
        self.since = now
        return self.integral


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 3.0
    read_s: float = 30.0


# A request body: bytes, or parts sent one after the other (a chunk's header and its
# payload, never joined in memory).
Body = bytes | tuple[bytes, ...]


def body_size(body: Body | None) -> int:
    if body is None:
        return 0
    return len(body) if isinstance(body, bytes) else sum(len(part) for part in body)


def _payload(body: Body | None) -> bytes | _SlicedBody | None:
    """What aiohttp sends for ``body``: a large one in slices (aiohttp sends a bytes
    body in one write and warns (ResourceWarning) that it may stall the loop)."""
    if body is None:
        return None
    if body_size(body) > STREAM_BODY_BYTES_MIN:
        return _SlicedBody(body if isinstance(body, tuple) else (body,))
    return body if isinstance(body, bytes) else b"".join(body)


class _SlicedBody(Payload):
    """An immutable body, in parts, written in slices of ``BODY_SLICE_BYTES`` without
    copies.

    aiohttp warns (ResourceWarning) that a bytes body above 1 MiB, sent in one write, may
    stall the loop. A BytesIO body avoids the warning but is copied whole on creation
    (``getbuffer`` unshares it) and again in 64 KiB reads; for 1.5 MB chunk bodies that
    cost the client about 40 % more CPU per PUT than memoryview slices. Each slice waits
    for the socket to drain, so the loop is never stalled either.
    """

    _value: tuple[bytes, ...]
    _autoclose = True  # in memory: nothing to close, and safe to send again on a retry

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        super().__init__(parts, content_type="application/octet-stream")
        self._size = body_size(parts)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"".join(self._value)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        size = body_size(self._value)
        left = size if content_length is None else min(content_length, size)
        for part in self._value:
            view = memoryview(part)[:left]
            for offset in range(0, len(view), BODY_SLICE_BYTES):
                await writer.write(view[offset : offset + BODY_SLICE_BYTES])
            left -= len(view)
            if not left:
                return


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The answer as JSON, bounded like every body a peer accepts (``api.load_json``)."""
        try:
            return api.load_json(self.body)
        except ProtocolError as exc:
            raise ProtocolError(f"peer answered with invalid JSON: {exc}") from exc


class BodyStream:
    """The body of a streamed answer, piece by piece as the network delivers it
    (``async for piece in stream``). A connection that breaks raises ``PeerUnavailable``;
    the caller decides whether the bytes it got form a complete message."""

    def __init__(self, answer: aiohttp.ClientResponse, address: str, what: str) -> None:
        self.status = answer.status
        self.headers: Mapping[str, str] = answer.headers
        self._answer = answer
        self._address = address
        self._what = what

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            piece = await self._answer.content.readany()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise PeerUnavailable(self._address, f"{self._what}: {_reason(exc)}") from exc
        if not piece:
            raise StopAsyncIteration
        return piece


class Transport:
    """One pooled aiohttp session for all peers; create and close it on one event loop."""

    def __init__(
        self,
        secret: str,
        *,
        timeouts: Timeouts = Timeouts(),
        connections_per_peer_max: int = CONNECTIONS_PER_PEER_MAX,
        clock: Callable[[], float] = time.time,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._signer = Signer(secret, clock)
        # HTTPS with this context (the cluster's CA; ``ring.tls``), else plain HTTP.
        self._tls = tls
        self._scheme = "https" if tls is not None else "http"
        self._timeouts = timeouts
        self._connections_per_peer_max = connections_per_peer_max
        self._session: aiohttp.ClientSession | None = None
        # Recent answers, for cost models: (bytes, seconds) of large downloads, with the
        # seconds divided by the mean number of requests and streams in flight to the
        # same address (they shared its egress); seconds of small requests.
        self._transfers: deque[tuple[int, float]] = deque(maxlen=SAMPLES_MAX)
        self._round_trips: deque[float] = deque(maxlen=SAMPLES_MAX)
        self._in_flight: dict[str, _InFlight] = {}
        # Where an address came from, for the errors that name it ("peer-1's address on
        # the 'internal' network, as 127.0.0.1:7401 described the ring"); None: not known.
        self.describe_address: Callable[[str], str | None] = lambda _address: None

    def _unreachable(self, address: str, what: str, exc: BaseException) -> PeerUnavailable:
        reason = _reason(exc)
        if self._tls is None and isinstance(exc, aiohttp.ServerDisconnectedError):
            # What a peer serving HTTPS does to a plain-HTTP request.
            reason += " before answering (if the ring serves HTTPS (TLS), set SR3_TLS_CA)"
        elif self._tls is not None and (
            reason == "connection reset by peer" or isinstance(exc, aiohttp.ServerDisconnectedError)
        ):
            # What a peer does, under TLS 1.3, to a client certificate it refuses: its
            # alert comes after the client's handshake is done, and whether the client
            # then reads a reset or a closed connection is a matter of timing.
            reason += (
                " (TLS: a peer that requires client certificates does this to one it "
                "refuses: is SR3_TLS_CERT from the cluster's CA?)"
            )
        origin = self.describe_address(address)
        if origin is not None and _unresolved(exc):
            reason += f" ({address} is {origin})"
        return PeerUnavailable(address, f"{what}: {reason}")

    def digest(self, body: bytes | memoryview | tuple[bytes, ...] | None) -> BodyDigest:
        """The digest a signature of ``body`` covers (compute it once per body, off the
        event loop for a large one, and pass it to every ``request`` sending it)."""
        return digest_of(body, self._signer.algorithm)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=CONNECTIONS_MAX,
                limit_per_host=self._connections_per_peer_max,
                ssl=self._tls if self._tls is not None else True,
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
        body: Body | None = None,
        body_bytes_max: int = JSON_BYTES_MAX,
        ok: tuple[int, ...] = (200, 201),
        any_target: bool = False,
        body_digest: BodyDigest | None = None,
    ) -> Response:
        """Send one signed request; raise unless the status is in ``ok``.

        The signature names ``address`` as its target, or ``*`` with ``any_target`` (only
        peers' ``GET /v1/ring`` accepts that: a seed's advertised address is not yet known).
        ``body_digest``: the body's (``digest``), for a body sent to several peers.
        """
        target = ANY_TARGET if any_target else address
        headers = self._signer.headers(method, path_qs, body, target=target, digest=body_digest)
        url = URL(f"{self._scheme}://{address}{path_qs}", encoded=True)
        data = _payload(body)
        with self._counted(address) as in_flight:
            started = time.perf_counter()
            integral_at_start = in_flight.advance(started)
            try:
                async with self._open().request(method, url, data=data, headers=headers) as answer:
                    payload = await _read_bounded(answer, body_bytes_max, address)
                    response = Response(answer.status, answer.headers, payload)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._unreachable(address, f"{method} {path_qs[:60]}", exc) from exc
            ended = time.perf_counter()
            shared = in_flight.advance(ended) - integral_at_start
        if response.status not in ok:
            raise _rejection(address, response)
        self._sample(len(payload), body_size(body), ended - started, shared)
        return response

    @contextmanager
    def _counted(self, address: str) -> Iterator[_InFlight]:
        """Count a request (or stream) as in flight to ``address`` while in the block."""
        in_flight = self._in_flight.get(address)
        if in_flight is None:
            if len(self._in_flight) >= ADDRESSES_TRACKED_MAX:
                self._in_flight = {a: f for a, f in self._in_flight.items() if f.count}
            in_flight = self._in_flight[address] = _InFlight(time.perf_counter())
        in_flight.advance(time.perf_counter())
        in_flight.count += 1
        try:
            yield in_flight
        finally:
            in_flight.advance(time.perf_counter())
            in_flight.count -= 1

    def _sample(self, answer_bytes: int, body_bytes: int, seconds: float, shared: float) -> None:
        """``shared``: the integral of requests in flight to the address over this one
        (``seconds`` when it was alone). Only downloads are bandwidth samples: they are
        what a recovery asks of a peer's egress; uploads say nothing of it."""
        if answer_bytes >= TRANSFER_SAMPLE_BYTES_MIN and body_bytes < answer_bytes:
            alone_s = seconds * seconds / shared if shared > seconds > 0 else seconds
            self._transfers.append((answer_bytes, alone_s))
        elif answer_bytes + body_bytes <= ROUND_TRIP_SAMPLE_BYTES_MAX:
            self._round_trips.append(seconds)

    def transfers(self) -> list[tuple[int, float]]:
        """``(bytes, seconds)`` of recent large downloads, each as if it had had its
        peer to itself: its seconds divided by the mean number of requests in flight to
        that peer meanwhile (at most ``SAMPLES_MAX``)."""
        return list(self._transfers)

    def round_trips(self) -> list[float]:
        """Seconds of recent small requests (at most ``SAMPLES_MAX``)."""
        return list(self._round_trips)

    @asynccontextmanager
    async def stream(
        self,
        address: str,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> AsyncIterator[BodyStream]:
        """Send one signed request and hand its answer's body over in pieces.

        ``request`` is for bounded answers read whole; this is for long ones (recovery
        streams) that the caller consumes as they arrive. The read timeout bounds the
        silence between two pieces, not the whole answer. Leaving the block before the
        end closes the connection.
        """
        what = f"{method} {path_qs[:60]}"
        headers = self._signer.headers(method, path_qs, body, target=address)
        url = URL(f"{self._scheme}://{address}{path_qs}", encoded=True)
        data = _payload(body)
        with self._counted(address):  # it shares the peer's egress with downloads
            try:
                answer = await self._open().request(method, url, data=data, headers=headers)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._unreachable(address, what, exc) from exc
            try:
                if answer.status not in ok:
                    raise _rejection(address, await _read_error(answer, address, what))
                yield BodyStream(answer, address, what)
            finally:
                answer.close()


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


async def _read_error(answer: aiohttp.ClientResponse, address: str, what: str) -> Response:
    try:
        payload = await _read_bounded(answer, ERROR_BYTES_MAX, address)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise PeerUnavailable(address, f"{what}: {_reason(exc)}") from exc
    except ProtocolError:
        payload = b""
    return Response(answer.status, answer.headers, payload)


def _unresolved(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to resolve the peer's host name."""
    return isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, socket.gaierror
    )


def _reason(exc: BaseException) -> str:
    """Why a peer could not be reached, in words ("connection refused", "timed out",
    "cannot resolve peer1"), not aiohttp's repr of its connection key."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if (tls := describe_tls_error(exc)) is not None:
        return tls
    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if isinstance(cause, TimeoutError):
            return "timed out"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve {exc.host} ({cause.strerror or 'no such name'})"
        if cause.errno:
            return os.strerror(cause.errno).lower()
        return (cause.strerror or str(cause) or type(cause).__name__).lower()
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the peer closed the connection"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rejection(address: str, response: Response) -> Exception:
    error = api.parse_error(response.body)
    if response.status == 401 and error.code == "clock_skew":
        # This peer's clock or ours is off: that peer fails the request (the others may
        # serve it), where wrong credentials would fail everywhere.
        return PeerRejected(address, 401, error.code, error.message)
    if response.status == 401:
        return AuthError(f"{address} refused our credentials: {error.message}")
    return PeerRejected(address, response.status, error.code, error.message, error.version)
