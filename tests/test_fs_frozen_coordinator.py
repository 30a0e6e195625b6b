"""A frozen ``sr3://`` coordinator (SIGSTOP: its kernel accepts connections and buffers
what they carry, the process answers nothing) must not hold a client's request for the
client's own timeout, and a request that reached it must not be committed once it runs
again, after the client went on through another peer and wrote the same path anew.

The client (``FsClient``) probes a peer that has not answered (``GET /v1/health``) and
gives the request up there when the probe goes unanswered, then goes on through the next
seed; reads are hedged to the next seed as well. The peer (``filesystem.freshness``)
refuses (425 ``stalled``) to commit a write it stalled across or that came just after a
stall, and one whose client closed its connection.

Real peers on the shared 5-peer ring; the frozen peer is always resumed afterwards.
Requests the test writes by hand (``HeldRequest``) keep their connection open, as a
client that gave up without closing would: the peer's own clock, not the closed
connection, must stop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from pathlib import Path
from typing import Any

from support import HttpProbe, frozen, log_ends, tracebacks_since

from filesystem.freshness import AFTER_STALL_S, STALL_S, StallWatch
from ring import api, fs_api
from ring.auth import Signer
from ring.transport import Timeouts
from spark_connector.fs_client import PROBE_AFTER_S, PROBE_TIMEOUT_S, STALLED_PAUSE_S, FsClient
from sr3.local import LocalCluster

# The clients' timeouts in these tests: an attempt that waited for one to the frozen
# peer would take this long, far past the hang guard below.
PATIENT = Timeouts(connect_s=300.0, read_s=300.0)
# A hang guard, not a performance figure: a client that waits for its timeout on the
# frozen peer is stopped here (the latencies are in benchmarks/bench_gray.py).
HANG_S = 120.0
# How long a client waits on a coordinator before it sends the request elsewhere: it
# probes after PROBE_AFTER_S and gives up once the probe went unanswered for
# PROBE_TIMEOUT_S. The tests go elsewhere no sooner: a coordinator frozen for less than
# STALL_S was, to its client, a slow peer, and may still commit.
GIVE_UP_S = PROBE_AFTER_S + PROBE_TIMEOUT_S
# Requests through a peer that is not frozen, sent again after a 425 of its own.
STALLED_ATTEMPTS_MAX = 5


class HeldRequest:
    """A signed request written by hand on a connection the test holds open, its body in
    parts, and the peer's answer read when the test asks for it."""

    def __init__(self, secret: str, address: str, method: str, path_qs: str, body: bytes) -> None:
        self.address = address
        self.body = body
        signed = Signer(secret, time.time).headers(method, path_qs, body, target=address)
        lines = [f"{method} {path_qs} HTTP/1.1", f"Host: {address}"]
        lines += [f"{name}: {value}" for name, value in signed.items()]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        self.head = "\r\n".join(lines).encode()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, start: int, end: int) -> None:
        """Send the body's bytes ``[start, end)`` (the head first, when ``start`` is 0);
        they go out as the peer's kernel takes them."""
        if self._streams is None:
            host, port = self.address.rsplit(":", 1)
            self._streams = await asyncio.open_connection(host, int(port))
        writer = self._streams[1]
        writer.write((self.head if start == 0 else b"") + self.body[start:end])

    async def answer(self) -> tuple[int, dict[str, Any]]:
        assert self._streams is not None
        reader, writer = self._streams
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        self.close()
        return status, api.load_json(body) if body else {}

    def close(self) -> None:
        """Close the connection (a test that failed before reading the answer too)."""
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def put_through(
    probe: HttpProbe, address: str, path: str, data: bytes, op: str
) -> dict[str, Any]:
    """An overwriting PUT of ``path`` with operation id ``op`` through ``address``."""
    path_qs = fs_api.fs_path(fs_api.FS_WRITE, path) + f"?op={op}&overwrite=1"
    answer = await signed_past_stalls(probe, address, "PUT", path_qs, data)
    assert answer.status == 201, answer
    stat: dict[str, Any] = answer.json()
    return stat


async def signed_past_stalls(
    probe: HttpProbe, address: str, method: str, path_qs: str, body: bytes = b""
) -> Any:
    """A signed request through ``address`` (one that is not frozen), sent again after a
    425 stalled as the clients do: on a loaded machine that peer's own loop may pause."""
    for _attempt in range(STALLED_ATTEMPTS_MAX):
        answer = await probe.signed(address, method, path_qs, body=body)
        if answer.status != 425:
            return answer
        await asyncio.sleep(STALLED_PAUSE_S)
    return answer


def addresses(cluster: LocalCluster) -> list[str]:
    return [cluster.peer(f"peer-{index}").address for index in range(1, 6)]


async def test_a_write_the_coordinator_froze_across_is_not_committed_after_a_newer_one(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: an overwriting PUT of 600 kB (chunks) reaches peer-1, which has read half
    of its body when it is frozen; the rest waits in its socket buffer, the connection
    stays open. Meanwhile the same PUT (same op) goes through peer-2, then a newer
    version of the path. Must hold once peer-1 runs again: it answers 425 ``stalled``
    (it committed nothing), the newer version stands, and no peer logged a traceback."""
    coordinator, other = addresses(ring)[:2]
    path = f"/frozen/in-flight-{rng.randrange(10**9)}"
    older, newer = rng.randbytes(600_000), rng.randbytes(700_000)
    op = secrets.token_hex(12)
    ends = log_ends(ring)
    held = HeldRequest(
        ring.secret, coordinator, "PUT",
        fs_api.fs_path(fs_api.FS_WRITE, path) + f"?op={op}&overwrite=1", older,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:  # the held connections closed at the end
        async with asyncio.timeout(HANG_S), HttpProbe(ring.secret) as probe:
            stack.callback(held.close)
            await held.send(0, len(older) // 2)
            # The coordinator's handler starts and reads the first half (one that had not
            # started by the freeze would wait in the buffer instead, and be refused too).
            await asyncio.sleep(1.0)
            with frozen(ring, "peer-1"):
                await held.send(len(older) // 2, len(older))
                await asyncio.sleep(GIVE_UP_S)
                await put_through(probe, other, path, older, op)
                stat = await put_through(probe, other, path, newer, secrets.token_hex(12))
            status, answer = await held.answer()
            assert (status, answer.get("error")) == (425, "stalled"), answer
            async with FsClient([other], ring.secret) as client:
                assert await client.read(path) == newer
                assert (await client.stat(path)).version == stat["version"]
    assert tracebacks_since(ring, ends) == []


async def test_a_write_and_a_delete_that_waited_in_a_frozen_peers_buffer_are_not_committed(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: peer-1 is frozen before a PUT of 100 kB (inline) and a DELETE of another
    path reach it, whole, and wait in its socket buffer on connections held open.
    Meanwhile the PUT goes through peer-2 with the same op and a newer version follows;
    the DELETE goes through peer-2 and its path is written again. Must hold once peer-1
    runs again: both answer 425 ``stalled``; the newer version and the rewritten file
    stand."""
    coordinator, other = addresses(ring)[:2]
    base = f"/frozen/buffered-{rng.randrange(10**9)}"
    written, deleted = f"{base}/written", f"{base}/deleted"
    older, newer, again = rng.randbytes(100_000), rng.randbytes(90_000), rng.randbytes(80_000)
    op = secrets.token_hex(12)
    ends = log_ends(ring)
    with contextlib.ExitStack() as stack:  # the held connections closed at the end
        async with asyncio.timeout(HANG_S), HttpProbe(ring.secret) as probe:
            await put_through(probe, other, deleted, rng.randbytes(1000), secrets.token_hex(12))
            put = HeldRequest(
                ring.secret, coordinator, "PUT",
                fs_api.fs_path(fs_api.FS_WRITE, written) + f"?op={op}&overwrite=1", older,
            )  # fmt: skip
            delete = HeldRequest(
                ring.secret, coordinator, "DELETE", fs_api.fs_path(fs_api.FS_DELETE, deleted), b""
            )
            stack.callback(put.close)
            stack.callback(delete.close)
            with frozen(ring, "peer-1"):
                await put.send(0, len(older))
                await delete.send(0, 0)
                await asyncio.sleep(GIVE_UP_S)
                await put_through(probe, other, written, older, op)
                await put_through(probe, other, written, newer, secrets.token_hex(12))
                path_qs = fs_api.fs_path(fs_api.FS_DELETE, deleted)
                gone = await signed_past_stalls(probe, other, "DELETE", path_qs)
                assert gone.status == 200, gone
                await put_through(probe, other, deleted, again, secrets.token_hex(12))
            for held in (put, delete):
                status, answer = await held.answer()
                assert (status, answer.get("error")) == (425, "stalled"), answer
            async with FsClient([other], ring.secret) as client:
                assert await client.read(written) == newer
                assert await client.read(deleted) == again
    assert tracebacks_since(ring, ends) == []


async def test_a_client_whose_first_seed_is_frozen_reads_and_writes_through_the_next(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: peer-1, every client's first seed, is frozen; the clients wait 300 s for
    an answer or a connection (far past the hang guard). Must hold: a write, an
    overwrite, a rename, mkdirs, a delete, a stat, a listing and reads each complete,
    with the right results, each client having given its first request up on peer-1 or
    hedged it to peer-2 (counted), and no peer logged a traceback."""
    seeds = addresses(ring)
    base = f"/frozen/client-{rng.randrange(10**9)}"
    older, newer = rng.randbytes(300_000), rng.randbytes(5_000_000)
    ends = log_ends(ring)

    def client() -> FsClient:
        return FsClient(seeds, ring.secret, timeouts=PATIENT)

    async def went_around(fs: FsClient) -> None:
        assert fs.stats.abandoned + fs.stats.hedges >= 1, fs.stats
        await fs.close()

    async with asyncio.timeout(HANG_S):
        with frozen(ring, "peer-1"):
            fs = client()
            await fs.write(f"{base}/file", older)
            assert fs.stats.abandoned == 1, fs.stats
            await fs.write(f"{base}/file", newer, overwrite=True)  # through peer-2 now
            await went_around(fs)
            for action in (
                lambda fs: fs.mkdirs(f"{base}/dir"),
                lambda fs: fs.write(f"{base}/dir/gone", b"x"),
            ):
                fs = client()
                await action(fs)
                await went_around(fs)
            fs = client()
            await fs.rename(f"{base}/dir/gone", f"{base}/dir/moved")
            await went_around(fs)
            fs = client()
            assert await fs.delete(f"{base}/dir/moved") == 1
            await went_around(fs)
            fs = client()
            assert (await fs.stat(f"{base}/file")).size == len(newer)
            await went_around(fs)
            fs = client()
            assert [entry.name for entry in await fs.list(base)] == ["dir", "file"]
            await went_around(fs)
            fs = client()
            assert await fs.read(f"{base}/file") == newer
            await went_around(fs)
            fs = client()
            assert await fs.read(f"{base}/file", 1000, 4000) == newer[1000:5000]
            await went_around(fs)
        async with FsClient(seeds[1:], ring.secret) as fs:
            assert await fs.read(f"{base}/file") == newer
    assert tracebacks_since(ring, ends) == []


async def test_writes_just_after_their_only_seed_thawed_wait_the_refusal_out(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a client's only seed (peer-1) is frozen for 0.5 s and thawed just before a
    write and a delete through it; the peer refuses writes arriving within
    ``AFTER_STALL_S`` of a stall of its loop (425 stalled), longer than the client's
    rounds took without a pause (its pauses were computed as 0). Must hold: the client
    waits each refusal out and both go through once; the peer did refuse."""
    path = f"/frozen/thawed-{rng.randrange(10**9)}/file"
    data = rng.randbytes(20_000)
    peer = ring.peer("peer-1")
    ends = log_ends(ring)
    async with asyncio.timeout(HANG_S), FsClient(peer.address, ring.secret) as fs:
        await fs.write(path, b"before")
        for step in range(2):
            with frozen(ring, "peer-1"):
                await asyncio.sleep(0.5)
            if step == 0:
                await fs.write(path, data, overwrite=True)
            else:
                assert await fs.delete(path) == 1
        assert not await fs.exists(path)
    assert _refusals(peer.log_file, ends[peer.peer_id]) >= 2
    assert tracebacks_since(ring, ends) == []


def _refusals(log_file: str | None, end: int) -> int:
    """Writes a peer logged it did not commit (``filesystem.freshness``) past ``end``."""
    assert log_file is not None
    return Path(log_file).read_text(errors="replace")[end:].count("a write is not committed")


def test_a_stall_refuses_requests_across_it_and_just_after_it() -> None:
    """The watch's rules, on a clock the test sets: ticks every 50 ms are no stall; a
    gap above STALL_S is one; a request marked before it cannot commit after it, one
    marked within AFTER_STALL_S after it cannot either, one marked later can; and a
    loop that has not ticked for more than STALL_S refuses everything until it does."""
    watch = StallWatch(100.0)
    now = 100.0
    for _tick in range(20):
        now += 0.05
        assert watch.tick(now) <= STALL_S
    before = watch.mark(now)
    assert watch.refusal(before, now + 0.01) is None
    assert watch.refusal(before, now + STALL_S + 0.01) is not None  # not ticked since
    now += 2.0
    watch.tick(now)
    assert watch.stalls == 1
    assert watch.refusal(before, now) is not None  # in flight across the stall
    soon = watch.mark(now + 0.1)
    assert watch.refusal(soon, now + 0.1) is not None  # may have waited through it
    for _tick in range(int(AFTER_STALL_S / 0.05) + 2):
        now += 0.05
        watch.tick(now)
    later = watch.mark(now)
    assert watch.refusal(later, now) is None
    assert watch.refusal(soon, now) is not None
