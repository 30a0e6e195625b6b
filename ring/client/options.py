"""What a client is configured with and hands back: its limits, the sources it stores
and the record values it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ring.blobs import CHUNK_BYTES_DEFAULT, PACK_BELOW_BYTES_DEFAULT
from ring.errors import SR3Error
from ring.tls import ClientTls
from ring.transport import Timeouts

__all__ = [
    "BLOB_KEY_PREFIX",
    "TRANSFERS_MAX_DEFAULT",
    "ClientOptions",
    "Progress",
    "RecordScan",
    "RecordValue",
    "ScannedRecord",
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
    # A peer that has not acknowledged one write attempt within this is treated as
    # unreachable for it: the lane moves on to a stand-in, which keeps a hint. Calls
    # return once W acknowledged; this bounds the lanes that go on in the background.
    write_attempt_s: float = 5.0
    # The same for one record read: a replica silent this long is treated as
    # unreachable and a stand-in asked instead (reads return sooner once enough
    # replicas agreed; this bounds those that cannot, such as a frozen peer while
    # another is believed down).
    read_attempt_s: float = 2.0
    # The same for one peer's part of a listing (``list_records``): every record is on R
    # peers, so a silent one is left out rather than waited for.
    list_attempt_s: float = 10.0
    # Write lanes still running after their call returned (W acknowledged), per client;
    # past this, more are cancelled and repair restores those copies.
    background_lanes_max: int = 256
    # How long ``close`` waits for the write lanes in the background before it cancels
    # them.
    close_wait_s: float = 10.0
    # Extra requests in flight per chunk read, to replicas asked because the first was
    # silent past the hedge delay (``ring.client.view.LatencyWindow``).
    read_hedges_max: int = 1
    # The network whose addresses this client reaches peers at (peers advertise one
    # address per network, ``sr3 peer --advertise-networks``; "internal" is the peers'
    # own). None: the network of the address a seed was reached at.
    network: str | None = None
    # HTTPS with the cluster's CA (and a client certificate, when peers require one);
    # None: from SR3_TLS_CA/SR3_TLS_CERT/SR3_TLS_KEY or the cluster file, else plain.
    tls: ClientTls | None = None


@dataclass(frozen=True, slots=True)
class Source:
    """``size`` bytes that ``read(offset, length)`` returns (called in a worker thread).
    ``read_into(offset, view)``, when given, fills ``view`` with the ``len(view)`` bytes
    from ``offset`` instead: large pieces are then read into buffers the writer reuses
    rather than into fresh memory for each chunk."""

    size: int
    read: Callable[[int, int], bytes]
    read_into: Callable[[int, memoryview], None] | None = None


@dataclass(frozen=True, slots=True)
class RecordValue:
    key: str
    version: int
    value: bytes
    # Kept for callers of the per-replica records; consensus reads never see a conflict.
    conflict: bool = False
    # True when the newest version is a delete (a tombstone: no value).
    deleted: bool = False
    # False when read with ``allow_stale`` from fewer of the key's acceptors than a
    # quorum: the value accepted at the highest ballot among them, possibly not the last.
    settled: bool = True
    # The id of the operation that wrote this version (``put_record(op=...)``).
    op: str = ""


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A record a scan found, as chosen: its version, op, whether it is a tombstone, and
    the first bytes of its value (as many as the scan asked for)."""

    key: str
    version: int
    head: bytes
    deleted: bool = False
    op: str = ""
    # False: read with ``allow_stale`` from fewer of its acceptors than a quorum.
    settled: bool = True


@dataclass(frozen=True, slots=True)
class RecordScan:
    """A page of a scan, in key order: records, and the prefixes a delimiter rolled up.
    ``truncated``: there may be more past ``last`` (scan again with ``after=last``).
    ``read``: records whose acceptors' slots did not agree, read one by one instead.
    ``complete``: every key's acceptors answered enough to show every record chosen
    (False only with ``allow_stale``: too many peers did not answer)."""

    records: list[ScannedRecord]
    prefixes: list[str]
    truncated: bool
    last: str
    read: int
    complete: bool = True


def file_source(path: Path) -> Source:
    size = path.stat().st_size

    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
        if len(data) != length:
            raise SR3Error(f"{path} changed while it was being stored")
        return data

    def read_into(offset: int, view: memoryview) -> None:
        with open(path, "rb", buffering=0) as handle:
            handle.seek(offset)
            filled = 0
            while filled < len(view):
                count = handle.readinto(view[filled:])
                if not count:
                    raise SR3Error(f"{path} changed while it was being stored")
                filled += count

    return Source(size, read, read_into)
