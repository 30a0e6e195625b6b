"""Integrity at the door of a real peer: it never keeps or serves bytes that do not match
their address, a client that hangs up is not a server error, and nothing a client sends
puts a traceback in the peer's log.

Real peer processes on loopback; chunk files are altered on disk where a case needs a
bad copy already stored (as a run that checked less would have left it).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import HttpProbe, MakeCluster, chunk_file, chunk_holders, metric_value
from yarl import URL

from ring import api, codec, paxos, records_api
from ring.auth import BodyDigest
from ring.client import Client
from ring.client.chunks import ChunkIO
from ring.errors import DataUnavailable
from ring.paxos import Ballot, Slot, Value
from ring.transport import Body
from sr3.local import LocalCluster
from sr3.statedata import state_bytes

UNRECOVERABLE = "sr3_peer_chunks_unrecoverable"
WAIT_S = 30.0


def _five_xx_but_not_ready(metrics: str) -> float:
    """5xx answers, but a starting peer's 503 to GET /v1/cluster ("not_ready": it has
    not learned the configuration yet), which a restart or the ring's start brings."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith("sr3_peer_requests_total{") or 'status="5' not in line:
            continue
        if 'route="/v1/cluster"' in line and 'status="503"' in line:
            continue
        total += float(line.rsplit(" ", 1)[1])
    return total


def _five_xx_routes(metrics: str) -> str:
    """Which routes answered 5xx, for a failure's message."""
    lines = [
        line
        for line in metrics.splitlines()
        if line.startswith("sr3_peer_requests_total{") and 'status="5' in line
    ]
    return "5xx answers: " + "; ".join(lines)


def _forged(raw: bytes, claimed: str) -> bytes:
    """``raw``'s stored form under the id ``claimed``: header and payload checksum
    valid, content not matching the address."""
    _other, other = codec.encode(raw)
    header = bytearray(other[: codec.HEADER_BYTES])
    header[32:48] = bytes.fromhex(claimed)
    return bytes(header) + other[codec.HEADER_BYTES :]


def _log(cluster: LocalCluster, index: int = 0) -> str:
    log_file = cluster.cluster.peers[index].log_file
    assert log_file is not None
    return Path(log_file).read_text(errors="replace")


async def _eventually(check: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        result = check() if callable(check) else check
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.2)


async def test_a_forged_compressed_chunk_is_refused_and_a_good_one_then_stored(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: a signed PUT of a compressed chunk whose payload is another chunk's, with
    a valid checksum (was: 201 created, then the good PUT answered "already here" and
    GET served the bad bytes). Must hold: 422 chunk_corrupt, nothing stored (HEAD 404),
    then the good PUT is 201 and GET serves the good bytes."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    chunk_id, good = codec.encode(state_bytes(65536, seed=11))
    assert codec.parse_header(good).codec == codec.CODEC_ZSTD
    path = f"/v1/chunks/{chunk_id}"
    async with HttpProbe(cluster.secret) as probe:
        forged = _forged(state_bytes(65536, seed=12), chunk_id)
        refused = await probe.signed(address, "PUT", path, body=forged)
        assert refused.status == 422 and refused.json()["error"] == "chunk_corrupt", refused
        assert (await probe.signed(address, "HEAD", path)).status == 404
        assert (await probe.signed(address, "PUT", path, body=good)).status == 201
        served = await probe.signed(address, "GET", path)
        assert served.status == 200 and served.body == good
        metrics = await probe.metrics(address)
        assert _five_xx_but_not_ready(metrics) == 0, _five_xx_routes(metrics)


def _send_and_hang_up(address: str, head: bytes, body: bytes) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head + body)
        time.sleep(0.1)


async def test_a_client_that_hangs_up_mid_body_is_counted_499_not_500(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: signed PUTs declaring 4 KiB and 64 MiB that send 1 KiB and close (was: a
    500 counted and a traceback logged for each). Must hold: the 5xx counter stays 0,
    the first is counted under status 499, the second under 413 (a chunk body longer
    than any chunk is refused by its declared length, before a byte of it is read),
    nothing is stored, the log has no traceback, and the peer keeps serving."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    chunk_id, stored = codec.encode(b"r" * 8192, compress=False)
    path = f"/v1/chunks/{chunk_id}"
    async with HttpProbe(cluster.secret) as probe:
        for declared in (4096, 64 * 1024 * 1024):
            headers = probe.signer.headers("PUT", path, stored, target=address)
            lines = [f"PUT {path} HTTP/1.1", f"Host: {address}", f"Content-Length: {declared}"]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            head = ("\r\n".join(lines) + "\r\n\r\n").encode()
            await asyncio.to_thread(_send_and_hang_up, address, head, stored[:1024])

        async def counted() -> bool:
            text = await probe.metrics(address)
            return 'status="499"} 1.0' in text and 'status="413"} 1.0' in text

        await _eventually(counted, "one request counted under 499, one under 413")
        text = await probe.metrics(address)
        assert _five_xx_but_not_ready(text) == 0, _five_xx_routes(text)
        assert 'status="500"' not in text
        assert (await probe.signed(address, "HEAD", path)).status == 404
        assert await probe.health(address) == 200
    assert "Traceback" not in _log(cluster)


def _send_and_read_answer(address: str, head: bytes, body: bytes) -> bytes:
    """Send ``head`` and the start of a body, keep the connection open, and return what
    the peer answers within ``WAIT_S`` (empty: nothing, it waits for the rest)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(head + body)
        try:
            return sock.recv(65536)
        except TimeoutError:
            return b""


async def test_a_body_declared_longer_than_its_route_takes_is_refused_before_it_is_sent(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: signed requests to a buffered route that is not a chunk PUT (which chunks
    a peer holds, a record accept) declare a body one byte over what a peer buffers
    (``api.REQUEST_BYTES_MAX``), send 1 KiB of it and wait (was: the peer read on,
    waiting for bytes it would refuse once they came). Must hold: each is answered 413 at
    once, counted 413, not 5xx, and the peer keeps serving."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    declared = api.REQUEST_BYTES_MAX + 1
    paths = [
        ("POST", api.CHUNKS_EXIST.pattern),
        ("POST", records_api.accept_path("door/long", paxos.FAST.wire(), "00ff")),
    ]
    async with HttpProbe(cluster.secret) as probe:
        for method, path in paths:
            headers = probe.signer.headers(method, path, b"{}", target=address)
            lines = [f"{method} {path} HTTP/1.1", f"Host: {address}"]
            lines += [f"Content-Length: {declared}"]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            head = ("\r\n".join(lines) + "\r\n\r\n").encode()
            answer = await asyncio.to_thread(_send_and_read_answer, address, head, b"{" * 1024)
            assert answer.startswith(b"HTTP/1.1 413 "), (path, answer[:200])
        text = await probe.metrics(address)
        assert text.count('status="413"} 1.0') == 2, text
        assert _five_xx_but_not_ready(text) == 0, _five_xx_routes(text)
        assert await probe.health(address) == 200
    assert "Traceback" not in _log(cluster)


async def _put_in_pieces(probe: HttpProbe, address: str, path: str, body: bytes) -> int:
    """PUT ``body``, signed, in 64 KiB pieces with no Content-Length (chunked transfer
    encoding): the peer cannot size its buffer from the headers."""

    async def pieces() -> AsyncIterator[bytes]:
        for offset in range(0, len(body), 65536):
            yield body[offset : offset + 65536]

    headers = probe.signer.headers("PUT", path, body, target=address)
    url = URL(f"http://{address}{path}", encoded=True)
    async with probe.session.put(url, data=pieces(), headers=headers) as answer:
        assert "Content-Length" not in answer.request_info.headers
        await answer.read()
        return answer.status


async def test_a_chunk_body_without_a_length_is_read_whole_and_bounded(
    make_cluster: MakeCluster,
) -> None:
    """The peer reads a chunk's body into one buffer of its declared length; a body sent
    without one must still be read whole, and still be bounded. Breaks if the reader
    trusts a length that is not there (a short or empty chunk stored, or a 5xx), or reads
    an unbounded body. Must hold: the chunk is stored and served byte for byte; a body
    one byte longer than the largest stored chunk is refused 413 and nothing is stored."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    chunk_id, stored = codec.encode(state_bytes(700_000, seed=21))
    path = f"/v1/chunks/{chunk_id}"
    too_long_id = "0" * 32
    too_long = b"x" * (codec.STORED_BYTES_MAX + 1)
    async with HttpProbe(cluster.secret) as probe:
        assert await _put_in_pieces(probe, address, path, stored) == 201
        served = await probe.signed(address, "GET", path)
        assert served.status == 200 and served.body == stored
        refused = await _put_in_pieces(probe, address, f"/v1/chunks/{too_long_id}", too_long)
        assert refused == 413
        assert (await probe.signed(address, "HEAD", f"/v1/chunks/{too_long_id}")).status == 404
        metrics = await probe.metrics(address)
        assert _five_xx_but_not_ready(metrics) == 0, _five_xx_routes(metrics)


async def test_malformed_request_lines_are_one_log_line_not_a_traceback_each(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: 50 requests with a 20 kB request line and 50 with a bad header (was: a
    traceback at error for each). Must hold: each is answered 400, the peer logs at
    most one line about them (rate-limited) and no traceback, and it keeps serving."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    host, _, port = address.rpartition(":")

    def send(request: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(request)
            return sock.recv(64)

    for index in range(50):
        answer = await asyncio.to_thread(send, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer[:16], answer
        answer = await asyncio.to_thread(send, b"GET / HTTP/1.1\r\nBad Header\x01: x\r\n\r\n")
        assert b" 400 " in answer[:16], (index, answer)
    async with HttpProbe(cluster.secret) as probe:
        assert await probe.health(address) == 200
        metrics = await probe.metrics(address)
        assert _five_xx_but_not_ready(metrics) == 0, _five_xx_routes(metrics)
    log = _log(cluster)
    assert "Traceback" not in log
    reports = [line for line in log.splitlines() if "malformed request" in line]
    assert len(reports) == 1, reports


async def test_a_slot_with_a_malformed_field_is_refused_at_the_acceptor(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: signed accepts whose slot says ``"deleted": 2`` or carries a
    ``deleted_at`` on a live value (checksums valid; the first was taken as "not
    deleted"). Must hold: 400 bad_request for both, the key stays absent, a valid
    accept then succeeds."""
    cluster = make_cluster(1, replication=1, write_quorum=1)
    address = cluster.cluster.addresses[0]
    key = "door/slot"
    ballot = Ballot(1, "ab")
    good = paxos.encode_slot(Slot(ballot, ballot, Value(1, b"v", op="01")))
    meta_len = int.from_bytes(good[4:8], "little")
    meta = good[8 : 8 + meta_len].replace(b'"version":1', b'"version":1,"deleted":2')
    deleted_two = good[:4] + len(meta).to_bytes(4, "little") + meta + good[8 + meta_len :]
    meta = good[8 : 8 + meta_len].replace(b'"version":1', b'"version":1,"deleted_at":5')
    other = good[:4] + len(meta).to_bytes(4, "little") + meta + good[8 + meta_len :]
    async with HttpProbe(cluster.secret) as probe:
        info = await probe.info(address)
        ring = (await probe.signed(address, "GET", "/v1/ring")).json()
        view = paxos.view_digest([info["peer_id"]])
        path = records_api.accept_path(key, ballot.wire(), view, epoch=ring["epoch"])
        for body in (deleted_two, other):
            answer = await probe.signed(address, "POST", path, body=body)
            assert answer.status == 400 and answer.json()["error"] == "bad_request", answer
        async with Client(cluster.ring, cluster.secret) as client:
            assert await client.get_record(key) is None
        answer = await probe.signed(address, "POST", path, body=good)
        assert answer.status == 200, answer


@pytest.mark.parametrize("restart", [False, True], ids=["scrubbed", "read-after-restart"])
async def test_a_chunk_bad_on_every_copy_is_reported_kept_and_healed_by_a_rewrite(
    make_cluster: MakeCluster, restart: bool
) -> None:
    """Breaks: every holder's copy of a chunk replaced on disk by another chunk's content
    under its id, checksum valid. Found by the scrubber, or by reads after a restart.
    Must hold: no reader gets the bad bytes (``DataUnavailable``); each holder
    quarantines its file (the bad bytes kept), lists the chunk as unrecoverable in
    /v1/info and its metric, and logs why at error; ``sr3 status`` says "corrupt"; then
    the writer's retry of the same data stores good copies, the listing clears, and the
    data reads back."""
    scrubbing = ["--scrub-rate", "100MB/s", "--scrub-interval", "1"]
    scrub = ["--scrub-rate", "0"] if restart else scrubbing
    flags = ["--repair-interval", "3600", *scrub]
    cluster = make_cluster(3, replication=3, write_quorum=2, peer_flags=flags)
    data = state_bytes(200 * 1024, seed=21)
    async with Client(cluster.ring, cluster.secret) as client:
        ref = await client.chunks.put_blob(data)
    (chunk_id,) = {extent.chunk_id for extent in ref.extents}
    await _eventually(lambda: len(chunk_holders(cluster, chunk_id)) == 3, "three copies")
    holders = chunk_holders(cluster, chunk_id)
    bad = _forged(state_bytes(200 * 1024, seed=22), chunk_id)
    for peer_id in holders:
        chunk_file(cluster, peer_id, chunk_id).write_bytes(bad)
    if restart:
        for peer_id in holders:
            cluster.stop(peer_id)
        for peer_id in holders:
            cluster.start(peer_id)
        async with Client(cluster.ring, cluster.secret) as client:
            with pytest.raises(DataUnavailable):
                await client.chunks.get_blob(ref)

    async with HttpProbe(cluster.secret) as probe:

        async def reported() -> bool:
            for peer_id in holders:
                info = await probe.info(cluster.peer(peer_id).address)
                if chunk_id not in info["chunks_unrecoverable"]:
                    return False
            return True

        await _eventually(reported, "every holder lists the chunk as unrecoverable")
        for peer_id in holders:
            address = cluster.peer(peer_id).address
            assert metric_value(await probe.metrics(address), UNRECOVERABLE) == 1
            assert (await probe.signed(address, "GET", f"/v1/chunks/{chunk_id}")).status == 404
            quarantine = Path(cluster.peer(peer_id).data_dir) / "quarantine"
            kept = [p.read_bytes() for p in quarantine.iterdir() if p.name.startswith(chunk_id)]
            assert bad in kept, peer_id
            metrics = await probe.metrics(address)
            assert _five_xx_but_not_ready(metrics) == 0, _five_xx_routes(metrics)
        logs = [_log(cluster, index) for index in range(3)]
        assert all(f"chunk {chunk_id} is corrupt here and none of" in log for log in logs)
        async with Client(cluster.ring, cluster.secret) as client:
            status = await client.admin.status()
            assert status.chunks_unrecoverable == (chunk_id,)
            with pytest.raises(DataUnavailable):
                await client.chunks.get_blob(ref)
            assert await client.chunks.put_blob(data) == ref
            assert await client.chunks.get_blob(ref) == data

        async def cleared() -> bool:
            for peer_id in holders:
                info = await probe.info(cluster.peer(peer_id).address)
                if info["chunks_unrecoverable"]:
                    return False
            return True

        await _eventually(cleared, "the listing clears once good copies are back")


async def test_a_chunk_whose_file_cannot_be_read_is_a_422_then_restored_not_a_500(
    make_cluster: MakeCluster,
) -> None:
    """Breaks: a holder's chunk file cannot be read (a directory in its place; a file
    rewritten in place under a read fails the same way, with EIO: that GET, from a peer
    restoring its own bad copy, answered 500 in one of three runs of the scrubbed case
    above). Must hold: the GET answers 422 chunk_corrupt, the copy is quarantined and
    fetched again from the other replica, then served; no 5xx is counted and the log
    has no traceback."""
    cluster = make_cluster(2, replication=2, write_quorum=2, peer_flags=["--scrub-rate", "0"])
    data = state_bytes(100 * 1024, seed=41)
    async with Client(cluster.ring, cluster.secret) as client:
        ref = await client.chunks.put_blob(data)
    (chunk_id,) = {extent.chunk_id for extent in ref.extents}
    await _eventually(lambda: len(chunk_holders(cluster, chunk_id)) == 2, "two copies")
    peer = cluster.cluster.peers[0]
    path = chunk_file(cluster, peer.peer_id, chunk_id)
    good = path.read_bytes()
    path.unlink()
    path.mkdir()
    async with HttpProbe(cluster.secret) as probe:
        answer = await probe.signed(peer.address, "GET", f"/v1/chunks/{chunk_id}")
        assert answer.status == 422 and answer.json()["error"] == "chunk_corrupt", answer

        async def restored() -> bool:
            again = await probe.signed(peer.address, "GET", f"/v1/chunks/{chunk_id}")
            return again.status == 200 and again.body == good

        await _eventually(restored, "the copy fetched again from the other replica")
        metrics = await probe.metrics(peer.address)
        assert _five_xx_but_not_ready(metrics) == 0, _five_xx_routes(metrics)
    quarantine = Path(peer.data_dir) / "quarantine"
    assert [p.name.split(".")[0] for p in quarantine.iterdir()] == [chunk_id]
    assert "Traceback" not in _log(cluster)


async def test_a_writer_whose_bytes_the_replicas_refuse_encodes_them_again(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: the client's first encoding of a chunk is bad after its own check (a
    memory fault, injected: another chunk's content under the id, checksum valid).
    Must hold: every replica refuses it (422), the client encodes the chunk again from
    its raw bytes and stores it; the blob reads back, and no replica kept the bad
    bytes."""
    cluster = make_cluster(3, replication=3, write_quorum=2)
    data = state_bytes(100 * 1024, seed=31)
    calls: list[str] = []
    real = ChunkIO._encode

    def faulty(self: ChunkIO, raw: bytes) -> tuple[str, Body, BodyDigest]:
        chunk_id, stored, digest = real(self, raw)
        calls.append(chunk_id)
        if len(calls) > 1:
            return chunk_id, stored, digest
        bad = _forged(state_bytes(100 * 1024, seed=32), chunk_id)
        return chunk_id, bad, self._transport.digest(bad)

    monkeypatch.setattr(ChunkIO, "_encode", faulty)
    async with Client(cluster.ring, cluster.secret) as client:
        ref = await client.chunks.put_blob(data)
        assert len(calls) == 2 and calls[0] == calls[1]
        assert await client.chunks.get_blob(ref) == data
    for peer_id in chunk_holders(cluster, calls[0]):
        assert codec.decode(chunk_file(cluster, peer_id, calls[0]).read_bytes()) == data
