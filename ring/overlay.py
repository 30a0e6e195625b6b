"""The discovery overlay: a hardened Kademlia node that every storage peer runs.

Peers find each other through the overlay and through nothing else: its values are small
(at most ``VALUE_BYTES_MAX``), held in memory and bounded in number, and bulk data never
travels over it. It reuses the ``kademlia`` package's routing table, node lookups
(crawlers) and RPC handlers, and replaces what is unsafe there: the datagram path, the
dispatch by name, the fire-and-forget tasks and the unbounded value store.

Datagram format (UDP, one message per datagram, at most ``DATAGRAM_BYTES_MAX`` bytes)::

    tag (32) | timestamp (8) | kind (1) | message id (20) | msgpack body
               |<------------ signed: HMAC-SHA256 under the overlay key -------->|

- ``tag`` is HMAC-SHA256 over everything after it, keyed with
  ``HMAC-SHA256(cluster secret, "sr3-overlay-v1")``, so the raw secret signs nothing.
- ``timestamp`` is unix seconds (unsigned, big endian) from the sender's clock; a receiver
  drops datagrams more than ``SKEW_S_MAX`` seconds away from its own clock, and tags it
  has already seen within that window (a bounded replay cache).
- ``kind | message id | body`` is rpcudp's payload: kind 0x00 is a request whose body is
  ``[method, [arguments]]``, 0x01 the response to the request with the same message id.

What arrives is checked in this order, and a datagram that fails is dropped and counted
under its reason (``OverlayStats.dropped``): size (``oversized``), tag (``bad_tag``),
timestamp (``stale``), replay (``replay``), room in the bounded inbound queue
(``queue_full``); then, when ``run()`` takes it from the queue, msgpack decoding and the
message's shape (``malformed``), the method against an explicit table of four
(``unknown_method``), the arguments' types and sizes (``bad_args``), and for a response
the request it answers (``unexpected_response``) and the shape that request expects
(``bad_response``; the call then fails). Nothing is ever unpickled or looked up by name.

Threat model. The tag keeps out anyone without the cluster secret: such a host cannot
join (its pings and lookups get no answer, and nothing it sends adds a contact), cannot
poison routing tables or stored values (its stores never reach the store), cannot forge
answers to our requests, and gets no traffic reflected or amplified to anyone. A datagram
captured on the wire can be replayed only within the clock window, at most once while the
replay cache remembers it. The overlay gives no confidentiality: bodies are plain
msgpack, so node ids, addresses and announced values are readable on the path; announce
nothing secret. Every holder of the secret is trusted: a peer with it can store any value
under any key, claim any node id and hand out made-up contacts. Flooding is bounded (the
inbound queue drops and counts) but still costs honest datagrams, and peers whose clocks
differ by more than ``SKEW_S_MAX`` drop each other's traffic as stale.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import random
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import umsgpack
from kademlia.crawling import NodeSpiderCrawl, ValueSpiderCrawl
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol
from kademlia.routing import RoutingTable
from kademlia.utils import digest
from rpcudp.protocol import RPCProtocol

from ring.auth import SECRET_CHARS_MIN, SKEW_S_MAX, ReplayCache

__all__ = [
    "DATAGRAM_BYTES_MAX",
    "DROP_REASONS",
    "INBOX_DATAGRAMS_MAX",
    "SKEW_S_MAX",
    "VALUES_MAX",
    "VALUE_BYTES_MAX",
    "Overlay",
    "OverlayStats",
    "node_id_for",
]

log = logging.getLogger(__name__)

KEY_LABEL = b"sr3-overlay-v1"
NODE_ID_PREFIX = b"sr3-node:"
NODE_ID_BYTES = 20
NODE_ID_MAX = 2**160 - 1
TAG_BYTES = 32
TIMESTAMP_BYTES = 8
MESSAGE_ID_BYTES = 20
HEADER_BYTES = 1 + MESSAGE_ID_BYTES
REQUEST = b"\x00"
RESPONSE = b"\x01"

VALUE_BYTES_MAX = 8192
# A store request carrying a maximal value is ~55 bytes of msgpack framing and ids
# around it; rpcudp itself would refuse it (its limit is 8 KB for the whole body).
BODY_BYTES_MAX = VALUE_BYTES_MAX + 256
DATAGRAM_BYTES_MAX = TAG_BYTES + TIMESTAMP_BYTES + HEADER_BYTES + BODY_BYTES_MAX

INBOX_DATAGRAMS_MAX = 1024
VALUES_MAX = 4096
OWN_VALUES_MAX = 64
TASKS_MAX = 64
OUTSTANDING_REQUESTS_MAX = 1024
KSIZE_MAX = 64  # keeps a find_node answer (ksize contacts) far below BODY_BYTES_MAX
SEEDS_MAX = 32
REPLAY_TAGS_MAX = 16_384
# A value nobody re-announces is forgotten after this many refresh intervals.
VALUE_TTL_REFRESHES = 10

DATAGRAM_DROP_REASONS = (
    "oversized",
    "bad_tag",
    "stale",
    "replay",
    "queue_full",
    "malformed",
    "unknown_method",
    "bad_args",
    "unexpected_response",
    "bad_response",
)
# "tasks_full": a hand-over store or a bucket-head ping not started (task set full).
DROP_REASONS = (*DATAGRAM_DROP_REASONS, "tasks_full")

Address = tuple[str, int]
CallResult = tuple[bool, Any]  # kademlia's (answered, body) convention


@dataclass(frozen=True)
class OverlayStats:
    handled: int
    dropped: dict[str, int]  # reason (DROP_REASONS) -> count
    values_stored: int = 0


def node_id_for(peer_id: str) -> bytes:
    """The overlay node id of a peer: stable across restarts, 20 bytes."""
    return hashlib.sha1(NODE_ID_PREFIX + peer_id.encode()).digest()


def overlay_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), KEY_LABEL, hashlib.sha256).digest()


# --- the pure core: sealing, opening and parsing datagrams -------------------------------


class _Dropped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Opened:
    tag: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Request:
    message_id: bytes
    method: str
    arguments: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Response:
    message_id: bytes
    body: Any  # checked against the request it answers


def seal(key: bytes, timestamp_s: int, payload: bytes) -> bytes:
    signed = timestamp_s.to_bytes(TIMESTAMP_BYTES, "big") + payload
    return hmac.new(key, signed, hashlib.sha256).digest() + signed


def unseal(key: bytes, datagram: bytes, now_s: float) -> _Opened:
    """The authenticated payload of ``datagram``; raises ``_Dropped`` with the reason."""
    if len(datagram) > DATAGRAM_BYTES_MAX:
        raise _Dropped("oversized")
    if len(datagram) < TAG_BYTES + TIMESTAMP_BYTES:
        raise _Dropped("bad_tag")
    tag, signed = datagram[:TAG_BYTES], datagram[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, signed, hashlib.sha256).digest()):
        raise _Dropped("bad_tag")
    timestamp_s = int.from_bytes(signed[:TIMESTAMP_BYTES], "big")
    if abs(timestamp_s - now_s) > SKEW_S_MAX:
        raise _Dropped("stale")
    return _Opened(tag, signed[TIMESTAMP_BYTES:])


def _is_id(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == NODE_ID_BYTES


def _is_value(value: object) -> bool:
    return isinstance(value, bytes) and len(value) <= VALUE_BYTES_MAX


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_ipv4(text: object) -> bool:
    if not isinstance(text, str) or len(text) > len("255.255.255.255"):
        return False
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _is_contact(entry: object) -> bool:
    if not isinstance(entry, list | tuple) or len(entry) != 3:
        return False
    node_id, ip, port = entry
    port_ok = isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
    return _is_id(node_id) and _is_ipv4(ip) and port_ok


def _is_contact_list(body: object) -> bool:
    return isinstance(body, list) and len(body) <= KSIZE_MAX and all(map(_is_contact, body))


def _is_found_value(body: object) -> bool:
    if isinstance(body, dict):
        return body.keys() == {"value"} and _is_value(body["value"])
    return _is_contact_list(body)


# The only methods a datagram can name, with one check per argument (after the sender).
REQUEST_ARGUMENTS: dict[str, tuple[Callable[[object], bool], ...]] = {
    "ping": (_is_id,),
    "store": (_is_id, _is_id, _is_value),
    "find_node": (_is_id, _is_id),
    "find_value": (_is_id, _is_id),
}
RESPONSE_CHECKS: dict[str, Callable[[object], bool]] = {
    "ping": _is_id,
    "store": _is_bool,
    "find_node": _is_contact_list,
    "find_value": _is_found_value,
}


def parse_message(payload: bytes) -> _Request | _Response:
    """Decode rpcudp's payload; raises ``_Dropped`` for anything not well-formed."""
    if len(payload) <= HEADER_BYTES:
        raise _Dropped("malformed")
    kind, message_id = payload[:1], payload[1:HEADER_BYTES]
    try:
        body = umsgpack.unpackb(payload[HEADER_BYTES:])
    except Exception as exc:  # any decoding failure, deep nesting included
        raise _Dropped("malformed") from exc
    if kind == RESPONSE:
        return _Response(message_id, body)
    if kind != REQUEST:
        raise _Dropped("malformed")
    return _parse_request(message_id, body)


def _parse_request(message_id: bytes, body: Any) -> _Request:
    shaped = isinstance(body, list) and len(body) == 2
    if not (shaped and isinstance(body[0], str) and isinstance(body[1], list)):
        raise _Dropped("malformed")
    method, arguments = body
    checks = REQUEST_ARGUMENTS.get(method)
    if checks is None:
        raise _Dropped("unknown_method")
    if len(arguments) != len(checks):
        raise _Dropped("bad_args")
    if not all(check(argument) for check, argument in zip(checks, arguments, strict=True)):
        raise _Dropped("bad_args")
    return _Request(message_id, method, tuple(arguments))


# --- kademlia's parts, bounded -----------------------------------------------------------


class _BoundedStorage:
    """kademlia's storage interface (``IStorage``), bounded in entries and value size.

    Holds at most ``values_max`` values, forgetting the least recently stored first, and
    forgets a value ``ttl_s`` after it was last stored (by the injected clock).
    """

    def __init__(self, clock: Callable[[], float], values_max: int, ttl_s: float) -> None:
        self._data: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self._clock = clock
        self._values_max = values_max
        self._ttl_s = ttl_s

    def put(self, key: bytes, value: bytes) -> bool:
        """Store ``value``; False (nothing stored) if it is not bytes within the limit."""
        if not (_is_id(key) and _is_value(value)):
            return False
        self._data.pop(key, None)
        self._data[key] = (self._clock(), value)
        while len(self._data) > self._values_max:
            self._data.popitem(last=False)
        return True

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if not self.put(key, value):
            raise ValueError(f"refused to store {len(value)} bytes under a {len(key)}-byte key")

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        self._cull()
        entry = self._data.get(key)
        return default if entry is None else entry[1]

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        self._cull()
        # A snapshot: callers store while they iterate.
        return iter([(key, value) for key, (_, value) in self._data.items()])

    def __len__(self) -> int:
        self._cull()
        return len(self._data)

    def iter_older_than(self, seconds_old: float) -> list[tuple[bytes, bytes]]:
        born_before = self._clock() - seconds_old
        return [(key, value) for key, (born, value) in self._data.items() if born <= born_before]

    def _cull(self) -> None:
        expired_before = self._clock() - self._ttl_s
        while self._data:
            born, _ = next(iter(self._data.values()))
            if born > expired_before:
                return
            self._data.popitem(last=False)


class _RoutingTable(RoutingTable):  # type: ignore[misc]
    """kademlia's routing table; the ping of a full bucket's head runs as a tracked task."""

    def add_contact(self, node: Any) -> None:
        index = self.get_bucket_for(node)
        bucket = self.buckets[index]
        if bucket.add_node(node):
            return
        # Section 4.2 of the paper: split when the bucket covers our own id, or when its
        # depth is not a multiple of 5; otherwise keep the node as a replacement.
        if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
            self.split_bucket(index)
            self.add_contact(node)
            return
        # The ping runs as a tracked task (spawn: bounded, awaited on close). A head that
        # does not answer is removed by handle_call_response, and a replacement takes
        # its place.
        self.protocol.spawn(self.protocol.call_ping, bucket.head())


class _SigningTransport:
    """The transport that rpcudp and kademlia see: every datagram they send is sealed."""

    def __init__(
        self, transport: asyncio.DatagramTransport, key: bytes, clock: Callable[[], float]
    ) -> None:
        self._transport = transport
        self._key = key
        self._clock = clock

    def sendto(self, payload: bytes, address: Address) -> None:
        self._transport.sendto(seal(self._key, int(self._clock()), payload), address)


async def _run_job(job: Callable[..., Awaitable[object]], arguments: tuple[Any, ...]) -> None:
    await job(*arguments)


class _Protocol(KademliaProtocol):  # type: ignore[misc]
    """KademliaProtocol with an authenticated datagram path and explicit dispatch.

    ``datagram_received`` only authenticates and queues; ``serve`` (run by
    ``Overlay.run``) decodes, dispatches and answers. Outgoing calls are explicit methods
    (rpcudp's ``__getattr__`` closures are never used), so each records the method it
    expects an answer to.
    """

    def __init__(
        self,
        node: Any,
        storage: _BoundedStorage,
        *,
        key: bytes,
        clock: Callable[[], float],
        ksize: int,
        rpc_timeout_s: float,
    ) -> None:
        RPCProtocol.__init__(self, wait_timeout=rpc_timeout_s)
        self.transport: _SigningTransport | None = None
        self.router = _RoutingTable(self, ksize, node)
        self.storage = storage
        self.source_node = node
        self.handled = 0
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._key = key
        self._clock = clock
        self._inbox: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue(INBOX_DATAGRAMS_MAX)
        self._replays = ReplayCache(REPLAY_TAGS_MAX)
        self._expected: dict[bytes, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._socket: asyncio.DatagramTransport | None = None
        self._lost: asyncio.Future[None] | None = None
        self._closing = False
        self._handlers: dict[str, Callable[..., object]] = {
            "ping": self.rpc_ping,
            "store": self.rpc_store,
            "find_node": self.rpc_find_node,
            "find_value": self.rpc_find_value,
        }

    # transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A datagram endpoint's transport (on 3.11 not a DatagramTransport subclass).
        self._socket = cast(asyncio.DatagramTransport, transport)
        self._lost = asyncio.get_running_loop().create_future()
        self.transport = _SigningTransport(self._socket, self._key, self._clock)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def local_address(self) -> Address | None:
        if self._socket is None:
            return None
        host, port = self._socket.get_extra_info("sockname")[:2]
        return (str(host), int(port))

    def datagram_received(self, data: bytes, addr: Address) -> None:
        # Replaces rpcudp's version (an ensure_future per datagram): authenticate, queue.
        try:
            opened = unseal(self._key, data, self._clock())
            if not self._replays.check_and_add(opened.tag.hex(), self._clock()):
                raise _Dropped("replay")
            self._inbox.put_nowait((opened.payload, (str(addr[0]), int(addr[1]))))
        except _Dropped as exc:
            self._drop(exc.reason)
        except asyncio.QueueFull:
            self._drop("queue_full")

    def _drop(self, reason: str) -> None:
        log.debug("overlay dropped: %s", reason)
        self.dropped[reason] += 1

    # incoming messages

    async def serve(self) -> None:
        while True:
            payload, sender = await self._inbox.get()
            self.handle(payload, sender)
            # get() does not yield while the queue holds a backlog; let other work run.
            await asyncio.sleep(0)

    def handle(self, payload: bytes, sender: Address) -> None:
        """Process one authenticated payload: answer a request or settle a call."""
        try:
            message = parse_message(payload)
            if isinstance(message, _Request):
                self._answer(message, sender)
            else:
                self._settle(message, sender)
        except _Dropped as exc:
            self._drop(exc.reason)
            return
        self.handled += 1

    def _answer(self, request: _Request, sender: Address) -> None:
        body = self._handlers[request.method](sender, *request.arguments)
        reply = umsgpack.packb(body)
        # Bounded by construction: at most KSIZE_MAX contacts or one VALUE_BYTES_MAX value.
        assert len(reply) <= BODY_BYTES_MAX, (request.method, len(reply))
        if self.transport is not None:
            self.transport.sendto(RESPONSE + request.message_id + reply, sender)

    def _settle(self, response: _Response, sender: Address) -> None:
        method = self._expected.pop(response.message_id, None)
        pending = self._outstanding.get(response.message_id)
        if method is None or pending is None or pending[0].done():
            self._finish(response.message_id, (False, None))  # e.g. its caller gave up
            raise _Dropped("unexpected_response")
        if not RESPONSE_CHECKS[method](response.body):
            self._finish(response.message_id, (False, None))
            raise _Dropped("bad_response")
        self._accept_response(response.message_id, response.body, sender)

    def rpc_store(self, sender: Address, nodeid: bytes, key: bytes, value: bytes) -> bool:
        self.welcome_if_new(Node(nodeid, sender[0], sender[1]))
        return self.storage.put(key, value)

    def welcome_if_new(self, node: Any) -> None:
        """Add a new node to the routing table and hand it the values it should hold.

        Upstream fires the hand-over stores with ensure_future, hashes the (already
        hashed) key again when picking them, and hands over to nodes that only make the
        replacement cache; here they are tracked tasks, for admitted nodes only.
        """
        if node.id == self.source_node.id or not self.router.is_new_node(node):
            return
        handover = [(key, value) for key, value in self.storage if self._hands_over(key, node)]
        self.router.add_contact(node)
        if self.router.is_new_node(node):
            return
        for key, value in handover:
            self.spawn(self.call_store, node, key, value)

    def _hands_over(self, key: bytes, node: Any) -> bool:
        # Section 2.5 of the paper: when the new node is closer to the key than the
        # farthest of its k known holders and this node is the closest, this node tells it.
        keynode = Node(key)
        neighbors = self.router.find_neighbors(keynode)
        if not neighbors:
            return True
        farthest = neighbors[-1].distance_to(keynode)
        closest = neighbors[0].distance_to(keynode)
        new_is_close = node.distance_to(keynode) < farthest
        return bool(new_is_close and self.source_node.distance_to(keynode) < closest)

    # outgoing calls

    def ping(self, address: Address, node_id: bytes) -> asyncio.Future[CallResult]:
        return self._call(address, "ping", node_id)

    def store(
        self, address: Address, node_id: bytes, key: bytes, value: bytes
    ) -> asyncio.Future[CallResult]:
        return self._call(address, "store", node_id, key, value)

    def find_node(self, address: Address, node_id: bytes, key: bytes) -> asyncio.Future[CallResult]:
        return self._call(address, "find_node", node_id, key)

    def find_value(
        self, address: Address, node_id: bytes, key: bytes
    ) -> asyncio.Future[CallResult]:
        return self._call(address, "find_value", node_id, key)

    def _call(self, address: Address, method: str, *arguments: bytes) -> asyncio.Future[CallResult]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[CallResult] = loop.create_future()
        body = umsgpack.packb([method, list(arguments)])
        assert len(body) <= BODY_BYTES_MAX, (method, len(body))
        if self.transport is None or self._closing:
            future.set_result((False, None))
            return future
        if len(self._outstanding) >= OUTSTANDING_REQUESTS_MAX:
            log.warning(
                "overlay: %d requests in flight; %s to %s not sent",
                len(self._outstanding),
                method,
                address,
            )
            future.set_result((False, None))
            return future
        # Unpredictable, not from the injected generator: it is what ties an answer to us.
        message_id = secrets.token_bytes(MESSAGE_ID_BYTES)
        self.transport.sendto(REQUEST + message_id + body, address)
        timer = loop.call_later(self._wait_timeout, self._timeout, message_id)
        self._outstanding[message_id] = (future, timer)
        self._expected[message_id] = method
        return future

    def _timeout(self, msg_id: bytes) -> None:
        log.debug("overlay: no answer within %.1f s", self._wait_timeout)
        self._finish(msg_id, (False, None))

    def _finish(self, message_id: bytes, result: CallResult) -> None:
        self._expected.pop(message_id, None)
        pending = self._outstanding.pop(message_id, None)
        if pending is None:
            return
        future, timer = pending
        timer.cancel()
        if not future.done():
            future.set_result(result)

    # background work and shutdown

    def spawn(self, job: Callable[..., Awaitable[object]], *arguments: Any) -> None:
        """Run ``job(*arguments)`` as a tracked task, unless TASKS_MAX are running."""
        if self._closing:
            return
        if len(self._tasks) >= TASKS_MAX:
            self._drop("tasks_full")
            return
        task = asyncio.get_running_loop().create_task(_run_job(job, arguments))
        self._tasks.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("overlay background job failed", exc_info=task.exception())

    async def close(self) -> None:
        """Cancel background jobs, fail calls in flight, close the socket. Idempotent."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for message_id in list(self._outstanding):
            self._finish(message_id, (False, None))
        if self._socket is not None and self._lost is not None:
            self._socket.close()
            await self._lost


# --- the overlay -------------------------------------------------------------------------


def _check_settings(
    secret: str, ksize: int, alpha: int, refresh_interval_s: float, rpc_timeout_s: float
) -> None:
    if len(secret) < SECRET_CHARS_MIN:
        raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    if not 1 <= ksize <= KSIZE_MAX:
        raise ValueError(f"ksize must be between 1 and {KSIZE_MAX}, not {ksize}")
    if not 1 <= alpha <= ksize:
        raise ValueError(f"alpha must be between 1 and ksize ({ksize}), not {alpha}")
    if refresh_interval_s <= 0 or rpc_timeout_s <= 0:
        raise ValueError("refresh_interval_s and rpc_timeout_s must be positive")


def _digest(key: str) -> bytes:
    hashed: bytes = digest(key)
    return hashed


async def _resolve_seed(seed: str) -> Address | None:
    """``host:port`` as an IPv4 address, or None (logged) when it is not one."""
    host, _, port_text = seed.rpartition(":")
    port_ok = port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536
    if not host or not port_ok:
        log.warning("overlay seed %r is not host:port; skipped", seed)
        return None
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            host, int(port_text), family=socket.AF_INET, type=socket.SOCK_DGRAM
        )
    except (OSError, UnicodeError) as exc:
        log.warning("overlay seed %r does not resolve (%s); skipped", seed, exc)
        return None
    if not infos:
        log.warning("overlay seed %r has no IPv4 address; skipped", seed)
        return None
    ip, port = infos[0][4][:2]
    return (str(ip), int(port))


class Overlay:
    """One peer's node in the discovery overlay.

    ``start`` binds the socket; ``run`` (inside the peer's TaskGroup, until cancelled)
    processes datagrams and refreshes; the other calls need ``run`` to be going, since it
    is what delivers their answers. ``stop`` closes everything it started.
    """

    def __init__(
        self,
        secret: str,
        peer_id: str,
        *,
        clock: Callable[[], float] = time.time,
        ksize: int = 20,
        alpha: int = 3,
        refresh_interval_s: float = 60.0,
        rpc_timeout_s: float = 2.0,
        values_max: int = VALUES_MAX,
        rng: random.Random | None = None,
    ) -> None:
        _check_settings(secret, ksize, alpha, refresh_interval_s, rpc_timeout_s)
        if values_max < 1:
            raise ValueError(f"values_max must be positive, not {values_max}")
        self._node = Node(node_id_for(peer_id))
        self._ksize = ksize
        self._alpha = alpha
        self._refresh_interval_s = refresh_interval_s
        self._rng = rng if rng is not None else random.Random()
        ttl_s = VALUE_TTL_REFRESHES * refresh_interval_s
        self._storage = _BoundedStorage(clock, values_max, ttl_s)
        self._protocol = _Protocol(
            self._node,
            self._storage,
            key=overlay_key(secret),
            clock=clock,
            ksize=ksize,
            rpc_timeout_s=rpc_timeout_s,
        )
        self._own_values: OrderedDict[bytes, bytes] = OrderedDict()
        self._seeds: list[Address] = []
        self._address: Address | None = None

    async def start(self, host: str, port: int) -> None:
        """Bind UDP ``host:port`` (IPv4). OSError if the address is taken."""
        if self._address is not None:
            raise RuntimeError("the overlay is already started")
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(
            lambda: self._protocol, local_addr=(host, port), family=socket.AF_INET
        )
        self._address = self._protocol.local_address()

    async def run(self) -> None:
        """Process datagrams and refresh periodically, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._protocol.serve())
            group.create_task(self._refresh_forever())

    async def bootstrap(self, seeds: Sequence[str]) -> int:
        """Join through ``seeds`` ("host:port"); the number of contacts known afterwards.

        Seeds that do not parse, resolve or answer are skipped. They are remembered: a
        refresh that finds no contacts joins through them again.
        """
        resolved: list[Address] = []
        for seed in seeds[:SEEDS_MAX]:
            address = await _resolve_seed(seed)
            if address is not None and address != self._address and address not in resolved:
                resolved.append(address)
        self._seeds = resolved
        await self._join(resolved)
        return len(self.contacts())

    async def announce(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key`` on the nodes closest to it; True if one took it.

        The value is also re-announced on every refresh until this overlay stops.
        """
        if not isinstance(value, bytes):
            raise TypeError(f"overlay values are bytes, not {type(value).__name__}")
        if len(value) > VALUE_BYTES_MAX:
            raise ValueError(
                f"overlay values are at most {VALUE_BYTES_MAX} bytes, not {len(value)}"
            )
        dkey = _digest(key)
        self._own_values.pop(dkey, None)
        self._own_values[dkey] = value
        if len(self._own_values) > OWN_VALUES_MAX:
            forgotten, _ = self._own_values.popitem(last=False)
            log.warning(
                "overlay: more than %d own values; %s no longer re-announced",
                OWN_VALUES_MAX,
                forgotten.hex(),
            )
        return await self._publish(dkey, value)

    async def lookup(self, key: str) -> bytes | None:
        """The value stored under ``key``: held here, or found on the network; else None."""
        dkey = _digest(key)
        local = self._storage.get(dkey)
        if local is None:
            local = self._own_values.get(dkey)
        if local is not None:
            return local
        target = Node(dkey)
        nearest = self._protocol.router.find_neighbors(target)
        if not nearest:
            return None
        spider = ValueSpiderCrawl(self._protocol, target, nearest, self._ksize, self._alpha)
        found = await spider.find()
        return found if isinstance(found, bytes) else None

    def contacts(self) -> list[Address]:
        """(ip, port) of every node in the routing table."""
        buckets = self._protocol.router.buckets
        return [(str(n.ip), int(n.port)) for bucket in buckets for n in bucket.get_nodes()]

    def stats(self) -> OverlayStats:
        return OverlayStats(
            handled=self._protocol.handled,
            dropped=dict(self._protocol.dropped),
            values_stored=len(self._storage),
        )

    async def stop(self) -> None:
        """Cancel background jobs, fail calls in flight, close the socket. Idempotent."""
        await self._protocol.close()

    async def refresh(self) -> None:
        """One round of upkeep (``run`` does this every ``refresh_interval_s``).

        Rejoins through the seeds when no contact is left, looks up a random id in every
        bucket not used within the interval, and re-announces this node's own values.
        """
        if not self.contacts() and self._seeds:
            await self._join(self._seeds)
        for target in self._stale_bucket_targets():
            await self._find_nodes(target, self._alpha)
        for dkey, value in list(self._own_values.items()):
            await self._publish(dkey, value)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            await self.refresh()

    async def _join(self, addresses: Sequence[Address]) -> None:
        own_id = self._node.id
        answers = await asyncio.gather(*(self._protocol.ping(a, own_id) for a in addresses))
        seeds = [
            Node(body, address[0], address[1])
            for address, (answered, body) in zip(addresses, answers, strict=True)
            if answered and body != own_id
        ]
        if seeds:
            await NodeSpiderCrawl(
                self._protocol, self._node, seeds, self._ksize, self._alpha
            ).find()

    def _stale_bucket_targets(self) -> list[bytes]:
        # Bucket stamps are kademlia's own (time.monotonic), so they are compared on it.
        stale_before = time.monotonic() - self._refresh_interval_s
        targets = []
        for bucket in self._protocol.router.buckets:
            if bucket.last_updated < stale_before:
                low, high = bucket.range
                target = min(self._rng.randint(low, high), NODE_ID_MAX)
                targets.append(target.to_bytes(NODE_ID_BYTES, "big"))
        return targets

    async def _find_nodes(self, target_id: bytes, start_count: int) -> list[Any]:
        target = Node(target_id)
        nearest = self._protocol.router.find_neighbors(target, start_count)
        if not nearest:
            return []
        spider = NodeSpiderCrawl(self._protocol, target, nearest, self._ksize, self._alpha)
        return list(await spider.find())

    async def _publish(self, dkey: bytes, value: bytes) -> bool:
        target = Node(dkey)
        nodes = await self._find_nodes(dkey, self._ksize)
        farthest = max((n.distance_to(target) for n in nodes), default=0)
        if len(nodes) < self._ksize or self._node.distance_to(target) < farthest:
            self._storage.put(dkey, value)
        if not nodes:
            return False
        answers = await asyncio.gather(
            *(self._protocol.call_store(node, dkey, value) for node in nodes)
        )
        return any(answered and body is True for answered, body in answers)
