"""The sr3 client: blobs and records on the ring (``Client``), its options, and the
values it hands back. ``ring.sync_client.SyncClient`` is the blocking facade."""

from ring.client.admin import PeerStatus, RingStatus
from ring.client.client import Client
from ring.client.options import (
    BLOB_KEY_PREFIX,
    ClientOptions,
    Progress,
    RecordValue,
    Source,
    file_source,
)
from ring.client.view import RingView, parse_seeds

__all__ = [
    "BLOB_KEY_PREFIX",
    "Client",
    "ClientOptions",
    "PeerStatus",
    "Progress",
    "RecordValue",
    "RingStatus",
    "RingView",
    "Source",
    "file_source",
    "parse_seeds",
]
