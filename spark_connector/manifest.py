"""Manifests: one committed batch of one query, as the ring stores it.

A manifest lists every file of a batch's consistent cut (``spark_connector.cut``)
with its size, xxh3-128 digest and extents (the chunks that hold it). It is written only
after every chunk it names is on its write quorum, as record
``spark/<query>/batches/<batch id, 12 digits>``, and carries those chunks as the record's
refs. The newest batch of a query is the highest such key listed (a manifest is
complete when it exists). Pure values and JSON, no I/O.

Format 2 also says where a batch came from, so that a restore can tell which run it
resumes: when it was pushed (wall clock), from which host, and the Spark query id of
the checkpoint (its ``metadata`` file). Format 1 manifests, without those, are still
read.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from ring.blobs import BlobRef
from ring.errors import ConfigError, ProtocolError
from ring.lease import FENCE_MAX

__all__ = [
    "MANIFEST_FORMAT",
    "Manifest",
    "ManifestFile",
    "check_query_name",
    "files_json",
    "optional_fence",
    "optional_text",
    "optional_time",
    "format_wall",
    "manifest_key",
    "manifests_prefix",
    "plan_key",
    "plans_prefix",
]

MANIFEST_FORMAT = 2
# Formats this module reads: 1 has no pushed_at, host or query_id.
MANIFEST_FORMATS_READ = (1, 2)
HOST_CHARS_MAX = 255
QUERY_ID_CHARS_MAX = 128
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


def plans_prefix(query: str) -> str:
    """Where a query's plans are (``spark_connector.plans``): at most the batch after
    its newest manifest, for long."""
    return f"spark/{check_query_name(query)}/plans/"


def plan_key(query: str, batch_id: int) -> str:
    return f"{plans_prefix(query)}{batch_id:012d}"


def check_manifest_path(path: str) -> str:
    """``path`` when it names a file inside a checkpoint (relative, no empty, ``.`` or
    ``..`` part, no NUL): a manifest read from the ring never writes outside the
    directory it is restored into. ``ValueError`` otherwise."""
    parts = path.split("/")
    if not path or "\x00" in path or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"a manifest does not name {path[:80]!r}")
    return path


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
    # When the batch was pushed (seconds since the epoch, wall clock), from which host,
    # and the Spark query id its checkpoint holds; None when not recorded (format 1).
    pushed_at: float | None = None
    host: str | None = None
    query_id: str | None = None
    # The fence of the lease its pusher held (``spark_connector.lease``), None when the
    # query is not driven under a lease.
    fence: int | None = None

    def chunk_ids(self) -> list[str]:
        return sorted({e.chunk_id for f in self.files for e in f.blob.extents})

    @property
    def size(self) -> int:
        return sum(f.blob.size for f in self.files)

    def file(self, path: str) -> ManifestFile | None:
        """The file at ``path``, or None when the batch does not hold it."""
        for file in self.files:
            if file.path == path:
                return file
        return None

    def origin(self) -> str:
        """Where the batch came from, for logs: ``pushed at <UTC time> from host:dir``."""
        when = "an unknown time" if self.pushed_at is None else format_wall(self.pushed_at)
        host = "an unknown host" if self.host is None else self.host
        return f"pushed at {when} from {host}:{self.root}"

    def to_json(self) -> dict[str, Any]:
        head = {
            "format": MANIFEST_FORMAT,
            "query": self.query,
            "batch_id": self.batch_id,
            "state_version": self.state_version,
            "root": self.root,
        }
        optional = {"pushed_at": self.pushed_at, "host": self.host, "query_id": self.query_id}
        return files_json(head, {**optional, "fence": self.fence}, self.files)

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        try:
            if data["format"] not in MANIFEST_FORMATS_READ:
                raise ProtocolError(f"unsupported manifest format {data['format']}")
            files = tuple(
                ManifestFile(check_manifest_path(str(item["path"])), BlobRef.from_json(item))
                for item in data["files"]
            )
            return cls(
                check_query_name(str(data["query"])),
                int(data["batch_id"]),
                int(data["state_version"]),
                str(data["root"]),
                files,
                pushed_at=optional_time(data.get("pushed_at")),
                host=optional_text(data.get("host"), HOST_CHARS_MAX),
                query_id=optional_text(data.get("query_id"), QUERY_ID_CHARS_MAX),
                fence=optional_fence(data.get("fence")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed manifest: {exc!r}") from exc


def files_json(
    head: dict[str, Any], optional: dict[str, Any], files: tuple[ManifestFile, ...]
) -> dict[str, Any]:
    """A record's JSON (a manifest's, a plan's): ``head``, the ``optional`` fields that
    are set, and ``files`` with their blobs."""
    data = {**head, **{name: value for name, value in optional.items() if value is not None}}
    data["files"] = [{"path": f.path, **f.blob.to_json()} for f in files]
    return data


def optional_fence(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= FENCE_MAX:
        raise ProtocolError(f"manifest fence must be an integer in 1..{FENCE_MAX}")
    return value


def format_wall(seconds: float) -> str:
    """A wall-clock time (seconds since the epoch) as ``2026-11-23 20:30:01 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def optional_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"pushed_at is not a number: {value!r}")
    seconds = float(value)
    # Bounded: gmtime() of a huge value raises OverflowError.
    if not math.isfinite(seconds) or not 0 <= seconds < 2**40:
        raise ValueError(f"pushed_at out of range: {value!r}")
    return seconds


def optional_text(value: Any, chars_max: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > chars_max:
        raise ValueError(f"not a string of at most {chars_max} characters: {value!r:.80}")
    return value
