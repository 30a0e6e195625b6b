"""Small versioned records on a peer: manifests and pointers, with compare-and-set.

A record is ``(key, version, value, refs)``: ``refs`` are the chunk ids the value
points at (a blob reference, later a manifest), kept apart so that peers can audit and
collect chunks without parsing values. Version 0 means absent. A write names the version
it expects to replace: a replica accepts it when its own version is not newer than the
expected one (so a replica that missed earlier writes catches up) and stores it as
``expected + 1``; otherwise it refuses with its current version. A replica therefore holds
at most one value per version, and a stale writer never overwrites a newer version.

Repair writes carry an explicit version instead and are accepted only when newer than
what the replica holds.

On the wire and on disk, ``refs`` travel as concatenated 16-byte chunk ids in front of
the value (``?refs=N`` names how many). Each record is one file
``<data>/records/<xxh3-128 of key>.rec``, written atomically:

    b"SR3R" | u32 metadata length | metadata JSON | refs | value

where the metadata holds the key, version, value and refs lengths and their xxh3-64. Files
are verified when read; a corrupt one is quarantined like a corrupt chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ring.chunkstore import write_file_atomic
from sr3.errors import ProtocolError, RecordConflict

__all__ = [
    "KEY_PATTERN",
    "RECORD_BYTES_MAX",
    "REFS_MAX",
    "Record",
    "RecordStore",
    "split_envelope",
    "validate_key",
]

log = logging.getLogger(__name__)

MAGIC = b"SR3R"
RECORD_BYTES_MAX = 4 * 1024 * 1024
REFS_MAX = 65_536
REF_BYTES = 16
KEY_CHARS_MAX = 512
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=/-]*$")
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    version: int
    value: bytes
    refs: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        return xxhash.xxh3_64_hexdigest(self.value)

    def refs_bytes(self) -> bytes:
        return b"".join(bytes.fromhex(ref) for ref in self.refs)

    def envelope(self) -> bytes:
        """The wire form of a write: refs, then value (``?refs=len(refs)``)."""
        return self.refs_bytes() + self.value


def split_envelope(body: bytes, refs_count: int) -> tuple[bytes, tuple[str, ...]]:
    """Split a write's body into ``(value, refs)``."""
    if not 0 <= refs_count <= REFS_MAX or len(body) < refs_count * REF_BYTES:
        raise ProtocolError(f"refs must be 0..{REFS_MAX} ids of {REF_BYTES} bytes before the value")
    cut = refs_count * REF_BYTES
    refs = tuple(body[offset : offset + REF_BYTES].hex() for offset in range(0, cut, REF_BYTES))
    return body[cut:], refs


def validate_key(key: str) -> str:
    if (
        not 0 < len(key) <= KEY_CHARS_MAX
        or KEY_PATTERN.match(key) is None
        or "//" in key
        or any(part in (".", "..") for part in key.split("/"))
    ):
        raise ProtocolError(
            f"invalid record key {key[:80]!r}: 1-{KEY_CHARS_MAX} characters of "
            "[A-Za-z0-9._:=/-], starting with a letter or digit, no empty or dot segments"
        )
    return key


def _encode(record: Record) -> bytes:
    refs = record.refs_bytes()
    meta = json.dumps(
        {
            "key": record.key,
            "version": record.version,
            "value_bytes": len(record.value),
            "value_xxh3": record.digest,
            "refs": len(record.refs),
            "refs_xxh3": xxhash.xxh3_64_hexdigest(refs),
        },
        separators=(",", ":"),
    ).encode()
    return MAGIC + _LENGTH.pack(len(meta)) + meta + refs + record.value


def _decode(data: bytes) -> Record:
    if len(data) < 8 or data[:4] != MAGIC:
        raise ValueError("bad magic")
    (meta_len,) = _LENGTH.unpack_from(data, 4)
    meta = json.loads(data[8 : 8 + meta_len])
    body = data[8 + meta_len :]
    refs_count = int(meta.get("refs", 0))
    refs_bytes = body[: refs_count * REF_BYTES]
    if xxhash.xxh3_64_hexdigest(refs_bytes) != meta.get("refs_xxh3", xxhash.xxh3_64_hexdigest(b"")):
        raise ValueError("refs checksum mismatch")
    value, refs = split_envelope(body, refs_count)
    if len(value) != meta["value_bytes"] or xxhash.xxh3_64_hexdigest(value) != meta["value_xxh3"]:
        raise ValueError("value checksum mismatch")
    return Record(str(meta["key"]), int(meta["version"]), value, refs)


def _check_size(value: bytes, refs: tuple[str, ...]) -> None:
    if len(value) > RECORD_BYTES_MAX:
        raise ProtocolError(f"record value of {len(value)} bytes is above {RECORD_BYTES_MAX}")
    if len(refs) > REFS_MAX:
        raise ProtocolError(f"a record references at most {REFS_MAX} chunks")


class RecordStore:
    """Records of one peer. All mutations are serialized by one lock (records are small)."""

    def __init__(self, root: Path) -> None:
        self._dir = root / "records"
        self._tmp_dir = root / "tmp"
        self._quarantine_dir = root / "quarantine"
        self._versions: dict[str, int] = {}
        self._lock = asyncio.Lock()

    def open(self) -> None:
        for directory in (self._dir, self._tmp_dir, self._quarantine_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for entry in self._dir.glob("*.rec"):
            try:
                record = _decode(entry.read_bytes())
            except (ValueError, KeyError, json.JSONDecodeError) as exc:
                self._quarantine_file(entry, str(exc))
                continue
            self._versions[record.key] = record.version

    def _path(self, key: str) -> Path:
        return self._dir / f"{xxhash.xxh3_128_hexdigest(key.encode())}.rec"

    def _quarantine_file(self, path: Path, reason: str) -> None:
        log.error("record file %s is corrupt and was quarantined: %s", path.name, reason)
        shutil.move(path, self._quarantine_dir / f"{path.name}.{secrets.token_hex(4)}")

    def version(self, key: str) -> int:
        return self._versions.get(key, 0)

    def count(self) -> int:
        return len(self._versions)

    def keys(self) -> list[str]:
        return sorted(self._versions)

    def list(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        keys = sorted(key for key in self._versions if key.startswith(prefix))
        return [(key, self._versions[key]) for key in keys[:limit]]

    async def get(self, key: str) -> Record | None:
        if key not in self._versions:
            return None
        path = self._path(key)
        try:
            record = _decode(await asyncio.to_thread(path.read_bytes))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            async with self._lock:
                self._quarantine_file(path, str(exc))
                self._versions.pop(key, None)
            return None
        if record.key != key:
            raise AssertionError(f"record file for {key!r} holds {record.key!r}")
        return record

    async def put(
        self, key: str, value: bytes, expected_version: int, refs: tuple[str, ...] = ()
    ) -> Record:
        """Compare-and-set: store ``value`` as version ``expected_version + 1``."""
        _check_size(value, refs)
        async with self._lock:
            current = self._versions.get(key, 0)
            if current > expected_version:
                raise RecordConflict(key, expected_version, current)
            record = Record(key, expected_version + 1, value, refs)
            await self._write(record)
            return record

    async def put_repair(
        self, key: str, value: bytes, version: int, refs: tuple[str, ...] = ()
    ) -> bool:
        """Store a copy pushed by repair if it is newer than ours; False if it is not."""
        _check_size(value, refs)
        if version < 1:
            raise ProtocolError("a repaired record has a version of at least 1")
        async with self._lock:
            if self._versions.get(key, 0) >= version:
                return False
            await self._write(Record(key, version, value, refs))
            return True

    async def _write(self, record: Record) -> None:
        data = _encode(record)
        await asyncio.to_thread(write_file_atomic, self._tmp_dir, self._path(record.key), data)
        self._versions[record.key] = record.version

    async def delete_local(self, key: str) -> None:
        """Drop this replica's copy (an extra copy that repair handed over)."""
        async with self._lock:
            if self._versions.pop(key, None) is not None:
                await asyncio.to_thread(self._path(key).unlink, True)

    async def delete(self, key: str, expected_version: int) -> bool:
        """Delete a record if its version is exactly ``expected_version``."""
        async with self._lock:
            current = self._versions.get(key, 0)
            if current == 0:
                return False
            if current != expected_version:
                raise RecordConflict(key, expected_version, current)
            await asyncio.to_thread(self._path(key).unlink, True)
            del self._versions[key]
            return True
