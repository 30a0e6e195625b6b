"""The sweep of renames nobody finishes (``filesystem.sweep``): a rename whose coordinator
stopped and whose client never retried is aborted (if it had not committed) or cleaned
up (if it had), so no intent and no mark stays behind.

What it breaks: a file rename (with and without overwrite) and a directory rename cut
after each of their writes in turn, never retried, then swept; a rename too young to be
taken as abandoned; and the peers' own sweep, on a ring whose peers sweep every second.
Must hold: after the sweep the file or tree is at exactly one end (the source when the
rename had not committed, the target when it had), read and listed through other peers;
no record of either end holds a mark or a previous entry; the intent is gone; and both
ends take new writes. A young rename is left alone, and its retry finishes it.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time

import pytest
from support import MakeCluster, cut_rename, fs_rename, wall_ms, where_renamed

from filesystem.entries import decode_entry
from filesystem.moves import intent_key
from filesystem.namespace import Namespace
from filesystem.sweep import sweep_renames
from ring import fs_api
from ring.client import Client
from spark_connector.fs_client import FsClient
from sr3.local import LocalCluster

# The writes of a file rename: intent, two marks, commit, two clean-ups, intent gone.
FILE_RENAME_WRITES = 7
# A directory of this many files: intent, a mark and a copy per entry (directory
# included), commit, a clean-up write per copy and per original, intent gone.
TREE_FILES = 3
DIRECTORY_RENAME_WRITES = 1 + 2 * (TREE_FILES + 1) + 1 + 2 * (TREE_FILES + 1) + 1
SWEPT_WITHIN_S = 60.0
POLL_S = 0.2


async def _everything(_key: str) -> bool:
    return True


async def _unmarked(client: Client, paths: list[str]) -> None:
    """No record of ``paths`` holds a rename's mark or a replaced file."""
    for path in paths:
        record = await client.get_record(fs_api.path_key(path))
        if record is not None:
            entry = decode_entry(record.value)
            assert entry.marker is None and entry.previous is None, (path, entry)


@pytest.mark.parametrize("overwrite", [False, True])
async def test_the_sweep_finishes_a_file_rename_cut_after_any_write(
    ring: LocalCluster, rng: random.Random, overwrite: bool
) -> None:
    root = f"/tests/sweep-{rng.randrange(10**12)}"
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[1:3], ring.secret) as fs,
    ):
        sweeper = Namespace(client, wall_ms)
        for cut_at in range(FILE_RENAME_WRITES - 1):
            source, target = f"{root}/{cut_at}/part.tmp", f"{root}/{cut_at}/part"
            data, old = rng.randbytes(rng.randrange(1, 3000)), b"old file"
            await fs.write(source, data)
            if overwrite:
                await fs.write(target, old)
            op = secrets.token_hex(12)
            await cut_rename(
                client, source, target, op, cut_at=cut_at, when="after", overwrite=overwrite
            )
            before = await where_renamed(fs, source, target, data, old if overwrite else None)
            assert await sweep_renames(sweeper, abandoned_after_ms=0, owns=_everything) >= 1
            assert await client.get_record(intent_key(op)) is None, cut_at
            await _unmarked(client, [source, target])
            after = await where_renamed(fs, source, target, data, old if overwrite else None)
            # Committed (cut after the commit, write 3): at the target; else at the source.
            assert after == before == ((False, True) if cut_at >= 3 else (True, False)), cut_at
            if overwrite and not after[1]:
                assert await fs.read(target) == old
            await fs.write(target, b"written over", overwrite=True)
            assert await fs.read(target) == b"written over"


async def test_the_sweep_finishes_a_directory_rename_cut_after_any_write(
    ring: LocalCluster, rng: random.Random
) -> None:
    root = f"/tests/sweep-{rng.randrange(10**12)}"
    names = [f"f{index}" for index in range(TREE_FILES)]
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[3:5], ring.secret) as fs,
    ):
        sweeper = Namespace(client, wall_ms)
        for cut_at in range(DIRECTORY_RENAME_WRITES - 1):
            source, target = f"{root}/{cut_at}/a", f"{root}/{cut_at}/b"
            for name in names:
                await fs.write(f"{source}/{name}", name.encode())
            op = secrets.token_hex(12)
            await cut_rename(client, source, target, op, cut_at=cut_at, when="after")
            state = await sweeper.renames.state(op)
            assert await sweep_renames(sweeper, abandoned_after_ms=0, owns=_everything) >= 1
            assert await client.get_record(intent_key(op)) is None, cut_at
            ends = [source, target] + [
                f"{end}/{name}" for end in (source, target) for name in names
            ]
            await _unmarked(client, ends)
            at, gone = (target, source) if state == "committed" else (source, target)
            assert not await fs.exists(gone), (cut_at, state)
            assert sorted(entry.name for entry in await fs.list(at)) == names, (cut_at, state)
            for name in names:
                assert await fs.read(f"{at}/{name}") == name.encode()
            await fs.write(f"{gone}/new", b"new")


async def test_a_rename_younger_than_the_age_is_left_to_its_retry(
    ring: LocalCluster, rng: random.Random
) -> None:
    root = f"/tests/sweep-{rng.randrange(10**12)}"
    source, target = f"{root}/a.tmp", f"{root}/a"
    op = secrets.token_hex(12)
    async with (
        Client(ring.ring, ring.secret) as client,
        FsClient(ring.cluster.addresses[0], ring.secret) as fs,
    ):
        await fs.write(source, b"renamed")
        await cut_rename(client, source, target, op, cut_at=1, when="after")
        sweeper = Namespace(client, wall_ms)
        await sweep_renames(sweeper, abandoned_after_ms=3_600_000, owns=_everything)
        assert await sweeper.renames.state(op) == "copying"
        await fs_rename(fs, source, target, op)
        assert await where_renamed(fs, source, target, b"renamed") == (False, True)


async def test_peers_sweep_renames_nobody_finishes(
    make_cluster: MakeCluster,
) -> None:
    """The peers' own sweep (``sr3 peer --rename-sweep-interval``): a cut rename's intent
    goes, and its file stays at the source, with no one calling the sweep."""
    flags = ("--rename-sweep-interval", "1", "--rename-abandoned-after", "0")
    cluster = make_cluster(3, replication=3, peer_flags=flags)
    source, target = "/tests/sweep/a.tmp", "/tests/sweep/a"
    op = secrets.token_hex(12)
    async with (
        Client(cluster.ring, cluster.secret) as client,
        FsClient(cluster.cluster.addresses[2], cluster.secret) as fs,
    ):
        await fs.write(source, b"renamed")
        await cut_rename(client, source, target, op, cut_at=2, when="after")
        deadline = time.monotonic() + SWEPT_WITHIN_S
        while await client.get_record(intent_key(op)) is not None:
            assert time.monotonic() < deadline, "no peer swept the rename"
            await asyncio.sleep(POLL_S)
        await _unmarked(client, [source, target])
        assert await where_renamed(fs, source, target, b"renamed") == (True, False)
