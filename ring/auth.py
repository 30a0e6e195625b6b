"""Request signing with the cluster secret (scheme ``SR3-HMAC-SHA256``).

Every request to a peer, except ``GET /v1/health``, carries four headers:

    X-SR3-Timestamp        unix seconds when the request was signed
    X-SR3-Nonce            32 hex digits, fresh per request
    X-SR3-Content-BLAKE3   hex BLAKE3 of the request body (of b"" when there is none),
      or X-SR3-Content-SHA256, hex SHA-256 of it (one of the two, never both)
    Authorization          SR3-HMAC-SHA256 <hex HMAC-SHA256 of the canonical request>

Python clients digest bodies with BLAKE3, which costs this machine about a third of the
CPU per byte that SHA-256 does (chunk bodies are most of what a ring moves); the Java
FileSystem uses SHA-256 (what the JDK has). The canonical request is
``METHOD\\nTARGET\\nPATH?QUERY\\nTIMESTAMP\\nNONCE\\nBODY_DIGEST``, where BODY_DIGEST is the
SHA-256 hex, or ``blake3:`` and the BLAKE3 hex (a signature names its algorithm), signed
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

A scoped credential (``sr3 token scoped``) signs like the secret, with a key derived
for its claims instead, and names them in ``X-SR3-Credential``:

    scope_root = HMAC(secret, "sr3-scoped-v1")
    claims     = base64url(JSON {"expires", "issued", "prefix"})  (no padding, sorted keys)
    key        = HMAC(scope_root, claims)
    credential = "sr3c1." claims "." base64url(key)

A peer derives the key from its secret and the claims it receives, so it verifies a
credential from the secret alone (as AWS SigV4 derives its keys) and nothing is stored;
it refuses an expired one. What the credential reaches (the file namespace under its
prefix) is decided by the peer's guard (``ring.peer``), from ``Principal.prefix``.

Responses are not signed: chunk bodies are verified by their content address, and the
cluster network is assumed not to be actively hostile to responses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import blake3

from ring.api import (
    HEADER_AUTHORIZATION,
    HEADER_CONTENT_BLAKE3,
    HEADER_CONTENT_SHA256,
    HEADER_CREDENTIAL,
    HEADER_NONCE,
    HEADER_TARGET,
    HEADER_TIMESTAMP,
    load_json,
    parse_ascii_int,
)
from ring.errors import ProtocolError
from ring.fs_api import validate_path

__all__ = [
    "ANY_TARGET",
    "HEADER_AUTHORIZATION",
    "HEADER_CONTENT_BLAKE3",
    "HEADER_CONTENT_SHA256",
    "HEADER_NONCE",
    "HEADER_TARGET",
    "HEADER_TIMESTAMP",
    "SCHEME",
    "SECRET_CHARS_MIN",
    "FULL_ACCESS",
    "HEADER_CREDENTIAL",
    "AuthFailure",
    "BodyDigest",
    "Principal",
    "ReplayCache",
    "ScopedCredential",
    "Signer",
    "Verifier",
    "digest_of",
    "generate_secret",
    "is_credential",
    "metrics_token",
    "parse_credential",
    "scoped_credential",
]

SCHEME = "SR3-HMAC-SHA256"
CREDENTIAL_SCHEME = "sr3c1"
CREDENTIAL_CHARS_MAX = 1024
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
ANY_TARGET = "*"
TARGET_CHARS_MAX = 300
SKEW_S_MAX = 120
REPLAY_WINDOW_S = 2 * SKEW_S_MAX
NONCES_MAX = 262_144
SECRET_CHARS_MIN = 16
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
EMPTY_BLAKE3 = blake3.blake3(b"").hexdigest()
# Unix seconds of 12 digits at most: far beyond any clock, and refused before ``int()``.
TIMESTAMP_MAX = 10**12 - 1
_HEX = frozenset("0123456789abcdefABCDEF")


class AuthFailure(Exception):
    """A request's credentials are missing or wrong. The peer answers 401."""


class ClockSkew(AuthFailure):
    """A request signed at a time too far from this peer's clock: one of the two clocks
    is wrong. The peer answers 401 ``clock_skew``, naming its own time, and a client
    counts that peer as failing the request, not its credentials as wrong."""


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


def _signing_key(secret: str) -> bytes:
    if len(secret) < SECRET_CHARS_MIN:
        raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    return hmac.new(secret.encode(), b"sr3-request-signing-v1", hashlib.sha256).digest()


def metrics_token(secret: str) -> str:
    return hmac.new(secret.encode(), b"sr3-metrics-v1", hashlib.sha256).hexdigest()


def _canonical(
    method: str, target: str, path_qs: str, timestamp: str, nonce: str, body: BodyDigest
) -> bytes:
    fields = (method.upper(), target, path_qs, timestamp, nonce, body.canonical())
    return "\n".join(fields).encode()


DigestAlgorithm = Literal["sha256", "blake3"]


class Hasher(Protocol):
    def update(self, data: bytes, /) -> object: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True, slots=True)
class BodyDigest:
    """The digest of a request body that its signature covers, and its algorithm."""

    algorithm: DigestAlgorithm
    hex: str

    def canonical(self) -> str:
        return self.hex if self.algorithm == "sha256" else f"blake3:{self.hex}"

    def header(self) -> str:
        return HEADER_CONTENT_SHA256 if self.algorithm == "sha256" else HEADER_CONTENT_BLAKE3

    def hasher(self) -> Hasher:
        """An incremental hasher of this algorithm, for a body checked as it arrives."""
        return _hasher(self.algorithm)

    def matches(self, body: bytes | memoryview | None) -> bool:
        return hmac.compare_digest(digest_of(body, self.algorithm).hex, self.hex)


def _hasher(algorithm: DigestAlgorithm) -> Hasher:
    return hashlib.sha256() if algorithm == "sha256" else blake3.blake3()


def digest_of(
    body: bytes | memoryview | tuple[bytes, ...] | None, algorithm: DigestAlgorithm = "blake3"
) -> BodyDigest:
    """The digest of ``body`` (b"" when None; a tuple of parts: of their concatenation)
    with ``algorithm``."""
    if isinstance(body, tuple):
        hasher = _hasher(algorithm)
        for part in body:
            hasher.update(part)
        return BodyDigest(algorithm, hasher.hexdigest())
    if algorithm == "sha256":
        return BodyDigest("sha256", hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256)
    return BodyDigest("blake3", blake3.blake3(body).hexdigest() if body else EMPTY_BLAKE3)


@dataclass(frozen=True, slots=True)
class ScopedCredential:
    """A credential limited to the file namespace under ``prefix`` until ``expires``."""

    claims: str  # base64url of the claims' JSON, as sent in X-SR3-Credential
    prefix: str
    expires: int
    issued: int
    key: bytes


@dataclass(frozen=True, slots=True)
class Principal:
    """Who signed a request: the cluster secret (``prefix`` None) or a scoped
    credential reaching the namespace under ``prefix``."""

    prefix: str | None = None
    expires: int = 0


FULL_ACCESS = Principal()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    if not text or len(text) > CREDENTIAL_CHARS_MAX or not _B64URL.issuperset(text):
        raise ProtocolError(f"malformed credential: {what} is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, binascii.Error) as exc:
        raise ProtocolError(f"malformed credential: {what} is not base64url") from exc


def _scope_key(secret: str, claims: str) -> bytes:
    if len(secret) < SECRET_CHARS_MIN:
        raise ValueError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    root = hmac.new(secret.encode(), b"sr3-scoped-v1", hashlib.sha256).digest()
    return hmac.new(root, claims.encode("ascii"), hashlib.sha256).digest()


def _normal_prefix(prefix: str) -> str:
    text = "/" + prefix.strip("/") if prefix.strip("/") else "/"
    return validate_path(text)


def scoped_credential(secret: str, prefix: str, *, expires_at: int, issued_at: int) -> str:
    """A credential for the file namespace under ``prefix`` (``spark/sessions`` or
    ``/spark/sessions``; ``/`` for all of it) until ``expires_at`` (unix seconds)."""
    if not 0 <= issued_at < expires_at <= TIMESTAMP_MAX:
        raise ValueError("a credential expires after it is issued, within 12 digits")
    claims_json = json.dumps(
        {"expires": expires_at, "issued": issued_at, "prefix": _normal_prefix(prefix)},
        separators=(",", ":"),
        sort_keys=True,
    )
    claims = _b64(claims_json.encode())
    return f"{CREDENTIAL_SCHEME}.{claims}.{_b64(_scope_key(secret, claims))}"


def _parse_claims(claims: str) -> tuple[str, int, int]:
    raw = _unb64(claims, "claims")
    try:
        data = load_json(raw, bytes_max=CREDENTIAL_CHARS_MAX, depth_max=1)
    except ProtocolError as exc:
        raise ProtocolError(f"malformed credential: claims are not JSON ({exc})") from exc
    if not isinstance(data, dict) or set(data) != {"expires", "issued", "prefix"}:
        raise ProtocolError("malformed credential: claims are expires, issued and prefix")
    prefix, expires, issued = data["prefix"], data["expires"], data["issued"]
    for number in (expires, issued):
        if (
            isinstance(number, bool)
            or not isinstance(number, int)
            or not 0 <= number <= TIMESTAMP_MAX
        ):
            raise ProtocolError("malformed credential: times are unix seconds")
    if not isinstance(prefix, str) or _normal_prefix(prefix) != prefix:
        raise ProtocolError("malformed credential: the prefix is a normalized absolute path")
    return prefix, expires, issued


def parse_credential(text: str) -> ScopedCredential:
    """The credential ``scoped_credential`` made (``ProtocolError`` if malformed)."""
    scheme, _, rest = text.strip().partition(".")
    claims, _, key = rest.partition(".")
    if scheme != CREDENTIAL_SCHEME or not claims or not key:
        raise ProtocolError(f"a scoped credential reads {CREDENTIAL_SCHEME}.<claims>.<key>")
    prefix, expires, issued = _parse_claims(claims)
    raw_key = _unb64(key, "key")
    if len(raw_key) != 32:
        raise ProtocolError("malformed credential: the key is 32 bytes")
    return ScopedCredential(claims, prefix, expires, issued, raw_key)


def is_credential(text: str) -> bool:
    return text.startswith(CREDENTIAL_SCHEME + ".")


class Signer:
    """Produces the signing headers for outgoing requests, with the cluster secret or a
    scoped credential (``sr3c1.``...) in its place."""

    def __init__(
        self, secret: str, clock: Callable[[], float], *, algorithm: DigestAlgorithm = "blake3"
    ) -> None:
        self.algorithm: DigestAlgorithm = algorithm
        self._credential: str | None = None
        if is_credential(secret):
            credential = parse_credential(secret)
            self._key = credential.key
            self._credential = credential.claims
        else:
            self._key = _signing_key(secret)
        self._clock = clock

    def headers(
        self,
        method: str,
        path_qs: str,
        body: bytes | memoryview | tuple[bytes, ...] | None = None,
        *,
        target: str = ANY_TARGET,
        digest: BodyDigest | None = None,
    ) -> dict[str, str]:
        """Signing headers for a request to the peer at ``target`` (its host:port).
        ``digest``: the body's, when the caller has it (a body sent to several peers is
        digested once)."""
        timestamp = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        if digest is None:
            digest = digest_of(body, self.algorithm)
        signature = hmac.new(
            self._key,
            _canonical(method, target, path_qs, timestamp, nonce, digest),
            hashlib.sha256,
        ).hexdigest()
        headers = {
            HEADER_TARGET: target,
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            digest.header(): digest.hex,
            HEADER_AUTHORIZATION: f"{SCHEME} {signature}",
        }
        if self._credential is not None:
            headers[HEADER_CREDENTIAL] = self._credential
        return headers


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
    body: BodyDigest
    signature: str


def _parse(headers: Mapping[str, str]) -> _Parsed:
    """The signing headers, or ``AuthFailure``: hex where hex is due, ASCII throughout
    (``hmac.compare_digest`` refuses other text), the timestamp as ASCII digits."""
    authorization = headers.get(HEADER_AUTHORIZATION, "")
    scheme, _, signature = authorization.partition(" ")
    if scheme != SCHEME or not _is_hex(signature, 64):
        raise AuthFailure("missing or malformed Authorization header")
    nonce = headers.get(HEADER_NONCE, "")
    sha256, blake = headers.get(HEADER_CONTENT_SHA256), headers.get(HEADER_CONTENT_BLAKE3)
    if (sha256 is None) == (blake is None):
        raise AuthFailure("a request carries one body digest: BLAKE3 or SHA-256")
    digest = (
        BodyDigest("sha256", sha256) if sha256 is not None else (BodyDigest("blake3", blake or ""))
    )
    target = headers.get(HEADER_TARGET, "")
    if (
        len(nonce) != 32
        or not nonce.isascii()
        or not _is_hex(digest.hex, 64)
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
        self._secret = secret
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
    ) -> BodyDigest:
        """Check signature, target, freshness and replay from the headers alone, before
        any body is read; return the signed body digest for ``verify_body``.

        ``targets`` are the addresses (and ``*`` where allowed) this peer answers to.
        """
        return self.authenticate(method, path_qs, headers, targets)[0]

    def authenticate(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        targets: Collection[str] = (ANY_TARGET,),
    ) -> tuple[BodyDigest, Principal]:
        """``verify_headers``, and who signed: the secret or a scoped credential (its
        claims checked, expiry enforced, its key derived from the secret)."""
        parsed = _parse(headers)
        now = self._clock()
        key, principal = self._key, FULL_ACCESS
        claims = headers.get(HEADER_CREDENTIAL)
        if claims is not None:
            try:
                prefix, expires, _issued = _parse_claims(claims)
            except ProtocolError as exc:
                raise AuthFailure(str(exc)) from exc
            if now >= expires:
                raise AuthFailure("credential expired")
            key, principal = _scope_key(self._secret, claims), Principal(prefix, expires)
        if abs(now - parsed.timestamp) > SKEW_S_MAX:
            raise ClockSkew(
                f"request timestamp outside the allowed clock skew: signed at "
                f"{parsed.timestamp}, {parsed.timestamp - now:+.0f} s from this peer's clock "
                f"({now:.0f}); at most {SKEW_S_MAX} s either way"
            )
        canonical = _canonical(
            method,
            parsed.target,
            path_qs,
            str(parsed.timestamp),
            parsed.nonce,
            parsed.body,
        )
        expected = hmac.new(key, canonical, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, parsed.signature):
            raise AuthFailure("bad signature")
        if parsed.target not in targets:
            raise AuthFailure(f"request was signed for another peer ({parsed.target[:80]})")
        if not self._replays.check_and_add(parsed.nonce, now):
            raise AuthFailure("replayed request")
        return parsed.body, principal

    @staticmethod
    def verify_body(signed: BodyDigest, body: bytes | memoryview | None) -> None:
        if not signed.matches(body):
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
