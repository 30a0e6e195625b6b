"""A seeded fuzz pass against a real peer: malformed requests and datagrams never make it
answer 5xx, go down, or lose what it stored (invariant 7).

The pass sends a few hundred requests to a one-peer cluster of its own (a mutated gossip
body may be valid and add a member, which the shared ring must not see): every route of
``ring.api`` with malformed paths and query strings, signed, unsigned and tampered
signing headers, and bodies of random bytes, mutated valid bodies, deep nesting and
numbers no parser should take; then record rounds (prepare, accept, reads for a round)
with random and mutated ballots, views, next ballots and slot encodings, mostly signed
and often with the peer's real view, so that many reach the acceptor; then signed
requests that hang up mid-body and request lines the HTTP parser refuses. Then it checks
that every answer was below 500 and every error a JSON body, that the peer's 5xx
counter is 0 (a hang-up counts as 499), that its log holds no traceback, that it answers
``GET /v1/health`` from the same process, and that what was stored before reads back
intact. A failing pass prints its seed (``SR3_TEST_SEED``)
and replays exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from support import Answer, HttpProbe, MakeCluster, metric_value

from ring import api, codec, paxos, records_api
from ring.client import Client
from ring.paxos import FAST, Ballot, Slot, Value
from sr3.local import LocalCluster

REQUESTS = 300
RECORD_REQUESTS = 200
DATAGRAMS = 60
HANG_UPS = 30
FIVE_XX = "sr3_peer_responses_5xx_total"
KEEP_KEY = "keep/fuzz-record"
ROUTES = sorted(
    (value for value in vars(api).values() if isinstance(value, api.Route)),
    key=lambda route: (route.pattern, route.method),
)
# Signed, these would stop the peer on purpose; unsigned or tampered they are fuzzed too.
SIGNED_EXCLUDED = {api.ADMIN_LEAVE, api.ADMIN_KILL}
QUERY_NAMES = [
    "limit", "prefix", "deleted", "hint", "ballot", "next", "view", "scan", "head", "after",
    "delimiter",
]  # fmt: skip
NUMBERS = [
    "0", "1", "7", "-1", "1.5", "1e3", "0x10", "", "NaN", "Infinity", "%00", "%",
    "%zz", "9" * 19, "18446744073709551616", "9" * 4000, str(api.VERSION_MAX),
    str(api.VERSION_MAX + 1), "%C2%B2", "1%C2%B2", "%EF%BC%91%EF%BC%92", "%D9%A3",
]  # fmt: skip
BALLOTS = [
    "0.", "1.ab", "2.ab", "7.f", "1.5", f"{paxos.COUNTER_MAX}.f", f"{paxos.COUNTER_MAX + 1}.f",
    "0.ab", "1.", ".ab", "1.AB", "1.xyz", "1.5.ab", "-1.ab", "1e3.ab", "0x1.ab", "+1.ab",
    "%C2%B2.ab", "1.%C2%B2", "%EF%BC%91.ab", "1." + "f" * 33, "1." + "f" * 80, "%00", "",
]  # fmt: skip
BAD_TIMESTAMPS = ["\u00b2", "\uff11\uff17\uff10\uff10", "9" * 3000, "-1", "1.5", ""]
BAD_HEADER_VALUES = ["\u00e9" * 64, "\u00b2", "", "x" * 4000, "SR3-HMAC-SHA256 " + "\u00e9" * 64]


@dataclass(frozen=True)
class Stored:
    """What the peer holds before the pass, to read back after it, and the view digest
    it computes for every key (a one-peer ring: it is every key's acceptor)."""

    chunk_id: str
    chunk: bytes
    record: bytes
    view: str


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


def _ballot(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return Ballot(rng.randrange(1, 2**20), rng.randbytes(rng.randrange(1, 9)).hex()).wire()
    return rng.choice(BALLOTS) if rng.random() < 0.8 else rng.choice(NUMBERS)


def _view(rng: random.Random, stored: Stored) -> str:
    return rng.choice(
        [
            stored.view,
            stored.view,
            rng.randbytes(8).hex(),
            stored.view.upper(),
            stored.view[:-1],
            stored.view + "0",
            "",
            "%C3%A9" * 4,
            "%00",
            _percent(rng.randbytes(8)),
        ]
    )


def _query_value(rng: random.Random, name: str, stored: Stored) -> str:
    if rng.random() < 0.2:
        return _percent(rng.randbytes(6))
    if name in ("ballot", "next"):
        return _ballot(rng)
    if name == "view":
        return _view(rng, stored)
    if name in ("prefix", "after") and rng.random() < 0.5:
        return rng.choice(["fuzz/", "fuzz", "x" * 2000, "%C3%A9/", "%00", "/"])
    return rng.choice(NUMBERS)


def _query(rng: random.Random, stored: Stored) -> str:
    pairs = []
    for _ in range(rng.randrange(4)):
        name = rng.choice(QUERY_NAMES)
        pairs.append(f"{name}={_query_value(rng, name, stored)}")
    return "?" + "&".join(pairs) if pairs else ""


def _path(rng: random.Random, route: api.Route, stored: Stored) -> str:
    path = route.pattern.replace("{chunk_id}", _chunk_id(rng, stored))
    path = path.replace("{key:.+}", _key(rng))
    if rng.random() < 0.1:
        path += rng.choice(["/", "//x", "/%00", "/%FF", "/.."])
    return path + _query(rng, stored)


def _value(rng: random.Random, stored: Stored) -> Value:
    deleted = rng.random() < 0.2
    return Value(
        rng.choice([1, 2, rng.randrange(1, 1000), api.VERSION_MAX]),
        b"" if deleted else rng.randbytes(rng.randrange(0, 300)),
        () if deleted else rng.choice([(), (stored.chunk_id,), (codec.chunk_id(b"x"),)]),
        deleted,
        rng.randbytes(rng.randrange(0, 13)).hex(),
    )


def _slot_body(rng: random.Random, stored: Stored) -> bytes:
    """An accept's body: a valid slot encoding, a mutated one, or noise."""
    ballot = rng.choice([FAST, Ballot(1, "ab"), Ballot(rng.randrange(1, 99), "f")])
    valid = paxos.encode_slot(Slot(ballot, ballot, _value(rng, stored)))
    kind = rng.randrange(5)
    if kind <= 1:
        return valid
    if kind == 2:
        return _mutate(rng, valid)
    if kind == 3:
        cut = rng.randrange(len(valid) + 1)
        return valid[:cut] + rng.randbytes(rng.randrange(0, 40))
    return rng.choice([b"", b"SR3P", b"SR3P" + rng.randbytes(rng.randrange(4, 200))])


def _round_path(rng: random.Random, route: api.Route, key: str, stored: Stored) -> str:
    """A record route for ``key``, its query drawn mostly from plausible ballots and views."""
    view = _view(rng, stored)
    if route == api.RECORD_GET:
        return (
            records_api.record_raw_path(key)
            if rng.random() < 0.3
            else records_api.record_round_path(key, view)
        )
    if route == api.PAXOS_PREPARE:
        return records_api.prepare_path(key, _ballot(rng), view)
    following = _ballot(rng) if rng.random() < 0.5 else None
    return records_api.accept_path(key, _ballot(rng), view, following)


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
        records_api.versions_request([KEEP_KEY, "fuzz/1"]),
        json.dumps({"peer_id": "peer-1", "own": [stored.chunk_id], "upstreams": []}).encode(),
        records_api.record_envelope([stored.chunk_id], b"fuzz value"),
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


async def _store(
    probe: HttpProbe, cluster: LocalCluster, address: str, rng: random.Random
) -> Stored:
    chunk_id, chunk = codec.encode(rng.randbytes(4096))
    assert (await probe.signed(address, "PUT", f"/v1/chunks/{chunk_id}", body=chunk)).status == 201
    record = f"kept through the fuzz pass {rng.randrange(10**9)}".encode()
    async with Client(cluster.ring, cluster.secret) as client:
        written = await client.put_record(KEEP_KEY, record, expected_version=0, refs=[chunk_id])
        assert written == 1
    view = paxos.view_digest([cluster.cluster.peers[0].peer_id])
    return Stored(chunk_id, chunk, record, view)


async def _read_back(probe: HttpProbe, cluster: LocalCluster, stored: Stored) -> None:
    address = cluster.cluster.addresses[0]
    chunk = await probe.signed(address, "GET", f"/v1/chunks/{stored.chunk_id}")
    assert (chunk.status, chunk.body) == (200, stored.chunk)
    answer = await probe.signed(
        address, "GET", records_api.record_round_path(KEEP_KEY, stored.view)
    )
    assert answer.status == 200, answer
    assert answer.headers[api.HEADER_VIEW] == stored.view
    slot, _meta = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)
    value = slot.value
    assert (value.version, value.data, value.refs, value.deleted) == (
        1,
        stored.record,
        (stored.chunk_id,),
        False,
    )
    async with Client(cluster.ring, cluster.secret) as client:
        record = await client.get_record(KEEP_KEY)
        assert record is not None and (record.version, record.value) == (1, stored.record)


async def _one_request(
    probe: HttpProbe, address: str, rng: random.Random, stored: Stored, statuses: Counter[int]
) -> None:
    route = rng.choice(ROUTES)
    path = _path(rng, route, stored)
    if route.method not in ("PUT", "POST"):
        body = rng.choice([None, b"x"])
    elif route == api.PAXOS_ACCEPT and rng.random() < 0.5:
        body = _slot_body(rng, stored)
    else:
        body = _body(rng, stored)
    headers = _headers(rng, probe, route.method, path, body, address)
    if route in SIGNED_EXCLUDED and api.HEADER_AUTHORIZATION in headers:
        headers[api.HEADER_TIMESTAMP] = "\u00b2"
    answer = await probe.send(address, route.method, path, body=body, headers=headers)
    statuses[answer.status] += 1
    _check(answer, route.method, f"{route.method} {path[:120]} body={(body or b'')[:60]!r}")


async def _one_round_message(
    probe: HttpProbe, address: str, rng: random.Random, stored: Stored, statuses: Counter[int]
) -> None:
    """A prepare, accept or read for a round on a fuzz key, signed in most cases."""
    route = rng.choice([api.PAXOS_PREPARE, api.PAXOS_ACCEPT, api.RECORD_GET])
    key = rng.choice([f"fuzz/round-{rng.randrange(8)}", _key(rng)])
    path = _round_path(rng, route, key, stored)
    body = _slot_body(rng, stored) if route == api.PAXOS_ACCEPT else None
    if rng.random() < 0.85:
        headers = probe.signer.headers(route.method, path, body, target=address)
    else:
        headers = _headers(rng, probe, route.method, path, body, address)
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
    body = paxos.encode_slot(Slot(Ballot(1, "ab"), Ballot(1, "ab"), Value(1, b"v", op="01")))
    for digits in ("%C2%B2", "%EF%BC%91%EF%BC%92", str(10**30)):
        for path, sent in [
            (records_api.prepare_path("fuzz/digits", f"{digits}.ab", stored.view), None),
            (records_api.accept_path("fuzz/digits", f"{digits}.ab", stored.view), body),
            (records_api.accept_path("fuzz/digits", "1.ab", stored.view, f"{digits}.ab"), body),
        ]:
            answer = await probe.signed(address, "POST", path, body=sent)
            _check(answer, "POST", path)
            assert answer.status == 400, (path, answer.body[:200])
    chunk_id, chunk = codec.encode(b"hinted write")
    for hint in ("%E2%82%AC" * 120, "%0A", "x" * 200):
        path = f"/v1/chunks/{chunk_id}?hint={hint}"
        answer = await probe.signed(address, "PUT", path, body=chunk)
        _check(answer, "PUT", path)
        assert answer.status == 400
    # A compressed chunk whose content is another's under the id (checksum valid), and
    # a signed accept whose slot says "deleted": 2 (issue 26's cases).
    packed_id, packed = codec.encode(b"fuzzed content " * 400)
    _other, other = codec.encode(b"other content! " * 400)
    forged = other[:32] + packed[32:48] + other[48:]
    answer = await probe.signed(address, "PUT", f"/v1/chunks/{packed_id}", body=forged)
    _check(answer, "PUT", "forged compressed chunk")
    assert answer.status == 422, answer
    meta_len = int.from_bytes(body[4:8], "little")
    meta = body[8 : 8 + meta_len].replace(b'"version":1', b'"version":1,"deleted":2')
    deleted_two = body[:4] + len(meta).to_bytes(4, "little") + meta + body[8 + meta_len :]
    path = records_api.accept_path("fuzz/deleted", "1.ab", stored.view)
    answer = await probe.signed(address, "POST", path, body=deleted_two)
    _check(answer, "POST", "deleted: 2")
    assert answer.status == 400, answer
    for timestamp in BAD_TIMESTAMPS:
        headers = probe.signer.headers("GET", "/v1/info", target=address)
        headers[api.HEADER_TIMESTAMP] = timestamp
        answer = await probe.send(address, "GET", "/v1/info", headers=headers)
        _check(answer, "GET", f"timestamp {timestamp[:20]!r}")
        assert answer.status == 401


def _hang_up(address: str, head: bytes, body: bytes) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head + body)


async def _hang_ups(probe: HttpProbe, address: str, rng: random.Random, stored: Stored) -> None:
    """Signed requests with a body that declare more bytes than they send, then close;
    and raw request lines too long or malformed for the parser."""
    bodied = [route for route in ROUTES if route.method in ("PUT", "POST")]
    bodied = [route for route in bodied if route not in SIGNED_EXCLUDED]
    for _ in range(HANG_UPS):
        route = rng.choice(bodied)
        path = _path(rng, route, stored)
        body = rng.randbytes(rng.randrange(1, 4096))
        headers = probe.signer.headers(route.method, path, body, target=address)
        declared = len(body) + rng.choice([1, 4096, 64 * 1024 * 1024])
        lines = [f"{route.method} {path} HTTP/1.1", f"Host: {address}"]
        lines += [f"Content-Length: {declared}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sent = body[: rng.randrange(0, len(body) + 1)]
        await asyncio.to_thread(_hang_up, address, ("\r\n".join(lines) + "\r\n\r\n").encode(), sent)
    for _ in range(HANG_UPS):
        line = rng.choice(
            [b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nA\x01: b\r\n\r\n"]
        )
        await asyncio.to_thread(_hang_up, address, line, b"")


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
    await _read_back(probe, cluster, stored)
    log_file = peer.log_file
    assert log_file is not None
    log = await asyncio.to_thread(Path(log_file).read_text, errors="replace")
    assert "Traceback" not in log


async def test_fuzzed_requests_and_datagrams_get_4xx_and_leave_the_peer_intact(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: a few hundred malformed requests to every route, a few hundred record
    round messages (prepare, accept, reads) with random ballots, views and slot bodies,
    and malformed datagrams to the overlay. Must hold: no answer is 5xx, every error is
    JSON, the 5xx counter stays 0, the same process answers health, and stored data
    (a chunk and a record referencing it) reads back intact."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    pid = cluster.cluster.peers[0].pid
    statuses: Counter[int] = Counter()
    async with HttpProbe(cluster.secret) as probe:
        stored = await _store(probe, cluster, address, rng)
        await _known_cases(probe, address, stored)
        for _ in range(REQUESTS):
            await _one_request(probe, address, rng, stored, statuses)
        for _ in range(RECORD_REQUESTS):
            await _one_round_message(probe, address, rng, stored, statuses)
        await _hang_ups(probe, address, rng, stored)
        _send_datagrams(address, rng)
        await asyncio.sleep(0.5)
        await _peer_is_intact(probe, cluster, pid, stored)
    assert sum(statuses.values()) == REQUESTS + RECORD_REQUESTS
    assert any(400 <= status < 500 for status in statuses), statuses
    # The round messages reached the acceptor, not only the parsers in front of it.
    assert statuses[200] and statuses[409], statuses
