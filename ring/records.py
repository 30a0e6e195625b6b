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

A delete is a write too: a tombstone (no value, no refs) at ``expected + 1``, so that a
replica that missed the delete cannot push the old value back during repair (the newer
tombstone wins like any newer version). Reads and listings treat a tombstone as absent;
a tombstone is dropped ``tombstone_ttl_s`` after it was stored (a replica that was away
longer than that could bring the record back; the default is a week).

On the wire and on disk, ``refs`` travel as concatenated 16-byte chunk ids in front of
the value (``?refs=N`` names how many). Each record is one file
``<data>/records/<xxh3-128 of key>.rec``, written atomically:

    b"SR3R" | u32 metadata length | metadata JSON | refs | value

where the metadata holds the key, version, value and refs lengths and their xxh3-64 (and,
for a tombstone, ``deleted`` with the wall-clock time it was stored). Files
are verified when read; a corrupt one is quarantined like a corrupt chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ring.api import RECORD_BYTES_MAX, REF_BYTES, REFS_MAX, VERSION_MAX, record_envelope
from ring.api import split_record_envelope as split_envelope
from ring.errors import ProtocolError, RecordConflict
from ring.files import move_or_remove, write_file_atomic

__all__ = [
    "KEY_PATTERN",
    "RECORD_BYTES_MAX",
    "REFS_MAX",
    "TOMBSTONE_TTL_S_DEFAULT",
    "VERSION_MAX",
    "Record",
    "RecordStore",
    "split_envelope",
    "validate_key",
]

log = logging.getLogger(__name__)

MAGIC = b"SR3R"
KEY_CHARS_MAX = 512
TOMBSTONE_TTL_S_DEFAULT = 7 * 24 * 3600.0
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=/-]*$")
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    version: int
    value: bytes
    refs: tuple[str, ...] = ()
    # Wall-clock seconds when this replica stored the tombstone; None for a live record.
    deleted_at: float | None = None

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def digest(self) -> str:
        return xxhash.xxh3_64_hexdigest(self.value)

    def refs_bytes(self) -> bytes:
        return b"".join(bytes.fromhex(ref) for ref in self.refs)

    def envelope(self) -> bytes:
        """The wire form of a write (``ring.api.record_envelope``; ``?refs=len(refs)``)."""
        return record_envelope(self.refs, self.value)


def validate_key(key: str) -> str:
    if (
        not 0 < len(key) <= KEY_CHARS_MAX
        or KEY_PATTERN.fullmatch(key) is None
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
            **({} if record.deleted_at is None else {"deleted": record.deleted_at}),
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
    deleted = meta.get("deleted")
    return Record(
        str(meta["key"]), int(meta["version"]), value, refs,
        None if deleted is None else float(deleted),
    )  # fmt: skip


def _check_expected(expected_version: int) -> None:
    """A write stores ``expected + 1``, which must stay a valid version: no key can be
    pushed beyond what a writer can name."""
    if not 0 <= expected_version < VERSION_MAX:
        raise ProtocolError(f"an expected version is an integer in 0..{VERSION_MAX - 1}")


def _check_size(value: bytes, refs: tuple[str, ...]) -> None:
    if len(value) > RECORD_BYTES_MAX:
        raise ProtocolError(f"record value of {len(value)} bytes is above {RECORD_BYTES_MAX}")
    if len(refs) > REFS_MAX:
        raise ProtocolError(f"a record references at most {REFS_MAX} chunks")


class RecordStore:
    """Records of one peer. All mutations are serialized by one lock (records are small)."""

    def __init__(
        self,
        root: Path,
        *,
        tombstone_ttl_s: float = TOMBSTONE_TTL_S_DEFAULT,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._dir = root / "records"
        self._tmp_dir = root / "tmp"
        self._quarantine_dir = root / "quarantine"
        self._versions: dict[str, int] = {}
        # key -> when its tombstone was stored, for keys whose newest version is a delete
        self._tombstones: dict[str, float] = {}
        # key -> refs of live records that have any (chunk collection asks for them all)
        self._refs: dict[str, tuple[str, ...]] = {}
        self._tombstone_ttl_s = tombstone_ttl_s
        self._wall_clock = wall_clock
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
            if record.deleted_at is not None:
                self._tombstones[record.key] = record.deleted_at
            elif record.refs:
                self._refs[record.key] = record.refs

    def _path(self, key: str) -> Path:
        return self._dir / f"{xxhash.xxh3_128_hexdigest(key.encode())}.rec"

    def _quarantine_file(self, path: Path, reason: str) -> None:
        log.error("record file %s is corrupt and was quarantined: %s", path.name, reason)
        # On a disk too full for the move, the corrupt file is removed instead.
        move_or_remove(path, self._quarantine_dir / f"{path.name}.{secrets.token_hex(4)}")

    def version(self, key: str) -> int:
        return self._versions.get(key, 0)

    def is_deleted(self, key: str) -> bool:
        return key in self._tombstones

    def count(self) -> int:
        """Live records (tombstones not counted)."""
        return len(self._versions) - len(self._tombstones)

    def keys(self) -> list[str]:
        """Every key held, tombstones included (repair copies those too)."""
        return sorted(self._versions)

    def list(
        self, prefix: str, limit: int, *, include_deleted: bool = False
    ) -> list[tuple[str, int]]:
        keys = sorted(
            key
            for key in self._versions
            if key.startswith(prefix) and (include_deleted or key not in self._tombstones)
        )
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
                self._drop(key)
            return None
        if record.key != key:
            raise AssertionError(f"record file for {key!r} holds {record.key!r}")
        return record

    async def put(
        self, key: str, value: bytes, expected_version: int, refs: tuple[str, ...] = ()
    ) -> Record:
        """Compare-and-set: store ``value`` as version ``expected_version + 1``."""
        _check_expected(expected_version)
        _check_size(value, refs)
        async with self._lock:
            current = self._versions.get(key, 0)
            if current > expected_version:
                raise RecordConflict(key, expected_version, current)
            record = Record(key, expected_version + 1, value, refs)
            await self._write(record)
            return record

    async def put_repair(
        self, key: str, value: bytes, version: int, refs: tuple[str, ...] = (),
        *, deleted: bool = False,
    ) -> bool:  # fmt: skip
        """Store a copy pushed by repair if it is newer than ours; False if it is not.
        ``deleted``: the copy is a tombstone (it must carry no value and no refs)."""
        _check_size(value, refs)
        if not 1 <= version <= VERSION_MAX:
            raise ProtocolError(f"a repaired record has a version in 1..{VERSION_MAX}")
        if deleted and (value or refs):
            raise ProtocolError("a tombstone carries no value and no refs")
        async with self._lock:
            if self._versions.get(key, 0) >= version:
                return False
            deleted_at = self._wall_clock() if deleted else None
            await self._write(Record(key, version, value, refs, deleted_at))
            return True

    async def _write(self, record: Record) -> None:
        data = _encode(record)
        await asyncio.to_thread(write_file_atomic, self._tmp_dir, self._path(record.key), data)
        self._versions[record.key] = record.version
        self._refs.pop(record.key, None)
        if record.deleted_at is None:
            self._tombstones.pop(record.key, None)
            if record.refs:
                self._refs[record.key] = record.refs
        else:
            self._tombstones[record.key] = record.deleted_at

    def _drop(self, key: str) -> None:
        self._versions.pop(key, None)
        self._tombstones.pop(key, None)
        self._refs.pop(key, None)

    async def delete_local(self, key: str) -> None:
        """Drop this replica's copy (an extra copy that repair handed over)."""
        async with self._lock:
            if key in self._versions:
                self._drop(key)
                await asyncio.to_thread(self._path(key).unlink, True)

    async def delete(self, key: str, expected_version: int) -> Record:
        """Compare-and-set delete: store a tombstone as ``expected_version + 1``.

        Like ``put``, a replica that missed earlier versions accepts it (and one that
        never held the key stores the tombstone too, so a late copy cannot come back)."""
        _check_expected(expected_version)
        async with self._lock:
            current = self._versions.get(key, 0)
            if current > expected_version:
                raise RecordConflict(key, expected_version, current)
            record = Record(key, expected_version + 1, b"", (), self._wall_clock())
            await self._write(record)
            return record

    async def purge_tombstones(self) -> int:
        """Drop tombstones stored more than ``tombstone_ttl_s`` ago; how many were."""
        horizon = self._wall_clock() - self._tombstone_ttl_s
        expired = [key for key, at in self._tombstones.items() if at <= horizon]
        for key in expired:
            async with self._lock:
                if self._tombstones.get(key, horizon + 1) <= horizon:
                    self._drop(key)
                    await asyncio.to_thread(self._path(key).unlink, True)
        return len(expired)

    def referenced(self) -> set[str]:
        """Every chunk id the live records held here reference."""
        return {ref for refs in self._refs.values() for ref in refs}
