"""The discovery overlay: a hardened Kademlia node that every storage peer runs.

Peers find each other through the overlay and through nothing else: its values are small
(at most ``VALUE_BYTES_MAX``), held in memory and bounded in number, and bulk data never
travels over it. It reuses the ``kademlia`` package's routing table, node lookups
(crawlers) and RPC handlers, and replaces what is unsafe there: the datagram path, the
dispatch by name, the fire-and-forget tasks and the unbounded value store.

Datagram format (UDP, one message per datagram, at most ``DATAGRAM_BYTES_MAX`` bytes)::

    tag (32) | version (1) | timestamp (8) | source (6) | destination (6) |
               kind (1) | message id (20) | msgpack body

    signed: everything after the tag, HMAC-SHA256 under the overlay key

- ``tag`` is HMAC-SHA256 over everything after it, keyed with
  ``HMAC-SHA256(cluster secret, "sr3-overlay-v1")``, so the raw secret signs nothing.
- ``version`` is ``WIRE_VERSION`` (2). Version 1 had neither this byte nor the addresses;
  its datagrams are dropped as ``bad_version``, and a version 1 node reads ours as stale.
- ``timestamp`` is unix seconds (unsigned, big endian) from the sender's clock; a receiver
  drops datagrams more than ``SKEW_S_MAX`` (30) seconds away from its own clock, so one
  captured on the wire is replayable for 60 s at most, and within that window it drops
  tags it has already admitted (a replay cache of ``REPLAY_TAGS_MAX`` tags that, when
  full, refuses everything stamped at or before the oldest second it had to forget).
- ``source`` is the address the sender listens on and other nodes know it by (its
  advertised address), ``destination`` the address it sent the datagram to: each an
  IPv4 address (4 bytes) and a UDP port (2 bytes, big endian).
- ``kind | message id | body`` is rpcudp's payload: kind 0x00 is a request whose body is
  ``[method, [arguments]]``, 0x01 the response to the request with the same message id.

What arrives is checked in this order, and a datagram that fails is dropped and counted
under its reason (``OverlayStats.dropped``): size (``oversized``), tag (``bad_tag``),
version (``bad_version``), timestamp (``stale``), the signed destination against this
node's own addresses (``wrong_destination``), the signed source against the address the
datagram came from (``wrong_source``), replay (``replay``), room in the bounded inbound
queue (``queue_full``); then, when ``run()`` takes it from the queue, msgpack decoding and
the message's shape (``malformed``), the method against an explicit table of four
(``unknown_method``), the arguments' types and sizes (``bad_args``), and for a response
the request it answers (``unexpected_response``), that it comes from the address asked
(``wrong_source``) and the shape that request expects (``bad_response``; the call then
fails). Nothing is ever unpickled or looked up by name.

A contact enters the routing table only at an address its owner signed: a request's
sender at its signed source, which is where the datagram came from, and an answering
node at the address it was asked at, which is the source its answer signed. Requests
are answered at that same address.

Threat model. The tag keeps out anyone without the cluster secret: such a host cannot
join (its pings and lookups get no answer, and nothing it sends adds a contact), cannot
poison routing tables or stored values (its stores never reach the store), cannot forge
answers to our requests, and gets no traffic reflected or amplified to anyone. A datagram
it captured on the wire is of no use sent from its own address (``wrong_source``: no
contact, no answer) or to any node but the one it was meant for (``wrong_destination``);
with a forged source address it can deliver it once more to that node, within 60 s of
its timestamp and only if that node never admitted it. The overlay gives no
confidentiality: bodies are plain msgpack, so node ids, addresses and announced values
are readable on the path; announce nothing secret. Every holder of the secret is
trusted: a peer with it can store any value under any key, claim any node id and hand
out made-up contacts. Flooding is bounded (the inbound queue drops and counts) but still
costs honest datagrams, and peers whose clocks differ by more than ``SKEW_S_MAX`` drop
each other's traffic as stale. Nodes must reach each other at their advertised addresses
and send from them: there is no NAT traversal, and a datagram that arrives from another
address than the one signed is dropped.

Layout. This module is the public face and the upkeep: ``Overlay`` joins, announces,
looks up and refreshes. ``ring.overlay_wire`` implements the format above as pure
functions (sealing, opening, parsing, building, every size limit); ``ring.overlay_table``
holds the bounded value store and the routing decisions; ``ring.overlay_protocol`` is
the asyncio protocol that moves datagrams between them and the socket.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kademlia.crawling import NodeSpiderCrawl, ValueSpiderCrawl
from kademlia.node import Node
from kademlia.utils import digest

from ring.auth import SECRET_CHARS_MIN
from ring.loops import run_periodic
from ring.overlay_protocol import DROP_REASONS, INBOX_DATAGRAMS_MAX, OverlayProtocol
from ring.overlay_table import (
    VALUE_TTL_REFRESHES,
    VALUES_MAX,
    BoundedStorage,
    OwnValues,
    keeps_own_copy,
    stale_bucket_targets,
)
from ring.overlay_wire import (
    DATAGRAM_BYTES_MAX,
    KSIZE_MAX,
    REPLAY_TAGS_MAX,
    SKEW_S_MAX,
    VALUE_BYTES_MAX,
    WIRE_VERSION,
    Address,
    node_id_for,
    overlay_key,
)

__all__ = [
    "DATAGRAM_BYTES_MAX",
    "DROP_REASONS",
    "INBOX_DATAGRAMS_MAX",
    "REPLAY_TAGS_MAX",
    "SKEW_S_MAX",
    "VALUES_MAX",
    "VALUE_BYTES_MAX",
    "WIRE_VERSION",
    "Overlay",
    "OverlayStats",
    "node_id_for",
]

log = logging.getLogger(__name__)

SEEDS_MAX = 32


@dataclass(frozen=True)
class OverlayStats:
    handled: int
    dropped: dict[str, int]  # reason (DROP_REASONS) -> count
    values_stored: int = 0


def _check_settings(
    secret: str, ksize: int, alpha: int, refresh_interval_s: float, rpc_timeout_s: float
) -> None:
    if len(secret) < SECRET_CHARS_MIN:
        raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    if not 1 <= ksize <= KSIZE_MAX:
        raise ValueError(f"ksize must be between 1 and {KSIZE_MAX}, not {ksize}")
    if not 1 <= alpha <= ksize:
        raise ValueError(f"alpha must be between 1 and ksize ({ksize}), not {alpha}")
    if not all(
        math.isfinite(seconds) and seconds > 0 for seconds in (refresh_interval_s, rpc_timeout_s)
    ):
        raise ValueError("refresh_interval_s and rpc_timeout_s must be positive and finite")


def _digest(key: str) -> bytes:
    hashed: bytes = digest(key)
    return hashed


async def _resolve(text: str) -> Address:
    """``host:port`` as an IPv4 address; ValueError saying why it is not one."""
    host, _, port_text = text.rpartition(":")
    port_ok = port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536
    if not host or not port_ok:
        raise ValueError("is not host:port")
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            host, int(port_text), family=socket.AF_INET, type=socket.SOCK_DGRAM
        )
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"does not resolve ({exc})") from exc
    if not infos:
        raise ValueError("has no IPv4 address")
    ip, port = infos[0][4][:2]
    return (str(ip), int(port))


async def _resolve_seed(seed: str) -> Address | None:
    """``host:port`` as an IPv4 address, or None (logged) when it is not one."""
    try:
        return await _resolve(seed)
    except ValueError as exc:
        log.warning("overlay seed %r %s; skipped", seed, exc)
        return None


def _is_ipv4_text(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _is_unspecified(ip: str) -> bool:
    return ipaddress.IPv4Address(ip).is_unspecified


async def _resolve_advertised(host: str, advertise: str | None) -> Address | None:
    """The address ``advertise`` names, or None to advertise the bound address."""
    if advertise is None:
        if not host or (_is_ipv4_text(host) and _is_unspecified(host)):
            raise ValueError(
                f"an overlay listening on {host or 'every address'} needs advertise: "
                "the host:port other peers reach it at"
            )
        return None
    try:
        advertised = await _resolve(advertise)
    except ValueError as exc:
        raise ValueError(f"the overlay's advertised address {advertise!r} {exc}") from exc
    if _is_unspecified(advertised[0]):
        raise ValueError(f"the overlay cannot advertise {advertise!r}: peers cannot reach it")
    return advertised


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
        monotonic: Callable[[], float] | None = None,
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
        # Signed timestamps are compared across machines (``clock``, wall time); how long
        # a stored value lives is a duration (``monotonic``; the same clock if not given,
        # so a test steps one fake clock).
        self._storage = BoundedStorage(monotonic or clock, values_max, ttl_s)
        self._protocol = OverlayProtocol(
            self._node,
            self._storage,
            key=overlay_key(secret),
            clock=clock,
            ksize=ksize,
            rpc_timeout_s=rpc_timeout_s,
        )
        self._own_values = OwnValues()
        self._seed_names: list[str] = []
        self._address: Address | None = None

    async def start(self, host: str, port: int, advertise: str | None = None) -> None:
        """Bind UDP ``host:port`` (IPv4). OSError if the address is taken.

        ``advertise`` ("host:port", resolved to IPv4 once, here) is the address other
        nodes reach this one at and that it signs as its own; by default the bound
        address, which must then be a concrete one (not 0.0.0.0). This node answers
        datagrams signed for either. ValueError if ``advertise`` is not usable.
        """
        if self._address is not None:
            raise RuntimeError("the overlay is already started")
        advertised = await _resolve_advertised(host, advertise)
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(
            lambda: self._protocol, local_addr=(host, port), family=socket.AF_INET
        )
        bound = self._protocol.local_address()
        assert bound is not None, "the socket is bound"
        own = set() if _is_unspecified(bound[0]) else {bound}
        if advertised is not None:
            own.add(advertised)
            if advertised[1] != bound[1]:
                log.warning(
                    "overlay: advertises %s:%d but listens on port %d; other nodes drop "
                    "datagrams that do not come from the address they are signed with",
                    *advertised,
                    bound[1],
                )
        self._protocol.set_addresses(advertised or bound, frozenset(own))
        self._address = advertised or bound

    async def run(self) -> None:
        """Process datagrams and refresh periodically, until cancelled.

        A refresh that raises is a bug, not an operating error (unanswered calls are
        results, not exceptions): it ends ``run`` and the peer's TaskGroup with it.
        """
        async with asyncio.TaskGroup() as group:
            group.create_task(self._protocol.serve())
            group.create_task(
                run_periodic(
                    "overlay refresh",
                    self.refresh,
                    self._refresh_interval_s,
                    first_at_once=False,
                )
            )

    async def bootstrap(self, seeds: Sequence[str]) -> int:
        """Join through ``seeds`` ("host:port"); the number of contacts known afterwards.

        Seeds that do not parse, resolve or answer are skipped. They are remembered, by
        name: a refresh that finds no contacts resolves them again and joins through
        them (in a container network a seed's name resolves only once it started).
        """
        self._seed_names = list(seeds[:SEEDS_MAX])
        resolved: list[Address] = []
        for seed in seeds[:SEEDS_MAX]:
            address = await _resolve_seed(seed)
            own = self._protocol.own_addresses()
            if address is not None and address not in own and address not in resolved:
                resolved.append(address)
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
        forgotten = self._own_values.remember(dkey, value)
        if forgotten is not None:
            log.warning(
                "overlay: more than %d own values; %s no longer re-announced",
                self._own_values.values_max,
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
        if not self.contacts() and self._seed_names:
            await self.bootstrap(self._seed_names)
        # Bucket stamps are kademlia's own (time.monotonic), so they are compared on it.
        stale_before = time.monotonic() - self._refresh_interval_s
        buckets = self._protocol.router.buckets
        for target in stale_bucket_targets(buckets, stale_before, self._rng):
            await self._find_nodes(target, self._alpha)
        for dkey, value in self._own_values.items():
            await self._publish(dkey, value)

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

    async def _find_nodes(self, target_id: bytes, start_count: int) -> list[Any]:
        target = Node(target_id)
        nearest = self._protocol.router.find_neighbors(target, start_count)
        if not nearest:
            return []
        spider = NodeSpiderCrawl(self._protocol, target, nearest, self._ksize, self._alpha)
        return list(await spider.find())

    async def _publish(self, dkey: bytes, value: bytes) -> bool:
        nodes = await self._find_nodes(dkey, self._ksize)
        if keeps_own_copy(self._node, Node(dkey), nodes, self._ksize):
            self._storage.put(dkey, value)
        if not nodes:
            return False
        answers = await asyncio.gather(
            *(self._protocol.call_store(node, dkey, value) for node in nodes)
        )
        return any(answered and body is True for answered, body in answers)
