"""Directory rename: a tree of records moved so that a reader sees all of it at the source
or all of it at the destination, never part, and a crash at any point leaves a state the
next attempt completes.

Every path is a record of its own (``filesystem.entries``), so a directory rename moves
many records; it cannot be one write. It is an intent record, then marked copies, then a
commit, then clean-up:

1. **Intent**: the record ``fsx/renames/<op>`` (``op``: the rename's operation id, the same
   on every retry of the request) says ``copying`` from the source to the destination.
2. **Marks and copies**, entry by entry (the source directory's own record first, then
   everything under it): the original is rewritten *outgoing* (same entry, marked with
   the rename), then a copy is created at the destination *incoming* (same bytes or
   chunks: chunks are shared, nothing is copied but records).
3. **Commit**: one compare-and-set of the intent from ``copying`` to ``committed``. That is
   the instant the whole tree moves: an incoming entry is visible exactly when its
   rename committed, an outgoing one exactly until then (``Renames.visible``). So before
   the commit a reader finds the source whole and nothing at the destination; after it,
   the destination whole and nothing at the source.
4. **Clean-up**: incoming copies lose their mark, outgoing originals are deleted, then the
   intent record goes. Readers do not depend on it: a marked entry is already seen right.

A retry of the request (the clients retry through another peer when the one they asked
dies) finds the intent and goes on from where it is: copying again is idempotent, a
committed rename is cleaned up. A rename abandoned mid-copy (the client gone too) stays
invisible: its source keeps being read as it was and its copies are hidden; a recursive
delete of either tree, or a later write at those paths, removes them. Another rename of
the same source aborts an abandoned one first (a compare-and-set of its intent to
``aborted``, which a commit of it cannot pass), so one rename of a tree wins, never two.

A write that replaces or deletes a marked entry (``Namespace.give_way``) aborts a rename
still copying it first, so a rename never commits over a file written at its
destination meanwhile, nor a copy of a file changed or deleted meanwhile. Not given (as
HDFS gives it under its namespace lock): a file created under the source while the
rename runs may stay at the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from filesystem.entries import Entry, Marker, decode_entry, encode_entry
from ring import api, fs_api
from ring.client import Client
from ring.client.chunks import first_error
from ring.client.options import RecordValue
from ring.errors import ProtocolError, RecordConflict, RecordUnknown
from ring.fs_api import Stat

if TYPE_CHECKING:
    from filesystem.namespace import Namespace

__all__ = [
    "INTENT_KEY_PREFIX",
    "Intent",
    "Move",
    "MoveRefused",
    "Placed",
    "Renames",
    "StateCache",
    "abort_rename",
    "intent_key",
    "move_directory",
    "rename_directory",
    "settled_op",
    "start_move",
    "step_op",
]

INTENT_KEY_PREFIX = "fsx/renames/"
IntentState = Literal["copying", "committed", "aborted"]
_STATES: tuple[IntentState, ...] = ("copying", "committed", "aborted")
# Entries one directory rename moves (the source and everything under it): a bigger tree
# is refused before anything is marked.
MOVE_ENTRIES_MAX = 10_000
# Records marked, copied or cleaned at once.
MOVES_AT_ONCE = 16
# Final states (committed, aborted) of renames a coordinator remembers.
FINAL_STATES_MAX = 4096
CAS_ATTEMPTS_MAX = 8


class MoveRefused(Exception):
    """The rename cannot go on: its HTTP status, error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class Intent:
    source: str
    target: str
    state: IntentState
    started_ms: int
    # What moves: a directory's tree, or one file (``filesystem.file_rename``).
    kind: Literal["directory", "file"] = "directory"

    def encode(self) -> bytes:
        body = {
            "from": self.source,
            "to": self.target,
            "state": self.state,
            "started_ms": self.started_ms,
            "kind": self.kind,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Intent:
        body = api.load_json(data)
        if not isinstance(body, dict) or body.get("state") not in _STATES:
            raise ProtocolError("not a rename intent")
        started = body.get("started_ms")
        if isinstance(started, bool) or not isinstance(started, int) or started < 0:
            raise ProtocolError("rename intent: started_ms is a count of milliseconds")
        source = fs_api.validate_path(str(body.get("from", "")))
        target = fs_api.validate_path(str(body.get("to", "")))
        kind = body.get("kind", "directory")
        if kind not in ("directory", "file"):
            raise ProtocolError("rename intent: kind is 'directory' or 'file'")
        return cls(source, target, body["state"], started, kind)


def intent_key(op: str) -> str:
    return INTENT_KEY_PREFIX + op


def step_op(op: str, step: str, key: str) -> str:
    """The operation id of one write of rename ``op`` (``step`` of record ``key``): the
    same on every attempt, so a retried step is recognized as done (the records layer
    takes a write whose op the record already holds as done), and distinct per step."""
    return hashlib.blake2b(f"{op}/{step}/{key}".encode(), digest_size=12).hexdigest()


def settled_op(op: str, source: str, target: str, key: str) -> str:
    """The operation id of the clean-up write that leaves record ``key`` at the target
    of the committed rename ``op`` of ``source`` to ``target``. It names both ends
    (paths hold no control character, so the newline keeps them apart): a request that
    finds its target's record last written so is a retry of this very rename, done;
    one that reuses ``op`` for another source is not told it moved anything."""
    return step_op(op, f"settled\n{source}\n{target}", key)


class Renames:
    """Whether a marked entry is visible: by its rename's intent, read once per reader
    call (``StateCache``) and remembered once final."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._final: OrderedDict[str, IntentState] = OrderedDict()

    async def state(self, rename: str) -> IntentState | None:
        """The rename's state; None when it has no intent (never started, or cleaned up:
        then no entry names it any more, or one that does was never committed)."""
        final = self._final.get(rename)
        if final is not None:
            return final
        record = await self.client.get_record(intent_key(rename))
        if record is None:
            return None
        state = Intent.decode(record.value).state
        if state != "copying":
            self._final[rename] = state
            while len(self._final) > FINAL_STATES_MAX:
                self._final.popitem(last=False)
        return state

    def cache(self) -> StateCache:
        return StateCache(self)


class StateCache:
    """One reader call's view of renames: each one's state read at most once, so a
    listing sees a rename wholly before or wholly after its commit."""

    def __init__(self, renames: Renames) -> None:
        self._renames = renames
        self._seen: dict[str, IntentState | None] = {}

    async def visible(self, marker: Marker | None) -> bool:
        if marker is None:
            return True
        if marker.rename not in self._seen:
            self._seen[marker.rename] = await self._renames.state(marker.rename)
        committed = self._seen[marker.rename] == "committed"
        return committed if marker.kind == "incoming" else not committed

    async def gone(self, marker: Marker | None) -> bool:
        """Whether ``marker`` names a rename whose intent is gone: cleaned up after the
        record was read (the clean-up clears every mark before it drops the intent), so
        the record is to be read again."""
        if marker is None:
            return False
        if marker.rename not in self._seen:
            self._seen[marker.rename] = await self._renames.state(marker.rename)
        return self._seen[marker.rename] is None

    async def shown(self, entry: Entry) -> Entry | None:
        """What readers see of ``entry``: itself while visible, else the file it
        replaces (an incoming file renamed with overwrite, before its commit), else
        nothing."""
        if await self.visible(entry.marker):
            return entry
        return entry.previous


@dataclass(frozen=True, slots=True)
class _Moving:
    source: str  # a path under (or at) the rename's source
    record: RecordValue
    entry: Entry


@dataclass(frozen=True, slots=True)
class Placed:
    """A record this rename marked or copied: its path, version and entry."""

    path: str
    version: int
    entry: Entry


def _mapped(path: str, intent: Intent) -> str:
    return intent.target + path[len(intent.source) :]


async def _each(items: list[Any], action: Callable[[Any], Awaitable[None]]) -> None:
    """``action`` on every item, MOVES_AT_ONCE at a time; the first failure raised."""
    slots = asyncio.Semaphore(MOVES_AT_ONCE)

    async def one(item: Any) -> None:
        async with slots:
            await action(item)

    try:
        async with asyncio.TaskGroup() as group:
            for item in items:
                group.create_task(one(item))
    except BaseExceptionGroup as group_error:
        raise first_error(group_error) from None


async def _tree(ns: Namespace, root: str) -> list[_Moving]:
    """The record at ``root`` and every record under it, read whole (tombstones left
    out), at most ``MOVE_ENTRIES_MAX``."""
    keys = [fs_api.path_key(root)]
    prefix = fs_api.entries_prefix(root)
    cursor = ""
    while True:
        scan = await ns.client.scan_records(prefix, limit=fs_api.LIST_LIMIT_MAX, after=cursor)
        keys += [record.key for record in scan.records]
        if len(keys) > MOVE_ENTRIES_MAX:
            raise MoveRefused(
                409, "too_large", f"{root}: a directory rename moves at most "
                f"{MOVE_ENTRIES_MAX} files and directories",
            )  # fmt: skip
        if not scan.truncated:
            break
        cursor = scan.last
    found: list[_Moving] = []

    async def read(key: str) -> None:
        record = await ns.client.get_record(key)
        if record is not None:
            path = "/" + fs_api.name_of_key(key[len(fs_api.PATH_KEY_PREFIX) :])
            found.append(_Moving(path, record, decode_entry(record.value)))

    await _each(keys, read)
    return sorted(found, key=lambda moving: moving.source)


async def abort_rename(ns: Namespace, rename: str) -> bool:
    """Abort another rename that is still copying; False when it committed first."""
    key = intent_key(rename)
    for _attempt in range(CAS_ATTEMPTS_MAX):
        record = await ns.client.get_record(key)
        if record is None:
            return True
        intent = Intent.decode(record.value)
        if intent.state != "copying":
            return intent.state == "aborted"
        try:
            await ns.client.put_record(
                key, replace(intent, state="aborted").encode(), expected_version=record.version
            )
        except (RecordConflict, RecordUnknown):
            continue
        return True
    raise MoveRefused(503, "contention", f"rename {rename}: {CAS_ATTEMPTS_MAX} writers won")


class Move:
    """One directory rename, driven by its intent."""

    def __init__(self, ns: Namespace, op: str, intent: Intent, version: int) -> None:
        self.ns = ns
        self.op = op
        self.intent = intent
        self.version = version  # of the intent record
        # What this attempt marked and copied, for the clean-up; None when it did not
        # copy the whole tree itself (a retry after the commit): the clean-up scans.
        self.outgoing: list[Placed] | None = None
        self.incoming: list[Placed] | None = None
        # Path -> version of the records the clean-up left in place.
        self.settled: dict[str, int] = {}

    async def copy(self) -> None:
        """Mark every entry of the source outgoing and copy it incoming (idempotent)."""
        await self.ns.make_parents(self.intent.target)
        outgoing: list[Placed] = []
        incoming: list[Placed] = []

        async def move_one(moving: _Moving) -> None:
            placed = await self._move_one(moving)
            if placed is not None:
                outgoing.append(placed[0])
                incoming.append(placed[1])

        await _each(await _tree(self.ns, self.intent.source), move_one)
        self.outgoing, self.incoming = outgoing, incoming

    async def _move_one(self, moving: _Moving) -> tuple[Placed, Placed] | None:
        """Mark one entry outgoing and copy it incoming; what was marked and copied,
        or None when the entry is not this tree's to move."""
        entry = moving.entry
        if entry.marker is not None and entry.marker.rename != self.op:
            other = entry.marker
            if other.kind == "incoming":
                if await self.ns.renames.state(other.rename) != "committed":
                    if entry.previous is None:
                        return None  # another rename's hidden copy: not an entry of this tree
                    if await abort_rename(self.ns, other.rename):
                        # A file renamed onto this one, stopped: this one moves.
                        entry = entry.previous
            elif not await abort_rename(self.ns, other.rename):
                return None  # moved away by another rename that committed: not here now
        marked = replace(entry.settled(), marker=Marker("outgoing", self.op))
        version = moving.record.version
        if entry.marker != marked.marker:
            version = await self._write(fs_api.path_key(moving.source), marked, version)
        target = _mapped(moving.source, self.intent)
        copied = replace(entry.settled(), marker=Marker("incoming", self.op))
        copied_version = await self._copy(target, copied)
        return Placed(moving.source, version, marked), Placed(target, copied_version, copied)

    async def _write(self, key: str, entry: Entry, version: int) -> int:
        try:
            return await self.ns.client.put_record(
                key, encode_entry(entry), expected_version=version, refs=entry.refs,
                op=step_op(self.op, "outgoing", key),
            )  # fmt: skip
        except (RecordConflict, RecordUnknown):
            current = await self.ns.client.get_record(key)
            if current is not None and decode_entry(current.value).marker == entry.marker:
                return current.version  # marked by another attempt of this rename
            # Changed under the rename (written or deleted meanwhile): the tree is not
            # what it was; this rename gives way.
            raise MoveRefused(
                409, "changed", f"{key[len(fs_api.PATH_KEY_PREFIX) - 1 :]} changed while "
                "its directory was renamed; rename again",
            ) from None  # fmt: skip

    async def _copy(self, path: str, incoming: Entry) -> int:
        """Create the copy at ``path``; its version. The first attempt creates as if the
        path were free (the destination is new: one round, not a read and a round)."""
        key = fs_api.path_key(path)
        for attempt in range(CAS_ATTEMPTS_MAX):
            current = None
            if attempt > 0:
                current = await self.ns.client.get_record(key, include_deleted=True)
            expected = 0
            if current is not None:
                expected = current.version
                if not current.deleted:
                    there = decode_entry(current.value)
                    if there.marker == incoming.marker:
                        return current.version  # copied by an earlier attempt
                    if await self.ns.renames.cache().shown(there) is not None:
                        raise MoveRefused(409, "exists", f"{path} exists")
                    if not await self.ns.give_way(current):
                        continue
            try:
                return await self.ns.client.put_record(
                    key, encode_entry(incoming), expected_version=expected,
                    refs=incoming.refs, op=step_op(self.op, "incoming", key),
                )  # fmt: skip
            except (RecordConflict, RecordUnknown):
                continue
        raise MoveRefused(503, "contention", f"{path}: {CAS_ATTEMPTS_MAX} writers won")

    async def commit(self) -> None:
        key = intent_key(self.op)
        try:
            self.version = await self.ns.client.put_record(
                key, replace(self.intent, state="committed").encode(), expected_version=self.version
            )
        except (RecordConflict, RecordUnknown):
            record = await self.ns.client.get_record(key)
            state = None if record is None else Intent.decode(record.value).state
            self.version = 0 if record is None else record.version
            if state != "committed":
                # Aborted by a write that met one of its marks, or by another rename of
                # the same source: what this attempt placed is cleaned up.
                self.intent = replace(self.intent, state="aborted")
                await self.settle()
                raise MoveRefused(
                    409, "changed", f"the rename of {self.intent.source} was abandoned: "
                    "a write of its source or target, or another rename of it, came "
                    "first; rename again",
                ) from None  # fmt: skip
        self.intent = replace(self.intent, state="committed")

    async def settle(self) -> None:
        """Clean up after the commit (marks cleared, originals deleted) or the abort
        (copies deleted, marks cleared), then drop the intent. What this attempt placed
        is cleaned from memory; a retry that did not place it all scans both trees."""
        committed = self.intent.state == "committed"
        if self.incoming is None or self.outgoing is None:
            scanned_in = await _tree(self.ns, self.intent.target)
            scanned_out = await _tree(self.ns, self.intent.source)
            self.incoming = [_placed(m) for m in scanned_in if self._ours(m, "incoming")]
            self.outgoing = [_placed(m) for m in scanned_out if self._ours(m, "outgoing")]

        async def clear(placed: Placed) -> int:
            """The entry stays, unmarked (or, an incoming file of an aborted rename,
            the file it replaced comes back)."""
            key = fs_api.path_key(placed.path)
            entry = placed.entry.settled()
            op = settled_op(self.op, self.intent.source, self.intent.target, key)
            if not committed:
                op = step_op(self.op, "restored", key)
                if placed.entry.previous is not None:
                    entry = placed.entry.previous
            version = await self.ns.client.put_record(
                key, encode_entry(entry), expected_version=placed.version,
                refs=entry.refs, op=op,
            )  # fmt: skip
            self.settled[placed.path] = version
            return version

        async def delete(placed: Placed) -> int:
            key = fs_api.path_key(placed.path)
            return await self.ns.client.delete_record(key, expected_version=placed.version)

        async def settle_one(item: tuple[Placed, bool]) -> None:
            """One record cleaned up, or found changed by someone else; tried again
            while it still holds this rename's mark (a write whose outcome was lost):
            the intent goes only once no record holds one, or a reader that meets a
            mark left behind would take it as never committed."""
            placed, keep = item
            for _attempt in range(CAS_ATTEMPTS_MAX):
                try:
                    await (clear(placed) if keep else delete(placed))
                    return
                except (RecordConflict, RecordUnknown):
                    current = await self.ns.client.get_record(fs_api.path_key(placed.path))
                    if current is None:
                        return
                    entry = decode_entry(current.value)
                    if entry.marker != placed.entry.marker:
                        return  # cleaned by another attempt, or written by someone else
                    placed = Placed(placed.path, current.version, entry)
            raise MoveRefused(503, "contention", f"{placed.path}: {CAS_ATTEMPTS_MAX} writers won")

        # Incoming copies stay after a commit (and go after an abort, unless they hold
        # the file they replaced); outgoing originals the other way round.
        await _each(
            [(p, committed or p.entry.previous is not None) for p in self.incoming]
            + [(p, not committed) for p in self.outgoing],
            settle_one,
        )
        key = intent_key(self.op)
        version = self.version
        if not version:
            record = await self.ns.client.get_record(key)
            version = 0 if record is None else record.version
        if version:
            with contextlib.suppress(RecordConflict, RecordUnknown):
                await self.ns.client.delete_record(key, expected_version=version)

    def _ours(self, moving: _Moving, kind: str) -> bool:
        marker = moving.entry.marker
        return marker is not None and marker.rename == self.op and marker.kind == kind


async def start_move(
    ns: Namespace,
    source: str,
    target: str,
    record: RecordValue | None,
    *,
    op: str,
    kind: Literal["directory", "file"],
) -> Move:
    """The rename ``op`` of ``source`` to ``target``: its intent written (``copying``)
    when ``record`` (its intent record as just read) is None, else as it stands."""
    key = intent_key(op)
    if record is None:
        intent = Intent(source, target, "copying", ns.wall_ms(), kind)
        try:
            version = await ns.client.put_record(key, intent.encode(), expected_version=0)
        except (RecordConflict, RecordUnknown):
            record = await ns.client.get_record(key)
            if record is None:
                # Its intent came and went: an earlier attempt finished or gave up.
                raise MoveRefused(
                    409, "changed", f"rename {op} ended before this attempt; rename again"
                ) from None
    if record is not None:
        intent, version = Intent.decode(record.value), record.version
        if (intent.source, intent.target, intent.kind) != (source, target, kind):
            raise ProtocolError(
                f"op {op} names the rename of the {intent.kind} {intent.source} to {intent.target}"
            )
    return Move(ns, op, intent, version)


async def move_directory(
    ns: Namespace, source: str, target: str, record: RecordValue | None, *, op: str
) -> Stat:
    """Rename the directory ``source`` to ``target`` (which must not exist), or go on
    with the rename ``op`` started; ``record``: its intent record as just read (None:
    none yet); the stat of ``target``."""
    move = await start_move(ns, source, target, record, op=op, kind="directory")
    intent = move.intent
    if intent.state == "copying":
        try:
            await move.copy()
        except MoveRefused:
            if await abort_rename(ns, op):
                move.intent, move.version = replace(intent, state="aborted"), 0
                await move.settle()
            raise
        await move.commit()
    elif intent.state == "aborted":
        await move.settle()
        raise MoveRefused(409, "changed", f"the rename of {source} was abandoned; rename again")
    await move.settle()
    if (await ns.find(target)).stat is None:
        # The source was a directory only implied by what was under it (no record of
        # its own: a create that raced a delete): the destination gets one.
        await ns.mkdirs(target)
    return await ns.stat(target)


async def rename_directory(
    ns: Namespace, source: str, target: str, source_exists: bool, *, op: str, overwrite: bool
) -> Stat:
    """``move_directory``, for a source that is a directory (or was: a retry of a rename
    that committed finds it moved), onto a target that is free (or, with ``overwrite``,
    an empty directory, which goes first, as in HDFS)."""
    record = await ns.client.get_record(intent_key(op))
    if record is None:
        if not source_exists and not await ns.holds_anything(fs_api.entries_prefix(source)):
            # A retry of this rename after it was done and cleaned up finds the
            # destination's record last written by its clean-up.
            key = fs_api.path_key(target)
            done = await ns.client.get_record(key)
            if done is not None and done.op == settled_op(op, source, target, key):
                return await ns.stat(target)
            raise MoveRefused(404, "not_found", f"no such file or directory: {source}")
        there = await ns.find(target)
        if there.stat is not None:
            if not overwrite:
                raise MoveRefused(409, "exists", f"{target} exists")
            if there.stat.type == "file":
                raise MoveRefused(409, "exists", f"{target} is a file; a directory replaces none")
            await ns.delete(target, recursive=False)
    ns.forget_known(source)
    return await move_directory(ns, source, target, record, op=op)


def _placed(moving: _Moving) -> Placed:
    return Placed(moving.source, moving.record.version, moving.entry)
