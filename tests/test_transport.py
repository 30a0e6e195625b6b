"""What the transport samples for the recovery cost model (``Transport.transfers``).

A plain aiohttp server on 127.0.0.1 stands in for a peer: what is under test is the
client's accounting, not a peer. It answers downloads of ``BODY_BYTES`` only once
``CONCURRENT`` of them have arrived, so they overlap.

What must hold: an upload is never a bandwidth sample (it says nothing of a peer's
egress); downloads that shared one peer are each timed as if alone, so that together
they account for about the time they took, not ``CONCURRENT`` times as much; an open
stream from the same peer counts as sharing it too.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from ring import api
from ring.errors import AuthError, PeerError, PeerRejected
from ring.transport import TRANSFER_SAMPLE_BYTES_MIN, Response, Transport, _rejection

BODY_BYTES = 1024 * 1024
CONCURRENT = 6
STREAM_HELD_S = 1.0


@pytest.fixture
async def peer() -> AsyncIterator[str]:
    arrived = 0
    everyone = asyncio.Event()

    async def download(_request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived >= CONCURRENT:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), timeout=10.0)
        return web.Response(body=bytes(BODY_BYTES))

    async def one(_request: web.Request) -> web.Response:
        return web.Response(body=bytes(BODY_BYTES))

    async def slow(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse()
        await answer.prepare(request)
        await asyncio.sleep(STREAM_HELD_S)
        await answer.write(b"end")
        return answer

    async def upload(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=4 * BODY_BYTES)
    app.router.add_get("/download", download)
    app.router.add_get("/one", one)
    app.router.add_get("/slow", slow)
    app.router.add_post("/upload", upload)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_uploads_are_not_bandwidth_samples(peer: str) -> None:
    transport = Transport("a-secret-for-the-test")
    try:
        await transport.request(peer, "POST", "/upload", body=bytes(BODY_BYTES))
        assert BODY_BYTES >= TRANSFER_SAMPLE_BYTES_MIN
        assert transport.transfers() == []
    finally:
        await transport.close()


async def test_downloads_sharing_a_peer_are_each_timed_as_if_alone(peer: str) -> None:
    transport = Transport("a-secret-for-the-test")
    try:
        started = time.perf_counter()
        await asyncio.gather(
            *(transport.request(peer, "GET", "/download") for _ in range(CONCURRENT))
        )
        elapsed = time.perf_counter() - started
        samples = transport.transfers()
    finally:
        await transport.close()
    assert [size for size, _ in samples] == [BODY_BYTES] * CONCURRENT
    # Timed as they were, each would span nearly all of `elapsed` (they overlap from
    # the first answer to the last): together CONCURRENT times it. As if alone, each is
    # its share, and together they come to about the time taken (a little more where
    # they did not start together).
    assert sum(seconds for _, seconds in samples) <= elapsed * 1.2
    assert all(seconds > 0 for _, seconds in samples)


async def test_a_download_beside_an_open_stream_shares_the_peer(peer: str) -> None:
    transport = Transport("a-secret-for-the-test")
    try:
        async with transport.stream(peer, "GET", "/slow") as pieces:
            started = time.perf_counter()
            await transport.request(peer, "GET", "/one")
            elapsed = time.perf_counter() - started
            assert [piece async for piece in pieces] == [b"end"]
        samples = transport.transfers()
    finally:
        await transport.close()
    # Two in flight to the peer throughout the download: timed as if alone, it is half.
    assert len(samples) == 1 and samples[0][0] == BODY_BYTES
    assert samples[0][1] <= elapsed * 0.6


async def test_an_unreachable_peer_is_named_with_a_reason_in_words() -> None:
    """aiohttp's errors are translated where they enter: the message says "connection
    refused", not the repr of aiohttp's connection key."""
    from ring.errors import PeerUnavailable
    from sr3.local import pick_port

    port = pick_port(["127.0.0.1"], 24500)  # free: nothing listens there
    transport = Transport("s" * 32)
    try:
        with pytest.raises(PeerUnavailable) as caught:
            await transport.request(f"127.0.0.1:{port}", "GET", "/v1/info")
    finally:
        await transport.close()
    message = str(caught.value)
    assert message.endswith("connection refused"), message
    assert "ClientConnector" not in message and "ConnectionKey" not in message


@pytest.mark.parametrize(
    "cut", [aiohttp.ServerDisconnectedError(), ConnectionResetError(104, "Connection reset")]
)
def test_a_tls_connection_cut_before_any_answer_names_the_client_certificate(
    cut: BaseException,
) -> None:
    """Breaks: a peer that requires client certificates refuses this client's (TLS 1.3:
    after the client's side of the handshake), which the client reads, by timing, as a
    reset or as a closed connection. Must hold: either way the message says TLS and
    names the client certificate, as one line."""
    transport = Transport("s" * 32, tls=ssl.create_default_context())
    message = str(transport._unreachable("10.0.0.1:7400", "GET /v1/ring", cut))
    assert "TLS" in message and "SR3_TLS_CERT" in message and "\n" not in message, message
    plain = str(Transport("s" * 32)._unreachable("10.0.0.1:7400", "GET /v1/ring", cut))
    assert "SR3_TLS_CERT" not in plain, plain


def test_a_clock_skew_refusal_is_that_peers_failure_and_other_401s_are_ours() -> None:
    """Breaks: a peer answers 401 ``clock_skew`` (its clock or ours is off), another 401
    ``unauthorized`` (a wrong secret). Must hold: the first is a PeerRejected (a fan-out
    goes on with the other peers), the second an AuthError (the call fails at once)."""
    skew = Response(401, {}, _error("clock_skew", "signed 600 s ahead"))
    wrong = Response(401, {}, _error("unauthorized", "bad signature"))
    rejected = _rejection("10.0.0.1:7400", skew)
    assert isinstance(rejected, PeerRejected) and isinstance(rejected, PeerError)
    assert (rejected.status, rejected.code) == (401, "clock_skew")
    assert isinstance(_rejection("10.0.0.1:7400", wrong), AuthError)


def _error(code: str, message: str) -> bytes:
    return json.dumps(api.error_body(code, message)).encode()
