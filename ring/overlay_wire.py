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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import umsgpack

from ring.auth import SKEW_S_MAX, ReplayCache

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
    "DatagramGate",
    "Dropped",
    "Opened",
    "Request",
    "Response",
    "is_node_id",
    "is_value",
    "node_id_for",
    "overlay_key",
    "parse_message",
    "request_payload",
    "response_payload",
    "seal",
    "unseal",
]

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
KSIZE_MAX = 64  # keeps a find_node answer (ksize contacts) far below BODY_BYTES_MAX
REPLAY_TAGS_MAX = 16_384

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


class Dropped(Exception):
    """A datagram that fails a check; ``reason`` is one of ``DATAGRAM_DROP_REASONS``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Opened:
    tag: bytes
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


# --- sealing and opening -----------------------------------------------------------------


def seal(key: bytes, timestamp_s: int, payload: bytes) -> bytes:
    signed = timestamp_s.to_bytes(TIMESTAMP_BYTES, "big") + payload
    return hmac.new(key, signed, hashlib.sha256).digest() + signed


def unseal(key: bytes, datagram: bytes, now_s: float) -> Opened:
    """The authenticated payload of ``datagram``; raises ``Dropped`` with the reason."""
    if len(datagram) > DATAGRAM_BYTES_MAX:
        raise Dropped("oversized")
    if len(datagram) < TAG_BYTES + TIMESTAMP_BYTES:
        raise Dropped("bad_tag")
    tag, signed = datagram[:TAG_BYTES], datagram[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, signed, hashlib.sha256).digest()):
        raise Dropped("bad_tag")
    timestamp_s = int.from_bytes(signed[:TIMESTAMP_BYTES], "big")
    if abs(timestamp_s - now_s) > SKEW_S_MAX:
        raise Dropped("stale")
    return Opened(tag, signed[TIMESTAMP_BYTES:])


class DatagramGate:
    """Opens datagrams under one key and refuses tags it has already let through."""

    def __init__(self, key: bytes, replay_tags_max: int = REPLAY_TAGS_MAX) -> None:
        self._key = key
        self._replays = ReplayCache(replay_tags_max)

    def admit(self, datagram: bytes, now_s: float) -> bytes:
        """The payload of a fresh, authentic datagram; raises ``Dropped`` otherwise."""
        opened = unseal(self._key, datagram, now_s)
        if not self._replays.check_and_add(opened.tag.hex(), now_s):
            raise Dropped("replay")
        return opened.payload


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
