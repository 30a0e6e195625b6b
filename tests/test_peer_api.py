"""A real peer refuses unauthenticated and malformed requests, and stays up.

Every test here sends requests by hand (signed with ``ring.auth.Signer`` where the case
needs a valid signature) to one peer of the shared 5-peer ring, checks the status, the
JSON error body and that nothing was stored, and afterwards (``peer_stays_up``) that
every peer still answers ``GET /v1/health`` with 200 from the same process.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import HttpProbe, metric_value, peer_address

from ring import codec
from ring.api import EXISTS_IDS_MAX, REQUEST_BYTES_MAX
from ring.auth import Signer
from ring.client import Client
from ring.errors import AuthError
from sr3.local import LocalCluster

WRONG_SECRET = "not-the-cluster-secret-0123456789"


@pytest.fixture
def peer_stays_up(ring: LocalCluster) -> Iterator[LocalCluster]:
    """After the test: every peer answers health 200 and runs under its old pid."""
    pids = {peer.peer_id: peer.pid for peer in ring.cluster.peers}
    yield ring

    async def healths() -> list[int]:
        async with HttpProbe(ring.secret) as probe:
            return [await probe.health(address) for address in ring.cluster.addresses]

    assert asyncio.run(healths()) == [200] * len(pids)
    for peer in ring.cluster.peers:
        assert peer.pid == pids[peer.peer_id], f"{peer.peer_id} was restarted"
        assert ring.running(peer.peer_id), f"{peer.peer_id} is gone"


@pytest.fixture
def target(peer_stays_up: LocalCluster, rng: random.Random) -> str:
    """The address of one peer, chosen with the seeded generator."""
    return rng.choice(peer_stays_up.cluster.addresses)


def _fresh_chunk(rng: random.Random) -> tuple[str, bytes]:
    return codec.encode(rng.randbytes(2048) * 4)


def _assert_json_error(status: int, body: bytes, expected_status: int | None = None) -> None:
    assert 400 <= status < 500, (status, body[:200])
    if expected_status is not None:
        assert status == expected_status, body[:200]
    parsed = json.loads(body)
    assert isinstance(parsed["error"], str) and parsed["error"], parsed


async def _chunk_absent(probe: HttpProbe, address: str, chunk_id: str) -> bool:
    answer = await probe.signed(address, "HEAD", f"/v1/chunks/{chunk_id}")
    assert answer.status in (200, 404)
    return answer.status == 404


# -- authentication ------------------------------------------------------------------------


async def test_health_needs_no_credentials(ring: LocalCluster) -> None:
    async with HttpProbe(ring.secret) as probe:
        for peer in ring.cluster.peers:
            answer = await probe.send(peer.address, "GET", "/v1/health")
            assert answer.status == 200
            assert answer.json() == {
                "status": "ok",
                "peer_id": peer.peer_id,
                "ready": True,
                "members": 5,
            }


async def test_request_without_credentials_is_401_and_stores_nothing(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: requests carry no Authorization header. Must hold: 401 with a JSON error
    for every route but health; the chunk and the record are not stored; an existing
    chunk is not served."""
    chunk_id, stored = _fresh_chunk(rng)
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await probe.info(target)
        for method, path, body in [
            ("PUT", f"/v1/chunks/{chunk_id}", stored),
            ("PUT", "/v1/records/unauth/k?expected_version=0", b"value"),
            ("GET", f"/v1/chunks/{chunk_id}", None),
            ("HEAD", f"/v1/chunks/{chunk_id}", None),
            ("POST", "/v1/chunks/exists", json.dumps({"ids": [chunk_id]}).encode()),
            ("GET", "/v1/records?prefix=", None),
            ("GET", "/v1/records/unauth/k", None),
            ("DELETE", "/v1/records/unauth/k?expected_version=1", None),
            ("GET", "/v1/info", None),
            ("GET", "/v1/ring", None),
            ("GET", "/metrics", None),
            ("GET", "/no/such/route", None),
        ]:
            answer = await probe.send(target, method, path, body=body)
            assert answer.status == 401, (method, path, answer)
            if method != "HEAD":
                assert answer.json()["error"] == "unauthorized"
        after = await probe.info(target)
        assert await _chunk_absent(probe, target, chunk_id)
        assert (await probe.signed(target, "GET", "/v1/records/unauth/k")).status == 404
    assert after["chunk_count"] == before["chunk_count"]
    assert after["record_count"] == before["record_count"]


async def test_existing_data_is_not_served_without_credentials(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    chunk_id, stored = _fresh_chunk(rng)
    async with HttpProbe(peer_stays_up.secret) as probe:
        assert (
            await probe.signed(target, "PUT", f"/v1/chunks/{chunk_id}", body=stored)
        ).status == 201
        answer = await probe.send(target, "GET", f"/v1/chunks/{chunk_id}")
        assert answer.status == 401
        assert stored not in answer.body


async def test_wrong_secret_is_401_and_client_raises_auth_error(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: requests signed with another secret. Must hold: 401 and nothing stored;
    the client raises ``AuthError`` (not a generic peer error) on reads and writes."""
    chunk_id, stored = _fresh_chunk(rng)
    async with HttpProbe(WRONG_SECRET) as stranger, HttpProbe(peer_stays_up.secret) as probe:
        answer = await stranger.signed(target, "PUT", f"/v1/chunks/{chunk_id}", body=stored)
        _assert_json_error(answer.status, answer.body, 401)
        assert await _chunk_absent(probe, target, chunk_id)
    async with Client(target, WRONG_SECRET) as client:
        with pytest.raises(AuthError):
            await client.chunks.put_blob(b"x" * 1000)
        with pytest.raises(AuthError):
            await client.get_record("blob/anything")
        with pytest.raises(AuthError):
            await client.status()


async def test_body_swapped_under_a_valid_signature_is_401(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: a valid signature for one body, sent with another (itself a valid chunk).
    Must hold: 401, the other chunk is not stored."""
    _signed_id, signed_body = _fresh_chunk(rng)
    swapped_id, swapped_body = _fresh_chunk(rng)
    path = f"/v1/chunks/{swapped_id}"
    async with HttpProbe(peer_stays_up.secret) as probe:
        headers = probe.signer.headers("PUT", path, signed_body, target=target)
        answer = await probe.send(target, "PUT", path, body=swapped_body, headers=headers)
        _assert_json_error(answer.status, answer.body, 401)
        assert await _chunk_absent(probe, target, swapped_id)
        # The same for a record: the signed value is not the one that arrives.
        record_path = "/v1/records/swapped/k?expected_version=0"
        headers = probe.signer.headers("PUT", record_path, b"signed value", target=target)
        answer = await probe.send(target, "PUT", record_path, body=b"evil value", headers=headers)
        _assert_json_error(answer.status, answer.body, 401)
        assert (await probe.signed(target, "GET", "/v1/records/swapped/k")).status == 404


async def test_replayed_request_is_401(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: an accepted request is sent again byte for byte (same nonce). Must hold:
    the replay gets 401 (not a 409 or a second write), the record stays at version 1."""
    key = f"replay/{rng.randrange(10**9)}"
    path = f"/v1/records/{key}?expected_version=0"
    async with HttpProbe(peer_stays_up.secret) as probe:
        headers = probe.signer.headers("PUT", path, b"first", target=target)
        first = await probe.send(target, "PUT", path, body=b"first", headers=headers)
        assert first.status == 201, first
        replay = await probe.send(target, "PUT", path, body=b"first", headers=headers)
        _assert_json_error(replay.status, replay.body, 401)
        assert "replay" in replay.json()["message"]
        # A replayed read is refused too.
        read_headers = probe.signer.headers("GET", f"/v1/records/{key}", target=target)
        assert (
            await probe.send(target, "GET", f"/v1/records/{key}", headers=read_headers)
        ).status == 200
        again = await probe.send(target, "GET", f"/v1/records/{key}", headers=read_headers)
        assert again.status == 401
        current = await probe.signed(target, "GET", f"/v1/records/{key}")
        assert current.headers["X-SR3-Version"] == "1"


@pytest.mark.parametrize("offset_s", [-600, 600, -86_400])
async def test_stale_or_future_timestamp_is_401(
    peer_stays_up: LocalCluster, target: str, rng: random.Random, offset_s: int
) -> None:
    chunk_id, stored = _fresh_chunk(rng)
    path = f"/v1/chunks/{chunk_id}"
    skewed = Signer(peer_stays_up.secret, lambda: time.time() + offset_s)
    async with HttpProbe(peer_stays_up.secret) as probe:
        headers = skewed.headers("PUT", path, stored, target=target)
        answer = await probe.send(target, "PUT", path, body=stored, headers=headers)
        _assert_json_error(answer.status, answer.body, 401)
        assert "skew" in answer.json()["message"]
        assert await _chunk_absent(probe, target, chunk_id)


async def test_auth_failures_are_counted_and_metrics_accept_the_bearer_token(
    peer_stays_up: LocalCluster, target: str
) -> None:
    from ring.auth import metrics_token

    async with HttpProbe(peer_stays_up.secret) as probe:
        before = metric_value(await probe.metrics(target), "sr3_peer_auth_failures_total")
        await probe.send(target, "GET", "/v1/info")
        bearer = {"Authorization": f"Bearer {metrics_token(peer_stays_up.secret)}"}
        answer = await probe.send(target, "GET", "/metrics", headers=bearer)
        assert answer.status == 200
        after = metric_value(answer.body.decode(), "sr3_peer_auth_failures_total")
        assert after >= before + 1
        # The metrics token opens nothing else.
        assert (await probe.send(target, "GET", "/v1/info", headers=bearer)).status == 401


# -- malformed requests --------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunk_id",
    ["xyz", "A" * 32, "0" * 31, "0" * 33, "g" * 32, "..%2F..%2Fetc%2Fpasswd", "%00" * 16],
)
async def test_bad_chunk_id_is_400(peer_stays_up: LocalCluster, target: str, chunk_id: str) -> None:
    async with HttpProbe(peer_stays_up.secret) as probe:
        for method in ("PUT", "GET"):
            answer = await probe.signed(target, method, f"/v1/chunks/{chunk_id}", body=b"x")
            _assert_json_error(answer.status, answer.body, 400)


def _claims_too_large(rng: random.Random) -> tuple[str, bytes]:
    chunk_id, stored = _fresh_chunk(rng)
    header = bytearray(stored[: codec.HEADER_BYTES])
    header[8:16] = (codec.CHUNK_BYTES_MAX + 1).to_bytes(8, "little")
    return chunk_id, bytes(header) + stored[codec.HEADER_BYTES :]


def _truncated(rng: random.Random) -> tuple[str, bytes]:
    chunk_id, stored = _fresh_chunk(rng)
    return chunk_id, stored[:-7]


def _not_matching_its_id(rng: random.Random) -> tuple[str, bytes]:
    other_id, _other = _fresh_chunk(rng)
    _chunk_id, stored = _fresh_chunk(rng)
    return other_id, stored


BAD_CHUNK_BODIES = {
    "empty": (lambda rng: (_fresh_chunk(rng)[0], b""), 422),
    "not a stored chunk": (lambda rng: (_fresh_chunk(rng)[0], b"hello, peer"), 422),
    "truncated": (_truncated, 422),
    "content does not match its id": (_not_matching_its_id, 422),
    "header claims a chunk above the limit": (_claims_too_large, None),
}


@pytest.mark.parametrize("kind", sorted(BAD_CHUNK_BODIES))
async def test_bad_chunk_body_is_4xx_and_not_stored(
    peer_stays_up: LocalCluster, target: str, rng: random.Random, kind: str
) -> None:
    """Breaks: a correctly signed PUT whose body is not the chunk its path names. Must
    hold: 4xx with a JSON error (422 for content that fails verification), not stored."""
    make, expected_status = BAD_CHUNK_BODIES[kind]
    chunk_id, body = make(rng)
    async with HttpProbe(peer_stays_up.secret) as probe:
        answer = await probe.signed(target, "PUT", f"/v1/chunks/{chunk_id}", body=body)
        _assert_json_error(answer.status, answer.body, expected_status)
        assert await _chunk_absent(probe, target, chunk_id)


async def test_oversized_body_is_413(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: a signed body one byte above the request limit, and an unsigned one.
    Must hold: 413 for the signed one, 401 for the unsigned one (refused before the body
    is buffered); nothing stored."""
    chunk_id, _stored = _fresh_chunk(rng)
    body = bytes(REQUEST_BYTES_MAX + 1)
    async with HttpProbe(peer_stays_up.secret) as probe:
        answer = await probe.signed(target, "PUT", f"/v1/chunks/{chunk_id}", body=body)
        _assert_json_error(answer.status, answer.body, 413)
        unsigned = await probe.send(target, "PUT", f"/v1/chunks/{chunk_id}", body=body)
        assert unsigned.status == 401
        answer = await probe.signed(
            target, "PUT", "/v1/records/big/k?expected_version=0", body=body
        )
        _assert_json_error(answer.status, answer.body, 413)
        assert await _chunk_absent(probe, target, chunk_id)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"",
        b"[1, 2]",
        b'"ids"',
        b'{"ids": "0123"}',
        b'{"ids": [1, 2]}',
        b'{"ids": ["not-a-chunk-id"]}',
        b'{"ids": null}',
        b"{}",
        json.dumps({"ids": ["0" * 32] * (EXISTS_IDS_MAX + 1)}).encode(),
    ],
    ids=lambda body: body[:24].decode("utf-8", "replace"),
)
async def test_bad_exists_request_is_400(
    peer_stays_up: LocalCluster, target: str, body: bytes
) -> None:
    async with HttpProbe(peer_stays_up.secret) as probe:
        answer = await probe.signed(target, "POST", "/v1/chunks/exists", body=body)
        _assert_json_error(answer.status, answer.body, 400)


async def test_exists_answers_which_chunks_are_present(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    present_id, stored = _fresh_chunk(rng)
    absent_id, _absent = _fresh_chunk(rng)
    async with HttpProbe(peer_stays_up.secret) as probe:
        assert (
            await probe.signed(target, "PUT", f"/v1/chunks/{present_id}", body=stored)
        ).status == 201
        body = json.dumps({"ids": [present_id, absent_id]}).encode()
        answer = await probe.signed(target, "POST", "/v1/chunks/exists", body=body)
        assert answer.status == 200
        assert answer.json() == {"present": [present_id]}


@pytest.mark.parametrize(
    "key",
    ["../x", "%2e%2e/x", "a/../b", "a/./b", "-x", ".x", "a%20b", "a%00b", "k" * 600, "", "/abs"],
    ids=lambda key: key[:12] or "empty",
)
async def test_bad_record_key_is_4xx(peer_stays_up: LocalCluster, target: str, key: str) -> None:
    """Breaks: record keys that could escape the data folder or are malformed. Must
    hold: 4xx with a JSON error for writes and reads, and no record is created."""
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = (await probe.info(target))["record_count"]
        for method, path in [
            ("PUT", f"/v1/records/{key}?expected_version=0"),
            ("GET", f"/v1/records/{key}"),
            ("DELETE", f"/v1/records/{key}?expected_version=1"),
        ]:
            answer = await probe.signed(
                target, method, path, body=b"v" if method == "PUT" else None
            )
            _assert_json_error(answer.status, answer.body)
        assert (await probe.info(target))["record_count"] == before


async def test_record_key_longer_than_a_request_line_is_400(
    peer_stays_up: LocalCluster, target: str
) -> None:
    async with HttpProbe(peer_stays_up.secret) as probe:
        path = "/v1/records/" + "k" * 9000 + "?expected_version=0"
        answer = await probe.signed(target, "PUT", path, body=b"v")
        assert answer.status == 400


@pytest.mark.parametrize("version", ["abc", "-1", "1.5", "", "1e3", "0x1", "9" * 19, None])
async def test_non_integer_expected_version_is_400(
    peer_stays_up: LocalCluster, target: str, rng: random.Random, version: str | None
) -> None:
    key = f"versions/{rng.randrange(10**9)}"
    query = "" if version is None else f"?expected_version={version}"
    async with HttpProbe(peer_stays_up.secret) as probe:
        answer = await probe.signed(target, "PUT", f"/v1/records/{key}{query}", body=b"v")
        _assert_json_error(answer.status, answer.body, 400)
        assert (await probe.signed(target, "GET", f"/v1/records/{key}")).status == 404


async def test_unknown_route_and_method_are_json_4xx(
    peer_stays_up: LocalCluster, target: str
) -> None:
    async with HttpProbe(peer_stays_up.secret) as probe:
        answer = await probe.signed(target, "GET", "/v1/nothing-here")
        _assert_json_error(answer.status, answer.body, 404)
        answer = await probe.signed(target, "DELETE", "/v1/chunks/" + "0" * 32)
        _assert_json_error(answer.status, answer.body, 405)
        answer = await probe.signed(target, "GET", "/v1/records?limit=0")
        _assert_json_error(answer.status, answer.body, 400)


RAW_GARBAGE = {
    "binary noise": b"\x00\xff\xfe\x01 garbage \x80\x81\r\n\r\n",
    "not http": b"hello peer, how are you?\r\n\r\n",
    "bad version": b"GET /v1/health HTTP/9.9\r\n\r\n",
    "too many headers": b"GET /v1/info HTTP/1.1\r\n"
    + b"".join(b"X-H%d: 1\r\n" % i for i in range(200))
    + b"\r\n",
    "huge header": b"GET /v1/info HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "negative content length": b"PUT /v1/chunks/x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "two content lengths": b"PUT /v1/chunks/x HTTP/1.1\r\nContent-Length: 1\r\n"
    b"Content-Length: 2\r\n\r\nab",
    "bad chunked body": b"PUT /v1/chunks/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "truncated body": b"PUT /v1/chunks/x HTTP/1.1\r\nContent-Length: 100000\r\n\r\nabc",
    "request line not ascii": b"GET /v1/records/\xc3\xa9?limit=\xc2\xb2 HTTP/1.1\r\n\r\n",
    "request line too long": b"GET /v1/records?prefix=" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
    "header not utf-8": b"GET /v1/info HTTP/1.1\r\nX-SR3-Timestamp: \xff\xfe\r\n"
    b"X-SR3-Target: \xc2\xb2\r\nAuthorization: SR3-HMAC-SHA256 \xff\r\n\r\n",
    "content length not ascii": b"PUT /v1/chunks/x HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n",
}


@pytest.mark.parametrize("kind", sorted(RAW_GARBAGE))
def test_raw_garbage_over_tcp_gets_400_or_close(peer_stays_up: LocalCluster, kind: str) -> None:
    """Breaks: bytes that are not (valid) HTTP, sent over a raw socket. Must hold: the
    peer answers 4xx or closes the connection, and keeps serving everyone else."""
    host, _, port = peer_address(peer_stays_up, "peer-1").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(RAW_GARBAGE[kind])
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
    if answer:
        status_line = answer.split(b"\r\n", 1)[0]
        assert status_line.split(b" ")[1].startswith(b"4"), status_line


async def test_request_signed_for_one_peer_is_refused_by_another(
    peer_stays_up: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a signed record write to peer A is captured and sent to peer B. Must hold
    (invariant 6): B refuses it with 401 and stores nothing."""
    first, second = rng.sample(peer_stays_up.cluster.addresses, 2)
    key = f"cross-peer/{rng.randrange(10**9)}"
    path = f"/v1/records/{key}?expected_version=0"
    async with HttpProbe(peer_stays_up.secret) as probe:
        headers = probe.signer.headers("PUT", path, b"value", target=first)
        assert (await probe.send(first, "PUT", path, body=b"value", headers=headers)).status == 201
        replayed = await probe.send(second, "PUT", path, body=b"value", headers=headers)
        assert replayed.status == 401, replayed
        assert (await probe.signed(second, "GET", f"/v1/records/{key}")).status == 404


# -- numbers and JSON that once made a peer answer 500 (issue 15, item 5) ------------------

FIVE_XX = "sr3_peer_responses_5xx_total"
# Percent-encoded digits that are not ASCII: "²" (str.isdigit takes it, int() does not),
# fullwidth one-two and Arabic-Indic three (int() reads both), "1²".
OTHER_DIGITS = ["%C2%B2", "%EF%BC%91%EF%BC%92", "%D9%A3", "1%C2%B2"]


async def _five_xx(probe: HttpProbe, address: str) -> float:
    return metric_value(await probe.metrics(address), FIVE_XX)


@pytest.mark.parametrize("digits", OTHER_DIGITS)
async def test_query_integers_in_other_digits_are_400(
    peer_stays_up: LocalCluster, target: str, rng: random.Random, digits: str
) -> None:
    """Breaks: integer query parameters written in digits that are not ASCII. Must hold:
    400 with a JSON error on every route that reads one, nothing written, no 5xx."""
    key = f"digits/{rng.randrange(10**9)}"
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        for method, path, body in [
            ("GET", f"/v1/records?prefix=digits/&limit={digits}", None),
            ("PUT", f"/v1/records/{key}?expected_version={digits}", b"v"),
            ("PUT", f"/v1/records/{key}?expected_version=0&refs={digits}", b"v"),
            ("PUT", f"/v1/records/{key}?version={digits}&refs=0", b"v"),
            ("DELETE", f"/v1/records/{key}?expected_version={digits}", None),
        ]:
            answer = await probe.signed(target, method, path, body=body)
            _assert_json_error(answer.status, answer.body, 400)
        assert (await probe.signed(target, "GET", f"/v1/records/{key}")).status == 404
        assert await _five_xx(probe, target) == before


@pytest.mark.parametrize(
    "timestamp",
    ["\u00b2", "{now}\u00b2", "{fullwidth}", "{now}" + "0" * 5000],
    ids=["superscript", "trailing superscript", "fullwidth", "5000 digits"],
)
async def test_signing_timestamp_in_other_digits_is_401(
    peer_stays_up: LocalCluster, target: str, timestamp: str
) -> None:
    """Breaks: X-SR3-Timestamp in digits that are not ASCII (or of thousands of digits)
    under an otherwise valid signature. Must hold: 401 with a JSON error, no 5xx."""
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        headers = probe.signer.headers("GET", "/v1/info", target=target)
        now = headers["X-SR3-Timestamp"]
        fullwidth = "".join(chr(ord(char) - ord("0") + 0xFF10) for char in now)
        headers["X-SR3-Timestamp"] = timestamp.format(now=now, fullwidth=fullwidth)
        answer = await probe.send(target, "GET", "/v1/info", headers=headers)
        _assert_json_error(answer.status, answer.body, 401)
        assert await _five_xx(probe, target) == before


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Authorization", "SR3-HMAC-SHA256 " + "\u00e9" * 64),
        ("X-SR3-Content-SHA256", "\u00e9" * 64),
        ("X-SR3-Target", "\u00e9"),
    ],
    ids=["signature", "body digest", "target"],
)
async def test_signing_headers_that_are_not_ascii_are_401(
    peer_stays_up: LocalCluster, target: str, header: str, value: str
) -> None:
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        headers = {**probe.signer.headers("GET", "/v1/info", target=target), header: value}
        answer = await probe.send(target, "GET", "/v1/info", headers=headers)
        _assert_json_error(answer.status, answer.body, 401)
        bearer = await probe.send(target, "GET", "/metrics", headers={"Authorization": value})
        _assert_json_error(bearer.status, bearer.body, 401)
        assert await _five_xx(probe, target) == before


def _gossip_entry(epoch: bytes, heartbeat: bytes = b"1") -> bytes:
    # A peer that does not exist: were it accepted, it would join the shared ring's table.
    return (
        b'{"members": [{"peer_id": "not-a-peer", "address": "127.0.0.254:1", '
        b'"zone": "", "status": "up", "epoch": ' + epoch + b', "heartbeat": ' + heartbeat + b"}]}"
    )


MALFORMED_BODIES = {
    "100k-deep list": b"[" * 100_000,
    "100k-deep object": b'{"ids": ' * 100_000,
    "5000-digit integer": _gossip_entry(b"7" * 5000),
    "1e400": _gossip_entry(b"1e400"),
    "-Infinity": _gossip_entry(b"-Infinity"),
    "NaN": _gossip_entry(b"NaN"),
    "epoch 10**30": _gossip_entry(str(10**30).encode()),
    "heartbeat 1.5": _gossip_entry(b"1", b"1.5"),
    "heartbeat true": _gossip_entry(b"1", b"true"),
    "address not host:port": _gossip_entry(b"1").replace(b"127.0.0.254:1", b"\\u00fc:1"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_BODIES))
@pytest.mark.parametrize(
    "path", ["/v1/gossip", "/v1/chunks/exists", "/v1/records/versions", "/v1/recovery/stream"]
)
async def test_malformed_json_bodies_are_400(
    peer_stays_up: LocalCluster, target: str, path: str, kind: str
) -> None:
    """Breaks: JSON nested 100k deep, numbers of thousands of digits, beyond a double,
    NaN, infinities, a version of 10**30, to every route that takes a JSON body. Must
    hold: 400 with a JSON error, no 5xx, the member table unchanged, the peer up."""
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        answer = await probe.signed(target, "POST", path, body=MALFORMED_BODIES[kind])
        _assert_json_error(answer.status, answer.body, 400)
        members = await probe.signed(target, "GET", "/v1/members")
        assert "not-a-peer" not in {member["peer_id"] for member in members.json()["members"]}
        assert await _five_xx(probe, target) == before


async def test_record_versions_are_bounded_and_a_key_stays_writable(
    peer_stays_up: LocalCluster, target: str, rng: random.Random
) -> None:
    """Breaks: versions beyond VERSION_MAX, by repair (``version``) and by compare-and-set
    (``expected_version``), which once left a key that no writer could name. Must hold:
    400, nothing stored, and the key is written normally afterwards."""
    from ring.api import VERSION_MAX

    key = f"huge-version/{rng.randrange(10**9)}"
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        for query in [
            f"version={VERSION_MAX + 1}&refs=0",
            f"version={10**17}1&refs=0",
            f"version={10**30}&refs=0",
            f"expected_version={VERSION_MAX}",
            f"expected_version={10**30}",
        ]:
            answer = await probe.signed(target, "PUT", f"/v1/records/{key}?{query}", body=b"v")
            _assert_json_error(answer.status, answer.body, 400)
        assert (await probe.signed(target, "GET", f"/v1/records/{key}")).status == 404
        path = f"/v1/records/{key}?version={VERSION_MAX - 1}&refs=0"
        assert (await probe.signed(target, "PUT", path, body=b"old")).status == 200
        path = f"/v1/records/{key}?expected_version={VERSION_MAX - 1}"
        assert (await probe.signed(target, "PUT", path, body=b"new")).status == 201
        answer = await probe.signed(target, "GET", f"/v1/records/{key}")
        assert (answer.status, answer.body) == (200, b"new")
        assert answer.headers["X-SR3-Version"] == str(VERSION_MAX)
        assert await _five_xx(probe, target) == before


# build_app keeps the Peer under a plain string key, which aiohttp warns about.
async def test_every_5xx_answer_is_json_and_counted(tmp_path: Path) -> None:
    """An in-process peer with one extra route that fails unexpectedly (a bug stands in
    for whatever input might still reach one). Must hold: a JSON 500, counted in
    ``sr3_peer_responses_5xx_total``; the fuzz tests assert that counter stays 0."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from ring.clock import SYSTEM_CLOCKS
    from ring.node import Node
    from ring.peer import build_app
    from ring.peer_config import PeerConfig

    secret = "fuzz-secret-0123456789abcdef"
    config = PeerConfig("p1", "127.0.0.1", 1, tmp_path, secret, overlay=False)
    node = Node(config, SYSTEM_CLOCKS)
    node.open()

    async def broken(_request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    def extension(app: web.Application, _node: Node) -> None:
        app.router.add_get("/v1/broken", broken)

    signer = Signer(secret, time.time)
    async with TestClient(TestServer(build_app(node, [extension]))) as client:
        for expected in (1, 2):
            headers = signer.headers("GET", "/v1/broken", target=config.address)
            answer = await client.get("/v1/broken", headers=headers)
            assert answer.status == 500
            assert (await answer.json())["error"] == "internal"
            headers = signer.headers("GET", "/metrics", target=config.address)
            metrics = await (await client.get("/metrics", headers=headers)).text()
            assert metric_value(metrics, FIVE_XX) == expected
    await node.data_transport.close()
    await node.control_transport.close()


@pytest.mark.parametrize("hint", ["%E2%82%AC" * 120, "x" * 200, "%0A", "%00x"])
async def test_a_hint_that_cannot_name_a_file_is_400_and_stores_nothing(
    peer_stays_up: LocalCluster, target: str, rng: random.Random, hint: str
) -> None:
    """Breaks: ``?hint=`` peer ids too long for a file name (in bytes of UTF-8) or not
    printable; the long one once made the hint store fail with ENAMETOOLONG, a 500.
    Must hold: 400, the chunk not stored, no 5xx."""
    chunk_id, stored = _fresh_chunk(rng)
    async with HttpProbe(peer_stays_up.secret) as probe:
        before = await _five_xx(probe, target)
        path = f"/v1/chunks/{chunk_id}?hint={hint}"
        answer = await probe.signed(target, "PUT", path, body=stored)
        _assert_json_error(answer.status, answer.body, 400)
        assert await _chunk_absent(probe, target, chunk_id)
        assert await _five_xx(probe, target) == before
