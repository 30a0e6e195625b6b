"""The overlay's wire format as pure functions: sealing, opening, parsing and building.

Bytes in, values or a ``Dropped`` reason out; no sockets, no clock of its own (callers
pass ``now_s``). The format itself, the order of the checks and the threat model are
written down in ``ring.overlay``'s docstring; this module is the one place that
implements them, with every size limit a datagram is held to.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import umsgpack

__all__ = [
    "BODY_BYTES_MAX",
    "DATAGRAM_BYTES_MAX",
    "DATAGRAM_DROP_REASONS",
    "KSIZE_MAX",
    "MESSAGE_ID_BYTES",
    "NODE_ID_BYTES",
    "NODE_ID_MAX",
    "REPLAY_TAGS_MAX",
    "REQUEST_ARGUMENTS",
    "RESPONSE_CHECKS",
    "SKEW_S_MAX",
    "VALUE_BYTES_MAX",
    "WIRE_VERSION",
    "Address",
    "Admitted",
    "DatagramGate",
    "Dropped",
    "Opened",
    "TagCache",
    "Request",
    "Response",
    "is_node_id",
    "is_value",
    "node_id_for",
    "overlay_key",
    "pack_address",
    "parse_message",
    "request_payload",
    "response_payload",
    "seal",
    "unpack_address",
    "unseal",
]

Address = tuple[str, int]  # (IPv4 address, UDP port)

KEY_LABEL = b"sr3-overlay-v1"
NODE_ID_PREFIX = b"sr3-node:"
NODE_ID_BYTES = 20
NODE_ID_MAX = 2**160 - 1
TAG_BYTES = 32
# Version 1 had no version byte: its first signed byte, the top of its timestamp, is 0.
WIRE_VERSION = 2
VERSION_BYTES = 1
TIMESTAMP_BYTES = 8
ADDRESS_BYTES = 4 + 2  # IPv4 address, port (big endian)
# Signed, before rpcudp's payload: version | timestamp | source | destination.
ENVELOPE_BYTES = VERSION_BYTES + TIMESTAMP_BYTES + 2 * ADDRESS_BYTES
MESSAGE_ID_BYTES = 20
HEADER_BYTES = 1 + MESSAGE_ID_BYTES
REQUEST = b"\x00"
RESPONSE = b"\x01"

VALUE_BYTES_MAX = 8192
# A store request carrying a maximal value is ~55 bytes of msgpack framing and ids
# around it; rpcudp itself would refuse it (its limit is 8 KB for the whole body).
BODY_BYTES_MAX = VALUE_BYTES_MAX + 256
DATAGRAM_BYTES_MAX = TAG_BYTES + ENVELOPE_BYTES + HEADER_BYTES + BODY_BYTES_MAX
KSIZE_MAX = 64  # keeps a find_node answer (ksize contacts) far below BODY_BYTES_MAX
# A datagram is accepted while its timestamp is within SKEW_S_MAX of the receiver's
# clock, so a captured one can be replayed for at most 2 * SKEW_S_MAX seconds (60 s);
# within that window the replay cache refuses a tag it has seen. Clocks of peers must
# agree to within SKEW_S_MAX (NTP does far better).
SKEW_S_MAX = 30
REPLAY_TAGS_MAX = 16_384

DATAGRAM_DROP_REASONS = (
    "oversized",
    "bad_tag",
    "bad_version",
    "stale",
    "wrong_destination",
    "wrong_source",
    "replay",
    "queue_full",
    "malformed",
    "unknown_method",
    "bad_args",
    "unexpected_response",
    "bad_response",
)


class Dropped(Exception):
    """A datagram that fails a check; ``reason`` is one of ``DATAGRAM_DROP_REASONS``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Opened:
    """An authentic datagram of this version, not yet checked for time or addresses."""

    tag: bytes
    timestamp_s: int
    source: Address  # where the sender listens, as it signed it
    destination: Address  # where the sender sent it, as it signed it
    payload: bytes  # rpcudp's payload


@dataclass(frozen=True, slots=True)
class Admitted:
    """A datagram that passed every check of ``DatagramGate``."""

    source: Address  # signed by the sender and equal to where it came from
    payload: bytes


@dataclass(frozen=True, slots=True)
class Request:
    message_id: bytes
    method: str
    arguments: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Response:
    message_id: bytes
    body: Any  # checked against the request it answers


def node_id_for(peer_id: str) -> bytes:
    """The overlay node id of a peer: stable across restarts, 20 bytes."""
    return hashlib.sha1(NODE_ID_PREFIX + peer_id.encode()).digest()


def overlay_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), KEY_LABEL, hashlib.sha256).digest()


# --- addresses ---------------------------------------------------------------------------


def pack_address(address: Address) -> bytes:
    """``address`` as 6 bytes; it must be an IPv4 address and a port (a bug otherwise)."""
    ip, port = address
    assert 0 <= port < 65536, address
    return ipaddress.IPv4Address(ip).packed + port.to_bytes(2, "big")


def unpack_address(packed: bytes) -> Address:
    assert len(packed) == ADDRESS_BYTES, len(packed)
    return (str(ipaddress.IPv4Address(packed[:4])), int.from_bytes(packed[4:], "big"))


# --- sealing and opening -----------------------------------------------------------------


def seal(
    key: bytes, timestamp_s: int, source: Address, destination: Address, payload: bytes
) -> bytes:
    """The datagram that ``source`` sends to ``destination`` carrying ``payload``."""
    signed = (
        WIRE_VERSION.to_bytes(VERSION_BYTES, "big")
        + timestamp_s.to_bytes(TIMESTAMP_BYTES, "big")
        + pack_address(source)
        + pack_address(destination)
        + payload
    )
    return hmac.new(key, signed, hashlib.sha256).digest() + signed


def unseal(key: bytes, datagram: bytes, now_s: float) -> Opened:
    """The authentic, fresh content of ``datagram``; raises ``Dropped`` with the reason."""
    if len(datagram) > DATAGRAM_BYTES_MAX:
        raise Dropped("oversized")
    if len(datagram) < TAG_BYTES + ENVELOPE_BYTES:
        raise Dropped("bad_tag")
    tag, signed = datagram[:TAG_BYTES], datagram[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, signed, hashlib.sha256).digest()):
        raise Dropped("bad_tag")
    if signed[0] != WIRE_VERSION:
        raise Dropped("bad_version")
    at = VERSION_BYTES
    timestamp_s = int.from_bytes(signed[at : at + TIMESTAMP_BYTES], "big")
    if abs(timestamp_s - now_s) > SKEW_S_MAX:
        raise Dropped("stale")
    at += TIMESTAMP_BYTES
    source = unpack_address(signed[at : at + ADDRESS_BYTES])
    destination = unpack_address(signed[at + ADDRESS_BYTES : at + 2 * ADDRESS_BYTES])
    return Opened(tag, timestamp_s, source, destination, signed[ENVELOPE_BYTES:])


class TagCache:
    """The tags admitted within the window, by timestamp; never more than ``tags_max``.

    A tag is kept until its timestamp is more than ``SKEW_S_MAX`` in the past, when the
    datagram is refused as stale anyway. When full, it forgets the oldest second of tags
    and from then on refuses anything stamped at or before that second, so that no
    replay gets through however fast datagrams arrive (honest ones are stamped now).
    """

    def __init__(self, tags_max: int) -> None:
        assert tags_max >= 1, tags_max
        self._tags_max = tags_max
        self._by_second: dict[int, set[bytes]] = {}
        self._count = 0
        self._floor_s = -1  # the newest second forgotten while still within the window

    def admit(self, tag: bytes, timestamp_s: int, now_s: float) -> str | None:
        """Record ``tag``; the drop reason if it cannot be admitted, else None."""
        for second in [s for s in self._by_second if s < now_s - SKEW_S_MAX]:
            self._count -= len(self._by_second.pop(second))
        if timestamp_s <= self._floor_s:
            return "stale"
        seen = self._by_second.setdefault(timestamp_s, set())
        if tag in seen:
            return "replay"
        seen.add(tag)
        self._count += 1
        while self._count > self._tags_max:
            oldest = min(self._by_second)
            self._count -= len(self._by_second.pop(oldest))
            self._floor_s = max(self._floor_s, oldest)
        return None

    def __len__(self) -> int:
        return self._count


class DatagramGate:
    """Admits datagrams signed under one key, sent to this node, from where they say.

    Checks, in order: size, tag, version, timestamp (``unseal``); the signed destination
    is one of this node's own addresses (``wrong_destination``: captured on its way to
    another node); the signed source is the address it came from (``wrong_source``: sent
    again by someone else); its tag was not admitted before (``replay``).
    """

    def __init__(self, key: bytes, replay_tags_max: int = REPLAY_TAGS_MAX) -> None:
        self._key = key
        self._tags = TagCache(replay_tags_max)

    def admit(
        self, datagram: bytes, came_from: Address, own_addresses: Collection[Address], now_s: float
    ) -> Admitted:
        """The sender and payload of an admissible datagram; raises ``Dropped`` otherwise."""
        opened = unseal(self._key, datagram, now_s)
        if opened.destination not in own_addresses:
            raise Dropped("wrong_destination")
        if opened.source != came_from:
            raise Dropped("wrong_source")
        refused = self._tags.admit(opened.tag, opened.timestamp_s, now_s)
        if refused is not None:
            raise Dropped(refused)
        return Admitted(opened.source, opened.payload)


# --- what a message may carry ------------------------------------------------------------


def is_node_id(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == NODE_ID_BYTES


def is_value(value: object) -> bool:
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
    return is_node_id(node_id) and _is_ipv4(ip) and port_ok


def _is_contact_list(body: object) -> bool:
    return isinstance(body, list) and len(body) <= KSIZE_MAX and all(map(_is_contact, body))


def _is_found_value(body: object) -> bool:
    if isinstance(body, dict):
        return body.keys() == {"value"} and is_value(body["value"])
    return _is_contact_list(body)


# The only methods a datagram can name, with one check per argument (after the sender).
REQUEST_ARGUMENTS: dict[str, tuple[Callable[[object], bool], ...]] = {
    "ping": (is_node_id,),
    "store": (is_node_id, is_node_id, is_value),
    "find_node": (is_node_id, is_node_id),
    "find_value": (is_node_id, is_node_id),
}
RESPONSE_CHECKS: dict[str, Callable[[object], bool]] = {
    "ping": is_node_id,
    "store": _is_bool,
    "find_node": _is_contact_list,
    "find_value": _is_found_value,
}


# --- parsing and building payloads -------------------------------------------------------


def parse_message(payload: bytes) -> Request | Response:
    """Decode rpcudp's payload; raises ``Dropped`` for anything not well-formed."""
    if len(payload) <= HEADER_BYTES:
        raise Dropped("malformed")
    kind, message_id = payload[:1], payload[1:HEADER_BYTES]
    try:
        body = umsgpack.unpackb(payload[HEADER_BYTES:])
    except Exception as exc:  # any decoding failure, deep nesting included
        raise Dropped("malformed") from exc
    if kind == RESPONSE:
        return Response(message_id, body)
    if kind != REQUEST:
        raise Dropped("malformed")
    return _parse_request(message_id, body)


def _parse_request(message_id: bytes, body: Any) -> Request:
    shaped = isinstance(body, list) and len(body) == 2
    if not (shaped and isinstance(body[0], str) and isinstance(body[1], list)):
        raise Dropped("malformed")
    method, arguments = body
    checks = REQUEST_ARGUMENTS.get(method)
    if checks is None:
        raise Dropped("unknown_method")
    if len(arguments) != len(checks):
        raise Dropped("bad_args")
    if not all(check(argument) for check, argument in zip(checks, arguments, strict=True)):
        raise Dropped("bad_args")
    return Request(message_id, method, tuple(arguments))


def request_payload(message_id: bytes, method: str, arguments: Sequence[bytes]) -> bytes:
    """rpcudp's payload for a call of ``method``; its body is within ``BODY_BYTES_MAX``."""
    assert len(message_id) == MESSAGE_ID_BYTES, len(message_id)
    body: bytes = umsgpack.packb([method, list(arguments)])
    # Bounded by construction: callers pass ids and at most one VALUE_BYTES_MAX value.
    assert len(body) <= BODY_BYTES_MAX, (method, len(body))
    return REQUEST + message_id + body


def response_payload(message_id: bytes, method: str, answer: object) -> bytes:
    """rpcudp's payload answering the request ``message_id`` to ``method``."""
    assert len(message_id) == MESSAGE_ID_BYTES, len(message_id)
    body: bytes = umsgpack.packb(answer)
    # Bounded by construction: at most KSIZE_MAX contacts or one VALUE_BYTES_MAX value.
    assert len(body) <= BODY_BYTES_MAX, (method, len(body))
    return RESPONSE + message_id + body
