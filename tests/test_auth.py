"""Unit tests for ring.auth: request signing, verification and the replay cache.

What must hold: a correctly signed, fresh request verifies once; changing anything it
covers (method, path, query, timestamp, nonce, body, body digest, signature, scheme,
secret) makes it fail; a stale or far-future timestamp fails; a replay of a request fails
for as long as that request would otherwise be accepted; the replay cache stays bounded.
"""

from __future__ import annotations

import hashlib

import blake3
import pytest

from ring import auth
from ring.auth import (
    HEADER_AUTHORIZATION,
    HEADER_CONTENT_BLAKE3,
    HEADER_CONTENT_SHA256,
    HEADER_NONCE,
    HEADER_TARGET,
    HEADER_TIMESTAMP,
    SKEW_S_MAX,
    AuthFailure,
    ClockSkew,
    ReplayCache,
    Signer,
    Verifier,
    metrics_token,
)

SECRET = "s" * 24
OTHER_SECRET = "t" * 24
NOW = 1_750_000_000.0
BODY = b'{"ids": []}'
PATH = "/v1/records/blob/x?expected_version=3"


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _signed(method: str = "PUT", path: str = PATH, body: bytes | None = BODY) -> dict[str, str]:
    return Signer(SECRET, Clock()).headers(method, path, body)


def test_signed_request_verifies() -> None:
    verifier = Verifier(SECRET, Clock())
    verifier.verify("PUT", PATH, _signed(), BODY)
    verifier.verify("GET", "/v1/info", _signed("GET", "/v1/info", None), None)
    verifier.verify("GET", "/v1/info", _signed("GET", "/v1/info", None), b"")


def test_fresh_nonce_per_request() -> None:
    signer = Signer(SECRET, Clock())
    assert (
        signer.headers("GET", "/v1/info")[HEADER_NONCE]
        != signer.headers("GET", "/v1/info")[HEADER_NONCE]
    )


def test_sha256_bodies_verify_as_blake3_ones_do() -> None:
    """The Java FileSystem signs with SHA-256, Python clients with BLAKE3: both verify,
    and a digest given to ``headers`` is used as is (computed once per body)."""
    verifier = Verifier(SECRET, Clock())
    sha = Signer(SECRET, Clock(), algorithm="sha256").headers("PUT", PATH, BODY)
    assert sha[HEADER_CONTENT_SHA256] == hashlib.sha256(BODY).hexdigest()
    assert HEADER_CONTENT_BLAKE3 not in sha
    verifier.verify("PUT", PATH, sha, BODY)
    digest = auth.digest_of(BODY)
    given = Signer(SECRET, Clock()).headers("PUT", PATH, None, digest=digest)
    assert given[HEADER_CONTENT_BLAKE3] == blake3.blake3(BODY).hexdigest()
    verifier.verify("PUT", PATH, given, BODY)


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_a_body_signed_in_parts_verifies_as_the_parts_joined(
    algorithm: auth.DigestAlgorithm,
) -> None:
    """A chunk's header and payload are digested and sent as two parts, never joined.
    Must hold: the signature verifies against the joined bytes, and not against others."""
    verifier = Verifier(SECRET, Clock())
    parts = (BODY[:5], BODY[5:])
    headers = Signer(SECRET, Clock(), algorithm=algorithm).headers("PUT", PATH, parts)
    assert auth.digest_of(parts, algorithm) == auth.digest_of(BODY, algorithm)
    verifier.verify("PUT", PATH, headers, BODY)
    with pytest.raises(AuthFailure):
        verifier.verify("PUT", PATH, headers, BODY[5:] + BODY[:5])


def _flip_hex(text: str) -> str:
    return ("1" if text[0] == "0" else "0") + text[1:]


TAMPERS = {
    "method": lambda h: ("POST", PATH, h, BODY),
    "path": lambda h: ("PUT", PATH.replace("blob/x", "blob/y"), h, BODY),
    "query": lambda h: ("PUT", PATH.replace("=3", "=0"), h, BODY),
    "body": lambda h: ("PUT", PATH, h, BODY + b" "),
    "body dropped": lambda h: ("PUT", PATH, h, None),
    "timestamp header": lambda h: (
        "PUT",
        PATH,
        {**h, HEADER_TIMESTAMP: str(int(h[HEADER_TIMESTAMP]) - 1)},
        BODY,
    ),
    "nonce header": lambda h: ("PUT", PATH, {**h, HEADER_NONCE: _flip_hex(h[HEADER_NONCE])}, BODY),
    "digest header matching another body": lambda h: (
        "PUT",
        PATH,
        {**h, HEADER_CONTENT_BLAKE3: blake3.blake3(b"other").hexdigest()},
        b"other",
    ),
    "the digest named as the other algorithm's": lambda h: (
        "PUT",
        PATH,
        {
            **{k: v for k, v in h.items() if k != HEADER_CONTENT_BLAKE3},
            HEADER_CONTENT_SHA256: h[HEADER_CONTENT_BLAKE3],
        },
        BODY,
    ),
    "a second digest": lambda h: (
        "PUT",
        PATH,
        {**h, HEADER_CONTENT_SHA256: hashlib.sha256(BODY).hexdigest()},
        BODY,
    ),
    "signature": lambda h: (
        "PUT",
        PATH,
        {**h, HEADER_AUTHORIZATION: h[HEADER_AUTHORIZATION][:-1] + "0"}
        if not h[HEADER_AUTHORIZATION].endswith("0")
        else {**h, HEADER_AUTHORIZATION: h[HEADER_AUTHORIZATION][:-1] + "1"},
        BODY,
    ),
    "scheme": lambda h: (
        "PUT",
        PATH,
        {**h, HEADER_AUTHORIZATION: h[HEADER_AUTHORIZATION].replace("SR3-HMAC-SHA256", "Bearer")},
        BODY,
    ),
    "no authorization": lambda h: (
        "PUT",
        PATH,
        {k: v for k, v in h.items() if k != HEADER_AUTHORIZATION},
        BODY,
    ),
    "no timestamp": lambda h: (
        "PUT",
        PATH,
        {k: v for k, v in h.items() if k != HEADER_TIMESTAMP},
        BODY,
    ),
    "no nonce": lambda h: ("PUT", PATH, {k: v for k, v in h.items() if k != HEADER_NONCE}, BODY),
    "no digest": lambda h: (
        "PUT",
        PATH,
        {k: v for k, v in h.items() if k != HEADER_CONTENT_BLAKE3},
        BODY,
    ),
    "non-numeric timestamp": lambda h: ("PUT", PATH, {**h, HEADER_TIMESTAMP: "1e9"}, BODY),
}


@pytest.mark.parametrize("what", sorted(TAMPERS))
def test_every_tamper_fails(what: str) -> None:
    """Breaks: one signed element of a request. Must hold: verification fails, while the
    untouched request verifies (so the tamper alone is what was refused)."""
    headers = _signed()
    method, path, tampered_headers, body = TAMPERS[what](headers)
    with pytest.raises(AuthFailure):
        Verifier(SECRET, Clock()).verify(method, path, tampered_headers, body)
    Verifier(SECRET, Clock()).verify("PUT", PATH, headers, BODY)


def test_wrong_secret_fails() -> None:
    with pytest.raises(AuthFailure):
        Verifier(OTHER_SECRET, Clock()).verify("PUT", PATH, _signed(), BODY)


@pytest.mark.parametrize("offset_s", [-SKEW_S_MAX - 1, SKEW_S_MAX + 1, -86_400, 86_400 * 365])
def test_timestamp_outside_skew_fails(offset_s: float) -> None:
    """Refused as ``ClockSkew`` (401 ``clock_skew``: the client routes around the peer),
    naming how far apart the clocks are."""
    verifier = Verifier(SECRET, Clock(NOW + offset_s))
    with pytest.raises(ClockSkew, match=rf"skew: signed at {NOW:.0f}, \{-offset_s:+.0f} s"):
        verifier.verify("PUT", PATH, _signed(), BODY)


@pytest.mark.parametrize("offset_s", [-SKEW_S_MAX, SKEW_S_MAX])
def test_timestamp_at_the_skew_limit_passes(offset_s: float) -> None:
    Verifier(SECRET, Clock(NOW + offset_s)).verify("PUT", PATH, _signed(), BODY)


def test_replay_fails() -> None:
    headers = _signed()
    verifier = Verifier(SECRET, Clock())
    verifier.verify("PUT", PATH, headers, BODY)
    with pytest.raises(AuthFailure, match="replay"):
        verifier.verify("PUT", PATH, headers, BODY)


@pytest.mark.parametrize("first_seen_offset_s", [-SKEW_S_MAX, -60, 0, 60, SKEW_S_MAX])
def test_replay_fails_for_as_long_as_the_timestamp_is_accepted(first_seen_offset_s: int) -> None:
    """Breaks: a captured request is replayed later, by a peer whose clock differs from
    the signer's (within the allowed skew). Must hold: every replay is refused at every
    moment the request's timestamp is still inside the skew window of the peer."""
    headers = _signed()  # signed at NOW by the client's clock
    clock = Clock(NOW + first_seen_offset_s)
    verifier = Verifier(SECRET, clock)
    verifier.verify("PUT", PATH, headers, BODY)
    for later_s in range(0, 2 * SKEW_S_MAX + 1, 10):
        clock.now = NOW + first_seen_offset_s + later_s
        if abs(clock.now - NOW) > SKEW_S_MAX:
            continue  # refused as stale anyway
        with pytest.raises(AuthFailure):
            verifier.verify("PUT", PATH, headers, BODY)


def test_replay_cache_is_bounded_and_forgets_oldest_first() -> None:
    cache = ReplayCache(capacity=4)
    for index in range(10):
        assert cache.check_and_add(f"n{index}", NOW)
    # Only the 4 newest are remembered (bounded memory): the newest are still refused...
    for index in range(7, 10):
        assert not cache.check_and_add(f"n{index}", NOW)
    # ...and the oldest were forgotten to make room.
    assert cache.check_and_add("n0", NOW)
    assert len(cache._seen) <= 4


def test_replay_cache_forgets_nonces_after_the_window() -> None:
    cache = ReplayCache(capacity=100)
    assert cache.check_and_add("a", NOW)
    assert not cache.check_and_add("a", NOW + SKEW_S_MAX)
    assert cache.check_and_add("b", NOW + 10 * SKEW_S_MAX)
    assert len(cache._seen) == 1


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        Signer("short", Clock())
    with pytest.raises(ValueError, match="at least"):
        Verifier("x" * (auth.SECRET_CHARS_MIN - 1), Clock())


def test_generated_secrets_are_long_and_distinct() -> None:
    first, second = auth.generate_secret(), auth.generate_secret()
    assert first != second
    assert len(first) >= auth.SECRET_CHARS_MIN


def test_metrics_bearer_token() -> None:
    verifier = Verifier(SECRET, Clock())
    token = metrics_token(SECRET)
    assert verifier.verify_metrics_bearer({HEADER_AUTHORIZATION: f"Bearer {token}"})
    assert not verifier.verify_metrics_bearer({HEADER_AUTHORIZATION: f"Bearer {token[:-1]}0"})
    assert not verifier.verify_metrics_bearer(
        {HEADER_AUTHORIZATION: f"Bearer {metrics_token(OTHER_SECRET)}"}
    )
    assert not verifier.verify_metrics_bearer({})
    # The metrics token does not sign requests.
    with pytest.raises(AuthFailure):
        verifier.verify(
            "GET", "/v1/info", {**_signed("GET", "/v1/info", None), "Authorization": token}, None
        )


def test_a_request_signed_for_one_peer_is_refused_by_another() -> None:
    headers = Signer(SECRET, Clock()).headers("PUT", PATH, BODY, target="127.0.0.1:7401")
    with pytest.raises(AuthFailure, match="another peer"):
        Verifier(SECRET, Clock()).verify("PUT", PATH, headers, BODY, ("127.0.0.2:7401",))
    Verifier(SECRET, Clock()).verify("PUT", PATH, headers, BODY, ("127.0.0.1:7401",))


def test_the_target_is_covered_by_the_signature() -> None:
    headers = Signer(SECRET, Clock()).headers("PUT", PATH, BODY, target="127.0.0.1:7401")
    forged = {**headers, HEADER_TARGET: "127.0.0.2:7401"}
    with pytest.raises(AuthFailure, match="bad signature"):
        Verifier(SECRET, Clock()).verify("PUT", PATH, forged, BODY, ("127.0.0.2:7401",))


# -- malformed signing headers (issue 15, item 5) -----------------------------------------


def _with(header: str, value: str) -> dict[str, str]:
    return {**_signed(), header: value}


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (HEADER_TIMESTAMP, "\u00b2"),
        (HEADER_TIMESTAMP, "1750000000\u00b2"),
        (
            HEADER_TIMESTAMP,
            "\uff11\uff17\uff15\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10",
        ),  # fullwidth digits: int() reads them
        (HEADER_TIMESTAMP, "\u0661\u0667\u0665\u0660\u0660\u0660\u0660\u0660\u0660\u0660"),
        (HEADER_TIMESTAMP, "9" * 5000),
        (HEADER_TIMESTAMP, "-1750000000"),
        (HEADER_TIMESTAMP, ""),
        (HEADER_AUTHORIZATION, f"{auth.SCHEME} " + "é" * 64),
        (HEADER_AUTHORIZATION, f"{auth.SCHEME} " + "\udcff" * 64),
        (HEADER_AUTHORIZATION, f"{auth.SCHEME} " + "z" * 64),
        (HEADER_CONTENT_SHA256, "é" * 64),
        (HEADER_CONTENT_SHA256, "\udcff" * 64),
        (HEADER_NONCE, "é" * 32),
        (HEADER_TARGET, "é"),
        (HEADER_TARGET, "\udcff\udcfe"),
        (HEADER_TARGET, "a\nb"),
    ],
    ids=lambda value: ascii(value)[:24],
)
def test_malformed_signing_headers_are_auth_failures(header: str, value: str) -> None:
    """Breaks: digits that are not ASCII, text that ``hmac.compare_digest`` refuses,
    bytes the HTTP parser passes through as surrogates. Must hold: ``AuthFailure`` (401),
    never another exception (500)."""
    with pytest.raises(AuthFailure):
        Verifier(SECRET, Clock()).verify("PUT", PATH, _with(header, value), BODY)


def test_a_timestamp_in_other_digits_does_not_verify() -> None:
    """The signed timestamp is the ASCII text: the same number in fullwidth digits is a
    different header, refused rather than read as the same value."""
    headers = _signed()
    timestamp = headers[HEADER_TIMESTAMP]
    fullwidth = "".join(chr(ord(char) - ord("0") + 0xFF10) for char in timestamp)
    assert int(fullwidth) == int(timestamp)
    with pytest.raises(AuthFailure):
        Verifier(SECRET, Clock()).verify(
            "PUT", PATH, {**headers, HEADER_TIMESTAMP: fullwidth}, BODY
        )


@pytest.mark.parametrize("token", ["\u00e9" * 64, "\udcff" * 64, "\u00b2"])
def test_a_bearer_token_that_is_not_ascii_is_refused(token: str) -> None:
    assert not Verifier(SECRET, Clock()).verify_metrics_bearer(
        {HEADER_AUTHORIZATION: f"Bearer {token}"}
    )
