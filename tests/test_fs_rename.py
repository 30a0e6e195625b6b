"""Directory rename in the ``sr3://`` namespace (``filesystem.moves``): the destination
appears whole or not at all, and a rename cut short by its coordinator's death is
completed by the retry or stays invisible.

What it breaks: readers listing both trees while the rename runs; the coordinating peer
SIGKILLed at random points of the rename (the client's retry goes to another peer with
the same operation id); a rename abandoned with no retry, then renamed again.
"""

from __future__ import annotations

import asyncio
import random
import secrets

import pytest
from support import fs_rename

from filesystem.entries import INLINE_BYTES_MAX
from ring.errors import NotFound, PeerUnavailable
from spark_connector.fs_client import FsClient, FsRefused
from sr3.local import LocalCluster

pytestmark = pytest.mark.slow

TREE_FILES = 24
KILL_ROUNDS = 4
READER_LISTINGS_MAX = 400


def _tree(rng: random.Random) -> dict[str, bytes]:
    """Relative path -> bytes: nested directories, small files and one of chunks."""
    files = {
        f"part-{index:05d} é/{'sub/' if index % 3 == 0 else ''}data-{index}.parquet": (
            rng.randbytes(rng.randrange(1, 5000))
        )
        for index in range(TREE_FILES)
    }
    files["big/blob.bin"] = rng.randbytes(INLINE_BYTES_MAX * 2 + 17)
    return files


async def _write_tree(fs: FsClient, root: str, files: dict[str, bytes]) -> None:
    await asyncio.gather(*(fs.write(f"{root}/{name}", data) for name, data in files.items()))


async def _walk(fs: FsClient, root: str) -> dict[str, int]:
    """Relative path -> size of every file under ``root`` (empty when it is absent)."""
    found: dict[str, int] = {}
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = await fs.list(directory)
        except NotFound:
            continue
        for entry in entries:
            if entry.type == "directory":
                pending.append(entry.path)
            else:
                found[entry.path[len(root) + 1 :]] = entry.size
    return found


async def test_a_directory_tree_moves_whole_and_reads_back_from_every_peer(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a tree of nested directories, small files and a file of chunks renamed.
    Must hold: every file is at the destination with its bytes, read from every peer;
    nothing is left at the source; a retry of the rename (its op) after it went through
    answers with the directory's stat; a second rename of the gone source is 404; a
    rename onto an existing directory is refused (409 exists), and with overwrite it
    replaces an empty one."""
    root = f"/tests/mv-{rng.randrange(10**12)}"
    files = _tree(rng)
    async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
        await _write_tree(fs, f"{root}/_temporary/attempt_1", files)
        await fs.mkdirs(f"{root}/out")
        with pytest.raises(FsRefused) as refused:
            await fs.rename(f"{root}/_temporary/attempt_1", f"{root}/out")
        assert refused.value.code == "exists"
        op = secrets.token_hex(12)
        stat = await fs_rename(
            fs, f"{root}/_temporary/attempt_1", f"{root}/out", op, overwrite=True
        )
        assert stat.type == "directory"
        # The client's retry of it, after it went through, answers as it did.
        again = await fs_rename(
            fs, f"{root}/_temporary/attempt_1", f"{root}/out", op, overwrite=True
        )
        assert (again.type, again.path) == ("directory", f"{root}/out")
        with pytest.raises(NotFound):
            await fs.rename(f"{root}/_temporary/attempt_1", f"{root}/again")
        assert await _walk(fs, f"{root}/_temporary") == {}
    for address in ring.cluster.addresses:
        async with FsClient(address, ring.secret) as fs:
            assert await _walk(fs, f"{root}/out") == {k: len(v) for k, v in files.items()}
            for name in [*rng.sample(sorted(files), 4), "big/blob.bin"]:
                assert await fs.read(f"{root}/out/{name}") == files[name]


async def test_readers_see_a_renamed_tree_whole_at_one_place_or_the_other(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: readers list the source and the destination over and over while the tree
    moves. Must hold: one listing of either directory shows all its entries or none; a
    walk of the destination (many listings) finds every file or none; and when a walk of
    the source misses a file (the rename committed during it), a walk of the
    destination right after finds them all: the tree is never lost between the two."""
    root = f"/tests/mv-{rng.randrange(10**12)}"
    files = _tree(rng)
    expected = {k: len(v) for k, v in files.items()}
    tops = {name.split("/")[0] for name in files}
    source, target = f"{root}/a", f"{root}/b"
    walks = 0
    async with FsClient(ring.cluster.addresses[1], ring.secret) as fs:
        await _write_tree(fs, source, files)
        done = asyncio.Event()

        async def listed(client: FsClient, directory: str) -> set[str]:
            try:
                return {entry.name for entry in await client.list(directory)}
            except NotFound:
                return set()

        async def reader(address: str) -> None:
            nonlocal walks
            async with FsClient(address, ring.secret) as other:
                for _ in range(READER_LISTINGS_MAX):
                    assert await listed(other, source) in (set(), tops)
                    assert await listed(other, target) in (set(), tops)
                    at_source = await _walk(other, source)
                    at_target = await _walk(other, target)
                    assert at_target in ({}, expected), sorted(at_target)
                    assert at_source.items() <= expected.items()
                    if at_source != expected:
                        assert at_target == expected, (sorted(at_source), sorted(at_target))
                    walks += 1
                    if done.is_set():
                        return

        readers = [asyncio.create_task(reader(a)) for a in ring.cluster.addresses[2:4]]
        await asyncio.sleep(0.2)
        await fs.rename(source, target)
        done.set()
        await asyncio.gather(*readers)
        assert await _walk(fs, target) == expected
    assert walks >= 4


@pytest.mark.parametrize("round_", range(KILL_ROUNDS))
async def test_a_rename_whose_coordinator_dies_is_finished_by_the_retry(
    ring: LocalCluster, rng: random.Random, round_: int
) -> None:
    """Breaks: the peer coordinating a directory rename SIGKILLed at a random moment
    (0-400 ms in); the client retries through the next seed with the same operation id.
    Must hold: the rename completes; every file is at the destination, byte-identical;
    nothing is left at the source."""
    root = f"/tests/mv-{rng.randrange(10**12)}"
    files = _tree(rng)
    first, second = ring.cluster.addresses[:2]
    async with FsClient([first, second], ring.secret) as fs:
        await _write_tree(fs, f"{root}/a", files)
        task = asyncio.ensure_future(fs_rename(fs, f"{root}/a", f"{root}/b", secrets.token_hex(12)))
        await asyncio.sleep(rng.uniform(0, 0.4))
        await asyncio.to_thread(ring.kill, ring.cluster.peers[0].peer_id)
        await task
        assert await _walk(fs, f"{root}/b") == {k: len(v) for k, v in files.items()}
        assert await _walk(fs, f"{root}/a") == {}
        for name, data in files.items():
            assert await fs.read(f"{root}/b/{name}") == data


async def test_an_abandoned_rename_stays_invisible_and_a_new_one_wins(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a rename whose coordinator dies with no retry (a client of that peer
    only), then a new rename of the same source to another place. Must hold: until the
    new one, the tree is whole at exactly one place (the source if the first did not
    commit, else its destination); after it, whole at the new destination (or, when the
    first had committed, the source is gone and the new rename is 404); no file lost."""
    root = f"/tests/mv-{rng.randrange(10**12)}"
    files = _tree(rng)
    expected = {k: len(v) for k, v in files.items()}
    victim = ring.cluster.peers[2]
    async with FsClient(ring.cluster.addresses[3], ring.secret) as fs:
        await _write_tree(fs, f"{root}/a", files)
        async with FsClient(victim.address, ring.secret, rounds=1) as doomed:
            task = asyncio.ensure_future(
                fs_rename(doomed, f"{root}/a", f"{root}/b", secrets.token_hex(12))
            )
            await asyncio.sleep(rng.uniform(0.02, 0.2))
            await asyncio.to_thread(ring.kill, victim.peer_id)
            with pytest.raises((PeerUnavailable, FsRefused)):
                await task
        at_a, at_b = await _walk(fs, f"{root}/a"), await _walk(fs, f"{root}/b")
        assert (at_a, at_b) in ((expected, {}), ({}, expected)), (sorted(at_a), sorted(at_b))
        if at_a:
            await fs.rename(f"{root}/a", f"{root}/c")
            assert await _walk(fs, f"{root}/c") == expected
            assert await _walk(fs, f"{root}/a") == {}
            assert await _walk(fs, f"{root}/b") == {}
        for name, data in files.items():
            assert await fs.read(f"{root}/{'c' if at_a else 'b'}/{name}") == data
