"""Manifests: one committed batch of one query, as the ring stores it.

A manifest lists every file of a batch's consistent cut (``spark_connector.cut``)
with its size, xxh3-128 digest and extents (the chunks that hold it). It is written only
after every chunk it names is on its write quorum, as record
``spark/<query>/batches/<batch id, 12 digits>``, and carries those chunks as the record's
refs. The newest batch of a query is the highest such key listed (a manifest is
complete when it exists). Pure values and JSON, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ring.blobs import BlobRef
from ring.errors import ConfigError, ProtocolError

__all__ = [
    "MANIFEST_FORMAT",
    "Manifest",
    "ManifestFile",
    "check_query_name",
    "manifest_key",
    "manifests_prefix",
]

MANIFEST_FORMAT = 1
_QUERY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_query_name(query: str) -> str:
    if _QUERY_NAME.match(query) is None:
        raise ConfigError(
            f"query name {query[:60]!r}: 1-128 characters of [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return query


def manifests_prefix(query: str) -> str:
    return f"spark/{check_query_name(query)}/batches/"


def manifest_key(query: str, batch_id: int) -> str:
    return f"{manifests_prefix(query)}{batch_id:012d}"


@dataclass(frozen=True, slots=True)
class ManifestFile:
    path: str
    blob: BlobRef


@dataclass(frozen=True, slots=True)
class Manifest:
    query: str
    batch_id: int
    state_version: int
    # The absolute checkpoint directory the files were read from (restores elsewhere
    # rewrite metadata that names it).
    root: str
    files: tuple[ManifestFile, ...]

    def chunk_ids(self) -> list[str]:
        return sorted({e.chunk_id for f in self.files for e in f.blob.extents})

    @property
    def size(self) -> int:
        return sum(f.blob.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "query": self.query,
            "batch_id": self.batch_id,
            "state_version": self.state_version,
            "root": self.root,
            "files": [{"path": f.path, **f.blob.to_json()} for f in self.files],
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        try:
            if data["format"] != MANIFEST_FORMAT:
                raise ProtocolError(f"unsupported manifest format {data['format']}")
            files = tuple(
                ManifestFile(str(item["path"]), BlobRef.from_json(item)) for item in data["files"]
            )
            return cls(
                check_query_name(str(data["query"])),
                int(data["batch_id"]),
                int(data["state_version"]),
                str(data["root"]),
                files,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed manifest: {exc!r}") from exc
