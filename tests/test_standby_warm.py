"""What an sr3:// standby reads ahead (spark_connector.warm), on a real ring.

What must hold: for the version the first batch after a takeover loads, exactly the
newest base at or below it (snapshot or RocksDB zip), the steps after it up to it, and
the SST files are read; nothing newer or older; nothing twice; a store deleted
meanwhile is skipped.
"""

from __future__ import annotations

import asyncio
import random

from ring.fs_api import Stat
from spark_connector.fs_client import FsClient
from spark_connector.warm import state_files_to_warm, warm_state
from sr3.local import LocalCluster


def stat(name: str, kind: str = "file") -> Stat:
    return Stat(f"/c/state/0/0/{name}", kind, 10, 0, 1)  # type: ignore[arg-type]


def test_the_files_a_version_loads_are_picked() -> None:
    names = ["1.delta", "2.delta", "2.snapshot", "3.delta", "4.delta", "4.snapshot", "5.zip"]
    entries = [stat(name) for name in names] + [stat("_metadata", "directory")]
    assert [e.name for e in state_files_to_warm(entries, 3)] == ["2.snapshot", "3.delta"]
    assert [e.name for e in state_files_to_warm(entries, 1)] == ["1.delta"]
    assert [e.name for e in state_files_to_warm(entries, 4)] == ["4.snapshot"]
    rocks = [stat(n) for n in ("3.zip", "4.zip", "4.changelog", "a.sst", "b.sst")]
    assert {e.name for e in state_files_to_warm(rocks, 4)} == {"4.zip", "a.sst", "b.sst"}


def test_warming_reads_those_files_once(ring: LocalCluster) -> None:
    root = f"/spark/warm-{random.randrange(10**9)}"
    files = {
        "state/0/0/1.delta": 100,
        "state/0/0/2.delta": 200,
        "state/0/0/2.snapshot": 300,
        "state/0/0/3.delta": 400,
        "state/0/1/3.delta": 500,
        "state/0/1/4.delta": 600,
        "state/1/0/3.zip": 700,
        "state/1/0/SSTs/x.sst": 800,
        "commits/2": 10,
    }

    async def run() -> None:
        async with FsClient(ring.ring, ring.secret) as client:
            for path, size in files.items():
                await client.write(f"{root}/{path}", bytes(size))
            done: set[tuple[str, int, int]] = set()
            first = await warm_state(client, root, 3, done)
            read = {path.removeprefix(root + "/") for path, _size, _mtime in done}
            assert read == {
                "state/0/0/2.snapshot",
                "state/0/0/3.delta",
                "state/0/1/3.delta",
                "state/1/0/3.zip",
                "state/1/0/SSTs/x.sst",
            }
            assert (first.files, first.bytes_read) == (5, 300 + 400 + 500 + 700 + 800)
            again = await warm_state(client, root, 3, done)
            assert (again.files, again.bytes_read) == (0, 0), "read twice"
            await client.delete(root, recursive=True)

    asyncio.run(run())
