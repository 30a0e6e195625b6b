"""The one error hierarchy of sr3.

Every error that sr3 raises on purpose derives from ``SR3Error``. Library errors
(aiohttp, OS, zstandard) are translated where they enter, with ``raise ... from exc``::

    SR3Error
    ├── ConfigError            configuration missing or invalid (ring, secret, cluster file)
    ├── ProtocolError          a request or response that does not follow the peer protocol
    ├── AuthError              a peer refused our credentials (HTTP 401)
    ├── PeerError              one peer failed one request
    │   ├── PeerUnavailable    connection refused, reset or timed out
    │   └── PeerRejected       the peer answered with an error status
    ├── ChunkError             a chunk is malformed or fails verification
    │   ├── ChunkCorrupt       checksum or content address mismatch
    │   └── ChunkTooLarge      above the chunk size limit
    ├── StorageFull            a peer's disk or quota is full
    ├── QuorumError            fewer than W replicas acknowledged a write
    ├── RecordConflict         compare-and-set refused: the expected version is stale
    ├── Fenced                 a lease holder's write refused: its lease was taken over
    ├── NotFound               no such record or blob
    └── DataUnavailable        too few live replicas could serve some chunks or records
                               (names them, and says which they are)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

__all__ = [
    "AuthError",
    "ChunkCorrupt",
    "ChunkError",
    "ChunkTooLarge",
    "ConfigError",
    "DataUnavailable",
    "Fenced",
    "NotFound",
    "PeerError",
    "PeerRejected",
    "PeerUnavailable",
    "ProtocolError",
    "QuorumError",
    "RecordConflict",
    "SR3Error",
    "StorageFull",
]


class SR3Error(Exception):
    """Base class of every error sr3 raises on purpose."""


class ConfigError(SR3Error):
    """Configuration is missing or invalid."""


class ProtocolError(SR3Error):
    """A request or response does not follow the peer protocol."""


class AuthError(SR3Error):
    """A peer refused the request's credentials."""


class PeerError(SR3Error):
    """One peer failed one request."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"{address}: {message}")
        self.address = address


class PeerUnavailable(PeerError):
    """The peer could not be reached (refused, reset, timed out)."""


class PeerRejected(PeerError):
    """The peer answered with an error status."""

    def __init__(
        self, address: str, status: int, code: str, message: str, version: int = 0
    ) -> None:
        super().__init__(address, f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        # The record version a 404 "deleted" or a 409 "version_conflict" names.
        self.version = version


class ChunkError(SR3Error):
    """A chunk is malformed or fails verification."""


class ChunkCorrupt(ChunkError):
    """A chunk's checksum or content address does not match its bytes."""


class ChunkTooLarge(ChunkError):
    """A chunk is above the chunk size limit."""


class StorageFull(SR3Error):
    """A peer's disk or configured capacity is full."""


class QuorumError(SR3Error):
    """Fewer than W replicas acknowledged a write."""

    def __init__(self, what: str, acks: int, needed: int, causes: Sequence[str]) -> None:
        detail = "; ".join(causes[:5]) or "no replica reachable"
        super().__init__(f"{what}: {acks} of {needed} required replicas acknowledged ({detail})")
        self.acks = acks
        self.needed = needed
        self.causes = list(causes)


class RecordConflict(SR3Error):
    """Compare-and-set refused because the expected version is stale."""

    def __init__(self, key: str, expected: int, current: int) -> None:
        super().__init__(f"record {key!r}: expected version {expected}, current is {current}")
        self.key = key
        self.expected = expected
        self.current = current


class RecordUnknown(SR3Error):
    """A record write was interrupted after its value reached some acceptors, and another
    value is now chosen above its version: it may have taken effect (and been
    overwritten) or not. Read the record to see where it stands."""


class RecordContention(SR3Error):
    """A record operation was pre-empted by other writers' rounds on the key as many times
    as it may retry: it may or may not have taken effect."""


class NotFound(SR3Error):
    """No such record or blob."""


# What a DataUnavailable names, and how its message says why they are unavailable: a chunk
# is readable from any one replica holding it, a record only from a quorum of its
# acceptors, and a scan of a prefix from enough peers to cover every key under it.
UnavailableKind = Literal["chunk", "record", "prefix"]
_UNAVAILABLE: dict[UnavailableKind, str] = {
    "chunk": "{count} chunk(s) unavailable on every replica",
    "record": "{count} record(s) unavailable: too few of their replicas answered",
    "prefix": "records under {count} prefix(es) unavailable",
}


class DataUnavailable(SR3Error):
    """Too few live replicas could serve some chunks, records, or the records under a
    prefix; ``missing`` names them and ``kind`` says which (chunks unless told)."""

    def __init__(
        self, missing: Sequence[str], causes: Sequence[str] = (), kind: UnavailableKind = "chunk"
    ) -> None:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        detail = f" ({'; '.join(causes[:3])})" if causes else ""
        what = _UNAVAILABLE[kind].format(count=len(missing))
        super().__init__(f"{what}: {shown}{detail}")
        self.missing = list(missing)
        self.kind = kind


class Fenced(SR3Error):
    """A write made under a lease was refused: the lease lapsed or was taken over (a
    newer holder's fence is on it), so this holder must stop writing."""
