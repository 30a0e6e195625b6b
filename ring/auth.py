"""Request signing with the cluster secret (scheme ``SR3-HMAC-SHA256``).

Every request to a peer, except ``GET /v1/health``, carries four headers:

    X-SR3-Timestamp        unix seconds when the request was signed
    X-SR3-Nonce            32 hex digits, fresh per request
    X-SR3-Content-SHA256   hex SHA-256 of the request body (of b"" when there is none)
    Authorization          SR3-HMAC-SHA256 <hex HMAC-SHA256 of the canonical request>

The canonical request is ``METHOD\\nPATH?QUERY\\nTIMESTAMP\\nNONCE\\nBODY_SHA256``, signed
with a key derived from the secret (``HMAC(secret, "sr3-request-signing-v1")``) so the raw
secret never signs anything directly. A peer accepts a request only when the signature
matches, the timestamp is within ``SKEW_S_MAX`` of its own clock, the body hash matches
the body it received, the target is one of its own addresses (a request captured on its
way to one peer is refused by every other), and the nonce was not seen in that window (a
bounded replay cache). Only ``GET /v1/ring`` also accepts the target ``*``: a client asks a
seed for the member table before it knows the seed's advertised address.

``GET /metrics`` also accepts ``Authorization: Bearer <metrics token>``, a read-only token
derived from the secret (``sr3 token metrics`` prints it) so that Prometheus can scrape
without signing. It opens nothing else.

Responses are not signed: chunk bodies are verified by their content address, and the
cluster network is assumed not to be actively hostile to responses.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ring.api import (
    HEADER_AUTHORIZATION,
    HEADER_CONTENT_SHA256,
    HEADER_NONCE,
    HEADER_TARGET,
    HEADER_TIMESTAMP,
    parse_ascii_int,
)
from ring.errors import ProtocolError

__all__ = [
    "ANY_TARGET",
    "HEADER_AUTHORIZATION",
    "HEADER_CONTENT_SHA256",
    "HEADER_NONCE",
    "HEADER_TARGET",
    "HEADER_TIMESTAMP",
    "SCHEME",
    "SECRET_CHARS_MIN",
    "AuthFailure",
    "ReplayCache",
    "Signer",
    "Verifier",
    "generate_secret",
    "metrics_token",
]

SCHEME = "SR3-HMAC-SHA256"
ANY_TARGET = "*"
TARGET_CHARS_MAX = 300
SKEW_S_MAX = 120
REPLAY_WINDOW_S = 2 * SKEW_S_MAX
NONCES_MAX = 262_144
SECRET_CHARS_MIN = 16
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Unix seconds of 12 digits at most: far beyond any clock, and refused before ``int()``.
TIMESTAMP_MAX = 10**12 - 1
_HEX = frozenset("0123456789abcdefABCDEF")


class AuthFailure(Exception):
    """A request's credentials are missing or wrong. The peer answers 401."""


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


def _signing_key(secret: str) -> bytes:
    if len(secret) < SECRET_CHARS_MIN:
        raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    return hmac.new(secret.encode(), b"sr3-request-signing-v1", hashlib.sha256).digest()


def metrics_token(secret: str) -> str:
    return hmac.new(secret.encode(), b"sr3-metrics-v1", hashlib.sha256).hexdigest()


def _canonical(
    method: str, target: str, path_qs: str, timestamp: str, nonce: str, body_sha256: str
) -> bytes:
    return "\n".join((method.upper(), target, path_qs, timestamp, nonce, body_sha256)).encode()


def body_digest(body: bytes | memoryview | None) -> str:
    if not body:
        return EMPTY_SHA256
    return hashlib.sha256(body).hexdigest()


class Signer:
    """Produces the signing headers for outgoing requests."""

    def __init__(self, secret: str, clock: Callable[[], float]) -> None:
        self._key = _signing_key(secret)
        self._clock = clock

    def headers(
        self,
        method: str,
        path_qs: str,
        body: bytes | memoryview | None = None,
        *,
        target: str = ANY_TARGET,
    ) -> dict[str, str]:
        """Signing headers for a request to the peer at ``target`` (its host:port)."""
        timestamp = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        digest = body_digest(body)
        signature = hmac.new(
            self._key,
            _canonical(method, target, path_qs, timestamp, nonce, digest),
            hashlib.sha256,
        ).hexdigest()
        return {
            HEADER_TARGET: target,
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_CONTENT_SHA256: digest,
            HEADER_AUTHORIZATION: f"{SCHEME} {signature}",
        }


class ReplayCache:
    """Nonces seen within the replay window, bounded to ``capacity`` entries.

    A request is accepted while its timestamp is within ``SKEW_S_MAX`` of the peer's
    clock, so one first seen at ``now`` (timestamp up to ``now + SKEW_S_MAX``) stays
    acceptable until ``now + 2 * SKEW_S_MAX``: its nonce is kept that long.

    When full, the oldest nonce is forgotten first; under request rates above
    capacity / window the replay protection covers a shorter window than that.
    """

    def __init__(self, capacity: int = NONCES_MAX) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._capacity = capacity

    def check_and_add(self, nonce: str, now: float) -> bool:
        """Record ``nonce``; False if it was already seen within the window."""
        while self._seen:
            oldest_nonce, seen_at = next(iter(self._seen.items()))
            if seen_at >= now - REPLAY_WINDOW_S and len(self._seen) < self._capacity:
                break
            del self._seen[oldest_nonce]
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


@dataclass(frozen=True, slots=True)
class _Parsed:
    target: str
    timestamp: int
    nonce: str
    body_sha256: str
    signature: str


def _parse(headers: Mapping[str, str]) -> _Parsed:
    """The signing headers, or ``AuthFailure``: hex where hex is due, ASCII throughout
    (``hmac.compare_digest`` refuses other text), the timestamp as ASCII digits."""
    authorization = headers.get(HEADER_AUTHORIZATION, "")
    scheme, _, signature = authorization.partition(" ")
    if scheme != SCHEME or not _is_hex(signature, 64):
        raise AuthFailure("missing or malformed Authorization header")
    nonce = headers.get(HEADER_NONCE, "")
    digest = headers.get(HEADER_CONTENT_SHA256, "")
    target = headers.get(HEADER_TARGET, "")
    if (
        len(nonce) != 32
        or not nonce.isascii()
        or not _is_hex(digest, 64)
        or not 0 < len(target) <= TARGET_CHARS_MAX
        or not (target.isascii() and target.isprintable())
    ):
        raise AuthFailure("missing or malformed signing headers")
    try:
        timestamp = parse_ascii_int(headers.get(HEADER_TIMESTAMP, ""), "timestamp", TIMESTAMP_MAX)
    except ProtocolError as exc:
        raise AuthFailure(f"malformed signing headers: {exc}") from exc
    return _Parsed(target, timestamp, nonce, digest, signature)


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and _HEX.issuperset(text)


class Verifier:
    """Checks incoming requests against the cluster secret."""

    def __init__(self, secret: str, clock: Callable[[], float]) -> None:
        self._key = _signing_key(secret)
        self._metrics_token = metrics_token(secret)
        self._clock = clock
        self._replays = ReplayCache()

    def verify_headers(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        targets: Collection[str] = (ANY_TARGET,),
    ) -> str:
        """Check signature, target, freshness and replay from the headers alone, before
        any body is read; return the signed body digest for ``verify_body``.

        ``targets`` are the addresses (and ``*`` where allowed) this peer answers to.
        """
        parsed = _parse(headers)
        now = self._clock()
        if abs(now - parsed.timestamp) > SKEW_S_MAX:
            raise AuthFailure("request timestamp outside the allowed clock skew")
        canonical = _canonical(
            method,
            parsed.target,
            path_qs,
            str(parsed.timestamp),
            parsed.nonce,
            parsed.body_sha256,
        )
        expected = hmac.new(self._key, canonical, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, parsed.signature):
            raise AuthFailure("bad signature")
        if parsed.target not in targets:
            raise AuthFailure(f"request was signed for another peer ({parsed.target[:80]})")
        if not self._replays.check_and_add(parsed.nonce, now):
            raise AuthFailure("replayed request")
        return parsed.body_sha256

    @staticmethod
    def verify_body(signed_digest: str, body: bytes | memoryview | None) -> None:
        if not hmac.compare_digest(body_digest(body), signed_digest):
            raise AuthFailure("body does not match its signed digest")

    def verify(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes | None,
        targets: Collection[str] = (ANY_TARGET,),
    ) -> None:
        """Raise ``AuthFailure`` unless the request is correctly signed and fresh."""
        self.verify_body(self.verify_headers(method, path_qs, headers, targets), body)

    def verify_metrics_bearer(self, headers: Mapping[str, str]) -> bool:
        scheme, _, token = headers.get(HEADER_AUTHORIZATION, "").partition(" ")
        return (
            scheme == "Bearer"
            and token.isascii()
            and hmac.compare_digest(token, self._metrics_token)
        )
