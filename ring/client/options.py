"""What a client is configured with and hands back: its limits, the sources it stores
and the record values it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ring.blobs import CHUNK_BYTES_DEFAULT, PACK_BELOW_BYTES_DEFAULT
from ring.errors import SR3Error
from ring.transport import Timeouts

__all__ = [
    "BLOB_KEY_PREFIX",
    "TRANSFERS_MAX_DEFAULT",
    "ClientOptions",
    "Progress",
    "RecordValue",
    "Source",
    "file_source",
]

Progress = Callable[[int], None]
# Records naming the files that ``Client.store_file`` stores (``sr3 put``).
BLOB_KEY_PREFIX = "blob/"
TRANSFERS_MAX_DEFAULT = 8


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Client limits. ``replication``/``write_quorum`` default to what the ring says."""

    replication: int | None = None
    write_quorum: int | None = None
    chunk_bytes: int = CHUNK_BYTES_DEFAULT
    pack_below_bytes: int = PACK_BELOW_BYTES_DEFAULT
    transfers_max: int = TRANSFERS_MAX_DEFAULT
    timeouts: Timeouts = field(default_factory=Timeouts)
    # After a peer could not be reached, it is tried last for this long.
    down_retry_s: float = 5.0
    # How long a fetched member table is used before it is fetched again.
    ring_refresh_s: float = 5.0
    # How long a peer believed down gets to answer when it must be asked anyway.
    down_probe_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Source:
    """``size`` bytes that ``read(offset, length)`` returns (called in a worker thread)."""

    size: int
    read: Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True)
class RecordValue:
    key: str
    version: int
    value: bytes
    # True when replicas hold different values at the newest version (concurrent writers).
    conflict: bool = False
    # True when the newest version is a delete (a tombstone: no value).
    deleted: bool = False


def file_source(path: Path) -> Source:
    size = path.stat().st_size

    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
        if len(data) != length:
            raise SR3Error(f"{path} changed while it was being stored")
        return data

    return Source(size, read)
