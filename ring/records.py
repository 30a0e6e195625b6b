"""Records on a peer: this peer's acceptor state for each key it holds (``ring.paxos``).

A record is a register decided by consensus among the key's R preferred peers (the rules
are in ``ring.paxos``; the peer side of a round in ``ring.consensus``). What a peer keeps
per key is a *slot*: the highest ballot it promised, the ballot it last accepted and the
value accepted with it: ``(version, value, refs, deleted, op)``, where ``refs`` are the
chunk ids the value points at, kept apart so that peers can audit and collect chunks
without parsing values. A slot is durable (written and fsynced) before the peer answers
the prepare or accept that changed it: a promise forgotten in a crash could let two
values be chosen.

A delete is a value too: a tombstone (no value, no refs), so that a replica that missed
the delete cannot bring the old value back (the higher ballot wins like any other).
Reads and listings treat a tombstone as absent; a tombstone is dropped
``tombstone_ttl_s`` after this peer stored it (a replica away longer than that could
bring the record back; the default is a week).

Each slot is one file ``<data>/records/<xxh3-128 of key>.rec`` (the ``ring.paxos`` slot
encoding with the key in its metadata), written atomically. Files are verified when read;
a corrupt one is quarantined like a corrupt chunk. Files of the record format before
consensus (``SR3R``) are read as values accepted at the lowest classic ballot.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import re
import secrets
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import xxhash

from ring import paxos
from ring.api import RECORD_BYTES_MAX, REF_BYTES, REFS_MAX, VERSION_MAX
from ring.errors import ProtocolError
from ring.files import make_folders, move_or_remove, write_file_atomic
from ring.parse import json_int, load_json
from ring.paxos import Ballot, Preempted, Slot, Value
from ring.records_api import SCAN_HEAD_BYTES_MAX, SCAN_VISITS_MAX
from ring.records_api import split_record_envelope as split_envelope

__all__ = [
    "KEY_PATTERN",
    "LEGACY_BALLOT",
    "RECORD_BYTES_MAX",
    "HEAD_BYTES_KEPT",
    "REFS_MAX",
    "TOMBSTONE_TTL_S_DEFAULT",
    "VERSION_MAX",
    "RecordStore",
    "ScanPage",
    "Scanned",
    "split_envelope",
    "validate_key",
]

log = logging.getLogger(__name__)

KEY_CHARS_MAX = 512
TOMBSTONE_TTL_S_DEFAULT = 7 * 24 * 3600.0
# How long a change is remembered in memory (``changed_within``): repair asks about the
# last seconds only, and this bounds the memory to the keys written in that time.
CHANGES_KEPT_S = 60.0
# Changes older than that forgotten per write at most: more than one, so that forgetting
# keeps up with writing, and few, so that a write's cost stays bounded.
CHANGES_FORGOTTEN_PER_WRITE = 64
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=/-]*$")
# Records written before consensus count as accepted at the lowest classic ballot.
LEGACY_BALLOT = Ballot(1, "0")
_LEGACY_MAGIC = b"SR3R"
_LENGTH = struct.Struct("<I")


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


def check_value(value: Value) -> None:
    """A value a round may store: bounded, a tombstone empty, its refs chunk ids."""
    if len(value.data) > RECORD_BYTES_MAX:
        raise ProtocolError(f"record value of {len(value.data)} bytes is above {RECORD_BYTES_MAX}")
    if len(value.refs) > REFS_MAX:
        raise ProtocolError(f"a record references at most {REFS_MAX} chunks")
    if value.deleted and (value.data or value.refs):
        raise ProtocolError("a tombstone carries no value and no refs")


def _encode(key: str, slot: Slot) -> bytes:
    # The key travels in the file (not on the wire): a file names what it holds.
    return paxos.encode_slot(slot, key)


def _decode(data: bytes) -> tuple[str, Slot]:
    if data[:4] == _LEGACY_MAGIC:
        return _decode_legacy(data)
    slot, meta = paxos.decode_slot(data, RECORD_BYTES_MAX)
    key = meta.get("key")
    if not isinstance(key, str):
        raise ProtocolError("a record file names its key")
    return key, slot


def _decode_legacy(data: bytes) -> tuple[str, Slot]:
    (meta_len,) = _LENGTH.unpack_from(data, 4)
    meta = load_json(data[8 : 8 + meta_len])
    body = data[8 + meta_len :]
    refs_count = json_int(meta.get("refs", 0), "refs", REFS_MAX)
    if xxhash.xxh3_64_hexdigest(body[: refs_count * REF_BYTES]) != meta.get(
        "refs_xxh3", xxhash.xxh3_64_hexdigest(b"")
    ):
        raise ValueError("refs checksum mismatch")
    value, refs = split_envelope(body, refs_count)
    if len(value) != meta["value_bytes"] or xxhash.xxh3_64_hexdigest(value) != meta["value_xxh3"]:
        raise ValueError("value checksum mismatch")
    deleted = meta.get("deleted")
    register = Value(
        json_int(meta["version"], "version", VERSION_MAX), value, refs, deleted is not None
    )
    slot = Slot(LEGACY_BALLOT, LEGACY_BALLOT, register, None if deleted is None else float(deleted))
    return str(meta["key"]), slot


# The first bytes of each value kept in memory, so that a scan answers what callers need
# to describe many records (a file's type, size and time) without reading their files.
HEAD_BYTES_KEPT = SCAN_HEAD_BYTES_MAX
# Sorts after "/" and before every other key character: "a/b0" is the first key past
# every key under "a/b/".
_PAST_SLASH = chr(ord("/") + 1)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a peer keeps in memory per key: enough to list, scan, plan repair and
    collect."""

    version: int
    accepted: Ballot | None
    op: str
    refs: tuple[str, ...]
    deleted_at: float | None
    head: bytes


def _entry(slot: Slot) -> _Entry:
    value = slot.value
    return _Entry(
        value.version,
        slot.accepted,
        value.op,
        value.refs,
        slot.deleted_at,
        value.data[:HEAD_BYTES_KEPT],
    )


@dataclass(frozen=True, slots=True)
class Scanned:
    """One record as a scan sees it on this peer: its accepted ballot and the identity
    of the value accepted with it (version, op, tombstone), and the value's first bytes."""

    key: str
    version: int
    accepted: Ballot | None
    op: str
    deleted: bool
    head: bytes


@dataclass(frozen=True, slots=True)
class ScanPage:
    """A page of a scan: records in key order, and the names of the key prefixes that a
    delimiter rolled up; ``last`` is the last key or prefix the page covers (nothing
    past it was looked at when ``truncated``)."""

    records: list[Scanned]
    prefixes: list[str]
    truncated: bool
    last: str


def _most_held(values: Sequence[Value]) -> Value:
    """The value most of ``values`` are, ties broken by operation id (deterministic)."""
    counts: dict[Value, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=lambda value: (counts[value], value.op))


class RecordStore:
    """The slots of one peer. Every change is serialized by one lock and durable before
    it returns (slots are small; a round writes one per key and acceptor)."""

    def __init__(
        self,
        root: Path,
        *,
        tombstone_ttl_s: float = TOMBSTONE_TTL_S_DEFAULT,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = root / "records"
        self._tmp_dir = root / "tmp"
        self._quarantine_dir = root / "quarantine"
        self._entries: dict[str, _Entry] = {}
        # Every key of ``_entries``, sorted: listings and scans of a prefix cost the
        # keys under it, not every key held.
        self._sorted: list[str] = []
        self._tombstone_ttl_s = tombstone_ttl_s
        self._wall_clock = wall_clock
        self._clock = clock
        # key -> clock() at its last change here, for the last ``CHANGES_KEPT_S``
        # seconds, oldest first (``changed_within``).
        self._changed: dict[str, float] = {}
        self._lock = asyncio.Lock()

    def open(self) -> None:
        make_folders([self._dir, self._tmp_dir, self._quarantine_dir])
        for entry in self._dir.glob("*.rec"):
            try:
                key, slot = _decode(entry.read_bytes())
            except (ProtocolError, ValueError, KeyError, TypeError, struct.error) as exc:
                self._quarantine_file(entry, str(exc))
                continue
            self._entries[key] = _entry(slot)
        self._sorted = sorted(self._entries)

    def _path(self, key: str) -> Path:
        return self._dir / f"{xxhash.xxh3_128_hexdigest(key.encode())}.rec"

    def _quarantine_file(self, path: Path, reason: str) -> None:
        log.error("record file %s is corrupt and was quarantined: %s", path.name, reason)
        # On a disk too full for the move, the corrupt file is removed instead.
        move_or_remove(path, self._quarantine_dir / f"{path.name}.{secrets.token_hex(4)}")

    # -- what is held -------------------------------------------------------------------

    def version(self, key: str) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.version

    def accepted(self, key: str) -> tuple[Ballot, str] | None:
        """The ballot and op of the value accepted here for ``key``, if any."""
        entry = self._entries.get(key)
        if entry is None or entry.accepted is None:
            return None
        return entry.accepted, entry.op

    def holds(self, key: str) -> bool:
        return key in self._entries

    def changed_within(self, key: str, seconds: float) -> bool:
        """Whether ``key``'s slot changed here in the last ``seconds`` (at most
        ``CHANGES_KEPT_S``): a write that reached this acceptor may still be on its way
        to the others."""
        changed = self._changed.get(key)
        return changed is not None and changed > self._clock() - seconds

    def is_deleted(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.deleted_at is not None

    def _live(self, entry: _Entry) -> bool:
        return entry.version > 0 and entry.deleted_at is None

    def count(self) -> int:
        """Live records (tombstones and bare promises not counted)."""
        return sum(1 for entry in self._entries.values() if self._live(entry))

    def keys(self) -> list[str]:
        """Every key with a slot here, tombstones included (repair copies those too)."""
        return list(self._sorted)

    def _set(self, key: str, entry: _Entry) -> None:
        if key not in self._entries:
            bisect.insort(self._sorted, key)
        self._entries[key] = entry

    def _drop(self, key: str) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            index = bisect.bisect_left(self._sorted, key)
            if index < len(self._sorted) and self._sorted[index] == key:
                del self._sorted[index]
        return entry

    def _under(self, prefix: str) -> Iterator[str]:
        """Keys under ``prefix``, in order."""
        for index in range(bisect.bisect_left(self._sorted, prefix), len(self._sorted)):
            key = self._sorted[index]
            if not key.startswith(prefix):
                return
            yield key

    def list(
        self, prefix: str, limit: int, *, include_deleted: bool = False
    ) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for key in self._under(prefix):
            if len(found) >= limit:
                break
            entry = self._entries[key]
            if entry.version > 0 and (include_deleted or entry.deleted_at is None):
                found.append((key, entry.version))
        return found

    def scan(
        self, prefix: str, limit: int, *, after: str = "", delimiter: bool = False,
        head_bytes: int = 0,
    ) -> ScanPage:  # fmt: skip
        """Records under ``prefix`` past ``after``, each with what a caller needs to tell
        whether its acceptors agree: up to ``limit`` live ones (and rolled-up prefixes),
        with the tombstones among them, which do not count toward ``limit`` (a directory
        Spark prunes keeps a week of them); at most ``SCAN_VISITS_MAX`` keys are looked
        at. With ``delimiter``, keys with a "/" past the prefix roll up into that prefix,
        once (and only if one of them is live here). ``after`` ending in "/" (a rolled-up
        prefix a page ended with) resumes past every key under it."""
        if not 0 <= head_bytes <= HEAD_BYTES_KEPT:
            raise ProtocolError(f"a scan gives at most {HEAD_BYTES_KEPT} bytes of each value")
        if after <= prefix:
            index = bisect.bisect_left(self._sorted, prefix)
        elif after.endswith("/"):
            index = bisect.bisect_left(self._sorted, after[:-1] + _PAST_SLASH)
        else:
            index = bisect.bisect_right(self._sorted, after)
        records: list[Scanned] = []
        prefixes: list[str] = []
        counted = visits = 0
        last = ""
        while index < len(self._sorted):
            key = self._sorted[index]
            if not key.startswith(prefix):
                break
            if counted >= limit or visits >= SCAN_VISITS_MAX:
                return ScanPage(records, prefixes, True, last)
            rest = key[len(prefix) :]
            if delimiter and "/" in rest:
                rolled = prefix + rest[: rest.index("/") + 1]
                end = bisect.bisect_left(self._sorted, rolled[:-1] + _PAST_SLASH, index)
                # Rolled up only when something under it is live here.
                for inner in range(index, end):
                    visits += 1
                    if self._live(self._entries[self._sorted[inner]]):
                        prefixes.append(rolled)
                        counted += 1
                        break
                last = rolled
                index = end
                continue
            entry = self._entries[key]
            last = key
            index += 1
            visits += 1
            if entry.version == 0:  # a bare promise: nothing accepted here
                continue
            deleted = entry.deleted_at is not None
            counted += 0 if deleted else 1
            records.append(
                Scanned(
                    key,
                    entry.version,
                    entry.accepted,
                    entry.op,
                    deleted,
                    entry.head[:head_bytes],
                )
            )
        return ScanPage(records, prefixes, False, last)

    def referenced(self) -> set[str]:
        """Every chunk id the values accepted here reference (tombstones have none)."""
        return {ref for entry in self._entries.values() for ref in entry.refs}

    async def slot(self, key: str) -> Slot:
        """This peer's slot for ``key`` (``paxos.NOTHING`` if it holds none)."""
        return await self._slot(key, locked=False)

    async def _slot(self, key: str, *, locked: bool) -> Slot:
        """``slot``; ``locked``: the caller holds the store's lock (a corrupt file is
        then quarantined under it, not by taking it again: it is not reentrant)."""
        if key not in self._entries:
            return paxos.NOTHING
        path = self._path(key)
        try:
            stored_key, slot = _decode(await asyncio.to_thread(path.read_bytes))
        except FileNotFoundError:
            return paxos.NOTHING
        except (ProtocolError, ValueError, KeyError, TypeError, struct.error) as exc:
            if locked:
                self._quarantine_file(path, str(exc))
                self._drop(key)
            else:
                async with self._lock:
                    self._quarantine_file(path, str(exc))
                    self._drop(key)
            return paxos.NOTHING
        if stored_key != key:
            raise AssertionError(f"record file for {key!r} holds {stored_key!r}")
        return slot

    # -- acceptor -----------------------------------------------------------------------

    async def prepare(self, key: str, ballot: Ballot) -> Slot | Preempted:
        """Promise ``ballot`` for ``key``; the slot as it then stands, or the refusal."""
        async with self._lock:
            outcome = paxos.prepare(await self._slot(key, locked=True), ballot)
            if isinstance(outcome, Slot):
                await self._write(key, outcome)
            return outcome

    async def accept(
        self, key: str, ballot: Ballot, value: Value, following: Ballot | None = None
    ) -> Slot | Preempted:
        """Accept ``value`` at ``ballot`` (and promise ``following``), or refuse."""
        check_value(value)
        async with self._lock:
            current = await self._slot(key, locked=True)
            outcome = paxos.accept(current, ballot, value, following, self._wall_clock())
            if isinstance(outcome, Slot) and outcome != current:
                await self._write(key, outcome)
            return outcome

    async def merge(self, key: str, slots: Sequence[Slot]) -> Slot:
        """Take in the slots other acceptors hold for ``key`` (a new owner catching up):
        the highest promise, and the value with the highest accepted ballot (a value some
        acceptor really accepted, so a later round sees what it would have seen there).

        Ballot 0 (a fast create) can hold different values on different acceptors: a
        slot that accepted one keeps it (an acceptor votes once per ballot), and an empty
        one takes the value most of the merged slots hold. A value chosen by a fast
        quorum is held by all but ``n - F`` of a group (one of five), so it is the one
        most of any majority of that group hold."""
        async with self._lock:
            current = await self._slot(key, locked=True)
            for other in slots:
                check_value(other.value)
            promised = max([current.promised, *(other.promised for other in slots)])
            best = max(
                (other.accepted for other in slots if other.accepted is not None), default=None
            )
            if best is not None and (current.accepted is None or best > current.accepted):
                if best == paxos.FAST:
                    value = _most_held([o.value for o in slots if o.accepted == paxos.FAST])
                else:
                    value = next(o.value for o in slots if o.accepted == best)
                deleted_at = self._wall_clock() if value.deleted else None
                merged = Slot(promised, best, value, deleted_at)
            else:
                merged = replace(current, promised=promised)
            if merged != current:
                await self._write(key, merged)
            return merged

    async def _write(self, key: str, slot: Slot) -> None:
        data = _encode(key, slot)
        await asyncio.to_thread(write_file_atomic, self._tmp_dir, self._path(key), data)
        self._set(key, _entry(slot))
        self._note_change(key)

    def _note_change(self, key: str) -> None:
        now = self._clock()
        self._changed.pop(key, None)
        self._changed[key] = now
        forget_before = now - CHANGES_KEPT_S
        oldest_first = itertools.islice(self._changed.items(), CHANGES_FORGOTTEN_PER_WRITE)
        for oldest, changed in list(oldest_first):
            if changed > forget_before:
                break
            del self._changed[oldest]

    # -- housekeeping -------------------------------------------------------------------

    async def delete_local(self, key: str) -> None:
        """Drop this replica's slot (an extra copy that repair handed over)."""
        async with self._lock:
            if self._drop(key) is not None:
                await asyncio.to_thread(self._path(key).unlink, True)

    async def purge_tombstones(self) -> int:
        """Drop tombstones stored more than ``tombstone_ttl_s`` ago; how many were."""
        horizon = self._wall_clock() - self._tombstone_ttl_s
        expired = [
            key
            for key, entry in self._entries.items()
            if entry.deleted_at is not None and entry.deleted_at <= horizon
        ]
        for key in expired:
            async with self._lock:
                entry = self._entries.get(key)
                if (
                    entry is not None
                    and entry.deleted_at is not None
                    and entry.deleted_at <= horizon
                ):
                    self._drop(key)
                    await asyncio.to_thread(self._path(key).unlink, True)
        return len(expired)
