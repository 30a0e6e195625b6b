"""sr3: a replicated ring of storage peers that keeps stream-processing state safe.

Public API::

    from sr3 import Client, SyncClient, ClientOptions, BlobRef, LocalCluster
"""

from sr3.blobs import BlobRef, Extent
from sr3.client import Client, ClientOptions, RecordValue, RingStatus, Source
from sr3.errors import (
    AuthError,
    ChunkCorrupt,
    ConfigError,
    DataUnavailable,
    NotFound,
    QuorumError,
    RecordConflict,
    SR3Error,
)
from sr3.local import LocalCluster
from sr3.sync import SyncClient

__all__ = [
    "AuthError",
    "BlobRef",
    "ChunkCorrupt",
    "Client",
    "ClientOptions",
    "ConfigError",
    "DataUnavailable",
    "Extent",
    "LocalCluster",
    "NotFound",
    "QuorumError",
    "RecordConflict",
    "RecordValue",
    "RingStatus",
    "SR3Error",
    "Source",
    "SyncClient",
]
