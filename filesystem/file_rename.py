"""File rename: the file is at its source or at its target, never both and never
neither, whatever point the request is cut at.

A rename of one file changes two records (the source's and the target's), so it cannot
be one write. It is a directory rename (``filesystem.moves``) of a tree of one entry,
written for that one entry so that it costs as few rounds as it can:

1. **Intent**: ``fsx/renames/<op>`` says ``copying`` (kind ``file``).
2. **Marks**, both at once: the source rewritten *outgoing*, the file written at the
   target *incoming*. Before the commit readers see the source and not the copy. A
   rename with overwrite onto a file writes the copy with that file as its *previous*
   entry (``filesystem.entries``), which readers see until the commit: the target holds
   the old file or the new one, never neither.
3. **Commit**: the intent's compare-and-set to ``committed`` is the instant the file
   moves.
4. **Clean-up**, both at once: the target's mark (and previous entry) cleared, the source
   deleted; then the intent goes.

Six rounds where writing the target and deleting the source took three; what they buy: a
request cut at any point (its coordinator dead, its client gone) leaves the file at one
end. A retry with the same op goes on from where the first attempt stopped; a rename
never retried stays at its source (its hidden copy is replaced by the next write of the
target, which aborts it first: ``Namespace.give_way``), until the peers' sweep
(``filesystem.sweep``) aborts it and cleans up.

Writers that meet a mark give way the same way: a create, overwrite, delete or rename of
a marked record aborts its rename first if it is still copying, so a rename never
commits a copy of a file that was changed or deleted meanwhile, nor over one written at
its target.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from filesystem.entries import Entry, Marker, decode_entry, encode_entry
from filesystem.moves import Move, MoveRefused, Placed, abort_rename, start_move, step_op
from ring import fs_api
from ring.client.options import RecordValue
from ring.errors import RecordConflict, RecordUnknown
from ring.fs_api import Stat

if TYPE_CHECKING:
    from filesystem.namespace import Namespace

__all__ = ["rename_file"]

# A mark's compare-and-set that loses to a concurrent writer is tried again this many
# times (each after reading the record again).
MARK_ATTEMPTS_MAX = 8


async def rename_file(
    ns: Namespace,
    source: str,
    target: str,
    intent: RecordValue | None,
    *,
    op: str,
    overwrite: bool,
    known: tuple[RecordValue | None, RecordValue | None] | None = None,
) -> Stat:
    """Move the file at ``source`` to ``target`` (replacing a file there with
    ``overwrite``), or go on with the rename ``op`` started (``intent``: its intent
    record as just read, None when there is none); the stat of ``target``. ``known``:
    the source's and the target's records (tombstones included) as just read, taken
    for the first attempt of the marks instead of reading them again."""
    if intent is None and known is not None:
        await _refuse_target(ns, target, known[1], overwrite=overwrite)
    move = await start_move(ns, source, target, intent, op=op, kind="file")
    if move.intent.state == "copying":
        try:
            # Both to the end (neither cancelled half-way), then the first failure.
            outcomes = await asyncio.gather(
                _mark_source(ns, move, None if known is None else known[0]),
                _copy_to_target(ns, move, overwrite=overwrite, known=known),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            marked, copied = cast("tuple[Placed, Placed]", outcomes)
            if marked.entry.settled() != copied.entry.settled():
                # The source changed between the copy's read and the mark: copy what
                # was marked (it stays as it is until this rename commits or aborts).
                moving = marked.entry.settled()
                copied = await _copy_to_target(ns, move, overwrite=overwrite, moving=moving)
        except MoveRefused:
            if await abort_rename(ns, op):
                move.intent, move.version = replace(move.intent, state="aborted"), 0
                move.outgoing = move.incoming = None
                await move.settle()
            raise
        move.outgoing, move.incoming = [marked], [copied]
        await move.commit()
    elif move.intent.state == "aborted":
        await move.settle()
        raise MoveRefused(409, "changed", f"the rename of {source} was abandoned; rename again")
    await move.settle()
    version = move.settled.get(target)
    if version is not None and move.incoming:
        entry = move.incoming[0].entry
        return Stat(target, "file", entry.size, entry.mtime_ms, version)
    return await ns.stat(target)


async def _mark_source(ns: Namespace, move: Move, known: RecordValue | None) -> Placed:
    """Rewrite the source outgoing (the entry readers see there, marked); what it wrote.
    ``known``: the source's record as just read, for the first attempt."""
    key = fs_api.path_key(move.intent.source)
    mark = Marker("outgoing", move.op)
    for attempt in range(MARK_ATTEMPTS_MAX):
        record = known if attempt == 0 and known else await ns.client.get_record(key)
        entry = None if record is None else decode_entry(record.value)
        if record is not None and entry is not None and entry.marker == mark:
            return Placed(move.intent.source, record.version, entry)
        shown = None if entry is None else await ns.renames.cache().shown(entry)
        if record is None or shown is None:
            raise MoveRefused(404, "not_found", f"no such file or directory: {move.intent.source}")
        if shown.type != "file":
            raise MoveRefused(409, "changed", f"{move.intent.source} became a directory")
        if not await ns.give_way(record):
            continue  # the rename that marked it committed meanwhile: read it again
        placed = await _place(ns, move, move.intent.source, replace(shown.settled(), marker=mark),
                              expected_version=record.version)  # fmt: skip
        if placed is not None:
            return placed
    raise MoveRefused(503, "contention", f"{move.intent.source}: {MARK_ATTEMPTS_MAX} writers won")


async def _copy_to_target(
    ns: Namespace,
    move: Move,
    *,
    overwrite: bool,
    moving: Entry | None = None,
    known: tuple[RecordValue | None, RecordValue | None] | None = None,
) -> Placed:
    """Write the source's file (``moving``, or as read) at the target, incoming (over the
    file there, as its previous entry, with ``overwrite``); what it wrote. ``known``:
    both records as just read, for the first attempt."""
    source_key, key = fs_api.path_key(move.intent.source), fs_api.path_key(move.intent.target)
    mark = Marker("incoming", move.op)
    for attempt in range(MARK_ATTEMPTS_MAX):
        if attempt == 0 and known is not None:
            found, current = known
        else:
            found, current = await asyncio.gather(
                _none() if moving is not None else ns.client.get_record(source_key),
                ns.client.get_record(key, include_deleted=True),
            )
        there = None if current is None or current.deleted else decode_entry(current.value)
        ours = there is not None and there.marker == mark
        if ours and there is not None and (moving is None or there.settled() == moving):
            assert current is not None
            return Placed(move.intent.target, current.version, there)
        copying = moving or await _moving(ns, found, move)
        previous: Entry | None = None
        if ours and there is not None:
            previous = there.previous  # copied by this rename before, as another file
        elif there is not None:
            previous = await _refuse_target(ns, move.intent.target, current, overwrite=overwrite)
            if not await ns.give_way(current):
                continue
        copied = replace(copying, marker=mark, previous=previous)
        expected = 0 if current is None else current.version
        placed = await _place(ns, move, move.intent.target, copied, expected_version=expected)
        if placed is not None:
            return placed
    raise MoveRefused(503, "contention", f"{move.intent.target}: {MARK_ATTEMPTS_MAX} writers won")


async def _place(
    ns: Namespace, move: Move, path: str, entry: Entry, *, expected_version: int
) -> Placed | None:
    """Write the marked ``entry`` at ``path`` (its mark names the step); None when a
    concurrent writer won the version (the caller reads it again)."""
    key = fs_api.path_key(path)
    assert entry.marker is not None
    try:
        version = await ns.client.put_record(
            key, encode_entry(entry), expected_version=expected_version, refs=entry.refs,
            op=step_op(move.op, entry.marker.kind, key),
        )  # fmt: skip
    except (RecordConflict, RecordUnknown):
        return None
    return Placed(path, version, entry)


async def _refuse_target(
    ns: Namespace, target: str, current: RecordValue | None, *, overwrite: bool
) -> Entry | None:
    """The file a rename replaces at ``target`` (``current``: its record), if any;
    refused where a directory is, or a file and not ``overwrite``."""
    there = None if current is None or current.deleted else decode_entry(current.value)
    shown = None if there is None else await ns.renames.cache().shown(there)
    if shown is None:
        return None
    if shown.type == "directory":
        raise MoveRefused(409, "is_directory", f"{target} is a directory")
    if not overwrite:
        raise MoveRefused(409, "exists", f"{target} exists")
    return shown.settled()


async def _moving(ns: Namespace, found: RecordValue | None, move: Move) -> Entry:
    """The file that moves, as the source's record holds it (marked by this rename or
    not yet): unmarked, with no previous entry."""
    entry = None if found is None else decode_entry(found.value)
    if entry is not None and entry.marker != Marker("outgoing", move.op):
        entry = await ns.renames.cache().shown(entry)
    if entry is None:
        raise MoveRefused(404, "not_found", f"no such file or directory: {move.intent.source}")
    if entry.type != "file":
        raise MoveRefused(409, "changed", f"{move.intent.source} became a directory")
    return entry.settled()


async def _none() -> None:
    return None
