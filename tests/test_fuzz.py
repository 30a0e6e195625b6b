"""A seeded fuzz pass against a real peer: malformed requests and datagrams never make it
answer 5xx, go down, or lose what it stored (invariant 7).

The pass sends a few hundred requests to a one-peer cluster of its own (a mutated gossip
body may be valid and add a member, which the shared ring must not see): every route of
``ring.api`` with malformed paths and query strings, signed, unsigned and tampered
signing headers, and bodies of random bytes, mutated valid bodies, deep nesting and
numbers no parser should take. Then it checks that every answer was below 500 and every
error a JSON body, that the peer's 5xx counter is 0, that it answers ``GET /v1/health``
from the same process, and that what was stored before reads back intact. A failing
pass prints its seed (``SR3_TEST_SEED``) and replays exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from support import Answer, HttpProbe, MakeCluster, metric_value

from ring import api, codec
from sr3.local import LocalCluster

REQUESTS = 300
DATAGRAMS = 60
FIVE_XX = "sr3_peer_responses_5xx_total"
KEEP_KEY = "keep/fuzz-record"
ROUTES = sorted(
    (value for value in vars(api).values() if isinstance(value, api.Route)),
    key=lambda route: (route.pattern, route.method),
)
# Signed, these would stop the peer on purpose; unsigned or tampered they are fuzzed too.
SIGNED_EXCLUDED = {api.ADMIN_LEAVE, api.ADMIN_KILL}
QUERY_NAMES = ["limit", "prefix", "deleted", "refs", "version", "expected_version", "hint"]
NUMBERS = [
    "0", "1", "7", "-1", "1.5", "1e3", "0x10", "", "NaN", "Infinity", "%00", "%",
    "%zz", "9" * 19, "18446744073709551616", "9" * 4000, str(api.VERSION_MAX),
    str(api.VERSION_MAX + 1), "%C2%B2", "1%C2%B2", "%EF%BC%91%EF%BC%92", "%D9%A3",
]  # fmt: skip
BAD_TIMESTAMPS = ["\u00b2", "\uff11\uff17\uff10\uff10", "9" * 3000, "-1", "1.5", ""]
BAD_HEADER_VALUES = ["\u00e9" * 64, "\u00b2", "", "x" * 4000, "SR3-HMAC-SHA256 " + "\u00e9" * 64]


@dataclass(frozen=True)
class Stored:
    """What the peer holds before the pass, to read back after it."""

    chunk_id: str
    chunk: bytes
    record: bytes


def _percent(data: bytes) -> str:
    return "".join(f"%{byte:02X}" for byte in data)


def _chunk_id(rng: random.Random, stored: Stored) -> str:
    return rng.choice(
        [
            stored.chunk_id,
            codec.chunk_id(rng.randbytes(8)),
            "A" * 32,
            "0" * 31,
            _percent(rng.randbytes(rng.randrange(1, 40))),
            "..%2F..%2Fetc%2Fpasswd",
            "%",
            "%C3%A9" * 16,
        ]
    )


def _key(rng: random.Random) -> str:
    key = rng.choice(
        [
            f"fuzz/{rng.randrange(1000)}",
            "fuzz/" + _percent(rng.randbytes(rng.randrange(1, 30))),
            "../fuzz",
            "fuzz/./x",
            "k" * 600,
            "%C3%A9",
            "fuzz%2F..%2F..",
            "-fuzz",
        ]
    )
    assert key != KEEP_KEY
    return key


def _query(rng: random.Random) -> str:
    pairs = []
    for _ in range(rng.randrange(4)):
        name = rng.choice(QUERY_NAMES)
        value = rng.choice(NUMBERS) if rng.random() < 0.8 else _percent(rng.randbytes(6))
        pairs.append(f"{name}={value}")
    return "?" + "&".join(pairs) if pairs else ""


def _path(rng: random.Random, route: api.Route, stored: Stored) -> str:
    path = route.pattern.replace("{chunk_id}", _chunk_id(rng, stored))
    path = path.replace("{key:.+}", _key(rng))
    if rng.random() < 0.1:
        path += rng.choice(["/", "//x", "/%00", "/%FF", "/.."])
    return path + _query(rng)


def _gossip(
    epoch: bytes = b"1", heartbeat: bytes = b"1", address: bytes = b"127.0.0.254:1"
) -> bytes:
    return (
        b'{"members": [{"peer_id": "fuzz-peer", "address": "' + address + b'", "zone": "", '
        b'"status": "up", "epoch": ' + epoch + b', "heartbeat": ' + heartbeat + b"}]}"
    )


def _valid_bodies(stored: Stored) -> list[bytes]:
    return [
        _gossip(),
        api.exists_request([stored.chunk_id], sizes=True),
        api.versions_request([KEEP_KEY, "fuzz/1"]),
        json.dumps({"peer_id": "peer-1", "own": [stored.chunk_id], "upstreams": []}).encode(),
        api.record_envelope([stored.chunk_id], b"fuzz value"),
    ]


# Bodies that once made a peer answer 500: deep nesting, huge and non-finite numbers.
KNOWN_BAD_BODIES = [
    b"[" * 100_000,
    b'{"ids": ' * 50_000,
    _gossip(b"7" * 5000),
    _gossip(b"1e400"),
    _gossip(b"-Infinity"),
    _gossip(b"NaN"),
    _gossip(str(10**30).encode()),
    _gossip(b"1", b"1.5"),
    _gossip(b"1", b"true"),
    _gossip(address=b"\\u00fc:1"),
    _gossip(address=b"127.0.0.254:99999"),
    b'{"ids": [' + b"1" * 5000 + b"]}",
    b'{"keys": [1e400]}',
]


def _mutate(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randrange(1, 6)):
        position = rng.randrange(len(data) + 1)
        action = rng.randrange(4)
        if action == 0 and data:
            data[min(position, len(data) - 1)] = rng.randrange(256)
        elif action == 1:
            token = rng.choice(
                [b"[", b"{", b'"', b"\\", b"1e400", b"NaN", b"-", b"9" * 40, b"\xff"]
            )
            data[position:position] = token
        elif action == 2:
            del data[position : position + rng.randrange(1, 8)]
        else:
            data[position:position] = data[: rng.randrange(len(data) + 1)]
    return bytes(data)


def _body(rng: random.Random, stored: Stored) -> bytes | None:
    kind = rng.randrange(6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.randbytes(rng.randrange(0, 2000))
    if kind == 2:
        return rng.choice(KNOWN_BAD_BODIES)
    if kind == 3:
        return rng.choice([b"[", b'{"a":', b'{"members":[']) * rng.choice([33, 1000, 100_000])
    return _mutate(rng, rng.choice(_valid_bodies(stored)))


def _headers(
    rng: random.Random, probe: HttpProbe, method: str, path: str, body: bytes | None, target: str
) -> dict[str, str]:
    mode = rng.random()
    if mode < 0.15:
        return {}
    headers = probe.signer.headers(method, path, body, target=target)
    if mode < 0.75:
        return headers
    if rng.random() < 0.5:
        headers[api.HEADER_TIMESTAMP] = rng.choice(BAD_TIMESTAMPS)
    else:
        header = rng.choice(
            [
                api.HEADER_AUTHORIZATION,
                api.HEADER_CONTENT_SHA256,
                api.HEADER_NONCE,
                api.HEADER_TARGET,
                api.HEADER_TIMESTAMP,
            ]
        )
        headers[header] = rng.choice(BAD_HEADER_VALUES)
    return headers


def _check(answer: Answer, method: str, what: str) -> None:
    assert answer.status < 500, (what, answer.status, answer.body[:300])
    if answer.status >= 400 and method != "HEAD":
        error = json.loads(answer.body)
        assert isinstance(error.get("error"), str) and error["error"], (what, error)


async def _store(probe: HttpProbe, address: str, rng: random.Random) -> Stored:
    chunk_id, chunk = codec.encode(rng.randbytes(4096))
    assert (await probe.signed(address, "PUT", f"/v1/chunks/{chunk_id}", body=chunk)).status == 201
    record = f"kept through the fuzz pass {rng.randrange(10**9)}".encode()
    path = api.record_cas_path(KEEP_KEY, 0, 1)
    body = api.record_envelope([chunk_id], record)
    assert (await probe.signed(address, "PUT", path, body=body)).status == 201
    return Stored(chunk_id, chunk, record)


async def _read_back(probe: HttpProbe, address: str, stored: Stored) -> None:
    chunk = await probe.signed(address, "GET", f"/v1/chunks/{stored.chunk_id}")
    assert (chunk.status, chunk.body) == (200, stored.chunk)
    record = await probe.signed(address, "GET", api.record_path(KEEP_KEY))
    assert (record.status, record.body) == (200, stored.record)
    assert record.headers[api.HEADER_VERSION] == "1"


async def _one_request(
    probe: HttpProbe, address: str, rng: random.Random, stored: Stored, statuses: Counter[int]
) -> None:
    route = rng.choice(ROUTES)
    path = _path(rng, route, stored)
    body = _body(rng, stored) if route.method in ("PUT", "POST") else rng.choice([None, b"x"])
    headers = _headers(rng, probe, route.method, path, body, address)
    if route in SIGNED_EXCLUDED and api.HEADER_AUTHORIZATION in headers:
        headers[api.HEADER_TIMESTAMP] = "\u00b2"
    answer = await probe.send(address, route.method, path, body=body, headers=headers)
    statuses[answer.status] += 1
    _check(answer, route.method, f"{route.method} {path[:120]} body={(body or b'')[:60]!r}")


async def _known_cases(probe: HttpProbe, address: str, stored: Stored) -> None:
    """The inputs issue 15 found, every time, before the random ones."""
    for route in (api.GOSSIP, api.CHUNKS_EXIST, api.RECORD_VERSIONS, api.RECOVERY_STREAM):
        for body in KNOWN_BAD_BODIES:
            answer = await probe.signed(address, route.method, route.pattern, body=body)
            _check(answer, route.method, f"{route.pattern} {body[:60]!r}")
            assert answer.status == 400, (route.pattern, body[:60], answer.body[:200])
    for digits in ("%C2%B2", "%EF%BC%91%EF%BC%92", str(10**30)):
        path = f"/v1/records/fuzz/digits?expected_version={digits}"
        answer = await probe.signed(address, "PUT", path, body=b"v")
        _check(answer, "PUT", path)
        assert answer.status == 400
    chunk_id, chunk = codec.encode(b"hinted write")
    for hint in ("%E2%82%AC" * 120, "%0A", "x" * 200):
        path = f"/v1/chunks/{chunk_id}?hint={hint}"
        answer = await probe.signed(address, "PUT", path, body=chunk)
        _check(answer, "PUT", path)
        assert answer.status == 400
    for timestamp in BAD_TIMESTAMPS:
        headers = probe.signer.headers("GET", "/v1/info", target=address)
        headers[api.HEADER_TIMESTAMP] = timestamp
        answer = await probe.send(address, "GET", "/v1/info", headers=headers)
        _check(answer, "GET", f"timestamp {timestamp[:20]!r}")
        assert answer.status == 401


def _send_datagrams(address: str, rng: random.Random) -> None:
    """Malformed UDP datagrams to the overlay (the peer's port, over UDP)."""
    host, _, port = address.rpartition(":")
    datagrams: list[Callable[[], bytes]] = [
        lambda: b"",
        lambda: rng.randbytes(rng.randrange(1, 1400)),
        lambda: rng.randbytes(60_000),
        lambda: b"\x00" * rng.randrange(1, 200),
        lambda: b"\xff" * rng.randrange(1, 200),
        lambda: json.dumps({"nested": [[[[]]]]}).encode() * rng.randrange(1, 50),
    ]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(DATAGRAMS):
            sock.sendto(rng.choice(datagrams)(), (host, int(port)))


async def _peer_is_intact(
    probe: HttpProbe, cluster: LocalCluster, pid: int | None, stored: Stored
) -> None:
    address = cluster.cluster.addresses[0]
    assert await probe.health(address) == 200
    peer = cluster.cluster.peers[0]
    assert peer.pid == pid and cluster.running(peer.peer_id), "the peer was restarted or died"
    assert metric_value(await probe.metrics(address), FIVE_XX) == 0
    await _read_back(probe, address, stored)


async def test_fuzzed_requests_and_datagrams_get_4xx_and_leave_the_peer_intact(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: a few hundred malformed requests to every route and malformed datagrams
    to the overlay. Must hold: no answer is 5xx, every error is JSON, the 5xx counter
    stays 0, the same process answers health, and stored data reads back intact."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    pid = cluster.cluster.peers[0].pid
    statuses: Counter[int] = Counter()
    async with HttpProbe(cluster.secret) as probe:
        stored = await _store(probe, address, rng)
        await _known_cases(probe, address, stored)
        for _ in range(REQUESTS):
            await _one_request(probe, address, rng, stored, statuses)
        _send_datagrams(address, rng)
        await asyncio.sleep(0.5)
        await _peer_is_intact(probe, cluster, pid, stored)
    assert sum(statuses.values()) == REQUESTS
    assert any(400 <= status < 500 for status in statuses), statuses
