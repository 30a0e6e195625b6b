"""The file namespace of ``sr3://``: what every peer serves (``filesystem.service`` has
its HTTP routes).

Any peer coordinates a request (the routes, answers and error codes are in
``ring.fs_api``): it reads and changes the file's record by consensus through a ring
client of its own, and writes a large file's chunks to their replicas (durable on W of
them) before the record names them, so a file is visible, whole, exactly when the
request that created it answers 201.

Semantics Spark's checkpoint code relies on (as on HDFS):

- create-if-absent is exact: of many concurrent creates of one path, one wins and the
  others get 409 "exists" (the record's compare-and-set decides);
- rename of a directory moves its whole tree at one instant (``filesystem.moves``: an
  intent, marked copies, a commit): a reader finds it whole at the source or whole at
  the destination, and a crash mid-way is finished by the retry or stays invisible;
- rename of a file is the same for one entry (``filesystem.file_rename``): the file is
  at one end, never both, never neither; with overwrite a reader of the target sees the
  old file or the new one;
- a file is never under another file, nor where a directory is.

Every directory has a record: ``mkdirs`` writes it, and so does a create for each
directory above the file that has none, so that stat and the checks of a create read
records and never list (a coordinator trusts a directory it saw for a few seconds, so a
create in a busy directory reads none). Listing asks every peer for the records under
the directory (``Client.list_records``) and reads each child's record for its size and
time: O(children) reads, bounded in concurrency.

Retries: PUT and rename carry an operation id (``op``) that goes into the record's
value; a retry that finds its own op there answers as the first attempt would have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from filesystem.entries import (
    STAT_BYTES,
    Entry,
    Head,
    Marker,
    decode_entry,
    decode_head,
    encode_entry,
)
from filesystem.file_rename import rename_file
from filesystem.moves import (
    Intent,
    MoveRefused,
    Renames,
    StateCache,
    abort_rename,
    intent_key,
    rename_directory,
    settled_op,
)
from filesystem.reads import read_entry
from filesystem.uploads import upload
from ring import fs_api
from ring.client import Client
from ring.client.chunks import first_error
from ring.client.options import RecordValue
from ring.errors import (
    RecordConflict,
    RecordUnknown,
    SR3Error,
)
from ring.fs_api import ROOT, Stat

__all__ = ["BODY_PIECE_BYTES", "FsError", "Namespace"]

log = logging.getLogger(__name__)

# A compare-and-set that loses to a concurrent writer is retried this many times.
CAS_ATTEMPTS_MAX = 8
# Records deleted at once when deleting a directory.
CHILD_READS_MAX = 16
# Scans of one listing (pages of entries, or more when peers' pages end apart), and of
# one recursive delete (LIST_LIMIT_MAX entries each).
LIST_PAGES_MAX = 8
# Reads of one path whose record names a rename cleaned up meanwhile.
GONE_READS_MAX = 3
# Records a listing looks at under a subdirectory that has no record of its own.
IMPLIED_CHECK_RECORDS = 64
DELETE_PAGES_MAX = 100
# Directories a coordinator saw marked, trusted without reading again for this long
# (at most this many): creates in a hot directory check none of its ancestors. A
# directory deleted through another peer meanwhile can get a file under it without its
# record; listings still show it.
KNOWN_DIRECTORY_S = 5.0
KNOWN_DIRECTORIES_MAX = 4096
# Files of chunks (at most OPENED_EXTENTS_MAX each) a coordinator keeps the record of,
# by version, for readers' later blocks.
OPENED_FILES_MAX = 256
OPENED_EXTENTS_MAX = 4096
# The body is read in pieces of this size.
BODY_PIECE_BYTES = 256 * 1024


class FsError(SR3Error):
    """A request the namespace refuses: its HTTP status and error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _not_found(path: str) -> FsError:
    return FsError(404, "not_found", f"no such file or directory: {path}")


@dataclass(frozen=True, slots=True)
class _Found:
    """What the namespace holds at a path: a file (with its record), a directory, or
    nothing."""

    stat: Stat | None
    record: RecordValue | None = None
    entry: Entry | None = None
    # A record there that readers do not see (a directory rename's copy before its
    # commit, or its original after): writers take the path as free, at this version.
    hidden: RecordValue | None = None


class Namespace:
    """The file system operations, over a ring client."""

    def __init__(
        self,
        client: Client,
        wall_ms: Callable[[], int],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.wall_ms = wall_ms
        self.renames = Renames(client)
        self._monotonic = monotonic
        # Directories this coordinator saw marked, and when: creates under them skip the
        # checks of their ancestors for KNOWN_DIRECTORY_S.
        self._known: OrderedDict[str, float] = OrderedDict()
        # Files of many chunks read lately, by (path, version): a version is written once,
        # so a reader's next block needs no record read.
        self._opened: OrderedDict[tuple[str, int, str], tuple[Stat, Entry]] = OrderedDict()

    # -- reading ------------------------------------------------------------------------

    async def find(self, path: str) -> _Found:
        """The file or directory at ``path`` (one record read)."""
        if path == ROOT:
            return _Found(Stat(ROOT, "directory", 0, 0, 0))
        key = fs_api.path_key(path)
        record = await self.client.get_record(key)
        for _read in range(GONE_READS_MAX):
            if record is None:
                return _Found(None)
            renames = self.renames.cache()
            if not await renames.gone(decode_head(record.value[:STAT_BYTES]).marker):
                break
            # Its rename was cleaned up since the read: the record as it is now.
            again = await self.client.get_record(key)
            if again is not None and record.version == again.version:
                break  # a mark left by a rename that is gone: as if never committed
            record = again
        if record is None:
            return _Found(None)
        entry = await renames.shown(decode_entry(record.value))
        if entry is None:
            return _Found(None, hidden=record)
        stat = Stat(path, entry.type, entry.size, entry.mtime_ms, record.version, entry.checksum)
        if entry.type == "directory":
            return _Found(stat)
        return _Found(stat, record, entry)

    async def stat(self, path: str) -> Stat:
        found = await self.find(path)
        if found.stat is None:
            raise _not_found(path)
        return found.stat

    async def open(self, path: str, tag: tuple[int, str] | None = None) -> tuple[Stat, Entry, str]:
        """The file at ``path`` and its tag (``fs_api.file_tag``); with ``tag`` (a
        reader's later blocks, naming the version its first block came from), that
        version or 409 ``changed``: served from the files this coordinator read lately
        (settled reads only), without reading the record again."""
        if tag is not None:
            opened = self._opened.get((path, *tag))
            if opened is not None:
                self._opened.move_to_end((path, *tag))
                return (*opened, fs_api.file_tag(*tag))
        found = await self.find(path)
        if found.stat is None:
            raise _not_found(path)
        if found.entry is None or found.record is None:
            raise FsError(409, "is_directory", f"{path} is a directory")
        now = (found.record.version, found.record.op)
        if tag is not None and now != tag:
            raise FsError(409, "changed", f"{path} changed while it was read (now {now[0]})")
        blob = found.entry.blob
        if found.record.settled and blob is not None and len(blob.extents) <= OPENED_EXTENTS_MAX:
            self._opened[(path, *now)] = (found.stat, found.entry)
            while len(self._opened) > OPENED_FILES_MAX:
                self._opened.popitem(last=False)
        return found.stat, found.entry, fs_api.file_tag(*now)

    async def read(self, entry: Entry, offset: int, length: int) -> AsyncIterator[bytes]:
        """The bytes ``[offset, offset + length)`` of a file, piece by piece."""
        async for piece in read_entry(self.client, entry, offset, length):
            yield piece

    async def children(
        self, path: str, *, after: str = "", limit: int = fs_api.LIST_LIMIT_MAX
    ) -> tuple[list[Stat], bool, str]:
        """Up to ``limit`` direct children of the directory at ``path`` whose names sort
        after ``after`` (a name, or a name and "/": past that name and everything under
        it), by name; whether there are more, and the ``after`` to ask for them with: a
        scan of the records under it rolled up at the next "/" (one request per peer;
        records whose acceptors disagree are read). A directory implied by records under
        it without one of its own (left by a delete racing a create) is listed too. After
        ``LIST_PAGES_MAX`` scans it answers with what it found (possibly nothing, past a
        long run of deleted entries) and where to go on."""
        prefix = fs_api.entries_prefix(path)
        base = "" if path == ROOT else path
        # Names as the keys write them (fs_api.key_name): the scan's order and cursors.
        cursor = fs_api.key_name(after) if after else ""
        floor = cursor.rstrip("/")
        found: dict[str, Stat] = {}
        hidden: set[str] = set()
        renames = self.renames.cache()
        for _page in range(LIST_PAGES_MAX):
            scan = await self.client.scan_records(
                prefix, limit=limit, after=prefix + cursor if cursor else "", delimiter=True,
                head_bytes=STAT_BYTES,
            )  # fmt: skip
            for record in scan.records:
                name = record.key[len(prefix) :]
                head = decode_head(record.head)
                child = f"{base}/{fs_api.name_of_key(name)}"
                if await renames.gone(head.marker):
                    # Its rename was cleaned up since the scan: read it as it is now.
                    seen = await self.find(child)
                    if seen.stat is not None:
                        found[name] = seen.stat
                    else:
                        hidden.add(name)
                    continue
                if not await renames.visible(head.marker):
                    if not head.has_previous:
                        hidden.add(name)
                        continue
                    # A file a rename with overwrite is replacing: until it commits,
                    # the one it replaces, whose stat is in the record.
                    seen = await self.find(child)
                    if seen.stat is not None:
                        found[name] = seen.stat
                    continue
                found[name] = Stat(child, head.type, head.size, head.mtime_ms, record.version)
            implied = [r[len(prefix) : -1] for r in scan.prefixes]
            unknown = [n for n in implied if n not in found and n not in hidden]
            for name in await self._implied(unknown, prefix, renames):
                found[name] = Stat(f"{base}/{fs_api.name_of_key(name)}", "directory", 0, 0, 0)
            names = sorted(name for name in found if name > floor)
            if len(names) > limit:
                following = fs_api.name_of_key(names[limit - 1])
                return [found[name] for name in names[:limit]], True, following
            if not scan.truncated:
                return [found[name] for name in names], False, ""
            cursor = scan.last[len(prefix) :]
        names = sorted(n for n in found if n > floor)
        return [found[name] for name in names], True, fs_api.name_of_key(cursor)

    async def _implied(self, names: list[str], prefix: str, renames: StateCache) -> list[str]:
        """Of the subdirectories some peer holds live records under but that have no
        record of their own (a create that raced a recursive delete, or a peer that
        missed deletes), those under which a live, visible record is chosen."""
        slots = asyncio.Semaphore(CHILD_READS_MAX)
        live: list[str] = []

        async def one(name: str) -> None:
            async with slots:
                scan = await self.client.scan_records(
                    f"{prefix}{name}/", limit=IMPLIED_CHECK_RECORDS, head_bytes=STAT_BYTES
                )
            for record in scan.records:
                if await _shows(renames, decode_head(record.head)):
                    live.append(name)
                    return
            if scan.truncated:  # not known empty, so shown
                live.append(name)

        async with asyncio.TaskGroup() as group:
            for name in names:
                group.create_task(one(name))
        return live

    # -- changing -----------------------------------------------------------------------

    def _is_known(self, directory: str) -> bool:
        seen = self._known.get(directory)
        if seen is None or self._monotonic() - seen > KNOWN_DIRECTORY_S:
            self._known.pop(directory, None)
            return False
        return True

    def _note_known(self, directory: str) -> None:
        self._known[directory] = self._monotonic()
        self._known.move_to_end(directory)
        while len(self._known) > KNOWN_DIRECTORIES_MAX:
            self._known.popitem(last=False)

    def forget_known(self, path: str) -> None:
        for directory in [d for d in self._known if d == path or d.startswith(path + "/")]:
            del self._known[directory]

    async def make_parents(self, path: str) -> None:
        """Every directory above ``path`` is one: 409 "parent_is_file" where a file is,
        and a directory record made where none is, top down (so a directory is always
        marked, and only once the one above it is: stat and the checks here read one
        record, never list). A parent known or found to be a directory stands for the
        ones above it, so a create in a busy directory reads at most one record."""
        parts = fs_api.components(path)
        ancestors = ["/" + "/".join(parts[:depth]) for depth in range(1, len(parts))]
        if not ancestors or self._is_known(ancestors[-1]):
            return
        closest = await self.find(ancestors[-1])
        if closest.stat is not None and closest.stat.type == "directory":
            self._note_known(ancestors[-1])
            return
        unknown = [a for a in ancestors if not self._is_known(a)]
        found = await asyncio.gather(*(self.find(a) for a in unknown))
        for ancestor, seen in zip(unknown, found, strict=True):
            if seen.stat is not None and seen.stat.type == "file":
                raise FsError(409, "parent_is_file", f"{ancestor} is a file")
        for ancestor, seen in zip(unknown, found, strict=True):
            if seen.stat is None:
                await self._mark(ancestor)
            self._note_known(ancestor)

    async def _mark(self, directory: str) -> bool:
        """Write ``directory``'s record unless one is there; whether this wrote it
        (409 "parent_is_file" when a file is there)."""
        value = encode_entry(Entry("directory", 0, self.wall_ms()))
        key = fs_api.path_key(directory)
        for _attempt in range(CAS_ATTEMPTS_MAX):
            current = await self.client.get_record(key, include_deleted=True)
            shown = await self._shown(current)
            if shown is not None:
                if shown.type == "file":
                    raise FsError(409, "parent_is_file", f"{directory} is a file")
                return False
            if not await self.give_way(current):
                continue
            try:
                await self.client.put_record(
                    key, value, expected_version=0 if current is None else current.version
                )
            except (RecordConflict, RecordUnknown):
                continue
            return True
        raise FsError(503, "contention", f"{directory}: {CAS_ATTEMPTS_MAX} writers won")

    async def _shown(self, record: RecordValue | None) -> Entry | None:
        """What readers see of the entry ``record`` holds (renames' marks), if anything."""
        if record is None or record.deleted:
            return None
        return await self.renames.cache().shown(decode_entry(record.value))

    async def give_way(self, record: RecordValue | Marker | None) -> bool:
        """Before a record (or the entry of ``marker``) is replaced or deleted: the
        rename that marked it, if it is still copying, is aborted, so that it never
        commits a copy of a file changed meanwhile, nor over one written at its target.
        False when that rename committed first: what readers see there changed, and the
        caller reads it again."""
        marker = record
        if isinstance(record, RecordValue):
            marker = None if record.deleted else decode_head(record.value[:STAT_BYTES]).marker
        if not isinstance(marker, Marker):
            return True
        if await self.renames.state(marker.rename) != "copying":
            return True
        return await abort_rename(self, marker.rename)

    def _check_not_known_directory(self, path: str) -> None:
        if self._is_known(path):
            raise FsError(409, "is_directory", f"{path} is a directory")

    async def _store(self, path: str, entry: Entry, *, overwrite: bool, op: str) -> Stat:
        """Name ``entry`` at ``path``: a compare-and-set on the path's record, retried
        when a concurrent writer wins the version (``exists`` if it made a file there
        and ``overwrite`` is off; ``is_directory`` where a directory is). The first
        attempt creates, as if the path were new (most are: one round instead of a read
        and a round); a record it replaces gives way first (``give_way``)."""
        key = fs_api.path_key(path)
        value = encode_entry(entry)
        current: RecordValue | None = None
        for attempt in range(CAS_ATTEMPTS_MAX):
            if attempt > 0:
                current = await self.client.get_record(key, include_deleted=True)
                shown = await self._shown(current)
                if current is not None and current.op == op and shown is not None:
                    return _stat_of(path, current)
                if shown is not None:
                    if shown.type == "directory":
                        raise FsError(409, "is_directory", f"{path} is a directory")
                    if not overwrite:
                        raise FsError(409, "exists", f"{path} exists")
                if not await self.give_way(current):
                    continue
            expected = 0 if current is None else current.version
            try:
                version = await self.client.put_record(
                    key, value, expected_version=expected, refs=entry.refs, op=op
                )
            except (RecordConflict, RecordUnknown):
                continue  # read again: this op, another file, or a free version
            return Stat(path, "file", entry.size, entry.mtime_ms, version)
        raise FsError(503, "contention", f"{path}: {CAS_ATTEMPTS_MAX} concurrent writers won")

    async def create(
        self, path: str, body: AsyncIterator[bytes], *, overwrite: bool, op: str
    ) -> Stat:
        """Store the file ``body`` gives (its bytes, already bounded) at ``path``."""
        if path == ROOT:
            raise FsError(409, "is_directory", "the root is a directory")
        self._check_not_known_directory(path)
        await self.make_parents(path)
        entry = await upload(self.client, body, self.wall_ms)
        return await self._store(path, entry, overwrite=overwrite, op=op)

    async def delete(self, path: str, *, recursive: bool) -> int:
        """Remove the file or directory at ``path``; how many entries went."""
        if path == ROOT and not recursive:
            raise FsError(409, "not_empty", "the root is deleted only recursively")
        found = await self.find(path)
        if found.stat is None:
            return 0
        if found.record is not None:
            key = fs_api.path_key(path)
            return await self._delete_key(key, found.record.version, "file", found.record)
        prefix = fs_api.entries_prefix(path)
        if not recursive and await self.holds_anything(prefix):
            raise FsError(409, "not_empty", f"{path} is a directory that is not empty")
        self.forget_known(path)
        removed = 0
        slots = asyncio.Semaphore(CHILD_READS_MAX)

        async def one(key: str, version: int, head: Head) -> None:
            nonlocal removed
            async with slots:
                gone = await self._delete_key(key, version, head.type, head.marker)
            removed += gone

        # Page by page, each page past the last (its entries are gone before the next
        # is scanned), at most DELETE_PAGES_MAX pages: a bigger tree is deleted by
        # asking again.
        cursor = ""
        for _page in range(DELETE_PAGES_MAX):
            scan = await self.client.scan_records(
                prefix, limit=fs_api.LIST_LIMIT_MAX, after=cursor, head_bytes=STAT_BYTES,
            )  # fmt: skip
            try:
                async with asyncio.TaskGroup() as group:
                    for record in scan.records:
                        head = decode_head(record.head)
                        group.create_task(one(record.key, record.version, head))
            except BaseExceptionGroup as group_error:
                raise first_error(group_error) from None
            if not scan.truncated:
                break
            cursor = scan.last
        else:
            raise FsError(503, "too_large", f"{path}: deleted {removed} entries; delete again")
        if path != ROOT:
            key = fs_api.path_key(path)
            removed += await self._delete_key(key, found.stat.version, "directory")
        return max(removed, 1)

    async def holds_anything(self, prefix: str) -> bool:
        """Whether a live record is under ``prefix`` (past any run of deleted ones, up to
        ``LIST_PAGES_MAX`` pages: beyond that, taken as holding something)."""
        cursor = ""
        renames = self.renames.cache()
        for _page in range(LIST_PAGES_MAX):
            scan = await self.client.scan_records(
                prefix, limit=IMPLIED_CHECK_RECORDS, after=cursor, head_bytes=STAT_BYTES
            )
            for record in scan.records:
                if await _shows(renames, decode_head(record.head)):
                    return True
            if not scan.truncated:
                return False
            cursor = scan.last
        return True

    async def _delete_key(
        self, key: str, version: int, kind: str, marked: RecordValue | Marker | None = None
    ) -> int:
        """Delete ``key``, a ``kind`` ("file" or "directory") as read at ``version``
        (``marked``: the record, or its marker); when it changed meanwhile, read it again
        and delete what is there if it is still of that kind (a directory that replaced a
        file, or the reverse, is not what was asked to go)."""
        expected: int | None = version
        for _attempt in range(CAS_ATTEMPTS_MAX):
            if expected is None:
                current = await self.client.get_record(key)
                if current is None or decode_entry(current.value).type != kind:
                    return 0
                expected, marked = current.version, current
            if not await self.give_way(marked):
                expected = None
                continue
            try:
                await self.client.delete_record(key, expected_version=expected)
            except (RecordConflict, RecordUnknown):
                expected = None
                continue
            return 1
        raise FsError(503, "contention", f"{key}: {CAS_ATTEMPTS_MAX} concurrent writers won")

    async def rename(self, source: str, target: str, *, overwrite: bool, op: str) -> Stat:
        """Move the file at ``source`` to ``target`` (replacing it with ``overwrite``)."""
        if source == target:
            return await self.stat(source)
        if target == ROOT or fs_api.components(target)[: len(fs_api.components(source))] == (
            fs_api.components(source)
        ):
            raise FsError(409, "is_directory", f"{target} is the root or under {source}")
        done, found, intent = await asyncio.gather(
            self.client.get_record(fs_api.path_key(target), include_deleted=True),
            self.find(source),
            self.client.get_record(intent_key(op)),
        )
        try:
            if intent is not None and Intent.decode(intent.value).kind == "file":
                return await rename_file(self, source, target, intent, op=op, overwrite=overwrite)
            if (
                intent is None
                and done is not None
                and not done.deleted
                and done.op == settled_op(op, source, target, fs_api.path_key(target))
                and decode_entry(done.value).type == "file"
            ):
                return _stat_of(target, done)  # a retry of a rename that went through
            if found.record is None or found.entry is None:  # a directory, or nothing
                exists = found.stat is not None
                return await rename_directory(
                    self, source, target, exists, op=op, overwrite=overwrite
                )
            self._check_not_known_directory(target)
            await self.make_parents(target)
            return await rename_file(
                self, source, target, None, op=op, overwrite=overwrite,
                known=(found.record, done),
            )  # fmt: skip
        except MoveRefused as refused:
            raise FsError(refused.status, refused.code, str(refused)) from None

    async def mkdirs(self, path: str) -> bool:
        """Make ``path`` a directory (its parents are implied); False if it was one."""
        if path == ROOT:
            return False
        await self.make_parents(path)
        found = await self.find(path)
        if found.stat is not None:
            if found.stat.type == "file":
                raise FsError(409, "parent_is_file", f"{path} is a file")
            return False
        made = await self._mark(path)
        self._note_known(path)
        return made


def _stat_of(path: str, record: RecordValue) -> Stat:
    entry = decode_entry(record.value)
    return Stat(path, "file", entry.size, entry.mtime_ms, record.version)


async def _shows(renames: StateCache, head: Head) -> bool:
    """Whether readers see an entry (itself, or the one it replaces) in the record whose
    first bytes are ``head``."""
    if head.has_previous or await renames.gone(head.marker):
        return True  # the one it replaces, or one read again would show (taken as there)
    return await renames.visible(head.marker)
