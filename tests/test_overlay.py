"""The discovery overlay on real UDP sockets: joining, values, and what it refuses.

Every node is an in-process ``Overlay`` on its own loopback address (127.0.0.2 and up)
with its ``run()`` in a task that the ``swarm`` fixture cancels and awaits, then
``stop()``s. Attackers are bare UDP sockets that build datagrams by hand from the wire
format in ``ring.overlay``'s docstring (tag | version | timestamp | source | destination
| rpcudp payload), so the tests check the format as specified, not as implemented.

Every datagram a node receives ends up counted exactly once: as handled or under one drop
reason. Tests wait on that count to know a node has processed what they sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pytest
import umsgpack
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ring.overlay as overlay_module
from ring.overlay import (
    DATAGRAM_BYTES_MAX,
    DROP_REASONS,
    INBOX_DATAGRAMS_MAX,
    SKEW_S_MAX,
    VALUE_BYTES_MAX,
    Overlay,
    OverlayStats,
    node_id_for,
)

SECRET = "overlay-test-secret-0123456789"
WRONG_SECRET = "not-the-cluster-secret-987654321"
RPC_TIMEOUT_S = 0.5
WAIT_S = 5.0
START_TRIES = 5
# The documented window: a datagram is admitted within 30 s of the receiver's clock.
WINDOW_S = 30


# --- hand-built datagrams ----------------------------------------------------------------


Address = tuple[str, int]
TAG_BYTES = 32
ENVELOPE_BYTES = 1 + 8 + 6 + 6  # version, timestamp, source, destination


def packed(address: Address) -> bytes:
    return socket.inet_aton(address[0]) + address[1].to_bytes(2, "big")


def seal(
    payload: bytes,
    *,
    source: Address,
    destination: Address,
    secret: str = SECRET,
    timestamp_s: int | None = None,
    version: int = 2,
) -> bytes:
    key = hmac.new(secret.encode(), b"sr3-overlay-v1", hashlib.sha256).digest()
    stamp = int(time.time()) if timestamp_s is None else timestamp_s
    envelope = bytes([version]) + stamp.to_bytes(8, "big") + packed(source) + packed(destination)
    signed = envelope + payload
    return hmac.new(key, signed, hashlib.sha256).digest() + signed


def seal_v1(payload: bytes) -> bytes:
    """A datagram of the first wire format: tag | timestamp | payload."""
    key = hmac.new(SECRET.encode(), b"sr3-overlay-v1", hashlib.sha256).digest()
    signed = int(time.time()).to_bytes(8, "big") + payload
    return hmac.new(key, signed, hashlib.sha256).digest() + signed


def request(method: str, *arguments: Any, message_id: bytes | None = None) -> bytes:
    message_id = os.urandom(20) if message_id is None else message_id
    return b"\x00" + message_id + umsgpack.packb([method, list(arguments)])


def key_digest(key: str) -> bytes:
    """kademlia's digest of a string key."""
    return hashlib.sha1(key.encode()).digest()


ATTACKER_ID = node_id_for("attacker")


class RawPeer(asyncio.DatagramProtocol):
    """A bare UDP socket that sends whatever a test builds and keeps what comes back.

    Sends go straight to the socket: asyncio's transport silently skips empty datagrams.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.put_nowait(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)

    @property
    def address(self) -> Address:
        host, port = self.sock.getsockname()
        return (str(host), int(port))

    @property
    def seed(self) -> str:
        return "{}:{}".format(*self.address)

    def send(self, datagram: bytes, address: Address) -> None:
        self.sock.sendto(datagram, address)

    def send_sealed(self, payload: bytes, address: Address, **options: Any) -> None:
        """Seal ``payload`` as sent from this socket to ``address``, and send it."""
        self.send(seal(payload, source=self.address, destination=address, **options), address)

    async def receive(self, kind: bytes) -> tuple[bytes, Any]:
        """The next datagram, checked as sealed for us and of ``kind``: (id, body)."""
        datagram = await asyncio.wait_for(self.received.get(), WAIT_S)
        tag, signed = datagram[:TAG_BYTES], datagram[TAG_BYTES:]
        key = hmac.new(SECRET.encode(), b"sr3-overlay-v1", hashlib.sha256).digest()
        assert hmac.compare_digest(tag, hmac.new(key, signed, hashlib.sha256).digest())
        assert signed[0] == 2
        assert abs(int.from_bytes(signed[1:9], "big") - time.time()) <= SKEW_S_MAX
        assert signed[15:21] == packed(self.address)
        payload = signed[ENVELOPE_BYTES:]
        assert payload[:1] == kind
        return payload[1:21], umsgpack.unpackb(payload[21:])

    async def answer(self) -> tuple[bytes, Any]:
        return await self.receive(b"\x01")

    async def request(self) -> tuple[bytes, Any]:
        return await self.receive(b"\x00")

    def respond(self, message_id: bytes, body: Any, address: Address) -> None:
        self.send_sealed(b"\x01" + message_id + umsgpack.packb(body), address)


# --- running nodes -----------------------------------------------------------------------


@dataclass
class Member:
    overlay: Overlay
    task: asyncio.Task[None] | None  # its run(), when started
    host: str
    port: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def seed(self) -> str:
        return f"{self.host}:{self.port}"


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class Swarm:
    """Overlays on 127.0.0.2, 127.0.0.3, ...; everything started is stopped in close()."""

    def __init__(self) -> None:
        self.members: list[Member] = []
        self.raw_peers: list[RawPeer] = []
        self._hosts = (f"127.0.0.{n}" for n in itertools.count(2))

    def next_host(self) -> str:
        return next(self._hosts)

    async def add(
        self,
        *,
        secret: str = SECRET,
        host: str | None = None,
        port: int | None = None,
        run: bool = True,
        advertise: str | None = None,
        **options: Any,
    ) -> Member:
        host = self.next_host() if host is None else host
        options.setdefault("rpc_timeout_s", RPC_TIMEOUT_S)
        overlay = Overlay(secret, f"peer-{host}", **options)
        for attempt in range(START_TRIES):
            chosen = free_port(host) if port is None else port
            try:
                if advertise is None:
                    await overlay.start(host, chosen)
                else:
                    await overlay.start(host, chosen, advertise)
                break
            except OSError:  # another process took the port between probe and bind
                if port is not None or attempt == START_TRIES - 1:
                    raise
        task = asyncio.create_task(overlay.run()) if run else None
        member = Member(overlay, task, host, chosen)
        self.members.append(member)
        return member

    async def remove(self, member: Member) -> None:
        self.members.remove(member)
        if member.task is not None:
            member.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await member.task
        await member.overlay.stop()

    async def raw_peer(self, host: str = "127.0.0.1", port: int = 0) -> RawPeer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind((host, port))
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_datagram_endpoint(lambda: RawPeer(sock), sock=sock)
        self.raw_peers.append(peer)
        return peer

    async def close_raw_peer(self, peer: RawPeer) -> None:
        self.raw_peers.remove(peer)
        assert peer.transport is not None
        peer.transport.close()
        await peer.closed

    async def close(self) -> None:
        for member in list(self.members):
            await self.remove(member)
        for peer in list(self.raw_peers):
            await self.close_raw_peer(peer)


@pytest.fixture
async def swarm() -> AsyncIterator[Swarm]:
    swarm = Swarm()
    try:
        yield swarm
    finally:
        await swarm.close()


def accounted(stats: OverlayStats) -> int:
    """Datagrams a node has processed: each is handled or dropped for one reason."""
    return stats.handled + sum(n for reason, n in stats.dropped.items() if reason != "tasks_full")


async def settled(member: Member, count: int) -> OverlayStats:
    """Wait until ``member`` has processed ``count`` datagrams in all; its stats then."""
    deadline = time.monotonic() + WAIT_S
    while accounted(stats := member.overlay.stats()) < count:
        assert time.monotonic() < deadline, f"{accounted(stats)} of {count} datagrams processed"
        assert member.task is None or not member.task.done(), "the overlay's run() ended"
        await asyncio.sleep(0.002)
    return stats


async def eventually(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.02)


def growth(before: OverlayStats, after: OverlayStats) -> Mapping[str, int]:
    grown = {r: after.dropped[r] - before.dropped[r] for r in DROP_REASONS}
    return {reason: n for reason, n in grown.items() if n}


# --- an honest cluster -------------------------------------------------------------------


async def test_five_nodes_discover_each_other_and_share_values(swarm: Swarm) -> None:
    members = [await swarm.add() for _ in range(5)]
    seed = members[0]
    for member in members[1:]:
        assert await member.overlay.bootstrap([seed.seed]) >= 1

    for member in members:
        others = {m.address for m in members if m is not member}
        assert set(member.overlay.contacts()) == others, member.seed

    assert await members[1].overlay.announce("peer/1", b"127.0.0.3:9000")
    assert await members[4].overlay.announce("peer/4", b"127.0.0.6:9000")
    for member in members:
        assert await member.overlay.lookup("peer/1") == b"127.0.0.3:9000"
        assert await member.overlay.lookup("peer/4") == b"127.0.0.6:9000"
        assert await member.overlay.lookup("peer/none") is None
    for member in members:
        stats = member.overlay.stats()
        assert stats.handled > 0
        assert not growth(OverlayStats(0, dict.fromkeys(DROP_REASONS, 0)), stats)


async def test_values_are_found_on_nodes_that_do_not_hold_them(swarm: Swarm) -> None:
    """With k=2 a value lives on a few nodes; the others find it by a network lookup."""
    members = [await swarm.add(ksize=2, alpha=2) for _ in range(6)]
    for member in members[1:]:
        assert await member.overlay.bootstrap([members[0].seed]) >= 1
    assert await members[0].overlay.announce("far", b"found")
    holders = [m for m in members if m.overlay.stats().values_stored]
    assert 1 <= len(holders) <= 3  # the 2 closest, and the announcer if it is closer
    for member in members:
        assert await member.overlay.lookup("far") == b"found"
        assert await member.overlay.lookup("nowhere") is None


async def test_largest_value_round_trips_and_larger_is_refused(
    swarm: Swarm, rng: random.Random
) -> None:
    """A maximal value fits in one datagram; announce() refuses anything larger."""
    a, b = await swarm.add(), await swarm.add()
    assert await b.overlay.bootstrap([a.seed]) == 1
    largest = rng.randbytes(VALUE_BYTES_MAX)
    assert await a.overlay.announce("big", largest)
    assert await b.overlay.lookup("big") == largest
    with pytest.raises(ValueError, match="at most 8192 bytes"):
        await a.overlay.announce("bigger", b"x" * (VALUE_BYTES_MAX + 1))


async def test_bootstrap_skips_seeds_it_cannot_use(swarm: Swarm) -> None:
    """Seeds that do not parse, resolve or answer are skipped; host names resolve."""
    local = await swarm.add(host="127.0.0.1")
    joiner = await swarm.add()
    silent = f"127.0.0.250:{free_port('127.0.0.250')}"
    seeds = [
        "no-port",
        "127.0.0.1:",
        "127.0.0.1:99999",
        "127.0.0.1:\uff11\uff12",  # full-width digits are not a port
        "no-such-host.invalid:4000",
        "a..b:4000",
        silent,
        f"localhost:{local.port}",
        joiner.seed,  # itself
    ]
    assert await joiner.overlay.bootstrap(seeds) == 1
    assert joiner.overlay.contacts() == [local.address]
    assert joiner.address in local.overlay.contacts()


async def test_a_new_node_is_handed_the_values_it_should_hold(swarm: Swarm) -> None:
    """kademlia's welcome_if_new hand-over, run as a tracked task: the value outlives A."""
    a = await swarm.add()
    assert not await a.overlay.announce("alone", b"v")  # nobody else to hold it
    assert await a.overlay.lookup("alone") == b"v"
    b = await swarm.add()
    assert await b.overlay.bootstrap([a.seed]) == 1
    await eventually(lambda: b.overlay.stats().values_stored == 1, "B holds A's value")
    await swarm.remove(a)
    assert await b.overlay.lookup("alone") == b"v"


def id_with_prefix(bits: str, low: int = 0) -> bytes:
    return (int(bits, 2) << (160 - len(bits)) | low).to_bytes(20, "big")


async def test_a_full_bucket_pings_its_head_and_replaces_it_when_silent(swarm: Swarm) -> None:
    """kademlia's add_contact ensure_future()s this ping; here it is a tracked task."""
    node = await swarm.add(ksize=2, alpha=1)
    far = "1" if node_id_for(f"peer-{node.host}")[0] < 0x80 else "0"  # the half without us
    # A and B share exactly 5 leading bits: their bucket's depth is 5, so it does not
    # split again; C arrives when it is full.
    ids = {
        "a": id_with_prefix(far + "00000", 1),
        "b": id_with_prefix(far + "00001", 2),
        "c": id_with_prefix(far + "00000", 3),
    }
    raws = {name: await swarm.raw_peer() for name in ids}
    addresses = {name: raw.sock.getsockname() for name, raw in raws.items()}
    for count, name in enumerate(ids, start=1):
        raws[name].send_sealed(request("ping", ids[name]), node.address)
        await settled(node, count)
    assert set(node.overlay.contacts()) == {addresses["a"], addresses["b"]}

    await raws["a"].answer()  # its pong
    _, (method, _) = await raws["a"].request()
    assert method == "ping"  # the head is pinged
    await eventually(
        lambda: set(node.overlay.contacts()) == {addresses["b"], addresses["c"]},
        "the silent head is replaced by C",
    )


async def test_refresh_rejoins_through_seeds_that_were_down(swarm: Swarm) -> None:
    """A node that started before its seed joins on a later refresh."""
    seed_host = swarm.next_host()
    seed_port = free_port(seed_host)
    joiner = await swarm.add(refresh_interval_s=0.1)
    assert await joiner.overlay.bootstrap([f"{seed_host}:{seed_port}"]) == 0
    seed = await swarm.add(host=seed_host, port=seed_port)
    await eventually(lambda: joiner.overlay.contacts() == [seed.address], "joiner found seed")
    assert seed.overlay.contacts() == [joiner.address]


async def test_refresh_resolves_seed_names_again(
    swarm: Swarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: a seed name that does not resolve when the node starts (a container whose
    name is registered only once it runs; name resolution is stood in for). Must hold:
    a later refresh resolves it again and joins (was: the seed was dropped for good)."""
    seed = await swarm.add()
    joiner = await swarm.add(refresh_interval_s=0.1)
    registered = False
    real = overlay_module._resolve

    async def resolve(text: str) -> Address:
        if text.startswith("seed-host:"):
            if not registered:
                raise ValueError("does not resolve")
            return await real(f"{seed.host}:{text.rpartition(':')[2]}")
        return await real(text)

    monkeypatch.setattr(overlay_module, "_resolve", resolve)
    assert await joiner.overlay.bootstrap([f"seed-host:{seed.port}"]) == 0
    registered = True
    await eventually(lambda: joiner.overlay.contacts() == [seed.address], "joiner found seed")


async def test_refresh_reannounces_own_values(swarm: Swarm) -> None:
    """Copies held for others expire after 10 refresh intervals unless re-announced."""
    interval_s = 0.1
    a = await swarm.add(refresh_interval_s=interval_s)
    b = await swarm.add(refresh_interval_s=interval_s)
    assert await b.overlay.bootstrap([a.seed]) == 1
    assert await a.overlay.announce("kept", b"alive")
    assert b.overlay.stats().values_stored == 1
    await asyncio.sleep(12 * interval_s)  # past the time-to-live of B's first copy
    await swarm.remove(a)
    assert await b.overlay.lookup("kept") == b"alive"
    await asyncio.sleep(12 * interval_s)  # nobody re-announces it any more
    assert await b.overlay.lookup("kept") is None


async def test_stop_fails_calls_in_flight_and_is_idempotent(swarm: Swarm) -> None:
    node = await swarm.add(rpc_timeout_s=60.0)
    silent = f"127.0.0.250:{free_port('127.0.0.250')}"
    joining = asyncio.create_task(node.overlay.bootstrap([silent]))
    await asyncio.sleep(0.1)
    await node.overlay.stop()
    async with asyncio.timeout(WAIT_S):
        assert await joining == 0
    await node.overlay.stop()


# --- what the overlay refuses ------------------------------------------------------------


async def test_a_node_without_the_secret_cannot_join_or_poison(swarm: Swarm) -> None:
    """Breaks: an outsider with a wrong secret joins, announces and stores.
    Holds: no honest node adds it or answers it, honest values stay, drops are counted."""
    seed, honest = await swarm.add(), await swarm.add()
    assert await honest.overlay.bootstrap([seed.seed]) == 1
    assert await honest.overlay.announce("members/honest", b"honest")

    outsider = await swarm.add(secret=WRONG_SECRET)
    assert await outsider.overlay.bootstrap([seed.seed, honest.seed]) == 0
    assert outsider.overlay.contacts() == []
    assert not await outsider.overlay.announce("poison", b"evil")

    raw = await swarm.raw_peer(outsider.host)
    before = {target.seed: accounted(target.overlay.stats()) for target in (seed, honest)}
    for target in (seed, honest):
        for key in ("members/honest", "poison"):
            store = request("store", ATTACKER_ID, key_digest(key), b"evil")
            raw.send_sealed(store, target.address, secret=WRONG_SECRET)
        raw.send_sealed(request("ping", ATTACKER_ID), target.address, secret=WRONG_SECRET)

    for target in (seed, honest):
        stats = await settled(target, before[target.seed] + 3)
        assert stats.dropped["bad_tag"] == 4  # its bootstrap ping, 2 stores and a ping
        assert all(ip != outsider.host for ip, _ in target.overlay.contacts())
        assert await target.overlay.lookup("poison") is None
        assert await target.overlay.lookup("members/honest") == b"honest"
    assert raw.received.empty()  # no answer to anything it sent
    assert outsider.overlay.stats().handled == 0


async def capture(at: RawPeer, sender: Member) -> bytes:
    """A datagram that ``sender`` signs for ``at``'s address: its ping when it joins there."""
    joining = asyncio.create_task(sender.overlay.bootstrap([at.seed]))
    datagram = await asyncio.wait_for(at.received.get(), WAIT_S)
    await joining  # unanswered
    return datagram


async def test_replayed_datagrams_never_put_a_stranger_in_a_routing_table(swarm: Swarm) -> None:
    """Breaks: a stranger without the secret captures real peers' signed datagrams (pings
    sent to it, and pings on their way to the victim's address) and replays them from its
    own address to a victim that knows none of them.
    Holds: the victim adds no contact (none at the stranger's address under a real
    peer's id), answers nothing, and drops each replay as misdirected or as sent from
    another address than the one signed."""
    a, b = await swarm.add(), await swarm.add()
    assert await b.overlay.bootstrap([a.seed]) == 1
    stranger = await swarm.raw_peer()
    victim_host = swarm.next_host()
    listener = await swarm.raw_peer(victim_host)  # where the victim will listen
    victim_port = listener.address[1]
    captured = [await capture(at, sender) for at in (stranger, listener) for sender in (a, b)]
    await swarm.close_raw_peer(listener)
    victim = await swarm.add(host=victim_host, port=victim_port)

    for datagram in captured:
        stranger.send(datagram, victim.address)
    stats = await settled(victim, len(captured))
    assert stranger.address not in victim.overlay.contacts()
    assert victim.overlay.contacts() == []
    assert stats.handled == 0
    assert growth(OverlayStats(0, dict.fromkeys(DROP_REASONS, 0)), stats) == {
        "wrong_destination": 2,  # signed for the stranger's address
        "wrong_source": 2,  # signed for the victim's, by a real peer at its own address
    }
    await asyncio.sleep(RPC_TIMEOUT_S)  # time for answers it should not get
    assert stranger.received.empty()


async def test_a_datagram_delivered_after_the_window_is_dropped(swarm: Swarm) -> None:
    """Breaks: a datagram captured on its way to the victim is delivered late from its
    sender's own address (a forged source, or the address taken over once it is free).
    Holds: more than WINDOW_S seconds after its timestamp it is dropped as stale;
    within them it is admitted once, and dropped as a replay after that."""
    assert SKEW_S_MAX == WINDOW_S
    offset_s = 0.0
    sender = await swarm.add()
    victim_host = swarm.next_host()
    listener = await swarm.raw_peer(victim_host)
    victim_port = listener.address[1]
    captured = await capture(listener, sender)
    await swarm.close_raw_peer(listener)
    sender_address = sender.address
    await swarm.remove(sender)
    forger = await swarm.raw_peer(*sender_address)
    victim = await swarm.add(
        host=victim_host,
        port=victim_port,
        clock=lambda: time.time() + offset_s,
        monotonic=time.monotonic,
    )

    offset_s = WINDOW_S + 1.0
    forger.send(captured, victim.address)
    stats = await settled(victim, 1)
    assert stats.handled == 0
    assert stats.dropped["stale"] == 1
    assert victim.overlay.contacts() == []

    offset_s = 0.0
    forger.send(captured, victim.address)
    forger.send(captured, victim.address)
    stats = await settled(victim, 3)
    assert stats.handled == 1
    assert stats.dropped["replay"] == 1
    assert victim.overlay.contacts() == [sender_address]


async def test_an_answer_from_another_address_fails_the_call(swarm: Swarm) -> None:
    """Breaks: a node asked at one address answers, signed, from another one.
    Holds: the call fails at once (wrong_source) and neither address becomes a contact."""
    node = await swarm.add(rpc_timeout_s=60.0)
    asked, other = await swarm.raw_peer(), await swarm.raw_peer()
    async with asyncio.timeout(WAIT_S):  # far below the 60 s timeout: failed, not timed out
        joining = asyncio.create_task(node.overlay.bootstrap([asked.seed]))
        message_id, (method, _) = await asked.request()
        assert method == "ping"
        other.respond(message_id, ATTACKER_ID, node.address)
        assert await joining == 0
    stats = await settled(node, 1)
    assert stats.dropped["wrong_source"] == 1
    assert node.overlay.contacts() == []


async def test_a_node_on_every_address_signs_the_address_it_advertises(swarm: Swarm) -> None:
    """A node bound to 0.0.0.0 must say where it is reached; others learn it there."""
    port = free_port("0.0.0.0")
    with pytest.raises(ValueError, match="needs advertise"):
        await Overlay(SECRET, "wild").start("0.0.0.0", port)
    with pytest.raises(ValueError, match="cannot advertise"):
        await Overlay(SECRET, "wild").start("0.0.0.0", port, advertise=f"0.0.0.0:{port}")
    with pytest.raises(ValueError, match="is not host:port"):
        await Overlay(SECRET, "wild").start("0.0.0.0", port, advertise="127.0.0.1")
    # Loopback datagrams from a socket on 0.0.0.0 leave from 127.0.0.1.
    wild = await swarm.add(host="0.0.0.0", port=port, advertise=f"localhost:{port}")
    joiner = await swarm.add()
    assert await joiner.overlay.bootstrap([f"127.0.0.1:{port}"]) == 1
    assert joiner.overlay.contacts() == [("127.0.0.1", port)]
    assert wild.overlay.contacts() == [joiner.address]


def test_the_replay_cache_is_bounded_and_leaves_no_hole() -> None:
    """Tags are kept while their datagram could still be fresh; when the cache is full,
    the oldest second is forgotten and nothing stamped at or before it is admitted."""
    from ring.overlay_wire import SKEW_S_MAX as skew_s
    from ring.overlay_wire import TagCache

    cache = TagCache(tags_max=3)
    assert cache.admit(b"a", 1000, 1000.0) is None
    assert cache.admit(b"a", 1000, 1000.0 + skew_s) == "replay"
    assert cache.admit(b"x", 1000 + skew_s + 10, 1000.5 + skew_s + 10) is None
    assert len(cache) == 1  # "a" is stale by now: forgotten
    t = 1000 + skew_s + 10
    for tag, second in ((b"b", t + 1), (b"c", t + 1), (b"d", t + 2)):
        assert cache.admit(tag, second, float(second)) is None
        assert len(cache) <= 3
    assert len(cache) == 3  # x was forgotten to make room
    assert cache.admit(b"x", t, t + 2.0) == "stale"  # a replay it can no longer recognise
    assert cache.admit(b"y", t, t + 2.0) == "stale"
    assert cache.admit(b"e", t + 3, t + 3.0) is None  # b and c are forgotten
    assert cache.admit(b"b", t + 1, t + 3.0) == "stale"
    assert cache.admit(b"d", t + 2, t + 3.0) == "replay"
    assert len(cache) == 2


async def test_garbage_datagrams_are_dropped_and_counted(swarm: Swarm, rng: random.Random) -> None:
    """Breaks: every kind of bad datagram at one node. Holds: each is dropped under its
    reason, nothing is stored or added, and the node still serves honest peers."""
    node, honest = await swarm.add(), await swarm.add()
    assert await honest.overlay.bootstrap([node.seed]) == 1
    raw = await swarm.raw_peer()
    now = int(time.time())

    def sealed(payload: bytes, **options: Any) -> bytes:
        return seal(payload, **{"source": raw.address, "destination": node.address, **options})

    ping = sealed(request("ping", ATTACKER_ID))
    next_port = (node.host, node.port + 1 if node.port < 65535 else node.port - 1)
    other_host = ("127.0.0.1", node.port)
    cases: list[tuple[bytes, str]] = [
        (rng.randbytes(200), "bad_tag"),
        (b"", "bad_tag"),
        (b"\x00", "bad_tag"),
        (b"\x00" * 40, "bad_tag"),
        (sealed(request("ping", ATTACKER_ID), secret=WRONG_SECRET), "bad_tag"),
        (sealed(b"\x00" + os.urandom(20) + b"\xc1"), "malformed"),  # reserved msgpack code
        (sealed(b"\x00" + os.urandom(20) + b"\x92"), "malformed"),  # truncated array
        (sealed(b"\x00" + os.urandom(20)), "malformed"),  # header only
        (sealed(b"\x00"), "malformed"),
        (sealed(b""), "malformed"),
        (sealed(b"\x02" + request("ping", ATTACKER_ID)[1:]), "malformed"),  # unknown kind
        (sealed(b"\x00" + os.urandom(20) + umsgpack.packb({"ping": []})), "malformed"),
        (sealed(b"\x00" + os.urandom(20) + umsgpack.packb(["ping", ATTACKER_ID])), "malformed"),
        (sealed(b"\x00" + os.urandom(20) + b"\x91" * 5000), "malformed"),  # deep nesting
        (sealed(request("ping", 123)), "bad_args"),
        (sealed(request("ping", ATTACKER_ID[:19])), "bad_args"),
        (sealed(request("ping")), "bad_args"),
        (sealed(request("ping", ATTACKER_ID, ATTACKER_ID)), "bad_args"),
        (sealed(request("store", ATTACKER_ID, key_digest("k"), "text, not bytes")), "bad_args"),
        (sealed(request("store", ATTACKER_ID, "k", b"v")), "bad_args"),
        (sealed(request("find_node", ATTACKER_ID, [1, 2])), "bad_args"),
        (sealed(request("_accept_response", os.urandom(20), None, ["x", 1])), "unknown_method"),
        (sealed(request("__init__")), "unknown_method"),
        (sealed(request("stun")), "unknown_method"),
        (sealed(request("rpc_ping", ATTACKER_ID)), "unknown_method"),
        (sealed(request("ping", ATTACKER_ID), timestamp_s=now - SKEW_S_MAX - 60), "stale"),
        (sealed(request("ping", ATTACKER_ID), timestamp_s=now + SKEW_S_MAX + 60), "stale"),
        (sealed(b"\x01" + os.urandom(20) + umsgpack.packb(b"x")), "unexpected_response"),
        (seal_v1(request("ping", ATTACKER_ID)), "bad_version"),
        (sealed(request("ping", ATTACKER_ID), version=3), "bad_version"),
        (sealed(request("ping", ATTACKER_ID), destination=next_port), "wrong_destination"),
        (sealed(request("ping", ATTACKER_ID), destination=other_host), "wrong_destination"),
        (sealed(request("ping", ATTACKER_ID), source=node.address), "wrong_source"),
        (sealed(request("ping", ATTACKER_ID), source=(raw.address[0], 1)), "wrong_source"),
        (rng.randbytes(64_000), "oversized"),
        (sealed(rng.randbytes(DATAGRAM_BYTES_MAX)), "oversized"),
        (ping, "handled"),
        (ping, "replay"),
    ]
    before = await settled(node, accounted(node.overlay.stats()))
    for datagram, _ in cases:
        raw.send(datagram, node.address)
    after = await settled(node, accounted(before) + len(cases))

    expected = {r: sum(1 for _, e in cases if e == r) for r in DROP_REASONS}
    assert growth(before, after) == {r: n for r, n in expected.items() if n}
    assert after.handled - before.handled == 1
    message_id, body = await raw.answer()  # the one valid ping, answered once
    assert message_id == ping[TAG_BYTES + ENVELOPE_BYTES + 1 :][:20]
    assert body == node_id_for(f"peer-{node.host}")
    assert after.values_stored == 0

    assert await honest.overlay.announce("after-garbage", b"still fine")
    assert await node.overlay.lookup("after-garbage") == b"still fine"
    assert await node.overlay.bootstrap([honest.seed]) >= 1


async def test_a_full_inbound_queue_drops_and_counts(swarm: Swarm) -> None:
    """Breaks: datagrams arrive while run() is not taking them. Holds: the queue stops at
    its bound, the rest are counted as queue_full, and run() then answers what it holds."""
    node = await swarm.add(run=False)
    raw = await swarm.raw_peer()
    extra = 10
    for sent in range(INBOX_DATAGRAMS_MAX + extra):
        raw.send_sealed(request("ping", ATTACKER_ID), node.address)
        if sent % 20 == 0:
            await asyncio.sleep(0.001)  # let the loop read: the socket buffer is smaller
    stats = await settled(node, extra)
    assert stats.dropped["queue_full"] == extra
    assert stats.handled == 0
    node.task = asyncio.create_task(node.overlay.run())
    stats = await settled(node, INBOX_DATAGRAMS_MAX + extra)
    assert stats.handled == INBOX_DATAGRAMS_MAX
    assert growth(OverlayStats(0, dict.fromkeys(DROP_REASONS, 0)), stats) == {"queue_full": extra}
    # Every ping is answered; a busy loopback may still lose some answers in its buffers.
    await eventually(lambda: raw.received.qsize() >= INBOX_DATAGRAMS_MAX // 2, "answers")


async def test_malformed_answers_fail_the_call_not_the_node(swarm: Swarm) -> None:
    """Breaks: a peer with the secret answers with bodies kademlia's crawlers would choke
    on. Holds: the call fails at once (counted bad_response), no contact is added."""
    node = await swarm.add(rpc_timeout_s=60.0)
    raw = await swarm.raw_peer()
    host, port = raw.sock.getsockname()
    async with asyncio.timeout(WAIT_S):  # far below the 60 s timeout: failed, not timed out
        joining = asyncio.create_task(node.overlay.bootstrap([f"{host}:{port}"]))
        message_id, (method, _) = await raw.request()
        assert method == "ping"
        raw.respond(message_id, True, node.address)  # a ping answers with a node id
        assert await joining == 0

        joining = asyncio.create_task(node.overlay.bootstrap([f"{host}:{port}"]))
        message_id, _ = await raw.request()
        raw.respond(message_id, ATTACKER_ID, node.address)
        message_id, (method, _) = await raw.request()
        assert method == "find_node"
        bad_contacts = [[ATTACKER_ID[:5], "127.0.0.1", 1], [ATTACKER_ID, "999.0.0.1", 1]]
        raw.respond(message_id, bad_contacts, node.address)
        assert await joining == 0
    stats = await settled(node, 3)
    assert stats.dropped["bad_response"] == 2
    assert stats.handled == 1
    assert node.overlay.contacts() == []


async def test_oversized_values_are_refused(swarm: Swarm) -> None:
    """Breaks: a peer with the secret stores values past the limit by hand.
    Holds: a datagram past the size limit or a value past 8 KB is dropped, not stored."""
    node = await swarm.add()
    raw = await swarm.raw_peer()
    route = {"source": raw.address, "destination": node.address}
    too_big = seal(request("store", ATTACKER_ID, key_digest("a"), b"x" * 9000), **route)
    assert len(too_big) > DATAGRAM_BYTES_MAX
    fits_datagram = seal(request("store", ATTACKER_ID, key_digest("b"), b"x" * 8300), **route)
    assert len(fits_datagram) <= DATAGRAM_BYTES_MAX
    largest = seal(request("store", ATTACKER_ID, key_digest("c"), b"x" * VALUE_BYTES_MAX), **route)

    for datagram in (too_big, fits_datagram, largest):
        raw.send(datagram, node.address)
    stats = await settled(node, 3)
    assert stats.dropped["oversized"] == 1
    assert stats.dropped["bad_args"] == 1
    assert stats.handled == 1
    _, stored = await raw.answer()
    assert stored is True
    assert stats.values_stored == 1


async def test_the_store_keeps_at_most_values_max_evicting_the_oldest(swarm: Swarm) -> None:
    node = await swarm.add(values_max=3)
    raw = await swarm.raw_peer()
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        raw.send_sealed(request("store", ATTACKER_ID, key_digest(key), key.encode()), node.address)
        await settled(node, keys.index(key) + 1)  # in order: the oldest are k0, k1
    assert node.overlay.stats().values_stored == 3
    for key in keys[2:]:
        assert await node.overlay.lookup(key) == key.encode()
    assert await node.overlay.lookup("k0") is None  # asks the raw peer, which is silent


# --- fuzzing -----------------------------------------------------------------------------

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), inner, max_size=4)
    ),
    max_leaves=12,
)
methods = st.sampled_from(
    ["ping", "store", "find_node", "find_value", "stun", "_accept_response", "__init__"]
) | st.text(max_size=20)


def is_valid_store(method: str, arguments: list[Any]) -> bool:
    return (
        method == "store"
        and len(arguments) == 3
        and all(isinstance(a, bytes) for a in arguments)
        and len(arguments[0]) == len(arguments[1]) == 20
        and len(arguments[2]) <= VALUE_BYTES_MAX
    )


@dataclass(frozen=True)
class Unsealed:
    """A payload the test seals as sent from its raw peer to the node under test."""

    payload: bytes


@st.composite
def signed_messages(draw: st.DrawFn) -> Unsealed:
    method, arguments = draw(methods), draw(st.lists(msgpack_values, max_size=4))
    assume(not is_valid_store(method, arguments))
    kind = draw(st.sampled_from([b"\x00", b"\x01", b"\x02"]))
    body = umsgpack.packb(draw(st.sampled_from([[method, arguments], [method], arguments])))
    return Unsealed(kind + draw(st.binary(min_size=20, max_size=20)) + body)


datagrams = (
    st.binary(max_size=DATAGRAM_BYTES_MAX + 500)
    | st.binary(max_size=600).map(Unsealed)
    | st.tuples(st.binary(min_size=20, max_size=20), st.binary(max_size=600)).map(
        lambda parts: Unsealed(b"\x00" + parts[0] + parts[1])
    )
    | signed_messages()
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(datagram=datagrams)
async def test_fuzzed_datagrams_never_crash_or_store(
    swarm: Swarm, datagram: bytes | Unsealed
) -> None:
    """Arbitrary bytes and signed junk: each datagram is processed and counted once,
    the node keeps running and stores nothing."""
    if not swarm.members:
        await swarm.add()
        await swarm.raw_peer()
    node, raw = swarm.members[0], swarm.raw_peers[0]
    before = accounted(node.overlay.stats())
    if isinstance(datagram, Unsealed):
        raw.send_sealed(datagram.payload, node.address)
    else:
        raw.send(datagram, node.address)
    stats = await settled(node, before + 1)
    assert stats.values_stored == 0


# --- small pure parts --------------------------------------------------------------------


def test_node_ids_are_stable_and_distinct() -> None:
    assert node_id_for("peer-1") == hashlib.sha1(b"sr3-node:peer-1").digest()
    assert len(node_id_for("peer-1")) == 20
    assert node_id_for("peer-1") != node_id_for("peer-2")


@pytest.mark.parametrize(
    ("secret", "options"),
    [
        ("short", {}),
        (SECRET, {"ksize": 0}),
        (SECRET, {"ksize": 65}),
        (SECRET, {"alpha": 0}),
        (SECRET, {"refresh_interval_s": 0.0}),
        (SECRET, {"rpc_timeout_s": -1.0}),
        (SECRET, {"values_max": 0}),
    ],
)
def test_settings_are_checked(secret: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Overlay(secret, "peer", **options)


def test_limits_leave_room_for_a_maximal_store() -> None:
    framing = TAG_BYTES + ENVELOPE_BYTES + 21
    store = umsgpack.packb(["store", [b"i" * 20, b"k" * 20, b"v" * VALUE_BYTES_MAX]])
    assert framing + len(store) <= DATAGRAM_BYTES_MAX < 64 * 1024
