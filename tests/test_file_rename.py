"""File rename in the ``sr3://`` namespace (``filesystem.file_rename``): the file is at
its source or at its target, never both and never neither, wherever the request is cut.

What it breaks: a rename's coordinator stopped after each of its writes (before the
write goes out, or after it landed and before its answer came back), then read through
other peers, then retried with the same operation id or never retried; readers of a
target replaced with overwrite while it is replaced; writers of either end while a
rename of it hangs half-way.

The cut is made in the coordinator's ring client (a namespace over the shared ring whose
client stops at the Nth write): that is the point the test is about, and a SIGKILL of a
peer cannot be timed to one write of a rename of a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from support import Cut, CutClient, WritesClient, cut_rename, fs_rename, wall_ms, where_renamed

from filesystem.entries import decode_entry
from filesystem.moves import intent_key
from filesystem.namespace import FsError, Namespace
from ring import fs_api
from ring.client import Client
from ring.errors import NotFound
from spark_connector.fs_client import FsClient, FsRefused
from sr3.local import LocalCluster

# The writes of a file rename: intent, two marks, commit, two clean-ups, intent gone.
RENAME_WRITES = 7
READS_WHILE_REPLACED_MIN = 10


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("overwrite", [False, True])
async def test_a_rename_cut_after_any_write_leaves_the_file_at_one_end(
    ring: LocalCluster, rng: random.Random, when: Literal["before", "after"], overwrite: bool
) -> None:
    """Breaks: a file rename (onto a free path, or with overwrite onto a file) whose
    coordinator stops before or after each of its writes in turn. Must hold: read and
    listed through another peer, the file is at exactly one end (the target holds the
    old file or the new one, never neither); a retry with the same op finishes the
    rename; with no retry, a new rename of the file and a write of the target both
    work."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[1:3], ring.secret) as fs,
    ):
        for cut_at in range(RENAME_WRITES + 1):
            source, target = f"{root}/{cut_at}/part.tmp", f"{root}/{cut_at}/part"
            data, old = rng.randbytes(rng.randrange(1, 3000)), b"old file"
            await fs.write(source, data)
            if overwrite:
                await fs.write(target, old)
            op = secrets.token_hex(12)
            cut = CutClient(client, cut_at, when)
            namespace = Namespace(cut, wall_ms)  # type: ignore[arg-type]
            try:
                await namespace.rename(source, target, overwrite=overwrite, op=op)
                finished = True
            except Cut:
                finished = False
            assert finished == (cut_at >= RENAME_WRITES), (cut_at, cut.writes)
            before = old if overwrite else None
            at_source, at_target = await where_renamed(fs, source, target, data, before)
            assert at_source != at_target, (cut_at, when, at_source, at_target)
            if cut_at % 2 == 0:
                await fs_rename(fs, source, target, op, overwrite=overwrite)
                assert await where_renamed(fs, source, target, data) == (False, True)
            elif at_source:
                await fs.rename(source, f"{source}.again")
                assert await fs.read(f"{source}.again") == data
                await fs.write(target, b"written over", overwrite=True)
                assert await fs.read(target) == b"written over"
                assert not await fs.exists(source)
            else:
                await fs.write(target, b"written over", overwrite=True)
                assert await fs.read(target) == b"written over"
                assert not await fs.exists(source)


async def test_readers_of_a_target_replaced_with_overwrite_see_the_old_or_new_file(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a target read over and over through two other peers while files are
    renamed onto it with overwrite, one after another. Must hold: every read returns the
    old file or the new one (never 404, never bytes of neither), and once the rename
    answers, the new one."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    target = f"{root}/final"
    contents = [f"version {index}".encode() * rng.randrange(1, 50) for index in range(6)]
    async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
        await fs.write(target, contents[0])
        done = asyncio.Event()
        seen: list[int] = []

        async def reader(address: str) -> None:
            async with FsClient(address, ring.secret) as other:
                while not done.is_set():
                    seen.append(contents.index(await other.read(target)))

        readers = [asyncio.create_task(reader(a)) for a in ring.cluster.addresses[3:5]]
        for index, data in enumerate(contents[1:], start=1):
            await fs.write(f"{root}/tmp-{index}", data)
            await fs.rename(f"{root}/tmp-{index}", target, overwrite=True)
            assert await fs.read(target) == data
        done.set()
        await asyncio.gather(*readers)
    assert len(seen) >= READS_WHILE_REPLACED_MIN, len(seen)


@pytest.mark.parametrize("writer", ["create-target", "overwrite-source", "delete-source"])
async def test_a_write_of_either_end_stops_a_rename_left_half_way(
    ring: LocalCluster, rng: random.Random, writer: str
) -> None:
    """Breaks: a rename cut after its marks (intent copying, source marked, copy written
    hidden at the target), then a create of the target, an overwrite of the source or a
    delete of the source through another peer, then the rename's retry. Must hold: the
    write works as on files no rename touches and aborts the rename, whose retry is
    refused (409 changed): it never commits a copy of a file changed meanwhile, nor over
    a file written at its target."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    source, target = f"{root}/a.tmp", f"{root}/a"
    op = secrets.token_hex(12)
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[2], ring.secret) as fs,
    ):
        await fs.write(source, b"renamed")
        await cut_rename(client, source, target, op, cut_at=3, when="before")
        assert await where_renamed(fs, source, target, b"renamed") == (True, False)
        if writer == "create-target":
            await fs.write(target, b"created")
        elif writer == "overwrite-source":
            await fs.write(source, b"rewritten", overwrite=True)
        else:
            assert await fs.delete(source)
        assert await Namespace(client, wall_ms).renames.state(op) == "aborted"
        with pytest.raises(FsRefused) as refused:
            await fs_rename(fs, source, target, op)
        assert refused.value.code == "changed"
        expected = {
            "create-target": (b"renamed", b"created"),
            "overwrite-source": (b"rewritten", None),
            "delete-source": (None, None),
        }[writer]
        for path, data in zip((source, target), expected, strict=True):
            if data is None:
                assert not await fs.exists(path)
            else:
                assert await fs.read(path) == data


class InterposedClient(WritesClient):
    """A ring client that runs ``step`` just before its ``at``-th write (from 0): another
    writer acting between two writes of a rename."""

    def __init__(self, client: Client, at: int, step: Callable[[], Awaitable[None]]) -> None:
        super().__init__(client)
        self._at = at
        self._step = step

    async def _write(self, index: int, send: Callable[[], Awaitable[int]]) -> int:
        if index == self._at:
            await self._step()
        return await send()


async def test_a_rename_whose_target_is_written_before_its_commit_is_refused_and_undone(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a create of the target through another peer lands between a rename's
    marks and its commit (the rename still running). Must hold: the create wins and the
    rename is refused (409 changed) without committing; the rename cleans up after
    itself: the source is unmarked and whole, no intent is left."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    source, target = f"{root}/a.tmp", f"{root}/a"
    op = secrets.token_hex(12)
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[4], ring.secret) as fs,
    ):
        await fs.write(source, b"renamed")

        async def create_target() -> None:
            await fs.write(target, b"created")

        namespace = Namespace(InterposedClient(client, 3, create_target), wall_ms)  # type: ignore[arg-type]
        with pytest.raises(FsError) as refused:
            await namespace.rename(source, target, overwrite=False, op=op)
        assert refused.value.code == "changed"
        assert await fs.read(source) == b"renamed"
        assert await fs.read(target) == b"created"
        assert await client.get_record(intent_key(op)) is None
        record = await client.get_record(fs_api.path_key(source))
        assert record is not None and decode_entry(record.value).marker is None


async def test_a_reader_racing_the_clean_up_still_finds_the_file(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a reader reads the target's record while it still holds a committed
    rename's mark, then the rename's clean-up (mark cleared, intent dropped) runs before
    the reader looks the intent up. Must hold: the reader finds the file (it reads the
    record again), not nothing."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    source, target = f"{root}/a.tmp", f"{root}/a"
    op = secrets.token_hex(12)
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[3], ring.secret) as fs,
    ):
        await fs.write(source, b"renamed")
        # Committed, not cleaned up.
        await cut_rename(client, source, target, op, cut_at=4, when="before")
        finished: list[bool] = []

        class Racing:
            """The reader's ring client: the rename finishes (its retry) just before
            the reader's first lookup of the intent."""

            def __getattr__(self, name: str) -> Any:
                return getattr(client, name)

            async def get_record(self, key: str, **options: Any) -> Any:
                if key == intent_key(op) and not finished:
                    finished.append(True)
                    await fs_rename(fs, source, target, op)
                return await client.get_record(key, **options)

        reader = Namespace(Racing(), wall_ms)  # type: ignore[arg-type]
        stat = await reader.stat(target)
        assert (stat.type, stat.size) == ("file", len(b"renamed"))
        assert finished == [True]


async def test_a_rename_onto_a_directory_or_without_overwrite_writes_nothing(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Must hold: a file renamed onto a directory, or onto a file without overwrite, is
    refused before any write (no intent is left behind), and both ends stay as they
    were."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    async with Client(ring.ring, ring.secret) as client:
        cut = CutClient(client, 0, "before")
        namespace = Namespace(cut, wall_ms)  # type: ignore[arg-type]
        async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
            await fs.write(f"{root}/f", b"file")
            await fs.write(f"{root}/other", b"other")
            await fs.mkdirs(f"{root}/dir")
            for target, code in ((f"{root}/dir", "is_directory"), (f"{root}/other", "exists")):
                with pytest.raises(FsError) as refused:
                    op = secrets.token_hex(12)
                    await namespace.rename(f"{root}/f", target, overwrite=False, op=op)
                assert refused.value.code == code
            assert cut.writes == 0
            assert await fs.read(f"{root}/f") == b"file"
            assert await fs.read(f"{root}/other") == b"other"


async def test_a_rename_is_done_only_when_that_rename_moved_the_file(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a client that reuses an operation id: a file written with op X, then a
    rename onto it with op X; a rename finished with op Y, then another source renamed
    onto the same target with op Y; a directory rename finished with op Z, then a
    missing directory renamed to its destination with op Z (each was answered 200, "done
    already", and moved nothing). Must hold: each is a rename of its own: refused 409
    "exists" onto a file without overwrite, moved with it (an op never used for a
    rename), refused 409 "changed" for an op whose rename ended, 404 for a missing
    source; a true retry (same op, source and target) is still answered as done."""
    root = f"/tests/fmv-{rng.randrange(10**12)}"
    reused = secrets.token_hex(12)
    async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
        put = fs_api.fs_path(fs_api.FS_WRITE, f"{root}/target") + f"?op={reused}"
        await fs._request("PUT", put, body=b"written with the op")
        await fs.write(f"{root}/source", b"source")
        with pytest.raises(FsRefused) as refused:
            await fs_rename(fs, f"{root}/source", f"{root}/target", reused)
        assert refused.value.code == "exists", refused.value
        await fs_rename(fs, f"{root}/source", f"{root}/target", reused, overwrite=True)
        assert await fs.read(f"{root}/target") == b"source"
        assert not await fs.exists(f"{root}/source")

        op = secrets.token_hex(12)
        await fs.write(f"{root}/a", b"a")
        await fs_rename(fs, f"{root}/a", f"{root}/b", op)
        assert (await fs_rename(fs, f"{root}/a", f"{root}/b", op)).size == 1  # the retry
        await fs.write(f"{root}/c", b"cc")
        for overwrite, code in ((False, "exists"), (True, "changed")):
            with pytest.raises(FsRefused) as refused:
                await fs_rename(fs, f"{root}/c", f"{root}/b", op, overwrite=overwrite)
            assert refused.value.code == code, refused.value
        assert await fs.read(f"{root}/b") == b"a"
        assert await fs.read(f"{root}/c") == b"cc"

        op = secrets.token_hex(12)
        await fs.write(f"{root}/d1/f", b"f")
        await fs_rename(fs, f"{root}/d1", f"{root}/d2", op)
        assert (await fs_rename(fs, f"{root}/d1", f"{root}/d2", op)).type == "directory"
        with pytest.raises(NotFound):
            await fs_rename(fs, f"{root}/d3", f"{root}/d2", op)
        assert await fs.read(f"{root}/d2/f") == b"f"


def test_cut_client_stops_where_it_is_told() -> None:
    """The test's own cut: it must stop at the write it names, before or after it."""

    class Writes:
        def __init__(self) -> None:
            self.done: list[int] = []

        async def put_record(self, value: int) -> int:
            self.done.append(value)
            return value

    async def run(when: Literal["before", "after"]) -> list[int]:
        inner = Writes()
        cut = CutClient(inner, 2, when)  # type: ignore[arg-type]
        for value in range(5):
            with contextlib.suppress(Cut):
                await cut.put_record(value)
        return inner.done

    assert asyncio.run(run("before")) == [0, 1]
    assert asyncio.run(run("after")) == [0, 1, 2]
