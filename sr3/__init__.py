"""sr3: a replicated ring of storage peers that keeps stream-processing state safe.

This package is the front door: the ``sr3`` command line, the embedded local cluster,
the demos, and the names users import::

    from sr3 import Client, SyncClient, FileInfo, ClientOptions, LocalCluster

``Client()`` and ``SyncClient()`` find the ring as the command line does; what they store
is named (``put_file(path, key)``, ``put_bytes(data, key)``) and kept until deleted.

The names live in the layers below (``ring`` for the client and errors); they are
imported on first use, so a peer process started as ``python -m sr3 peer`` loads only
what the peer needs, not the client or the local cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ring.exports import lazy_exports

if TYPE_CHECKING:
    from ring.blobs import BlobRef, Extent
    from ring.client import Client, ClientOptions, RecordValue, RingStatus, Source
    from ring.client.client import FileInfo
    from ring.errors import (
        AuthError,
        ChunkCorrupt,
        ConfigError,
        DataUnavailable,
        NotFound,
        QuorumError,
        RecordConflict,
        RecordContention,
        RecordUnknown,
        SR3Error,
    )
    from ring.sync_client import SyncClient
    from sr3.local import LocalCluster

# Public name -> the module that defines it.
_EXPORTS = {
    "AuthError": "ring.errors",
    "BlobRef": "ring.blobs",
    "ChunkCorrupt": "ring.errors",
    "Client": "ring.client",
    "ClientOptions": "ring.client",
    "ConfigError": "ring.errors",
    "DataUnavailable": "ring.errors",
    "Extent": "ring.blobs",
    "FileInfo": "ring.client.client",
    "LocalCluster": "sr3.local",
    "NotFound": "ring.errors",
    "QuorumError": "ring.errors",
    "RecordConflict": "ring.errors",
    "RecordContention": "ring.errors",
    "RecordUnknown": "ring.errors",
    "RecordValue": "ring.client",
    "RingStatus": "ring.client",
    "SR3Error": "ring.errors",
    "Source": "ring.client",
    "SyncClient": "ring.sync_client",
}

__all__ = [
    "AuthError",
    "BlobRef",
    "ChunkCorrupt",
    "Client",
    "ClientOptions",
    "ConfigError",
    "DataUnavailable",
    "Extent",
    "FileInfo",
    "LocalCluster",
    "NotFound",
    "QuorumError",
    "RecordConflict",
    "RecordContention",
    "RecordUnknown",
    "RecordValue",
    "RingStatus",
    "SR3Error",
    "Source",
    "SyncClient",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
